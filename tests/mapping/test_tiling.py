"""Tile and wave quantization, traffic with reuse and legality, against hand computation."""

from __future__ import annotations

import math

import pytest

from opmap.errors import OpmapError
from opmap.mapping.tiling import tile_candidates

# H100 SXM5: 132 SMs, 228 KB shared memory per SM, 50 MB L2 (NVIDIA H100 whitepaper), bf16 989 TFLOP/s dense
H100 = dict(sram_per_unit=233472, units=132, l2_bytes=50 * 2 ** 20, peak_flops_per_s=989e12,
            bandwidth_bytes_per_s=3.35e12)


def _pick(cands, bm, bn, bk, st, sk=1, stream_k=False):
    return next(t for t in cands if (t.bm, t.bn, t.bk, t.stages, t.split_k, t.stream_k) == (bm, bn, bk, st, sk,
                                                                                             stream_k))


def test_square_gemm_tile_and_wave_quantization():
    c = tile_candidates(1, 4096, 4096, 4096, "bf16", **H100)
    t = _pick(c, 128, 128, 64, 3)
    assert t.tiles == 32 * 32  # ceil(4096/128)^2
    assert t.waves == math.ceil(1024 / 132) == 8
    assert t.wave_efficiency == pytest.approx(1024 / (8 * 132))
    assert t.tile_efficiency == 1.0
    assert t.sram_bytes == 3 * (128 * 64 + 64 * 128) * 2  # 96 KiB
    # A and B (32 MiB each) exceed half the L2. A wave holds 132 tiles; grouped rasterisation in
    # G = sqrt(132 * 1 MiB / 1 MiB) = 11 tile rows touches 11 A panels (128x4096x2 B = 1 MiB each) and
    # ceil(132 / 11) = 12 B panels: 23 MiB, inside the 50 MiB L2, read once per wave; 8 waves
    panel = 128 * 4096 * 2
    operand = 4096 * 4096 * 2
    assert t.traffic_bytes == 8 * (11 + 12) * panel + operand  # + C written once
    # with a 16 MiB L2 one wave's whole panels (23 MiB) do not fit, but its tiles walk K in lockstep: the L2
    # holds only the slices in flight, 3 stages x (11 x 128 + 12 x 128) x 64 x 2 B = 1.08 MiB, so each panel
    # still comes from DRAM once per wave
    t2 = _pick(tile_candidates(1, 4096, 4096, 4096, "bf16", **{**H100, "l2_bytes": 16 * 2 ** 20}), 128, 128, 64, 3)
    assert t2.traffic_bytes == t.traffic_bytes
    # with 2 MiB of L2 not even those fit in half of it: A re-read per column of tiles, B per row
    t3 = _pick(tile_candidates(1, 4096, 4096, 4096, "bf16", **{**H100, "l2_bytes": 2 * 2 ** 20}), 128, 128, 64, 3)
    assert t3.traffic_bytes == operand * 32 + operand * 32 + operand
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
    with pytest.raises(OpmapError, match=r"needs 6.14 kB of shared memory, the device has 4.1 kB"):
        tile_candidates(1, 128, 128, 128, "bf16", **{**H100, "sram_per_unit": 4096})


