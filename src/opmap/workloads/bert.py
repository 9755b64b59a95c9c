"""BERT-base in plain PyTorch (Devlin et al. 2019): post-norm encoder with token-type embeddings and pooler.

Attention uses ``F.scaled_dot_product_attention`` so capture sees the fused kernel, as eager PyTorch runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


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
