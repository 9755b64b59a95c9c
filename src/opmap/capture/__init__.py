"""Capture: turn a workload into an OpGraph (torch dispatch tracer; ONNX importer later)."""

from opmap.capture.layer_types import LAYER_TYPES, classify, parse_overrides, unmatched_overrides
from opmap.capture.tracer import MetaCaptureError, ModelForwardError, capture

__all__ = ["LAYER_TYPES", "MetaCaptureError", "ModelForwardError", "capture", "classify", "parse_overrides",
           "unmatched_overrides"]
