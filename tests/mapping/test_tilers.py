"""The tiler registry: which tiler takes which kernel, what it returns, and a reason in numbers when none fits."""

from __future__ import annotations

from dataclasses import replace

import pytest

from opmap.costs.base import OpCost
from opmap.hardware import get_hardware
from opmap.hardware.curves import Curves
from opmap.hardware.spec import Value
from opmap.mapping.tilers import TILERS, NoTile, TileChoice, choose_tile
from opmap.mapping.tiling import attention_candidates, tile_candidates
from opmap.ops import MatrixFamily, MatrixProblem
from opmap.precision import resolve_precision


def _gemm(m, n, k, family=MatrixFamily.GEMM, reps=1):
    p = MatrixProblem(family, 1, m, n, k)
    return OpCost(matrix_flops=reps * p.flops, problem=p)


def _dev(hw, prec):
    return dict(sram_per_unit=hw.sram_per_unit_bytes, units=hw.compute_units, l2_bytes=hw.l2_bytes,
                peak_flops_per_s=prec.matrix_rate_flops_per_s, bandwidth_bytes_per_s=hw.memory_rate_bytes_per_s)


def test_registered_in_order():
    assert [name for name, _, _ in TILERS] == ["gpu_gemm", "cpu_blocking", "flash_attention"]


def test_gpu_gemm_takes_the_best_candidate_and_counts_conv_backward_twice():
    h100 = get_hardware("h100-sxm")
    prec = resolve_precision(h100, "bf16")
    # the tile model itself (the catalog H100 prices GEMMs off NVIDIA's measured grid: its curves left out here)
    c = choose_tile(_gemm(4096, 4096, 4096), h100, prec, Curves())
    assert isinstance(c, TileChoice)
    best = tile_candidates(1, 4096, 4096, 4096, "bf16", **_dev(h100, prec), sram_bytes_per_s=h100.sram_bytes_per_s,
                           min_bm=64)[0]
    assert (c.tile.bm, c.tile.bn, c.tile.bk) == (best.bm, best.bn, best.bk)
    assert c.compute_s == pytest.approx(best.compute_s)
    # convolution_backward makes two gradients: two forward-sized implicit GEMMs
    b = choose_tile(_gemm(3136, 64, 576, MatrixFamily.CONV_BWD, reps=2), h100, prec, Curves())
    f = choose_tile(_gemm(3136, 64, 576, MatrixFamily.CONV), h100, prec, Curves())
    assert b.compute_s == pytest.approx(2 * f.compute_s) and b.traffic_bytes == pytest.approx(2 * f.traffic_bytes)


def test_flash_attention_and_decode():
    h100 = get_hardware("h100-sxm")
    prec = resolve_precision(h100, "bf16")
    p = MatrixProblem(MatrixFamily.ATTENTION_CAUSAL, 12, 1024, 1024, 64)
    c = choose_tile(OpCost(matrix_flops=1.0, problem=p), h100, prec, h100.curves)
    best = attention_candidates(12, 1024, 1024, 64, "bf16", causal=True, **_dev(h100, prec))[0]
    assert c.tile == best and "flash tiling" in c.note
    d = choose_tile(OpCost(matrix_flops=1.0, problem=MatrixProblem(MatrixFamily.ATTENTION, 64, 1, 4096, 128)),
                    h100, prec, h100.curves)
    # flash-decoding splits the 4096-key cache in 256-key chunks: 16 splits
    assert "flash-decoding" in d.note and d.tile.split_k == 4096 // 256


def test_cpu_blocking_times_a_catalog_cpu_only():
    xeon = get_hardware("xeon-8480")
    prec = resolve_precision(xeon, "bf16")
    c = choose_tile(_gemm(1024, 1024, 1024), xeon, prec, xeon.curves)
    assert isinstance(c, TileChoice) and c.compute_s is not None
    assert choose_tile(OpCost(matrix_flops=1.0, problem=MatrixProblem(MatrixFamily.ATTENTION, 1, 8, 8, 8)),
                       xeon, prec, xeon.curves) is None  # no flash tiler on a CPU


