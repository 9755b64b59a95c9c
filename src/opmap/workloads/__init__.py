"""Workloads: the built-in zoo (plain PyTorch with shape knobs) and loaders for user files."""

from opmap.workloads.zoo import MODELS, ModelSpec, Workload, build_zoo, load_user, load_workload, parse_dtype

__all__ = ["MODELS", "ModelSpec", "Workload", "build_zoo", "load_user", "load_workload", "parse_dtype"]
