"""A Hugging Face model's geometry (opmap.geometry.ModelGeometry) from its config.json fields, once per workload.

One adapter per family where the family says something the generic reading cannot: Mistral's and Mixtral's one
sliding window, Qwen2's window on the layers from ``max_window_layers`` up (when ``use_sliding_window``), Gemma 2's
alternating local / global layers, GPT-2's own field names, DeepSeek-V2/V3's multi-head latent attention and
shared experts. Everything else takes the generic reading of the fields transformers' configs share
(``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``,
``sliding_window``, ``layer_types``, the expert counts): gpt-oss (its ``layer_types`` alternate a 128-token window
and full layers; its attention "sinks" are a learned logit per head added to the softmax's denominator, no cached
token, so no sink tokens are held), Qwen3 and Qwen3-MoE, Llama 4 (its chunked-attention layers hold a full layer's
cache here, as TensorRT-LLM keeps it: opmap.workloads.hf_chunked; their attention is priced as the chunked kernel).
Fields are read off the config object transformers built (a PretrainedConfig: its defaults filled in) or a plain dict
of config.json.

The checkpoint's quantization (``quantization_config``) is read too: the format its quantized weights are in
(``quant_method`` mxfp4: gpt-oss's MXFP4 experts; fp8 with ``weight_block_size`` [128, 128]: DeepSeek-V3's block
fp8; ModelOpt's nvfp4) and ``modules_to_not_convert`` (the modules the checkpoint keeps in bf16: gpt-oss's
attention, router, embedding and LM head), so an analysis in that format prices those modules as shipped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from opmap.errors import OpmapError
from opmap.geometry import AttentionSpec, ModelGeometry, attention_kind

_MISSING = object()


def _get(cfg: Any, *names: str, default: Any = None) -> Any:
    """The first of ``names`` the config sets (not None), else ``default``."""
    for n in names:
        v = cfg.get(n, _MISSING) if isinstance(cfg, dict) else getattr(cfg, n, _MISSING)
        if v is not _MISSING and v is not None:
            return v
    return default


def _text(cfg: Any) -> Any:
    """A multimodal config's text part (``text_config``), else the config itself."""
    t = _get(cfg, "text_config")
    return t if t is not None else cfg


