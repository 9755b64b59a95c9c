"""GPT-2 in plain PyTorch (Radford et al. 2019): learned positions, pre-norm blocks, tanh-form GELU, tied LM head.

Attention uses ``F.scaled_dot_product_attention`` so capture sees the fused kernel, as eager PyTorch runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPT2Config:
    vocab_size: int = 50257  # GPT-2 BPE vocabulary (Radford et al. 2019)
    block_size: int = 1024  # context length, the size of the position table
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    # "sdpa": one fused attention kernel (what eager PyTorch runs); "unfused": Megatron-LM's 2021 path, the
    # scores materialised (baddbmm with the scale, a fused causal-mask softmax, dropout, bmm with V)
    attention: str = "sdpa"
    dropout: float = 0.0  # attention-probability and hidden dropout (Megatron-LM's GPT runs used 0.1)


class CausalSelfAttention(nn.Module):
    def __init__(self, c: GPT2Config):
        super().__init__()
        self.n_head = c.n_head
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd)
        self.c_proj = nn.Linear(c.n_embd, c.n_embd)
        if c.attention not in ("sdpa", "unfused"):
            raise ValueError(f"attention must be sdpa or unfused, got {c.attention!r}")
        self.unfused, self.dropout = c.attention == "unfused", c.dropout

    def _unfused(self, q, k, v):
        """Megatron-LM's attention core: scores = Q K^T / sqrt(d) (baddbmm), the causal mask and softmax in one
        fused kernel (its scaled_upper_triang_masked_softmax), dropout, probabilities @ V (bmm)."""
        b, h, t, hd = q.shape
        q2, k2, v2 = (z.reshape(b * h, t, hd) for z in (q, k, v))
        scores = torch.baddbmm(torch.empty(b * h, t, t, dtype=q.dtype, device=q.device), q2, k2.transpose(1, 2),
                               beta=0.0, alpha=hd ** -0.5)
        probs = torch.softmax(scores, dim=-1)  # the fused kernel reads the scores once and writes probabilities
        probs = F.dropout(probs, self.dropout, self.training)
        return torch.bmm(probs, v2).view(b, h, t, hd)

    def forward(self, x, cache=None):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        hd = d // self.n_head
        q, k, v = (z.view(b, t, self.n_head, hd).transpose(1, 2) for z in (q, k, v))
        if self.unfused and cache is None:
            y = self._unfused(q, k, v)
            return F.dropout(self.c_proj(y.transpose(1, 2).reshape(b, t, d)), self.dropout, self.training)
        if cache is not None:  # decode: write the new K and V into the cache, attend over all of it
            from opmap.workloads.llama import write_cache

            k, v = write_cache(cache, k, v)
            y = F.scaled_dot_product_attention(q, k, v)
        else:  # attention dropout inside the fused kernel in training, as Megatron's and NeMo's GPT runs set it
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               dropout_p=self.dropout if self.training else 0.0)
        return F.dropout(self.c_proj(y.transpose(1, 2).reshape(b, t, d)), self.dropout, self.training)


class GPT2MLP(nn.Module):
    def __init__(self, c: GPT2Config):
        super().__init__()
        self.c_fc = nn.Linear(c.n_embd, 4 * c.n_embd)
        self.c_proj = nn.Linear(4 * c.n_embd, c.n_embd)
        self.dropout = c.dropout

    def forward(self, x):
        y = self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))  # GPT-2 uses the tanh form
        return F.dropout(y, self.dropout, self.training)


class GPT2Block(nn.Module):
    def __init__(self, c: GPT2Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.n_embd)
        self.attn = CausalSelfAttention(c)
        self.ln_2 = nn.LayerNorm(c.n_embd)
        self.mlp = GPT2MLP(c)

    def forward(self, x, cache=None):
        x = x + self.attn(self.ln_1(x), cache)
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """GPT-2 with the LM head tied to the token embedding (so 124,439,808 parameters for the 124M)."""

    def __init__(self, c: GPT2Config = GPT2Config()):
        super().__init__()
        self.config = c
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = nn.Embedding(c.block_size, c.n_embd)
        self.h = nn.ModuleList(GPT2Block(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.n_embd)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying

    def forward(self, idx, kv_cache=None, logits_to_keep: int = 0):
        """``kv_cache``: decode, one (K, V) pair of (B, H, L, D) per block; the new tokens take its last slots.
        ``logits_to_keep``: the LM head over the last that many positions only (0: every position), as
        transformers' argument of that name."""
        t = idx.shape[1]
        start = kv_cache[0][0].shape[-2] - t if kv_cache is not None else 0
        pos = torch.arange(start, start + t, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for i, block in enumerate(self.h):
            x = block(x, kv_cache[i] if kv_cache is not None else None)
        x = self.ln_f(x)
        return self.lm_head(x[:, -logits_to_keep:] if logits_to_keep else x)
