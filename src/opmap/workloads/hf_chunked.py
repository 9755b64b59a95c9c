"""Llama 4's chunked local attention as the chunked kernel serving engines run, not as dense masked SDPA.

Llama 4 (Scout, Maverick; transformers' ``llama4_text``) runs chunked attention on three of every four layers
(``layer_types`` "chunked_attention": the RoPE layers; ``attention_chunk_size`` 8192): a token attends causally to
the tokens of its own 8192-token chunk only. transformers builds it as a boolean mask
(``masking_utils.create_chunked_causal_mask``) and passes it to SDPA, which computes every (query, key) score of the
sequence and masks: 4x the in-chunk work at 32k tokens. Engines run a kernel that computes the in-chunk pairs only:
TensorRT-LLM's attention with ``attention_chunk_size`` (docs/source/features/long-sequence.md, "Chunked attention":
"tokens can only attend to other tokens in the same chunk ... the attention computation can be significantly
reduced"), vLLM's chunked local attention (``ChunkedLocalAttention``: each chunk a virtual batch of its own).

``install_chunked_attention`` registers an attention with transformers' ``AttentionInterface`` and, with
``AttentionMaskInterface``, a mask builder: transformers' SDPA mask, and for a chunked layer (the mask builder is
asked with ``local_size``, the chunk) that mask with the chunk and the first query's absolute position (its
``q_offset``: the tokens already cached) as a ``ChunkedMask``. A layer given a ``ChunkedMask`` calls
opmap.capture.functions.chunked_attention (exactly SDPA under the chunked mask on real tensors; recorded by a capture
as the chunked kernel, so costs count the in-chunk causal pairs and the in-chunk keys read); every other layer
(Llama 4's global NoPE layers, the vision encoder) runs transformers' own SDPA attention unchanged.

The KV cache is left as opmap holds it for a full layer (opmap.workloads.hf_geometry): TensorRT-LLM keeps a chunked
layer's whole KV unless a per-layer ``max_attention_window`` makes it a cyclic buffer, and applies chunked attention
to context requests only (the same document: "chunked attention can only be applied to context requests"); vLLM's
hybrid KV cache manager frees a chunked layer's blocks before the current chunk (``ChunkedLocalAttentionManager``,
vllm/v1/core/single_type_kv_cache_manager.py), which opmap does not model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from opmap.capture.functions import chunked_attention

CHUNKED_ATTENTION = "opmap_chunked_attention"  # the name registered with transformers' AttentionInterface


@dataclass(frozen=True)
class ChunkedMask:
    """What a chunked layer's attention is given in place of its mask: transformers' boolean chunked mask (None where
    causal alone says it), the chunk (tokens) and the first query's absolute position."""

    mask: torch.Tensor | None
    chunk: int
    q_offset: int


def chunked_layers(config) -> int:
    """The layers a (text) config runs as chunked attention: ``layer_types`` "chunked_attention" with an
    ``attention_chunk_size``; 0 for any other model."""
    cfg = getattr(config, "text_config", None) or config
    chunk = getattr(cfg, "attention_chunk_size", None)
    types = getattr(cfg, "layer_types", None) or ()
    return sum(1 for t in types if t == "chunked_attention") if isinstance(chunk, int) and chunk > 0 else 0


def chunked_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              attention_mask, dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """The attention function transformers calls per layer (its AttentionInterface signature): chunked_attention
    where the layer was given a ``ChunkedMask``, the output (B, Sq, H, D) as transformers' SDPA function returns it;
    transformers' SDPA attention otherwise."""
    if isinstance(attention_mask, ChunkedMask):
        out = chunked_attention(query, key, value, attention_mask.chunk, attention_mask.q_offset,
                                attn_mask=attention_mask.mask, scale=scaling, dropout_p=dropout)
        return out.transpose(1, 2).contiguous(), None
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)


def chunked_mask(*args, local_size: int | None = None, q_offset=0, **kwargs):
    """transformers' SDPA mask; for a chunked layer (``local_size``: the chunk) wrapped with the chunk and the first
    query's absolute position as a ``ChunkedMask``."""
    from transformers.masking_utils import sdpa_mask

    mask = sdpa_mask(*args, local_size=local_size, q_offset=q_offset, **kwargs)
    if local_size and not isinstance(q_offset, torch.Tensor):
        return ChunkedMask(mask, int(local_size), int(q_offset))
    return mask


def _register() -> None:
    """Register the attention and its mask builder with transformers, once (a new name: no other model's attention
    changes)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    if CHUNKED_ATTENTION not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionInterface.register(CHUNKED_ATTENTION, chunked_attention_forward)
        AttentionMaskInterface.register(CHUNKED_ATTENTION, chunked_mask)


def install_chunked_attention(model: torch.nn.Module) -> int:
    """Set the chunked attention (module docstring) on ``model`` where its config has chunked layers; their count
    (0: the model is left as it is)."""
    n = chunked_layers(model.config)
    if n:
        _register()
        model.set_attn_implementation(CHUNKED_ATTENTION)
    return n