def test_no_legal_tile_says_why_in_numbers():
    h100 = get_hardware("h100-sxm")
    tiny = replace(h100, fields={**h100.fields, "sram_per_unit_bytes": Value(4096.0, "assumed", "test")})
    c = choose_tile(_gemm(512, 512, 512), tiny, resolve_precision(tiny, "bf16"), tiny.curves)
    # Hopper's warpgroup MMA is m64, so the smallest candidate is 64x32x32 at 2 stages in bf16:
    # 2 * (64*32 + 32*32) * 2 B = 12,288 B = 12.3 kB > 4,096 B = 4.1 kB
    assert isinstance(c, NoTile)
    assert "(64x32x32, 2 stages) needs 12.3 kB of shared memory, the device has 4.1 kB" in c.reason


def test_no_problem_no_tile():
    h100 = get_hardware("h100-sxm")
    assert choose_tile(OpCost(vector_flops=10.0), h100, resolve_precision(h100, "bf16"), h100.curves) is None


@pytest.mark.parametrize("name", [n for n, h in __import__("opmap.hardware", fromlist=["catalog"]).catalog().items()
                                  if h.tiled])
def test_a_big_square_gemm_is_compute_bound_on_every_catalog_gpu(name):
    """8192^3 in bf16: 2 * 8192^3 FLOPs over 3 * 8192^2 * 2 B of operands and result, about 2,730 FLOP/B, far
    above five times every device's ridge point (peak / bandwidth, at most about 400), so it is compute-bound
    everywhere and runs near the matrix rate the model uses (the achievable rate, else the dense peak)."""
    hw = get_hardware(name)
    prec = resolve_precision(hw, "bf16")
    c = choose_tile(_gemm(8192, 8192, 8192), hw, prec, Curves())  # the tile model, measured grids aside
    memory_s = c.traffic_bytes / hw.memory_bandwidth_bytes_per_s
    assert 2 * 8192 ** 3 / (3 * 8192 ** 2 * 2) > 5 * prec.matrix_peak_flops_per_s / hw.memory_bandwidth_bytes_per_s
    assert c.compute_s > memory_s, f"{name}: {c.traffic_bytes / 1e9:.2f} GB of traffic"
    assert 2 * 8192 ** 3 / c.compute_s >= 0.9 * prec.matrix_rate_flops_per_s


def test_implicit_gemm_conv_reads_its_input_not_the_unfolded_matrix():
    """A 3x3 convolution, 8 x 64 x 56 x 56 fp16 in and out, on an L4: the unfolded A would be (8*56*56) x (64*9)
    x 2 B = 28.9 MB, nine times the 3.2 MB input. Implicit GEMM gathers overlapping windows through the caches,
    so device memory sees about the input, the weights and the output once each."""
    l4 = get_hardware("l4")
    prec = resolve_precision(l4, "fp16")
    m, n, k = 8 * 56 * 56, 64, 64 * 9
    x, w, y = 8 * 64 * 56 * 56 * 2, 64 * 64 * 9 * 2, 8 * 64 * 56 * 56 * 2
    p = MatrixProblem(MatrixFamily.CONV, 1, m, n, k)
    c = choose_tile(OpCost(matrix_flops=p.flops, bytes_read=x, param_bytes_read=w, bytes_written=y, problem=p),
                    l4, prec, l4.curves)
    assert m * k * 2 == pytest.approx(9 * x)
    assert 0.999 * (x + w + y) <= c.traffic_bytes <= 1.5 * (x + w + y)


def test_flash_attention_backward_runs_its_matrix_work_on_the_forward_tiles():
    # a flash-attention backward runs five GEMMs over the pairs (S, dP, dV, dQ, dK): 2 x pairs x (3d + 2d) MACs
    # = 2.5x the forward's 4 x pairs x d FLOPs (FlashAttention-2, section 3.2); its tiles are the forward's
    h100 = get_hardware("h100-sxm")
    prec = resolve_precision(h100, "bf16")
    p = MatrixProblem(MatrixFamily.ATTENTION_CAUSAL, 16, 2048, 2048, 128)
    pairs = 2048 * 2049 // 2
    # the tile model alone (the catalog's measured attention rows aside)
    fwd = choose_tile(OpCost(matrix_flops=4.0 * 16 * pairs * 128, problem=p), h100, prec, Curves())
    bwd = choose_tile(OpCost(matrix_flops=10.0 * 16 * pairs * 128, problem=p), h100, prec, Curves())
    assert bwd.compute_s == pytest.approx(2.5 * fwd.compute_s) and "backward" in bwd.note


