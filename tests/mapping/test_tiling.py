"""Tile and wave quantization, traffic with reuse and legality, against hand computation."""

from __future__ import annotations

import math

import pytest

from opmap.errors import OpmapError
from opmap.mapping.tiling import tile_candidates

# H100 SXM5: 132 SMs, 228 KB shared memory per SM, 50 MB L2 (NVIDIA H100 whitepaper), bf16 989 TFLOP/s dense
H100 = dict(sram_per_unit=233472, units=132, l2_bytes=50 * 2 ** 20, peak_flops_per_s=989e12,
            bandwidth_bytes_per_s=3.35e12)


def _pick(cands, bm, bn, bk, st, sk=1):
    return next(t for t in cands if (t.bm, t.bn, t.bk, t.stages, t.split_k) == (bm, bn, bk, st, sk))


def test_square_gemm_tile_and_wave_quantization():
    c = tile_candidates(1, 4096, 4096, 4096, "bf16", **H100)
    t = _pick(c, 128, 128, 64, 3)
    assert t.tiles == 32 * 32  # ceil(4096/128)^2
    assert t.waves == math.ceil(1024 / 132) == 8
    assert t.wave_efficiency == pytest.approx(1024 / (8 * 132))
    assert t.tile_efficiency == 1.0
    assert t.sram_bytes == 3 * (128 * 64 + 64 * 128) * 2  # 96 KiB
    # A and B (32 MiB each) exceed half the L2: A is read once per column of tiles, B once per row
    operand = 4096 * 4096 * 2
    assert t.traffic_bytes == operand * 32 + operand * 32 + operand
    assert t.compute_s == pytest.approx(2 * 4096 ** 3 / (989e12 * 1024 / 1056))
    assert c[0].time_s <= t.time_s


def test_ragged_m_wastes_the_edge_tile():
    t = _pick(tile_candidates(1, 1000, 4096, 4096, "bf16", **H100), 128, 128, 64, 3)
    assert t.tile_efficiency == pytest.approx(1000 / 1024)  # ceil(1000/128) = 8 tiles of 128 rows
    assert t.tiles == 8 * 32


def test_small_operands_stay_in_l2_and_split_k_fills_the_device():
    c = tile_candidates(1, 64, 64, 8192, "bf16", **H100)
    t1 = _pick(c, 64, 64, 64, 2, 1)
    assert t1.tiles == 1 and t1.wave_efficiency == pytest.approx(1 / 132)
    # A (64x8192x2 = 1 MiB) and B fit in half the L2: read once each
    assert t1.traffic_bytes == 64 * 8192 * 2 * 2 + 64 * 64 * 2
    t16 = _pick(c, 64, 64, 64, 2, 16)
    assert t16.tiles == 16 and t16.traffic_bytes == t1.traffic_bytes + 2 * 16 * 64 * 64 * 4
    assert c[0].split_k > 1  # one tile cannot fill 132 SMs: the search splits K


def test_k_alignment_padding():
    t = tile_candidates(1, 256, 256, 100, "bf16", **H100)[0]
    assert t.k_padded == 104  # 16 bytes = 8 bf16 elements


def test_illegal_plan_names_the_limit():
    with pytest.raises(OpmapError, match=r"needs 6 KB of shared memory, the device has 4 KB"):
        tile_candidates(1, 128, 128, 128, "bf16", **{**H100, "sram_per_unit": 4096})
