"""Saved activations measured on meta against Korthikanti et al. 2022 (opmap.mapping.activations).

Goldens are closed forms from the paper, written out beside each test."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from megatron_stack import megatron_stack

from opmap.errors import OpmapError
from opmap.mapping.activations import find_blocks, korthikanti_bytes, saved_activation_bytes
from opmap.workloads import build_zoo


# Korthikanti Eq. 1 counts, per layer in fp16 (bytes): attention 11 s b h + 5 a s^2 b (QKV input 2, Q and K 4,
# V 2, output-projection input 2, dropout mask 1; softmax output 2 a s^2 b, its dropout mask a s^2 b, the
# dropped probabilities 2 a s^2 b), MLP 19 s b h (input 2, GeLU input 8, GeLU output 8, mask 1), the two
# LayerNorm inputs 4 s b h. It leaves out LayerNorm's statistics: mean and 1/std in fp32 per token, two per
# LN, two LNs: 16 s b bytes, the one exact difference.
@pytest.mark.parametrize("b,s,h,a", [(2, 64, 128, 4), (1, 128, 256, 8), (3, 32, 64, 2)])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_saved_activations_per_layer_are_korthikanti_eq1(b, s, h, a, recompute):
    m, x = megatron_stack(b, s, h, a)
    sa = saved_activation_bytes(m, x, recompute=recompute)
    assert sa.blocks == ["layers.0", "layers.1", "layers.2"]
    ln_stats = 0 if recompute == "full" else 16 * s * b  # full keeps only the layer input: 2 s b h exactly
    golden = {"none": s * b * h * (34 + 5 * a * s / h), "selective": 34 * s * b * h, "full": 2 * s * b * h}
    for blk in sa.blocks:
        assert sa.by_block[blk] == golden[recompute] + ln_stats
    assert korthikanti_bytes(s, b, h, a, recompute) == golden[recompute]
    assert sa.by_block.get("", 0.0) == 0.0  # nothing is saved outside the layers of this stack
    assert sa.total_bytes == 3 * (golden[recompute] + ln_stats)


def test_selective_drops_exactly_the_s_squared_terms():
    """none - selective = 5 a s^2 b per layer (the softmax output, its mask and the dropped probabilities)."""
    b, s, h, a = 2, 64, 128, 4
    m, x = megatron_stack(b, s, h, a)
    none, sel = (saved_activation_bytes(m, x, recompute=r).per_block_bytes for r in ("none", "selective"))
    assert none - sel == 5 * a * s * s * b


def test_the_same_storage_saved_twice_counts_once_and_weights_never():
    with torch.device("meta"):
        lin = nn.Linear(64, 64, bias=False)
    x = torch.empty(4, 64, device="meta")
    # x is saved by the first matmul and by the mul; lin.weight (saved by both matmuls as weight.t()) is not
    # an activation. Saved: x (1 KiB) and lin(x) (1 KiB, saved by the second matmul).
    sa = saved_activation_bytes(lin, (x,), forward=lambda x: lin(lin(x)) * x)
    assert sa.total_bytes == 2 * 4 * 64 * 4
    assert sa.tensors == 2


def test_fused_sdpa_saves_nothing_s_by_s_and_selective_says_so():
    """GPT-2 small, fused (flash) SDPA: per block 32 s b h (LN inputs 2+2, QKV input 2, the QKV output storage
    6 (q, k, v are views of it), the attention output 2, MLP input 2, GeLU input 8, GeLU output 8; no dropout) +
    the fp32 log-sum-exp 4 a s b + LN statistics 16 s b: Korthikanti's 34 s b h less its two 1-byte dropout masks,
    the 5 a s / h term gone with flash attention. The fused kernels lay their output out like the query (PyTorch's
    CPU flash kernel; the CUDA ones as (B, S, H, D)), so the transpose(1, 2).reshape into the output projection is
    a view of it, not a copy (test_real_saved_tensors_of_a_hugging_face_llama_on_cpu measures it on a real run)."""
    b, s, h, a = 2, 64, 768, 12
    w = build_zoo("gpt2", b, s, "bf16")
    none = saved_activation_bytes(w.module, w.inputs)
    sel = saved_activation_bytes(w.module, w.inputs, recompute="selective")
    assert none.per_block_bytes == 32 * s * b * h + 4 * a * s * b + 16 * s * b
    assert sel.per_block_bytes == none.per_block_bytes and "nothing S x S" in sel.notes[0]
    # math attention: q, k, v copies 6 s b h replace the QKV storage and the output 2 s b h; the softmax output
    # (no dropout: the same storage the matmul with V saves) adds 2 a s^2 b, which selective drops
    math_ = saved_activation_bytes(w.module, w.inputs, attention="math")
    assert math_.per_block_bytes == 32 * s * b * h + 2 * a * s * s * b + 16 * s * b
    msel = saved_activation_bytes(w.module, w.inputs, attention="math", recompute="selective")
    assert msel.per_block_bytes == 32 * s * b * h + 16 * s * b
    full = saved_activation_bytes(w.module, w.inputs, recompute="full")
    assert full.per_block_bytes == 2 * s * b * h


def test_blocks_are_found_by_module_structure():
    w = build_zoo("llama-3-8b", 1, 8, "bf16")
    blocks = find_blocks(w.module)
    assert len(blocks) == 32 and blocks[0][0] == "layers.0"
    with pytest.raises(OpmapError, match="no nn.ModuleList"):
        saved_activation_bytes(nn.Linear(4, 4, device="meta"), (torch.empty(2, 4, device="meta"),),
                               recompute="full")
    with pytest.raises(OpmapError, match="accepted: none, selective, full"):
        saved_activation_bytes(nn.Linear(4, 4, device="meta"), (torch.empty(2, 4, device="meta"),),
                               recompute="some")
