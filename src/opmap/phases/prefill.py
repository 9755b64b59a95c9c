"""Prefill: the prompt's forward pass, priced as time to first token."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opmap.phases.common import dominant_bound, kernel_times
from opmap.phases.result import Prefill
from opmap.phases.runtime import runtime_text

if TYPE_CHECKING:
    from opmap.analyze import Analysis


def prefill_figures(a: Analysis) -> Prefill:
    """The prefill pass: time to first token = its kernels (``predicted_latency_s``) + the runtime's per-step
    time."""
    step = a.runtime_per_step_s
    lat = a.predicted_latency_s + step
    bound = dominant_bound([(b, t) for _, b, t in kernel_times(a)])
    tokens = int(a.assumptions.batch or 1) * int(a.assumptions.seq or 1)
    return Prefill(lat, a.predicted_latency_s, step, bound, a.kernels, tokens,
                   f"prefill: time to first token {lat * 1e3:.4g} ms ({bound}-bound{runtime_text(a)})")
