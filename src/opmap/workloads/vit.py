"""ViT-B/16 in plain PyTorch (Dosovitskiy et al. 2021), laid out like torchvision's vit_b_16.

Attention uses ``F.scaled_dot_product_attention`` so capture sees the fused kernel, as eager PyTorch runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


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
