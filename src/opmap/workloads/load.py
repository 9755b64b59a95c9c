"""Any workload by name: a zoo model, or a user's ``path/to/file.py:factory``."""

from __future__ import annotations

from opmap.errors import OpmapError
from opmap.workloads.user import load_user
from opmap.workloads.zoo import MODELS, Workload, build_zoo, check_device


def load_workload(target: str, batch: int = 1, seq: int | None = None, dtype: str = "fp32",
                  device: str = "meta") -> Workload:
    check_device(device)
    if target in MODELS:
        return build_zoo(target, batch, seq, dtype, device)
    if ":" in target and target.rpartition(":")[0].endswith(".py"):
        return load_user(target, dtype, device)
    raise OpmapError(f"unknown model {target!r}; accepted: {', '.join(MODELS)} (or path/to/file.py:factory)")
