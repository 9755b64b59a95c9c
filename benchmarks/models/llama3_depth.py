"""Llama 3 8B cut to 2 of its 32 layers, for opmap quality on the CPU: the zoo's own llama-3-8b module
(opmap.workloads.zoo.LLAMA3_8B: d 4096, GQA 32/8 heads, SwiGLU 14336, the 128256-token vocabulary and its untied LM
head) with n_layer = 2, so its fp32 weights take 6 GB rather than 32 GB. Random weights, as the zoo builds them; the
loader reads it as benchmarks/models/llama3_depth.py:llama3_8b_2layers.

    opmap quality benchmarks/models/llama3_depth.py:llama3_8b_2layers --dtype nvfp4 --out DIR
"""

from __future__ import annotations

import dataclasses

import torch

from opmap.workloads.llama import Llama
from opmap.workloads.zoo import LLAMA3_8B

BATCH, SEQ = 2, 64  # opmap quality's default text shape (2 sequences of 64 tokens)


def llama3_8b_2layers():
    torch.manual_seed(0)  # the same random weights every run
    return Llama(dataclasses.replace(LLAMA3_8B, n_layer=2)), (torch.zeros(BATCH, SEQ, dtype=torch.long),)
