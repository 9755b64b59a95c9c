"""Any workload by name: a zoo model, a user's ``path/to/file.py:factory``, or a Hugging Face config
(``path/to/config.json`` or ``hf:NAME`` from the local cache); and a built text model's position limit."""

from __future__ import annotations

from dataclasses import dataclass

from opmap.errors import OpmapError
from opmap.workloads.hf import build_hf, has_rope, is_hf_target, max_positions
from opmap.workloads.user import load_user
from opmap.workloads.zoo import MODELS, Workload, build_zoo, check_device

ACCEPTED = "path/to/file.py:factory, path/to/config.json, hf:NAME or path/to/model.onnx"


def load_workload(target: str, batch: int = 1, seq: int | None = None, dtype: str = "fp32",
                  device: str = "meta", allow_long_context: bool = False, dims: dict[str, int] | None = None,
                  overrides=()) -> Workload:
    """``allow_long_context``: a --seq past the model's position limit, for rotary models (rope scaling).
    ``dims``: an ONNX model's dynamic dims by name (--dim NAME=VALUE); ``overrides``: layer-type overrides, applied
    as an ONNX graph is built (a torch capture applies them itself)."""
    if target.lower().endswith(".onnx"):
        from opmap.workloads.onnx import load_onnx

        return load_onnx(target, batch, seq, dtype, dims, overrides)
    if dims:
        raise OpmapError("--dim binds an ONNX model's dynamic dims; this model is not a .onnx file")
    check_device(device)
    if target in MODELS:
        return build_zoo(target, batch, seq, dtype, device, allow_long_context)
    if is_hf_target(target):
        return build_hf(target, batch, seq, dtype, device, allow_long_context)
    if ":" in target and target.rpartition(":")[0].endswith(".py"):
        return load_user(target, dtype, device)
    raise OpmapError(f"unknown model {target!r}; accepted: {', '.join(MODELS)} (or {ACCEPTED})")


@dataclass(frozen=True)
class PositionLimit:
    """A text model's position limit: the positions it was built for (``max_positions``) and whether it places them
    by rotary embedding (``rope``: rope scaling can take it further, --allow-long-context)."""

    max_positions: int
    rope: bool


def position_limit(workload: Workload) -> PositionLimit | None:
    """A text model's position limit: of a zoo model (its max_seq) or a transformers model (its config's
    max_position_embeddings or rope-scaled maximum, opmap.workloads.hf.max_positions); None for anything else (a
    vision model, a model file without a transformers config)."""
    spec = MODELS.get(workload.name)
    if spec is not None:
        return PositionLimit(int(spec.max_seq), bool(spec.rope)) if spec.kind == "text" else None
    cfg = getattr(workload.module, "config", None)
    if workload.seq is None or not type(cfg).__module__.startswith("transformers"):
        return None
    limit = max_positions(cfg)
    return PositionLimit(limit, has_rope(cfg)) if limit else None
