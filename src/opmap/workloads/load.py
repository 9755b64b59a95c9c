"""Any workload by name: a zoo model, a user's ``path/to/file.py:factory``, or a Hugging Face config
(``path/to/config.json`` or ``hf:NAME`` from the local cache)."""

from __future__ import annotations

from opmap.errors import OpmapError
from opmap.workloads.hf import build_hf, is_hf_target
from opmap.workloads.user import load_user
from opmap.workloads.zoo import MODELS, Workload, build_zoo, check_device

ACCEPTED = "path/to/file.py:factory, path/to/config.json or hf:NAME"


def load_workload(target: str, batch: int = 1, seq: int | None = None, dtype: str = "fp32",
                  device: str = "meta", allow_long_context: bool = False) -> Workload:
    """``allow_long_context``: a --seq past the model's position limit, for rotary models (rope scaling)."""
    check_device(device)
    if target in MODELS:
        return build_zoo(target, batch, seq, dtype, device, allow_long_context)
    if is_hf_target(target):
        return build_hf(target, batch, seq, dtype, device, allow_long_context)
    if ":" in target and target.rpartition(":")[0].endswith(".py"):
        return load_user(target, dtype, device)
    raise OpmapError(f"unknown model {target!r}; accepted: {', '.join(MODELS)} (or {ACCEPTED})")
