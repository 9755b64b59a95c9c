"""Multi-head latent attention (MLA: DeepSeek-V2/V3/R1, Kimi K2) in a decode step, as serving engines run it.

transformers' ``DeepseekV3Attention`` caches the latent (``kv_lora_rank``) and the RoPE key (``qk_rope_head_dim``)
per token and layer, then decompresses every cached token's K and V through ``kv_b_proj`` at every step: for R1 at a
4,096-token context that is 4,096 x 512 x 32,768 multiply-adds per sequence per layer, work no engine does. SGLang,
vLLM and TensorRT-LLM decode with the absorbed weights (DeepSeek-V2, arXiv 2405.04434 sec. 2.1.2: "W^UK can be
absorbed into W^Q, and W^UV into W^O"): each head's query is taken into the latent space (q_nope x W_UK), attention
runs as multi-query attention over the one cached latent per token (keys: latent and RoPE key, kv_lora_rank +
qk_rope_head_dim wide; values: the latent, kv_lora_rank wide: FlashMLA's 576 / 512 for R1), and the result leaves
the latent space through W_UV before o_proj. The cache holds one entry of kv_lora_rank + qk_rope_head_dim elements
per token and layer (vLLM's ``kv_c_and_k_pe``), written in place by an engine.

``absorb_mla`` installs that forward on each MLA attention module for the steps that have a cache; the math is the
same attention (checked against transformers' own forward on real tensors in the tests). The fused attention kernel
reads the latent once; the graph's SDPA call shows its values as a view of the keys' first kv_lora_rank columns.
"""

from __future__ import annotations

import sys
import types

import torch
import torch.nn.functional as F

_MLA_FIELDS = ("kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj", "kv_lora_rank", "qk_nope_head_dim",
               "qk_rope_head_dim", "v_head_dim", "num_heads", "scaling", "layer_idx")


def is_mla(m: torch.nn.Module) -> bool:
    """A transformers MLA attention module (DeepseekV2/V3's layout: kv_a_proj_with_mqa, kv_b_proj, ...)."""
    return all(hasattr(m, a) for a in _MLA_FIELDS)


def absorb_mla(model: torch.nn.Module) -> int:
    """Install the absorbed decode forward (module docstring) on every MLA attention module; the count."""
    n = 0
    for m in model.modules():
        if is_mla(m):
            if getattr(m, "_opmap_decompressed", None) is None:  # installed once: a model decoded twice
                m._opmap_decompressed = m.forward
                m.forward = types.MethodType(_absorbed_forward, m)
            n += 1
    return n


def _rotate(self):
    """The rotary function transformers' module uses (interleaved or not)."""
    mod = sys.modules[type(self).__module__]
    if getattr(self.config, "rope_interleave", False) and hasattr(mod, "apply_rotary_pos_emb_interleave"):
        return mod.apply_rotary_pos_emb_interleave
    return mod.apply_rotary_pos_emb


def _absorbed_forward(self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
                      attention_mask: torch.Tensor | None = None, cache=None, past_key_values=None, **kwargs):
    """MLA with absorbed weights (module docstring) where the step has a cache (a decode step); without one (a
    prefill of the same model, as opmap serve captures both from one build) transformers' own forward, K and V
    decompressed, as engines prefill. Returns (output, None) as transformers' forward does."""
    cache = cache if cache is not None else past_key_values
    if cache is None:
        return self._opmap_decompressed(hidden_states, position_embeddings, attention_mask, **kwargs)
    b, s = hidden_states.shape[:-1]
    h, nope, rope, rank, vd = (self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim, self.kv_lora_rank,
                               self.v_head_dim)
    if getattr(self, "q_lora_rank", None) is None:
        q = self.q_proj(hidden_states)
    else:
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
    q_pass, q_rot = torch.split(q.view(b, s, h, nope + rope).transpose(1, 2), [nope, rope], dim=-1)
    kv_nope, k_rot = torch.split(self.kv_a_proj_with_mqa(hidden_states), [rank, rope], dim=-1)
    kv_nope = self.kv_a_layernorm(kv_nope).view(b, 1, s, rank)
    cos, sin = position_embeddings
    q_rot, k_rot = _rotate(self)(q_rot, k_rot.view(b, 1, s, rope), cos, sin)
    latent = torch.cat((kv_nope, k_rot), dim=-1)  # one cache entry per token: latent and RoPE key
    if cache is not None:
        latent, _ = cache.update(latent, latent[..., :0], self.layer_idx)
    w = self.kv_b_proj.weight.view(h, nope + vd, rank)
    # q_nope x W_UK per head: (h, b*s, nope) x (h, nope, rank), the heads as the batch of one bmm
    q_lat = torch.bmm(q_pass.permute(1, 0, 2, 3).reshape(h, b * s, nope), w[:, :nope])
    query = torch.cat((q_lat.view(h, b, s, rank).permute(1, 0, 2, 3), q_rot), dim=-1)
    causal = s > 1 and attention_mask is None
    o = F.scaled_dot_product_attention(query, latent, latent[..., :rank], attn_mask=attention_mask,
                                       is_causal=causal, scale=self.scaling, enable_gqa=True)
    # the latent result x W_UV per head: (h, b*s, rank) x (h, rank, v)
    out = torch.bmm(o.permute(1, 0, 2, 3).reshape(h, b * s, rank), w[:, nope:].transpose(1, 2))
    return self.o_proj(out.view(h, b, s, vd).permute(1, 2, 0, 3).reshape(b, s, h * vd)), None
