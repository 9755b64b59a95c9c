"""Attention with sinks (gpt-oss) as one fused attention call per layer, as serving engines run it.

transformers has no SDPA attention for ``GptOssForCausalLM``: its attention adds a learned logit per head (the
"sink", ``GptOssAttention.sinks``) to the softmax's denominator, and its eager path repeats K and V to the query
heads (``repeat_kv``: copies), writes the (B, H, Sq, Sk) scores, concatenates the sinks, subtracts the row max,
takes the softmax, drops the sink column and multiplies by V, each its own kernel with the scores through memory.
Engines run one kernel instead: TensorRT-LLM's and FlashInfer's attention kernels take the sinks as an argument
(FlashInfer's ``sinks`` in its prefill / decode wrappers, TensorRT-LLM's ``attention_sinks``), vLLM's
FlashAttention-3 its ``s_aux``, each adding exp(sink) to the online softmax's denominator, the sliding window a
kernel parameter and K and V read once per KV head.

``install_sink_attention`` registers that attention with transformers' ``AttentionInterface`` (and the boolean
masks transformers builds for SDPA with ``AttentionMaskInterface``) and sets it on the model: each layer calls
opmap.capture.functions.sink_attention, exactly transformers' eager result (checked on real tensors in the tests),
computed as one ``scaled_dot_product_attention`` over the keys and a zero sink column and recorded by a capture as
the engines' one kernel (no mask read, the window counted as the kernel counts it).
"""

from __future__ import annotations

import torch

from opmap.capture.functions import sink_attention

SINK_ATTENTION = "opmap_sink_attention"  # the name registered with transformers' AttentionInterface


def has_sinks(m: torch.nn.Module) -> bool:
    """A transformers attention module with a sink logit per head (gpt-oss's ``GptOssAttention.sinks``)."""
    s = getattr(m, "sinks", None)
    return isinstance(s, torch.Tensor) and s.dim() == 1 and hasattr(m, "scaling") and hasattr(m, "layer_idx")


def sink_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                           sliding_window: int | None = None, s_aux: torch.Tensor | None = None, **kwargs):
    """The attention function transformers calls per layer (its AttentionInterface signature): sink_attention over
    the layer's window, the output (B, Sq, H, D) as transformers' SDPA function returns it, no weights."""
    sinks = s_aux if s_aux is not None else module.sinks
    out = sink_attention(query, key, value, sinks, attn_mask=attention_mask, scale=scaling, window=sliding_window,
                         dropout_p=dropout)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    """Register the attention and its mask builder (transformers' SDPA one: a boolean mask, None where causal
    alone says it) with transformers, once (a new name: no other model's attention changes)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    if SINK_ATTENTION not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionInterface.register(SINK_ATTENTION, sink_attention_forward)
        AttentionMaskInterface.register(SINK_ATTENTION, sdpa_mask)


def install_sink_attention(model: torch.nn.Module) -> int:
    """Set the sink attention (module docstring) on ``model`` where its attention modules have sinks; the count of
    such modules (0: the model is left as it is)."""
    n = sum(1 for m in model.modules() if has_sinks(m))
    if n:
        _register()
        model.set_attn_implementation(SINK_ATTENTION)
    return n
