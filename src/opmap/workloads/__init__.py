"""Workloads: the built-in zoo (a file per model family: gpt2, bert, vit, llama, resnet; the registry in zoo.py),
users' own model files (user.py) and activation layouts (layout.py)."""

from opmap.workloads.layout import LAYOUTS, with_layout
from opmap.workloads.load import load_workload
from opmap.workloads.user import load_user
from opmap.workloads.zoo import MODELS, ModelSpec, Workload, build_zoo, parse_dtype

__all__ = ["LAYOUTS", "MODELS", "ModelSpec", "Workload", "build_zoo", "load_user", "load_workload", "parse_dtype",
           "with_layout"]