def test_a_measured_attention_forward_takes_the_time_from_its_curve():
    """H100 SXM's catalog carries the FlashAttention-3 paper's forward timings (Shah et al. 2024, Figure 5): the
    tiler hands a forward it has rows for to the curve (no compute time of its own, the tile kept for its
    traffic); without the rows the tile model prices it."""
    h100 = get_hardware("h100-sxm")
    prec = resolve_precision(h100, "bf16")
    p = MatrixProblem(MatrixFamily.ATTENTION_CAUSAL, 16, 2048, 2048, 128)
    c = OpCost(matrix_flops=4.0 * 16 * (2048 * 2049 // 2) * 128, problem=p)
    measured, tiled = choose_tile(c, h100, prec, h100.curves), choose_tile(c, h100, prec, Curves())
    assert measured.compute_s is None and "measured forward curve" in measured.note
    assert tiled.compute_s is not None and tiled.compute_s > 0 and measured.tile == tiled.tile


def test_a_measured_shape_curve_prices_the_gemm_the_tile_model_does_not():
    """MI300X's catalog carries published per-shape fp8 GEMM timings (ROCm/aiter @ 41fa6c4, a8w8_tuned_gemm.csv,
    cu_num 304): M = 1024, N = 8192, K = 8192 in 170.7549 us. The tiler hands the time to the curve (no compute
    time of its own, the tile still shown) and the kernel runs at 2 M N K / 170.7549 us = 805 TFLOP/s, where the
    tile model alone says about 1,100 (mi300x's sustained fp8 1159 TFLOP/s x its tile and wave efficiencies). A
    format without rows (bf16) keeps the tile model."""
    import torch

    from opmap.analyze import analyze_graph
    from opmap.capture import capture
    from opmap.workloads.zoo import Workload

    mi = get_hardware("mi300x")
    fp8 = resolve_precision(mi, "fp8")
    c = choose_tile(_gemm(1024, 8192, 8192), mi, fp8, mi.curves)
    assert isinstance(c, TileChoice) and c.compute_s is None and "measured shape curve" in c.note
    c16 = choose_tile(_gemm(1024, 8192, 8192), mi, resolve_precision(mi, "bf16"), mi.curves)
    assert isinstance(c16, TileChoice) and c16.compute_s is not None

    class Linear(torch.nn.Module):
        def forward(self, x, w):
            return x @ w.t()

    with torch.device("meta"):
        ins = (torch.empty(1024, 8192, dtype=torch.bfloat16), torch.empty(8192, 8192, dtype=torch.bfloat16))
    a = analyze_graph(capture(Linear(), ins), Workload("mm", None, ins, 1, None), mi, "fp8")
    (k,) = [k for k in a.kernel_results if k.time.matrix_s > 0]
    assert k.time.matrix_s == pytest.approx(170.7549e-6, rel=1e-6)
    assert 2 * 1024 * 8192 * 8192 / k.time.matrix_s == pytest.approx(805e12, rel=2e-3)
    assert "measured shape curve" in k.why


def test_flash_tiles_pay_the_kernels_measured_dropout_factor_where_no_curve_prices_the_pass():
    """A calibration that timed only the forward (opmap calibrate does) prices the backward on the flash tiles; a
    dropout factor measured for the kernel applies to that time too, as it does to a curve's."""
    from opmap.hardware import with_attention_dropout

    h100 = get_hardware("h100-sxm")
    fwd_only = [r for r in h100.calibration["attention"] if r.get("pass") != "backward" and r["kernel"] == "cudnn"]
    hw = with_attention_dropout(replace(h100, calibration={**h100.calibration, "attention": fwd_only}), 1.5, "test")
    prec = resolve_precision(hw, "bf16")
    times = {}
    for drop in (False, True):
        p = MatrixProblem(MatrixFamily.ATTENTION_BWD_CAUSAL, 64, 4096, 4096, 128, dropout=drop)
        c = OpCost(matrix_flops=2.5 * 4.0 * 64 * (4096 * 4097 // 2) * 128, problem=p)
        t = choose_tile(c, hw, prec, hw.curves)
        assert isinstance(t, TileChoice) and t.compute_s is not None  # the tiles' time, no backward curve
        times[drop] = t
    assert times[True].compute_s == pytest.approx(1.5 * times[False].compute_s)
    assert "dropout: 1.5x" in times[True].note and "dropout" not in times[False].note