def test_flash_attention_traffic_and_decode():
    from opmap.mapping.tiling import attention_candidates

    # GPT-2-like prefill: 12 heads, 2048 queries and keys, head dim 64, bf16; K and V of all heads
    # (2 * 12 * 2048 * 64 * 2 B = 6 MiB) fit in half of a 16 MiB L2: read once
    small_l2 = {**H100, "l2_bytes": 16 * 2 ** 20}
    t = next(x for x in attention_candidates(12, 2048, 2048, 64, "bf16", causal=False, **small_l2)
             if (x.bm, x.bn) == (128, 64))
    qo = kv = 2 * 12 * 2048 * 64 * 2
    assert t.traffic_bytes == qo + kv
    assert t.sram_bytes == (128 * 64 + 4 * 64 * 64) * 2
    assert t.tiles == 12 * 16  # ceil(2048 / 128) query blocks per head
    # with K and V outside a 1 MiB L2, a wave's query blocks walk their heads' keys in lockstep: 132 blocks
    # span ceil(132 / 16) = 9 heads, whose K / V blocks in flight take 9 x 2 stages x 2 x 64 x 64 x 2 B =
    # 288 KiB, inside half the L2, and the 16 blocks of a head fit in one wave: each head's K and V once
    one_mib = {**H100, "l2_bytes": 1 * 2 ** 20}
    t = next(x for x in attention_candidates(12, 2048, 2048, 64, "bf16", causal=False, **one_mib)
             if (x.bm, x.bn) == (128, 64))
    assert t.traffic_bytes == qo + kv
    # with 256 KiB not even those fit in half of it: K and V re-read once per query block, 16 times
    tiny_l2 = {**H100, "l2_bytes": 256 * 2 ** 10}
    t = next(x for x in attention_candidates(12, 2048, 2048, 64, "bf16", causal=False, **tiny_l2)
             if (x.bm, x.bn) == (128, 64))
    assert t.traffic_bytes == qo + 16 * kv
    # decode: one query per head over a 4096-token KV cache (32 heads, d 128): the cache read dominates
    d = attention_candidates(32, 1, 4096, 128, "bf16", causal=False, **H100)[0]
    cache = 2 * 32 * 4096 * 128 * 2
    assert d.split_k == 4096 // 256 and d.memory_s > d.compute_s
    assert d.traffic_bytes >= cache


def test_cpu_cache_blocking_by_hand():
    from opmap.mapping.tiling import cpu_tile_candidates

    # a 56-core Xeon 8480+: 2 MiB L2 per core, 105 MiB LLC (Intel ARK); bf16 GEMM 128 x 768 x 768
    xeon = dict(l2_per_core=2 * 2 ** 20, llc_bytes=105 * 2 ** 20, cores=56, peak_flops_per_s=229e12,
                bandwidth_bytes_per_s=307e9)
    c = cpu_tile_candidates(1, 128, 768, 768, "bf16", **xeon)
    t = next(x for x in c if (x.bm, x.bn, x.bk) == (64, 256, 512))
    assert t.tiles == 2 * 3 and t.waves == 1 and t.wave_efficiency == pytest.approx(6 / 56)
    assert t.sram_bytes == 64 * 512 * 2 + 512 * 16 * 2  # A block + B micro-panel
    # B (768 x 768 x 2 B) fits half the LLC: read once; A re-read once per column block of C
    assert t.traffic_bytes == 128 * 768 * 2 * 3 + 768 * 768 * 2 + 128 * 768 * 2
    assert c[0].wave_efficiency > t.wave_efficiency  # the search balances the cores better
    with pytest.raises(OpmapError, match="half the core's L2"):
        cpu_tile_candidates(1, 128, 768, 768, "bf16", **{**xeon, "l2_per_core": 2048})


# A100 SXM: 108 SMs at 1.41 GHz, 312 TFLOP/s dense fp16 (A100 whitepaper); shared memory 32 banks x 4 B per clock
# (CUDA Programming Guide) = 128 B/clk/SM
A100 = dict(sram_per_unit=167936, units=108, l2_bytes=40 * 2 ** 20, peak_flops_per_s=312e12,
            bandwidth_bytes_per_s=2.039e12, sram_bytes_per_s=128 * 1.41e9)


def test_operand_feed_efficiency_by_hand():
    from opmap.mapping.tiling import feed_efficiency

    # F = 312e12 / (2 * 108) multiply-adds per second per SM; S = 128 * 1.41e9 B/s; fed when
    # h = BM*BN/(BM+BN) >= 2 * F * 2 B / S = 32.0
    f, s = 312e12 / 216, 128 * 1.41e9
    need = 2 * f * 2 / s
    assert need == pytest.approx(32.0, rel=0.01)
    assert feed_efficiency(16, 32, 2, f, s) == pytest.approx((16 * 32 / 48) / need)  # about a third
    assert feed_efficiency(128, 128, 2, f, s) == 1.0
    assert feed_efficiency(16, 32, 2, f, None) == 1.0  # bandwidth unknown: not modelled


def test_nvidia_guide_example_1792_on_a100():
    """The NVIDIA Matrix Multiplication Background guide's example: 1792^2 fp16 on an A100 runs 256x128 tiles,
    98 tiles on 108 SMs, one wave at about 91% (98 / 108)."""
    best = tile_candidates(1, 1792, 1792, 1792, "fp16", **A100)[0]
    assert {best.bm, best.bn} == {256, 128} and best.split_k == 1
    assert best.tiles == 98 and best.waves == 1
    assert best.wave_efficiency == pytest.approx(98 / 108)
    assert best.feed_efficiency == 1.0


