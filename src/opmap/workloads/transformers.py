"""Transformer workloads in plain PyTorch: GPT-2, BERT, ViT, Llama 3 and a Mixtral-style MoE.

Random weights, shapes from the published configs. Attention uses ``F.scaled_dot_product_attention`` so
capture sees the fused kernel, as eager PyTorch runs it on CPU and CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---------------------------------------------------------------------------------------------- GPT-2
@dataclass(frozen=True)
class GPT2Config:
    vocab_size: int = 50257  # GPT-2 BPE vocabulary (Radford et al. 2019)
    block_size: int = 1024  # context length, the size of the position table
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768


class CausalSelfAttention(nn.Module):
    def __init__(self, c: GPT2Config):
        super().__init__()
        self.n_head = c.n_head
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd)
        self.c_proj = nn.Linear(c.n_embd, c.n_embd)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        hd = d // self.n_head
        q, k, v = (z.view(b, t, self.n_head, hd).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))


class GPT2MLP(nn.Module):
    def __init__(self, c: GPT2Config):
        super().__init__()
        self.c_fc = nn.Linear(c.n_embd, 4 * c.n_embd)
        self.c_proj = nn.Linear(4 * c.n_embd, c.n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))  # GPT-2 uses the tanh form


class GPT2Block(nn.Module):
    def __init__(self, c: GPT2Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.n_embd)
        self.attn = CausalSelfAttention(c)
        self.ln_2 = nn.LayerNorm(c.n_embd)
        self.mlp = GPT2MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
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

    def forward(self, idx):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# ----------------------------------------------------------------------------------------------- BERT
@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522  # WordPiece vocabulary of bert-base-uncased (Devlin et al. 2019)
    max_position: int = 512
    type_vocab_size: int = 2
    hidden: int = 768
    n_layer: int = 12
    n_head: int = 12
    intermediate: int = 3072
    eps: float = 1e-12


class BertEmbeddings(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden)
        self.position_embeddings = nn.Embedding(c.max_position, c.hidden)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden)
        self.LayerNorm = nn.LayerNorm(c.hidden, eps=c.eps)

    def forward(self, ids, token_type):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.word_embeddings(ids) + self.position_embeddings(pos) + self.token_type_embeddings(token_type)
        return self.LayerNorm(x)


class BertSelfAttention(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.n_head = c.n_head
        self.query = nn.Linear(c.hidden, c.hidden)
        self.key = nn.Linear(c.hidden, c.hidden)
        self.value = nn.Linear(c.hidden, c.hidden)
        self.dense = nn.Linear(c.hidden, c.hidden)

    def forward(self, x):
        b, t, d = x.shape
        hd = d // self.n_head
        q, k, v = (p(x).view(b, t, self.n_head, hd).transpose(1, 2) for p in (self.query, self.key, self.value))
        y = F.scaled_dot_product_attention(q, k, v)  # bidirectional: no mask for unpadded inputs
        return self.dense(y.transpose(1, 2).reshape(b, t, d))


class BertMLP(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.intermediate = nn.Linear(c.hidden, c.intermediate)
        self.output = nn.Linear(c.intermediate, c.hidden)

    def forward(self, x):
        return self.output(F.gelu(self.intermediate(x)))  # BERT uses the erf form


class BertLayer(nn.Module):
    """Post-LN block: x = LN(x + attn(x)); x = LN(x + mlp(x))."""

    def __init__(self, c: BertConfig):
        super().__init__()
        self.attention = BertSelfAttention(c)
        self.attention_norm = nn.LayerNorm(c.hidden, eps=c.eps)
        self.mlp = BertMLP(c)
        self.output_norm = nn.LayerNorm(c.hidden, eps=c.eps)

    def forward(self, x):
        x = self.attention_norm(x + self.attention(x))
        return self.output_norm(x + self.mlp(x))


class BertPooler(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.dense = nn.Linear(c.hidden, c.hidden)

    def forward(self, x):
        return torch.tanh(self.dense(x[:, 0]))


class Bert(nn.Module):
    """BERT encoder with its pooler (109,482,240 parameters for bert-base)."""

    def __init__(self, c: BertConfig = BertConfig()):
        super().__init__()
        self.config = c
        self.embeddings = BertEmbeddings(c)
        self.layer = nn.ModuleList(BertLayer(c) for _ in range(c.n_layer))
        self.pooler = BertPooler(c)

    def forward(self, input_ids, token_type_ids):
        x = self.embeddings(input_ids, token_type_ids)
        for layer in self.layer:
            x = layer(x)
        return x, self.pooler(x)


# ------------------------------------------------------------------------------------------------ ViT
@dataclass(frozen=True)
class ViTConfig:
    image_size: int = 224
    patch_size: int = 16
    hidden: int = 768
    n_layer: int = 12
    n_head: int = 12
    mlp_dim: int = 3072
    num_classes: int = 1000
    eps: float = 1e-6


class ViTSelfAttention(nn.Module):
    def __init__(self, c: ViTConfig):
        super().__init__()
        self.n_head = c.n_head
        self.qkv = nn.Linear(c.hidden, 3 * c.hidden)  # same parameters as nn.MultiheadAttention's in_proj
        self.out_proj = nn.Linear(c.hidden, c.hidden)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_head, d // self.n_head).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, d))


class ViTMLP(nn.Module):
    def __init__(self, c: ViTConfig):
        super().__init__()
        self.fc1 = nn.Linear(c.hidden, c.mlp_dim)
        self.fc2 = nn.Linear(c.mlp_dim, c.hidden)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class ViTBlock(nn.Module):
    def __init__(self, c: ViTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.hidden, eps=c.eps)
        self.self_attention = ViTSelfAttention(c)
        self.ln_2 = nn.LayerNorm(c.hidden, eps=c.eps)
        self.mlp = ViTMLP(c)

    def forward(self, x):
        x = x + self.self_attention(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class ViT(nn.Module):
    """ViT-B/16 in torchvision's layout (86,567,656 parameters with the 1000-class head)."""

    def __init__(self, c: ViTConfig = ViTConfig()):
        super().__init__()
        self.config = c
        n_patches = (c.image_size // c.patch_size) ** 2
        self.conv_proj = nn.Conv2d(3, c.hidden, kernel_size=c.patch_size, stride=c.patch_size)
        self.class_token = nn.Parameter(torch.zeros(1, 1, c.hidden))
        self.pos_embedding = nn.Parameter(torch.zeros(1, n_patches + 1, c.hidden))
        self.layers = nn.ModuleList(ViTBlock(c) for _ in range(c.n_layer))
        self.ln = nn.LayerNorm(c.hidden, eps=c.eps)
        self.head = nn.Linear(c.hidden, c.num_classes)

    def forward(self, images):
        x = self.conv_proj(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embedding
        for block in self.layers:
            x = block(x)
        return self.head(self.ln(x)[:, 0])


# ---------------------------------------------------------------------------------------- Llama / MoE
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

    def forward(self, seq: int, dtype):
        t = torch.arange(seq, device=self.inv_freq.device, dtype=torch.float32)
        freqs = torch.outer(t, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


class LlamaAttention(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.h, self.kv = c.n_head, c.n_kv_head
        self.hd = c.dim // c.n_head
        self.q_proj = nn.Linear(c.dim, c.n_head * self.hd, bias=False)
        self.k_proj = nn.Linear(c.dim, c.n_kv_head * self.hd, bias=False)
        self.v_proj = nn.Linear(c.dim, c.n_kv_head * self.hd, bias=False)
        self.o_proj = nn.Linear(c.n_head * self.hd, c.dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.h != self.kv)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.h * self.hd))


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
    device, where the router's choices do not exist, each expert gets an equal slice of the T*k
    assignments: the balanced-load assumption, stated in the workload's assumptions.
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
        if x.device.type == "meta":
            sizes = [n // e + (1 if i < n % e else 0) for i in range(e)]  # balanced load
        else:
            sizes = torch.bincount(flat, minlength=e).tolist()
        outs = [expert(chunk) for expert, chunk in zip(self.experts, routed.split(sizes))]
        y = torch.cat(outs) * weights.reshape(-1)[order].unsqueeze(-1)
        return torch.zeros_like(xf).index_add_(0, token, y).view(b, t, d)


class LlamaBlock(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.dim, c.eps)
        self.self_attn = LlamaAttention(c)
        self.post_attention_layernorm = RMSNorm(c.dim, c.eps)
        self.mlp = SparseMoeBlock(c) if c.n_experts else LlamaMLP(c.dim, c.ffn_dim)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """Llama 3 decoder (and Mixtral when ``n_experts`` > 0): RMSNorm, RoPE, GQA, SwiGLU, untied head."""

    def __init__(self, c: LlamaConfig = LlamaConfig()):
        super().__init__()
        self.config = c
        self.embed_tokens = nn.Embedding(c.vocab_size, c.dim)
        self.rotary = RotaryEmbedding(c.dim // c.n_head, c.rope_theta)
        self.layers = nn.ModuleList(LlamaBlock(c) for _ in range(c.n_layer))
        self.norm = RMSNorm(c.dim, c.eps)
        self.lm_head = nn.Linear(c.dim, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(input_ids.shape[1], x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


