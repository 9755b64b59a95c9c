"""Llama 3 (Meta 2024) and a Mixtral-style mixture of experts in plain PyTorch: RMSNorm, RoPE, GQA, SwiGLU.

Attention uses ``F.scaled_dot_product_attention`` so capture sees the fused kernel, as eager PyTorch runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from opmap.ops import active_experts


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 128256  # Llama 3 tokenizer (Meta, "The Llama 3 Herd of Models", 2024)
    dim: int = 4096
    n_layer: int = 32
    n_head: int = 32
    n_kv_head: int = 8  # grouped-query attention
    ffn_dim: int = 14336
    rope_theta: float = 500000.0
    eps: float = 1e-5
    max_seq: int = 8192
    tie_embeddings: bool = False
    # Mixture of experts (Mixtral-style) when n_experts > 0: every block's MLP becomes a top-k MoE
    n_experts: int = 0
    top_k: int = 2
    # attention head width; 0: dim // n_head (Llama's). MaxText's scaled models (and Qwen3, Gemma) set it apart
    # from the model width: n_head x head_dim need not equal dim
    head_dim: int = 0

    @property
    def hd(self) -> int:
        return self.head_dim or self.dim // self.n_head


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()  # statistics in fp32, as the reference implementation does
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope(x, cos, sin):
    """Rotary position embedding, rotate-half form."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim),
                             persistent=False)

    def forward(self, seq: int, dtype, start: int = 0):
        t = torch.arange(start, start + seq, device=self.inv_freq.device, dtype=torch.float32)
        freqs = torch.outer(t, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


class LlamaAttention(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.h, self.kv = c.n_head, c.n_kv_head
        self.hd = c.hd
        self.q_proj = nn.Linear(c.dim, c.n_head * self.hd, bias=False)
        self.k_proj = nn.Linear(c.dim, c.n_kv_head * self.hd, bias=False)
        self.v_proj = nn.Linear(c.dim, c.n_kv_head * self.hd, bias=False)
        self.o_proj = nn.Linear(c.n_head * self.hd, c.dim, bias=False)

    def forward(self, x, cos, sin, cache=None):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        if cache is not None:  # decode: the new token's K and V go into the cache's last slots, in place
            k, v = write_cache(cache, k, v)
            y = F.scaled_dot_product_attention(q, k, v, enable_gqa=self.h != self.kv)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.h != self.kv)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.h * self.hd))


def write_cache(cache, k, v):
    """Decode with a preallocated KV cache (B, H_kv, L, D): the step's t new keys and values are written into
    the last t slots in place (as vLLM and HF's static cache do) and attention reads all L cached tokens."""
    kc, vc = cache
    t = k.shape[-2]
    kc[:, :, -t:].copy_(k)
    vc[:, :, -t:].copy_(v)
    return kc, vc


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, dim: int, ffn: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, ffn, bias=False)
        self.up_proj = nn.Linear(dim, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Expert(LlamaMLP):
    """One SwiGLU expert of a mixture-of-experts block."""


class SparseMoeBlock(nn.Module):
    """Top-k routing over E experts (Mixtral: top-2 of 8), token-choice, softmax then renormalise.

    Dispatch sorts the (token, choice) pairs by expert, runs each expert on its contiguous slice and
    adds the weighted results back. The slice sizes come from the router on real tensors. On the meta
    device, where the router's choices do not exist, the T*k assignments go in equal slices to the experts T
    tokens are expected to activate under uniform routing (opmap.ops.active_experts: E (1 - (1 - k/E)^T)
    rounded up; all E for a prefill, k for one decode token): the balanced-load assumption, stated in the
    workload's assumptions.
    """

    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.top_k = c.top_k
        self.gate = nn.Linear(c.dim, c.n_experts, bias=False)  # the router
        self.experts = nn.ModuleList(Expert(c.dim, c.ffn_dim) for _ in range(c.n_experts))

    def forward(self, x):
        b, t, d = x.shape
        e = len(self.experts)
        xf = x.reshape(b * t, d)
        probs = F.softmax(self.gate(xf).float(), dim=-1)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        flat = chosen.reshape(-1)
        order = torch.argsort(flat, stable=True)
        token = order // self.top_k
        routed = xf.index_select(0, token)
        n = flat.numel()
        if x.device.type == "meta":  # balanced over the experts b*t tokens are expected to activate
            a = active_experts(e, self.top_k, b * t)
            sizes = [n // a + (1 if i < n % a else 0) if i < a else 0 for i in range(e)]
        else:
            sizes = torch.bincount(flat, minlength=e).tolist()
        # an expert with no tokens launches nothing (its weights are not read)
        outs = [expert(chunk) for expert, chunk in zip(self.experts, routed.split(sizes)) if chunk.shape[0]]
        y = torch.cat(outs) * weights.reshape(-1)[order].unsqueeze(-1)
        return torch.zeros_like(xf).index_add_(0, token, y).view(b, t, d)


class LlamaBlock(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.dim, c.eps)
        self.self_attn = LlamaAttention(c)
        self.post_attention_layernorm = RMSNorm(c.dim, c.eps)
        self.mlp = SparseMoeBlock(c) if c.n_experts else LlamaMLP(c.dim, c.ffn_dim)

    def forward(self, x, cos, sin, cache=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """Llama 3 decoder (and Mixtral when ``n_experts`` > 0): RMSNorm, RoPE, GQA, SwiGLU, untied head."""

    def __init__(self, c: LlamaConfig = LlamaConfig()):
        super().__init__()
        self.config = c
        self.embed_tokens = nn.Embedding(c.vocab_size, c.dim)
        self.rotary = RotaryEmbedding(c.hd, c.rope_theta)
        self.layers = nn.ModuleList(LlamaBlock(c) for _ in range(c.n_layer))
        self.norm = RMSNorm(c.dim, c.eps)
        self.lm_head = nn.Linear(c.dim, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids, kv_cache=None, logits_to_keep: int = 0):
        """``kv_cache``: decode, one (K, V) pair of (B, H_kv, L, D) per layer holding L tokens, the last
        ``input_ids.shape[1]`` of them the new tokens' (positions L - t .. L - 1). ``logits_to_keep``: the LM head
        over the last that many positions only (0: every position), as transformers' argument of that name."""
        x = self.embed_tokens(input_ids)
        t = input_ids.shape[1]
        start = kv_cache[0][0].shape[-2] - t if kv_cache is not None else 0
        cos, sin = self.rotary(t, x.dtype, start)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, kv_cache[i] if kv_cache is not None else None)
        x = self.norm(x)
        return self.lm_head(x[:, -logits_to_keep:] if logits_to_keep else x)