def test_warpgroup_mma_sets_the_smallest_tile_rows():
    c = tile_candidates(1, 8192, 8192, 8192, "bf16", **{**H100, "min_bm": 64})
    assert min(t.bm for t in c) == 64


def test_a_split_k_pays_its_reduction_after_the_k_loop():
    # 1792^3 split 2 ways: partials 2 * 2 * 1792^2 * 4 B are written and read back before the result exists
    c = tile_candidates(1, 1792, 1792, 1792, "fp16", **A100)
    t1 = _pick(c, 128, 128, 64, 3, 1)
    t2 = _pick(c, 128, 128, 64, 3, 2)
    partials = 2 * 2 * 1792 * 1792 * 4
    assert t2.compute_s - t1.compute_s * (t1.wave_efficiency / t2.wave_efficiency) == pytest.approx(
        partials / A100["bandwidth_bytes_per_s"], rel=1e-6)


def test_stream_k_deals_k_iterations_evenly_and_pays_a_fixup():
    # 1280 x 4096 bf16 on 132 SMs in 128x256 tiles: 10 x 16 = 160 tiles, two waves at 160 / 264 = 0.61. Stream-K
    # (Osama et al. 2023) deals the 160 x ceil(12032 / 64) = 30,080 K iterations to the 132 units, 227 or 228
    # each: 30080 / (228 * 132) = 0.995; each unit leaves at most one tile split, whose fp32 128x256
    # accumulator is written and read back: 2 * 132 * 128 * 256 * 4 B
    c = tile_candidates(1, 1280, 4096, 12032, "bf16", **H100, stream_k=True)
    dp = _pick(c, 128, 256, 64, 3)
    sk = _pick(c, 128, 256, 64, 3, stream_k=True)
    assert dp.wave_efficiency == pytest.approx(160 / 264)
    assert sk.wave_efficiency == pytest.approx(30080 / (228 * 132))
    fixup = 2 * 132 * 128 * 256 * 4
    assert sk.traffic_bytes - dp.traffic_bytes == fixup
    assert sk.compute_s == pytest.approx(2 * 1280 * 4096 * 12032 / (989e12 * sk.wave_efficiency)
                                         + fixup / 3.35e12)
    assert c[0].stream_k  # here dealing the K loop beats both a second, mostly idle wave and split-K
    # a shape that fills its waves exactly has no stream-K variant: there is nothing to even out
    assert not any(t.stream_k for t in tile_candidates(1, 128 * 12, 128 * 11, 4096, "bf16", **H100, stream_k=True)
                   if (t.bm, t.bn, t.split_k) == (128, 128, 1))


@pytest.mark.parametrize("m,n,k,stream_k", [(1, 7168, 2048, True), (64, 576, 7168, True), (1000, 4096, 4096, False),
                                            (4096, 4096, 4096, True), (7, 129280, 100, False)])
def test_best_tiles_are_the_first_two_candidates(m, n, k, stream_k):
    """A kernel row's tile and runner-up (opmap.mapping.tilers.gpu_gemm) come from ``best_tiles``, which ranks the
    candidates without making a Tile of each: it must hand back exactly the first two ``tile_candidates`` ranks,
    ties in the same order (the Stream-K twin of a tile ties on every field the rank reads but one)."""
    from opmap.mapping.tiling import best_tiles

    kw = dict(H100, sram_bytes_per_s=33e12, min_bm=64, stream_k=stream_k, b_elem_bytes=1.0)
    assert best_tiles(1, m, n, k, "fp8", **kw) == tile_candidates(1, m, n, k, "fp8", **kw)[:2]
    assert best_tiles(1, m, n, k, "bf16", **kw, count=5) == tile_candidates(1, m, n, k, "bf16", **kw)[:5]


def test_best_tiles_name_the_limit_as_the_candidates_do():
    from opmap.mapping.tiling import best_tiles

    with pytest.raises(OpmapError, match="no legal GEMM tile"):
        best_tiles(1, 128, 128, 128, "bf16", **{**H100, "sram_per_unit": 4096})