def _spec(cfg: Any, window: int | None, causal: bool = True) -> AttentionSpec:
    hidden = int(_get(cfg, "hidden_size", "n_embd", "d_model"))
    heads = int(_get(cfg, "num_attention_heads", "n_head", "num_heads"))
    kv = int(_get(cfg, "num_key_value_heads", "num_kv_heads", default=heads))
    hd = int(_get(cfg, "head_dim", default=0) or hidden // heads)
    return AttentionSpec(attention_kind(heads, kv), heads, kv, hd, window=window or None, causal=causal,
                         sinks=0)


def _layer_windows(cfg: Any, layers: int, window: int | None) -> list[int | None]:
    """Per layer: the window, or None for a full-attention layer; transformers' ``layer_types`` where set."""
    types = _get(cfg, "layer_types")
    if types:
        return [window if t == "sliding_attention" else None for t in types]
    return [window] * layers


def _moe(cfg: Any) -> dict[str, int]:
    experts = int(_get(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0) or 0)
    if not experts:
        return {}
    return {"n_experts": experts, "top_k": int(_get(cfg, "num_experts_per_tok", "top_k", default=0) or 0),
            "shared_experts": int(_get(cfg, "n_shared_experts", default=0) or 0),
            "expert_ffn": int(_get(cfg, "moe_intermediate_size", "intermediate_size", default=0) or 0)}


def _geometry(cfg: Any, windows: list[int | None], family: str, causal: bool = True) -> ModelGeometry:
    return ModelGeometry(
        layers=len(windows), hidden=int(_get(cfg, "hidden_size", "n_embd", "d_model")),
        vocab=int(_get(cfg, "vocab_size", default=0)), attention=tuple(_spec(cfg, w, causal) for w in windows),
        ffn=int(_get(cfg, "intermediate_size", "n_inner", "ffn_dim", default=0) or 0), source=f"config ({family})",
        **_moe(cfg))


def _layers(cfg: Any) -> int:
    return int(_get(cfg, "num_hidden_layers", "n_layer", "num_layers"))


def generic(cfg: Any) -> ModelGeometry:
    """The fields transformers' decoder configs share; ``sliding_window`` on every layer unless ``layer_types``
    says which."""
    cfg = _text(cfg)
    causal = not bool(_get(cfg, "is_encoder_decoder", default=False)) and _get(cfg, "model_type") not in ENCODERS
    return _geometry(cfg, _layer_windows(cfg, _layers(cfg), _get(cfg, "sliding_window")), "generic", causal)


def qwen2(cfg: Any) -> ModelGeometry:
    """Qwen2: a window only when ``use_sliding_window``, on the layers from ``max_window_layers`` up
    (transformers' Qwen2Config.layer_types)."""
    n = _layers(cfg)
    w = _get(cfg, "sliding_window") if _get(cfg, "use_sliding_window", default=False) else None
    if _get(cfg, "layer_types"):
        return _geometry(cfg, _layer_windows(cfg, n, w), "qwen2")
    first = int(_get(cfg, "max_window_layers", default=n))
    return _geometry(cfg, [w if w and i >= first else None for i in range(n)], "qwen2")


def gemma2(cfg: Any) -> ModelGeometry:
    """Gemma 2: local sliding-window layers alternate with global ones, the first local (layer i slides when i is
    even; transformers' Gemma2Config.layer_types)."""
    n, w = _layers(cfg), _get(cfg, "sliding_window")
    if _get(cfg, "layer_types"):
        return _geometry(cfg, _layer_windows(cfg, n, w), "gemma2")
    return _geometry(cfg, [w if i % 2 == 0 else None for i in range(n)], "gemma2")


def deepseek(cfg: Any) -> ModelGeometry:
    """DeepSeek-V2/V3: multi-head latent attention, the cache one ``kv_lora_rank`` latent plus the decoupled RoPE
    key of ``qk_rope_head_dim`` per token (arXiv 2405.04434 sec. 2.1); routed and shared experts."""
    n, heads = _layers(cfg), int(_get(cfg, "num_attention_heads"))
    nope, rope = int(_get(cfg, "qk_nope_head_dim")), int(_get(cfg, "qk_rope_head_dim"))
    spec = AttentionSpec("mla", heads, heads, nope + rope, int(_get(cfg, "v_head_dim")),
                         kv_lora_rank=int(_get(cfg, "kv_lora_rank")), qk_rope_head_dim=rope)
    return ModelGeometry(n, int(_get(cfg, "hidden_size")), int(_get(cfg, "vocab_size", default=0)), (spec,) * n,
                         ffn=int(_get(cfg, "intermediate_size", default=0)), source="config (deepseek)", **_moe(cfg))


ENCODERS = frozenset({"bert", "roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2", "vit"})
ADAPTERS: dict[str, Callable[[Any], ModelGeometry]] = {
    "qwen2": qwen2, "qwen2_moe": qwen2, "gemma2": gemma2, "deepseek_v2": deepseek, "deepseek_v3": deepseek,
}


MAX_UNQUANTIZED = 256  # published configs list a handful of module patterns (gpt-oss: 4)
MAX_PATTERN = 200


def checkpoint_quantization(cfg: Any) -> tuple[str, tuple[str, ...]]:
    """(the opmap format of the checkpoint's quantized weights, the module patterns it keeps unquantized) from a
    config's ``quantization_config`` (module docstring); ("", ()) without one or for a method opmap has no format
    for. A malformed ``modules_to_not_convert`` is refused in one line."""
    q = _get(cfg, "quantization_config", default=None)
    if q is not None and not isinstance(q, dict):
        q = q.to_dict() if hasattr(q, "to_dict") else None
    if not isinstance(q, dict):
        return "", ()
    method = str(q.get("quant_method", "")).lower()
    algo = str(q.get("quant_algo", "")).lower()
    fmt = ("mxfp4" if method == "mxfp4" else
           ("fp8-block" if q.get("weight_block_size") else "fp8") if method == "fp8" else
           "nvfp4" if method == "modelopt" and "nvfp4" in algo else
           "fp8" if method == "modelopt" and algo == "fp8" else "")
    keep = q.get("modules_to_not_convert") or q.get("ignore") or q.get("exclude_modules") or []
    if not isinstance(keep, list) or len(keep) > MAX_UNQUANTIZED or not all(
            isinstance(k, str) and 0 < len(k) <= MAX_PATTERN for k in keep):
        raise OpmapError(f"quantization_config.modules_to_not_convert must be a list of at most {MAX_UNQUANTIZED} "
                         f"module names or patterns (each 1-{MAX_PATTERN} characters), got {str(keep)[:80]!r}")
    return fmt, tuple(keep) if fmt else ()


def hf_geometry(cfg: Any) -> ModelGeometry:
    """The geometry of the model a config describes: its family's adapter (``ADAPTERS`` by ``model_type``), else
    the generic reading (llama, mistral, mixtral, gpt2, phi, gemma and the rest); with the checkpoint's
    quantization (``checkpoint_quantization``)."""
    geo = ADAPTERS.get(str(_get(cfg, "model_type", default="")), generic)(cfg)
    fmt, keep = checkpoint_quantization(cfg)
    return replace(geo, checkpoint_format=fmt, unquantized=keep) if fmt else geo
