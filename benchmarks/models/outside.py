"""Models outside the zoo, for the accuracy benchmark: the loader reads them as path.py:factory."""

from __future__ import annotations

import torch
from torch import nn


class MixerBlock(nn.Module):
    """MLP-Mixer block (Tolstikhin et al. 2021): token mixing, then channel mixing, each pre-norm + residual."""

    def __init__(self, tokens: int, dim: int, token_hidden: int, channel_hidden: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, token_hidden), nn.GELU(), nn.Linear(token_hidden, tokens))
        self.norm2 = nn.LayerNorm(dim)
        self.channel_mlp = nn.Sequential(nn.Linear(dim, channel_hidden), nn.GELU(), nn.Linear(channel_hidden, dim))

    def forward(self, x):
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class Mixer(nn.Module):
    """Mixer-S/16 at 224 px: 196 tokens, width 512, 8 blocks, token MLP 256, channel MLP 2048."""

    def __init__(self, blocks: int = 8, dim: int = 512, classes: int = 1000):
        super().__init__()
        self.stem = nn.Conv2d(3, dim, 16, 16)
        self.blocks = nn.Sequential(*[MixerBlock(196, dim, 256, 2048) for _ in range(blocks)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.stem(x).flatten(2).transpose(1, 2)
        return self.head(self.norm(self.blocks(x)).mean(1))


def mixer_s16():
    return Mixer(), (torch.randn(1, 3, 224, 224),)


class ConvNet(nn.Module):
    """A VGG-style stack of 3x3 conv + BN + ReLU with max pooling, on 128 px images."""

    def __init__(self, widths=(32, 64, 128, 256)):
        super().__init__()
        layers, c = [], 3
        for w in widths:
            layers += [nn.Conv2d(c, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU(inplace=True),
                       nn.Conv2d(w, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU(inplace=True), nn.MaxPool2d(2)]
            c = w
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c, 100)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


def convnet():
    return ConvNet(), (torch.randn(4, 3, 128, 128),)


class Stream(nn.Module):
    """A memory stream: an out-of-place ReLU over 2^28 fp32 elements (1 GiB in, a fresh 1 GiB out)."""

    def forward(self, x):
        return torch.relu(x)


def stream():
    return Stream(), (torch.randn(2 ** 28),)


def encoder():
    """nn.TransformerEncoder, 6 layers of d 512, 8 heads, FFN 2048, batch 8 x 128 tokens, in eval: the module PyTorch
    runs through its fused fast path (opmap profile measures the unfused path it captured, and says so)."""
    layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
    return nn.TransformerEncoder(layer, 6, enable_nested_tensor=False), (torch.randn(8, 128, 512),)
