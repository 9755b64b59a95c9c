"""Helpers of the memory tests: a GPT layer written as Megatron-LM runs it unfused, whose saved activations
Korthikanti et al. 2022 count in closed form (tests/mapping/test_activations.py, test_memory.py)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MegatronLayer(nn.Module):
    """A GPT layer written as Megatron-LM runs it unfused (Korthikanti et al. 2022, sec. 4.1 and Fig. 2): pre-LN,
    one QKV projection, scores by baddbmm (scale as alpha), softmax, dropout, times V, output projection,
    dropout, residual; LN, 4h GeLU MLP, dropout, residual."""

    def __init__(self, h: int, a: int, p: float = 0.1):
        super().__init__()
        self.a, self.p = a, p
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.dense = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x):
        b, s, h = x.shape
        a, d = self.a, h // self.a
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, a, d).transpose(1, 2).reshape(b * a, s, d) for t in (q, k, v))
        empty = torch.empty(b * a, s, s, dtype=x.dtype, device=x.device)
        scores = torch.baddbmm(empty, q, k.transpose(1, 2), beta=0.0, alpha=1 / math.sqrt(d))
        probs = F.dropout(torch.softmax(scores, dim=-1), self.p, self.training)
        ctx = torch.bmm(probs, v).view(b, a, s, d).transpose(1, 2).reshape(b, s, h)
        x = x + F.dropout(self.dense(ctx), self.p, self.training)
        return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), self.p, self.training)


class Stack(nn.Module):
    def __init__(self, n: int, h: int, a: int):
        super().__init__()
        self.layers = nn.ModuleList(MegatronLayer(h, a) for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def megatron_stack(b, s, h, a, n=3):
    with torch.device("meta"):
        m = Stack(n, h, a).half()
    return m, (torch.empty(b, s, h, device="meta", dtype=torch.float16),)
