"""Efficiency curves: interpolation by hand, and the time model reading them."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest

from opmap.costs.base import OpCost
from opmap.hardware.curves import Curves, RateTable
from opmap.hardware.spec import spec_from_dict
from opmap.ops import MatrixFamily, MatrixProblem
from opmap.precision import resolve_precision
from opmap.predict import predict_cost


def test_exact_hit_and_midpoint():
    t = RateTable.build([(256, 256, 256, 100.0), (1024, 256, 256, 300.0)])
    assert t.rate(256, 256, 256) == 100.0
    # (512, 256, 256) is one octave from each point in log2 space: equal weights, the mean
    assert t.rate(512, 256, 256) == pytest.approx(200.0)
    # outside the grid the nearest points decide: no extrapolated growth beyond the largest rate
    assert 100.0 < t.rate(1 << 20, 256, 256) < 300.0


def test_inverse_distance_weighting_by_hand():
    t = RateTable.build([(256, 256, 256, 100.0), (4096, 256, 256, 500.0)])
    # 1024 is 2 octaves from 256 and 2 from 4096: equal; 512 is 1 and 3: weights 1 and 1/9
    assert t.rate(1024, 256, 256) == pytest.approx(300.0)
    assert t.rate(512, 256, 256) == pytest.approx((100.0 + 500.0 / 9) / (1 + 1 / 9))


def test_bandwidth_curve_takes_dispatch_out_and_interpolates():
    # copy of B bytes moves 2B; measured rate includes a 1 us dispatch: t = 2B/rate
    cal = {"bandwidth": [{"kind": "copy", "bytes": 2 ** 20, "bytes_per_s": 2 * 2 ** 20 / 11e-6},
                         {"kind": "copy", "bytes": 2 ** 22, "bytes_per_s": 2 * 2 ** 22 / 201e-6},
                         {"kind": "read", "bytes": 2 ** 20, "bytes_per_s": 1.0}]}
    c = Curves.from_calibration(cal, launch_overhead_s=1e-6)
    lo, hi = 2 * 2 ** 20 / 10e-6, 2 * 2 ** 22 / 200e-6
    assert c.bandwidth(2 * 2 ** 20) == pytest.approx(lo)
    assert c.bandwidth(2 * 2 ** 22) == pytest.approx(hi)
    assert c.bandwidth(2 * 2 ** 21) == pytest.approx((lo + hi) / 2)  # halfway in log2(size)
    assert c.bandwidth(2 ** 40) == pytest.approx(hi) and c.bandwidth(1) == pytest.approx(lo)


def _spec(calibration):
    v = lambda x: {"value": x, "kind": "measured", "source": "test"}  # noqa: E731
    return spec_from_dict({"name": "t", "display_name": "t", "vendor": "t", "device_type": "cpu",
                           "matrix_peak_flops_per_s": {"fp32": v(100e9)},
                           "vector_peak_flops_per_s": {"fp32": v(10e9)},
                           "memory_bytes": v(1e9), "memory_bandwidth_bytes_per_s": v(10e9),
                           "launch_overhead_s": v(2e-6), "calibration": calibration}, "test")


def test_time_model_uses_the_gemm_curve_at_the_shape():
    cal = {"matmul": [{"m": 128, "n": 768, "k": 768, "dtype": "fp32", "layout": "nt", "flops_per_s": 50e9}],
           "vector_rates": {"transcendental_per_s": 1e9}, "view_overhead_s": 3e-6}
    hw = _spec(cal)
    prec = resolve_precision(hw, "fp32")
    curves = Curves.from_calibration(hw.calibration, hw.launch_overhead_s)
    flops = 2.0 * 128 * 768 * 768
    cost = OpCost(matrix_flops=flops, problem=MatrixProblem(MatrixFamily.GEMM, 1, 128, 768, 768))
    p = predict_cost(cost, hw, prec, curves)
    assert p.matrix_s == pytest.approx(flops / 50e9)  # the curve, not the 100 GFLOP/s peak
    assert p.predicted_s == pytest.approx(flops / 50e9 + 2e-6)
    # a GEMM without a shape (einsum chain) falls back to the peak
    assert predict_cost(OpCost(matrix_flops=flops), hw, prec, curves).matrix_s == pytest.approx(flops / 100e9)
    # the measured transcendental rate replaces the assumed slots
    t = predict_cost(OpCost(transcendental_flops=1e6), hw, prec, curves)
    assert t.vector_s == pytest.approx(1e6 / 1e9)
    # on a CPU a view costs its measured host dispatch
    assert predict_cost(OpCost(is_view=True, kernel=False), hw, prec, curves).predicted_s == pytest.approx(3e-6)


def test_no_calibration_means_datasheet_behaviour():
    hw = _spec({})
    c = Curves.from_calibration(hw.calibration, hw.launch_overhead_s)
    assert c.empty and c.bandwidth(1e6) is None
    assert c.matrix_rate(MatrixProblem(MatrixFamily.GEMM, 1, 8, 8, 8), "fp32") is None
    assert math.isclose(predict_cost(OpCost(is_view=True, kernel=False), hw, resolve_precision(hw, "fp32"),
                                     c).predicted_s, 0.0)


def test_vector_family_rate_replaces_the_pointwise_rate():
    hw = _spec({"vector_kinds": {"pool": 1e8}})
    c = Curves.from_calibration(hw.calibration, hw.launch_overhead_s)
    prec = resolve_precision(hw, "fp32")
    pool = OpCost(vector_flops=1e6, transcendental_flops=10.0, vector_kind="pool")
    assert predict_cost(pool, hw, prec, c).vector_s == pytest.approx(1e6 / 1e8)
    plain = OpCost(vector_flops=1e6)
    assert predict_cost(plain, hw, prec, c).vector_s == pytest.approx(1e6 / 10e9)


def test_transposed_left_operand_has_its_own_curve():
    from opmap.costs import cost_node
    from opmap.graph import Node, TensorMeta

    cal = {"matmul": [{"m": 512, "n": 196, "k": 256, "dtype": "fp32", "layout": "nt", "flops_per_s": 100e9},
                      {"m": 512, "n": 196, "k": 256, "dtype": "fp32", "layout": "tt", "flops_per_s": 20e9}]}
    c = Curves.from_calibration(cal, 1e-6)
    assert c.matrix_rate(MatrixProblem(MatrixFamily.GEMM_TA, 1, 512, 196, 256), "fp32") == 20e9
    assert c.matrix_rate(MatrixProblem(MatrixFamily.GEMM, 1, 512, 196, 256), "fp32") == 100e9
    assert Curves.from_calibration({"matmul": cal["matmul"][:1]}, 1e-6).matrix_rate(
        MatrixProblem(MatrixFamily.GEMM_TA, 1, 512, 196, 256), "fp32") == 100e9  # no transposed points: the plain curve
    # the mm rule marks a transposed left operand (stride (1, 512) on a 512 x 256 view)
    a = TensorMeta((512, 256), "float32", (1, 512))
    b = TensorMeta((256, 196), "float32", (1, 256))
    node = Node(id=0, op="aten.mm.default", module="", module_class="", layer_type="other", inputs=(a, b),
                outputs=(TensorMeta((512, 196), "float32", (196, 1)),), input_names=("self", "mat2"), args={},
                is_view=False, is_inplace=False)
    assert cost_node(node).problem == MatrixProblem(MatrixFamily.GEMM_TA, 1, 512, 196, 256)


def test_fresh_output_pages_by_hand():
    """A fresh write costs its reused write's time plus the faults: 1 MiB reused in 100 us and fresh in 301 us
    leaves 200 us of faults after 1 us of dispatch; 64 MiB reused in 6.4 ms and fresh in 6.4 ms + 64 MiB x
    1.9e-10 s/B + 1 us. The per-byte cost is interpolated in log2(size)."""
    mib = 2 ** 20
    p1, p2 = 200e-6 / mib, 1.9e-10
    cal = {"bandwidth": [
        {"kind": "write", "bytes": mib, "bytes_per_s": mib / 100e-6},
        {"kind": "fresh_write", "bytes": mib, "bytes_per_s": mib / 301e-6},
        {"kind": "write", "bytes": 64 * mib, "bytes_per_s": 64 * mib / 6.4e-3},
        {"kind": "fresh_write", "bytes": 64 * mib, "bytes_per_s": 64 * mib / (6.4e-3 + 64 * mib * p2 + 1e-6)},
    ]}
    c = Curves.from_calibration(cal, 1e-6)
    assert c.fresh_page_s(mib) == pytest.approx(200e-6)
    assert c.fresh_page_s(64 * mib) == pytest.approx(64 * mib * p2)
    assert c.fresh_page_s(8 * mib) == pytest.approx(8 * mib * (p1 + (p2 - p1) * (23 - 20) / (26 - 20)))
    assert c.fresh_page_s(1024 * mib) == pytest.approx(1024 * mib * p2)  # the largest point holds beyond
    assert c.fresh_page_s(mib // 2) == 0.0  # below the smallest measured size: recycled by the allocator
    assert Curves().fresh_page_s(64 * mib) == 0.0


def test_fresh_pages_are_charged_to_out_of_place_cpu_ops_only():
    import torch

    from opmap.capture import capture
    from opmap.costs import cost_graph

    class M(torch.nn.Module):
        def forward(self, x):
            y = torch.relu(x)  # out of place: a fresh 1 MiB output
            return y.relu_()  # in place: no allocation

    g = capture(M(), (torch.empty(2 ** 18, device="meta"),))
    relu, relu_ = cost_graph(g)
    assert relu.allocated_bytes == 2 ** 20 and relu_.allocated_bytes == 0.0


def _grid(tmp_path, monkeypatch, tables, aliases=None, name="t.gemm.json"):
    import json

    from opmap.hardware import curves as cv

    monkeypatch.setattr(cv, "GRID_DIR", tmp_path)
    cv.load_gemm_grid.cache_clear()
    (tmp_path / name).write_text(json.dumps({"tables": tables, **({"aliases": aliases} if aliases else {})}))
    return name


def test_a_measured_grid_interpolates_trilinearly_in_log_shape_and_log_rate(tmp_path, monkeypatch):
    from opmap.hardware.curves import load_gemm_grid

    # 2 x 1 x 1 grid: M = 64 and 256 at N = K = 1024; times chosen so the rates are 100 and 400 TFLOP/s
    f = lambda m, r: 2 * m * 1024 * 1024 / r * 1e6  # noqa: E731  (us)
    name = _grid(tmp_path, monkeypatch, {"fp8": {"m": [64, 256], "n": [1024], "k": [1024],
                                                 "latency_us": [f(64, 100e12), f(256, 400e12)]}},
                 aliases={"int8": "fp8"})
    g = load_gemm_grid(name)
    assert g["fp8"].rate(64, 1024, 1024) == pytest.approx(100e12)
    # M = 128 is halfway in log2(M): the geometric mean of the two rates, sqrt(100 x 400) = 200
    assert g["fp8"].rate(128, 1024, 1024) == pytest.approx(200e12)
    # clamped at the edges: no extrapolated growth, no fall below the smallest measured M
    assert g["fp8"].rate(1 << 20, 1 << 20, 1 << 20) == pytest.approx(400e12)
    assert g["fp8"].rate(1, 1, 1) == pytest.approx(100e12)
    assert g["int8"] is g["fp8"]


def test_a_grid_device_prices_its_gemms_off_the_grid_and_a_power_limit_caps_it(tmp_path, monkeypatch):
    from dataclasses import replace

    f = lambda m, r: 2 * m * 512 * 512 / r * 1e6  # noqa: E731
    name = _grid(tmp_path, monkeypatch, {"fp32": {"m": [128], "n": [512], "k": [512], "latency_us": [f(128, 60e9)]}})
    hw = _spec({"gemm_grid": name})
    prec = resolve_precision(hw, "fp32")
    flops = 2.0 * 128 * 512 * 512
    cost = OpCost(matrix_flops=flops, problem=MatrixProblem(MatrixFamily.GEMM, 1, 128, 512, 512))
    assert predict_cost(cost, hw, prec, hw.curves).matrix_s == pytest.approx(flops / 60e9)
    # under a power limit the matrix units run no faster than the sustained rate, whatever the shape measured
    held = replace(prec, matrix_rate_flops_per_s=40e9, sustained=True)
    assert predict_cost(cost, hw, held, hw.curves).matrix_s == pytest.approx(flops / 40e9)


@pytest.mark.parametrize("tables, why", [
    ({"fp8": {"m": [64, 32], "n": [8], "k": [8], "latency_us": [1.0, 1.0]}}, "increasing positive integers"),
    ({"fp8": {"m": [64], "n": [8], "k": [8], "latency_us": [1.0, 2.0]}}, "must list 1 times"),
    ({"fp8": {"m": [64], "n": [8], "k": [8], "latency_us": [float("nan")]}}, "latency_us[0]"),
    ({"fp8": {"m": [64], "n": [8], "k": [8], "latency_us": [0.0]}}, "latency_us[0]"),
])
def test_a_malformed_grid_is_refused_in_one_line(tmp_path, monkeypatch, tables, why):
    from opmap.errors import OpmapError
    from opmap.hardware.curves import load_gemm_grid

    name = _grid(tmp_path, monkeypatch, tables)
    with pytest.raises(OpmapError, match=re.escape(why)):
        load_gemm_grid(name)


@pytest.mark.parametrize("aliases, why", [(["fp16"], "aliases must map"), ({"fp16": "bf16"}, "names no table")])
def test_grid_aliases_must_name_a_table(tmp_path, monkeypatch, aliases, why):
    from opmap.errors import OpmapError
    from opmap.hardware.curves import load_gemm_grid

    name = _grid(tmp_path, monkeypatch, {"fp8": {"m": [64], "n": [8], "k": [8], "latency_us": [1.0]}}, aliases=aliases)
    with pytest.raises(OpmapError, match=why):
        load_gemm_grid(name)


@pytest.mark.parametrize("bad", ["../etc/passwd.gemm.json", "/tmp/x.gemm.json", "h100.json", 3])
def test_a_grid_is_a_bare_file_name_beside_the_catalog(bad):
    from opmap.errors import OpmapError

    with pytest.raises(OpmapError, match="gemm_grid must name a file"):
        _spec({"gemm_grid": bad})


def test_the_catalog_grids_reproduce_nvidias_table_at_its_own_points():
    # aiconfigurator-core 0.12.0, h100_sxm/gemm/trtllm/1.3.0rc20/gemm_perf.parquet (NVIDIA's measurement): fp8
    # x @ W.T at M = 16, N = 1024, K = 8192 in 17.8496 us, at 4096 x 8192 x 8192 in 446.597 us; bf16 at 16 x 1024 x
    # 8192 in 10.54 us (the table's latency column, ms x 1000; the catalog keeps 4 significant digits). The fp8 rows
    # time the activation's quantization too, which the catalog takes out: 3 M K bytes at the H100's 2.97 TB/s
    # (BabelStream, catalog), 0.1324 us and 33.894 us here
    q = lambda m, k: 3 * m * k / 2.97e12 * 1e6  # noqa: E731
    from opmap.hardware import get_hardware

    t = get_hardware("h100-sxm").curves.tables
    for dt, (m, n, k), us in (("fp8", (16, 1024, 8192), 17.8496 - q(16, 8192)),
                              ("fp8", (4096, 8192, 8192), 446.597 - q(4096, 8192)),
                              ("bf16", (16, 1024, 8192), 10.54)):
        assert 2 * m * n * k / t[MatrixFamily.GEMM, dt].rate(m, n, k) == pytest.approx(us * 1e-6, rel=1e-3)
    assert t[MatrixFamily.GEMM, "fp16"] is t[MatrixFamily.GEMM, "bf16"]


def test_the_blackwell_grids_reproduce_nvidias_tables_nvfp4_included():
    # aiconfigurator-core 0.12.0, b200_sxm and gb200 gemm/trtllm/1.3.0rc20/gemm_perf.parquet (NVIDIA's measurement,
    # the latency column in ms x 1000): B200 nvfp4 x @ W.T at 512 x 8192 x 8192 in 26.6747 us and at 2048 x 16384 x
    # 8192 in 140.781 us; GB200 nvfp4 at 1024 x 10240 x 8192 in 59.7413 us, fp8 at 512 x 8192 x 8192 in 44.064 us,
    # bf16 at 16 x 1024 x 8192 in 8.83733 us. The quantized rows time the activation's quantization too
    # (collector/trtllm/collect_gemm.py: TensorRT-LLM's Linear.forward on a bf16 x), which the catalog takes out: fp8
    # 3 M K bytes, nvfp4 2 + 1/2 + 1/16 (bf16 read, e2m1 and an e4m3 scale per 16 written) at the achievable
    # memory rate (B200 6.84043 TB/s, GB200 6.977 TB/s: catalog, measured)
    from opmap.hardware import get_hardware

    q = lambda per, m, k, bw: per * m * k / bw * 1e6  # noqa: E731
    cases = (("b200", "nvfp4", (512, 8192, 8192), 26.6747 - q(2.5625, 512, 8192, 6.84043e12)),
             ("b200", "nvfp4", (2048, 16384, 8192), 140.781 - q(2.5625, 2048, 8192, 6.84043e12)),
             ("gb200", "nvfp4", (1024, 10240, 8192), 59.7413 - q(2.5625, 1024, 8192, 6.977e12)),
             ("gb200", "fp8", (512, 8192, 8192), 44.064 - q(3, 512, 8192, 6.977e12)),
             ("gb200", "bf16", (16, 1024, 8192), 8.83733))
    for name, dt, (m, n, k), us in cases:
        t = get_hardware(name).curves.tables[MatrixFamily.GEMM, dt]
        assert 2 * m * n * k / t.rate(m, n, k) == pytest.approx(us * 1e-6, rel=1e-3), (name, dt)
    # a serving GEMM runs far below the one rate the catalog gave every nvfp4 shape before: 512 x 8192 x 8192 at
    # 2.73 PFLOP/s on the B200, not 9 PFLOPS dense x the bf16 fraction 0.78 = 6.98
    assert get_hardware("b200").curves.tables[MatrixFamily.GEMM, "nvfp4"].rate(512, 8192, 8192) < 0.4 * 9e15 * 0.7756


# AMD's tuned times on gfx950 with 256 CUs (the MI355X), ROCm/aiter @ e4048607a535ace3a2b51ded31b1c8c2d45c0879, the
# us column of aiter/configs/<table>.csv (the fastest kernel's device time of one x @ W.T; the tuners quantize the
# inputs before the timed call, so no cast is in it): a4w4_blockscale_tuned_gemm.csv (MXFP4), a8w8_bpreshuffle_tuned_
# gemm.csv (fp8 E4M3, per-token scales) and model_configs/llama70B_bf16_tuned_gemm.csv (bf16)
AITER_GFX950_US = {
    ("mxfp4", 1024, 4096, 4096): 14.6518, ("mxfp4", 2048, 4096, 4096): 22.0307,
    ("mxfp4", 64, 6144, 4096): 9.8189, ("mxfp4", 16384, 8192, 28672): 1325.5902,
    ("mxfp4", 1024, 14336, 8192): 60.3453, ("mxfp4", 1024, 16384, 8192): 59.9643,
    ("fp8", 1, 16384, 26624): 71.1231, ("fp8", 4096, 16384, 26624): 1192.4676,
    ("bf16", 1024, 8192, 8192): 149.1713, ("bf16", 1, 8192, 8192): 25.75,
}


def _aiter_rate(dt, m, n, k):
    return 2 * m * n * k / (AITER_GFX950_US[dt, m, n, k] * 1e-6)


def test_the_mi355x_grid_reproduces_aiters_tuned_tables_at_their_own_points():
    from opmap.hardware import get_hardware

    t = get_hardware("mi355x").curves.tables
    for (dt, m, n, k), us in AITER_GFX950_US.items():
        assert 2 * m * n * k / t[MatrixFamily.GEMM, dt].rate(m, n, k) == pytest.approx(us * 1e-6, rel=1e-9), (dt, m)
    # MI355X runs fp16 and bf16 at one dense peak (2516.6 TFLOPS): fp16 reads the bf16 table
    assert t[MatrixFamily.GEMM, "fp16"] is t[MatrixFamily.GEMM, "bf16"]
    # mxfp6 has no table on AITER's main branch: its GEMMs keep the catalog's measured rate
    assert (MatrixFamily.GEMM, "mxfp6") not in t


def test_the_mi355x_grid_interpolates_between_aiters_points_in_log_shape_and_log_rate():
    """Between two measured points the reader interpolates log rate linearly in log2 of the shape (curves module
    docstring): along M inside a tuned (N, K) (the grid's 1152 and 1536 between AITER's 1024 and 2048 lie on that line,
    the extractor's in-sweep fill), along N between two tuned (N, K) that are neighbours on the grid's N axis."""
    from opmap.hardware import get_hardware

    g = get_hardware("mi355x").curves.tables[MatrixFamily.GEMM, "mxfp4"]

    def between(x, x0, x1, r0, r1):
        f = (math.log2(x) - math.log2(x0)) / (math.log2(x1) - math.log2(x0))
        return math.exp(math.log(r0) + f * (math.log(r1) - math.log(r0)))

    # M 1448 between 1024 (2345 TFLOP/s) and 2048 (3119): the grid points between carry 4 significant digits
    want = between(1448, 1024, 2048, _aiter_rate("mxfp4", 1024, 4096, 4096), _aiter_rate("mxfp4", 2048, 4096, 4096))
    assert g.rate(1448, 4096, 4096) == pytest.approx(want, rel=1e-3)
    # N 15360 between 14336 and 16384 at M 1024, K 8192: two measured points, nothing filled between them
    want = between(15360, 14336, 16384, _aiter_rate("mxfp4", 1024, 14336, 8192),
                   _aiter_rate("mxfp4", 1024, 16384, 8192))
    assert g.rate(1024, 15360, 8192) == pytest.approx(want, rel=1e-9)
    # past the grid's edges the rate is clamped: M 65536 reads the 32768 edge's rate, no extrapolated growth
    assert g.rate(65536, 16384, 8192) == pytest.approx(g.rate(32768, 16384, 8192), rel=1e-12)


# Shah et al. 2024, FlashAttention-3 (arXiv 2407.08608), H100 SXM5, head dim 128, TFLOP/s printed atop the bars at
# sequence 2048 (Figure 5: forward without / with the causal mask; Figure 6: backward): cuDNN 617 / 484 / 465,
# FlashAttention-2 362 / 298 / 291, FlashAttention-3 625 / 521 / 501
FA3_PAPER_2K = {"cudnn": (617e12, 484e12, 465e12), "fa2": (362e12, 298e12, 291e12), "fa3": (625e12, 521e12, 501e12)}


@pytest.mark.parametrize("kernel", sorted(FA3_PAPER_2K))
def test_the_attention_kernel_picks_its_own_measured_rows(kernel):
    from opmap.hardware import get_hardware, with_attention_kernel

    hw = with_attention_kernel(get_hardware("h100-sxm"), kernel)
    fams = (MatrixFamily.ATTENTION, MatrixFamily.ATTENTION_CAUSAL, MatrixFamily.ATTENTION_BWD)
    got = tuple(hw.curves.matrix_rate(MatrixProblem(f, 64, 2048, 2048, 128), "bf16") for f in fams)
    assert got == pytest.approx(FA3_PAPER_2K[kernel])
    # the causal backward reads the backward's rows (the paper times it without the mask only)
    assert hw.curves.matrix_rate(MatrixProblem(MatrixFamily.ATTENTION_BWD_CAUSAL, 64, 2048, 2048, 128),
                                 "bf16") == pytest.approx(FA3_PAPER_2K[kernel][2])


def test_the_device_default_attention_kernel_is_transformer_engines():
    from opmap.hardware import attention_kernels, get_hardware

    for name in ("h100-sxm", "h200"):
        hw = get_hardware(name)
        assert attention_kernels(hw.calibration) == ("cudnn", "fa2", "fa3")
        assert hw.curves.matrix_rate(MatrixProblem(MatrixFamily.ATTENTION, 64, 2048, 2048, 128), "bf16") == \
            pytest.approx(FA3_PAPER_2K["cudnn"][0])


def test_an_attention_kernel_changes_the_predicted_time_by_its_rate():
    """A compute-bound causal forward at 8192 (64 heads x batch, head dim 128) runs pairs x 4d FLOPs at the kernel's
    measured rate: cuDNN 529, FlashAttention-2 333 TFLOP/s (FA3 paper Figure 5, causal, 8k)."""
    from opmap.hardware import get_hardware, with_attention_kernel

    pairs = 8192 * 8193 // 2
    c = OpCost(matrix_flops=4.0 * 64 * pairs * 128, bytes_read=3 * 64 * 8192 * 128 * 2,
               bytes_written=64 * 8192 * 128 * 2, problem=MatrixProblem(MatrixFamily.ATTENTION_CAUSAL, 64, 8192,
                                                                        8192, 128))
    times = {}
    for k in ("cudnn", "fa2"):
        hw = with_attention_kernel(get_hardware("h100-sxm"), k)
        times[k] = predict_cost(c, hw, resolve_precision(hw, "bf16"), hw.curves).matrix_s
    assert times["cudnn"] == pytest.approx(c.matrix_flops / 529e12)
    assert times["fa2"] / times["cudnn"] == pytest.approx(529 / 333)


@pytest.mark.parametrize("kernel,why", [("fa9", "has no measured rows for it; accepted: cudnn, fa2, fa3"),
                                        ("", "has no measured rows")])
def test_an_unknown_attention_kernel_is_refused_in_one_line(kernel, why):
    from opmap.errors import OpmapError
    from opmap.hardware import get_hardware, with_attention_kernel

    with pytest.raises(OpmapError, match=re.escape(why)) as e:
        with_attention_kernel(get_hardware("h100-sxm"), kernel)
    assert "\n" not in str(e.value)
    with pytest.raises(OpmapError, match="none"):  # a device without measured attention rows
        with_attention_kernel(get_hardware("a100-sxm-80gb"), "fa2")


@pytest.mark.parametrize("cal,why", [
    ({"attention_kernel": "fa2", "attention": [{"kernel": "cudnn", "sq": 512, "sk": 512, "d": 128,
                                                 "dtype": "bf16", "flops_per_s": 1e14}]}, "accepted: cudnn"),
    ({"attention": [{"kernel": "Bad Name!", "sq": 512, "sk": 512, "d": 128, "dtype": "bf16",
                     "flops_per_s": 1e14}]}, "must name a kernel in lower case"),
])
def test_a_calibration_naming_a_missing_attention_kernel_is_refused(cal, why):
    from opmap.errors import OpmapError
    from opmap.hardware.curves import check_calibration

    with pytest.raises(OpmapError, match=re.escape(why)):
        check_calibration(cal)


# TransformerEngine issue 3312: an H200 (sm90), TE 2.15.0's DotProductAttention on cuDNN, bf16, sbhd, 4 x 4096 tokens,
# 16 heads of 128, forward + backward: 0.594 ms at dropout 0, 0.614 ms at 0.1
TE_3312_CUDNN_DROPOUT = 0.614 / 0.594


def _attention_cost(fam: MatrixFamily, dropout: bool) -> OpCost:
    """A compute-bound causal pass at 4096 (64 heads x batch, head dim 128): pairs x 4d FLOPs forward, 2.5x that
    backward."""
    pairs = 4096 * 4097 // 2
    flops = 4.0 * 64 * pairs * 128 * (2.5 if fam.backward else 1.0)
    return OpCost(matrix_flops=flops, bytes_read=3 * 64 * 4096 * 128 * 2, bytes_written=64 * 4096 * 128 * 2,
                  problem=MatrixProblem(fam, 64, 4096, 4096, 128, dropout=dropout))


@pytest.mark.parametrize("fam", [MatrixFamily.ATTENTION_CAUSAL, MatrixFamily.ATTENTION_BWD_CAUSAL])
def test_attention_that_drops_scores_runs_the_kernels_measured_dropout_factor_longer(fam):
    from opmap.hardware import get_hardware, with_attention_kernel

    for name in ("h100-sxm", "h200"):
        hw = get_hardware(name)  # cuDNN, the catalog's default kernel
        prec = resolve_precision(hw, "bf16")
        plain = predict_cost(_attention_cost(fam, False), hw, prec, hw.curves).matrix_s
        dropped = predict_cost(_attention_cost(fam, True), hw, prec, hw.curves).matrix_s
        assert dropped / plain == pytest.approx(TE_3312_CUDNN_DROPOUT, rel=1e-3)
        # the measured no-dropout curve itself is untouched: the factor is the time model's
        p = _attention_cost(fam, True).problem
        assert hw.curves.matrix_rate(p, "bf16") == hw.curves.matrix_rate(_attention_cost(fam, False).problem, "bf16")
        # no FlashAttention-2 pair is published for sm90: its rows price dropout at their no-dropout rate
        fa2 = with_attention_kernel(hw, "fa2")
        assert fa2.curves.dropout_slowdown(p) == 1.0
        assert predict_cost(_attention_cost(fam, True), fa2, prec, fa2.curves).matrix_s == \
            pytest.approx(predict_cost(_attention_cost(fam, False), fa2, prec, fa2.curves).matrix_s)
    # GEMMs carry no dropout factor even when marked
    hw = get_hardware("h100-sxm")
    assert hw.curves.dropout_slowdown(MatrixProblem(MatrixFamily.GEMM, 1, 4096, 4096, 4096, dropout=True)) == 1.0


def test_the_dropout_factor_runs_on_top_of_the_power_limit():
    """Where the sustained (power-limited) rate caps a measured shape, the dropout path still costs its factor:
    min(rate, cap) / factor, not min(rate / factor, cap)."""
    from opmap.hardware import get_hardware, with_attention_dropout
    from opmap.precision import power_limited

    hw = with_attention_dropout(get_hardware("h100-sxm"), 1.5, "test")
    steady = power_limited(resolve_precision(hw, "bf16"), hw, math.inf)  # steady load: the sustained rate, 720
    prec = replace(steady, matrix_rate_flops_per_s=500e12)  # a cap under cuDNN's measured 609, as on a hotter card
    cap = prec.matrix_rate_flops_per_s
    assert steady.sustained and prec.sustained
    fwd = _attention_cost(MatrixFamily.ATTENTION, True)  # cuDNN's dense forward at 4k: 609 TFLOP/s measured
    rate = hw.curves.matrix_rate(fwd.problem, "bf16")
    assert rate / 1.5 < cap < rate  # the cap binds, and the factor would hide under it if taken first
    assert predict_cost(fwd, hw, prec, hw.curves).matrix_s == pytest.approx(fwd.matrix_flops * 1.5 / cap)


def test_a_stacks_own_dropout_factor_replaces_the_selected_kernels():
    from opmap.hardware import get_hardware, with_attention_dropout, with_attention_kernel

    hw = with_attention_kernel(get_hardware("h100-sxm"), "fa2")
    slow = with_attention_dropout(hw, 1.8, "a stack's own dropout path")
    c = _attention_cost(MatrixFamily.ATTENTION_CAUSAL, True)
    prec = resolve_precision(slow, "bf16")
    # FA3 paper Figure 5: FlashAttention-2's causal forward at 4k, 319 TFLOP/s
    assert predict_cost(c, slow, prec, slow.curves).matrix_s == pytest.approx(c.matrix_flops * 1.8 / 319e12)
    # the other kernels' rows stay as measured
    back = with_attention_kernel(slow, "cudnn")
    assert back.curves.attention_dropout == pytest.approx(TE_3312_CUDNN_DROPOUT, rel=1e-3)


def test_a_calibration_naming_no_kernel_takes_its_unnamed_dropout_row():
    from opmap.hardware.curves import attention_dropout_factor

    rows = [{"sq": 512, "sk": 512, "d": 128, "dtype": "bf16", "flops_per_s": 1e14}]
    assert attention_dropout_factor({"attention": rows, "attention_dropout": [{"factor": 1.2}]}) == 1.2
    named = [{**r, "kernel": "fa2"} for r in rows]
    cal = {"attention": named, "attention_kernel": "fa2",
           "attention_dropout": [{"factor": 1.2}, {"kernel": "fa2", "factor": 1.1}]}
    assert attention_dropout_factor(cal) == 1.1  # the selected kernel's own row first
    assert attention_dropout_factor({"attention": named, "attention_kernel": "fa2"}) is None


@pytest.mark.parametrize("factor", [float("nan"), float("inf"), 0.5, -1.0])
def test_a_dropout_factor_below_one_or_not_finite_is_refused_in_one_line(factor):
    from opmap.errors import OpmapError
    from opmap.hardware import get_hardware, with_attention_dropout

    with pytest.raises(OpmapError) as e:
        with_attention_dropout(get_hardware("h100-sxm"), factor, "test")
    assert "attention dropout factor" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("rows,why", [
    ([{"kernel": "cudnn", "factor": 0.9}], "attention_dropout[0].factor"),
    ([{"kernel": "fa9", "factor": 1.1}], "names no measured attention rows; accepted: cudnn"),
    ([{"kernel": "cudnn"}], "must be a table with a factor"),
    ([{"kernel": "cudnn", "factor": 1.1}, {"kernel": "cudnn", "factor": 1.2}], "a second row for kernel 'cudnn'"),
    ({"kernel": "cudnn", "factor": 1.1}, "must be an array of tables"),
])
def test_a_calibrations_bad_dropout_row_is_refused(rows, why):
    from opmap.errors import OpmapError
    from opmap.hardware.curves import check_calibration

    cal = {"attention_kernel": "cudnn", "attention_dropout": rows,
           "attention": [{"kernel": "cudnn", "sq": 512, "sk": 512, "d": 128, "dtype": "bf16", "flops_per_s": 1e14}]}
    with pytest.raises(OpmapError, match=re.escape(why)):
        check_calibration(cal)
