"""The AMD Instinct MI355X catalog entry (issue 37) against the figures printed beside it."""

import pytest

import opmap.errors
import opmap.hardware
from opmap.hardware.spec import CATALOG_DIR, load_spec_file


@pytest.fixture(scope="module")
def s():
    return opmap.hardware.catalog()["mi355x"]


def test_dense_peaks_are_amds_formula(s):
    # 2400 MHz x 512 FMA per matrix core per clock x 2 x 1024 matrix cores = 2516.6 TFLOPS (AMD: 2.5 PFLOPS)
    bf16 = 2400e6 * 512 * 2 * 1024
    assert s.matrix_peak_flops_per_s["bf16"].value == pytest.approx(bf16, rel=1e-4)
    assert s.matrix_peak_flops_per_s["fp16"].value == s.matrix_peak_flops_per_s["bf16"].value
    assert s.matrix_peak_flops_per_s["fp8"].value == pytest.approx(2 * bf16, rel=1e-4)  # AMD: 5.0 PFLOPS
    assert s.matrix_peak_flops_per_s["int8"].value == s.matrix_peak_flops_per_s["fp8"].value
    # ISSCC 2026: 8,192 FP8 FLOP per CU per clock on 256 CUs at 2.4 GHz
    assert s.matrix_peak_flops_per_s["fp8"].value == pytest.approx(256 * 8192 * 2.4e9, rel=1e-4)
    assert all(v.kind == "datasheet_dense" for v in s.matrix_peak_flops_per_s.values())


def test_sparse_is_twice_dense_as_amd_prints(s):
    assert s.fields["sparsity_factor"].value == 2
    for fmt in ("bf16", "fp16", "fp8", "int8"):
        sparse = s.sparse_matrix_peak_flops_per_s[fmt]
        assert sparse.kind == "datasheet_sparse"
        assert sparse.value == pytest.approx(2 * s.matrix_peak_flops_per_s[fmt].value)
    assert s.sparse_matrix_peak_flops_per_s["fp8"].value == pytest.approx(10066.4e12)  # AMD: 10.1 PFLOPS


def test_no_tf32_and_vector_rates(s):
    assert "tf32" not in s.matrix_peak_flops_per_s  # AMD prints no TF32 figure for the MI355X
    assert s.vector_peak_flops_per_s["fp32"].value == pytest.approx(157.3e12)
    assert s.vector_peak_flops_per_s["fp64"].value == pytest.approx(256 * 128 * 2.4e9, rel=1e-3)  # 78.6


def test_memory_clock_power_and_caches(s):
    f = {k: v.value for k, v in s.fields.items()}
    assert f["memory_bytes"] == 288 * 2**30
    assert f["memory_bandwidth_bytes_per_s"] == 8e12
    assert f["compute_units"] == 256 and f["clock_hz"] == 2.4e9 and f["tdp_w"] == 1400
    assert f["sram_per_unit_bytes"] == 160 * 2**10 and f["l2_bytes"] == 256 * 2**20
    mamf = s.achievable_matrix_flops_per_s["bf16"]
    assert mamf.kind == "measured" and mamf.value == pytest.approx(1565.0e12)


def test_scale_up_is_seven_infinity_fabric_links_of_153_6(s):
    tier = s.interconnect.tiers[0]
    assert tier.devices == 8 and tier.topology.value == "full_mesh" and tier.in_network_reduction.value == 0
    assert tier.directions == 2 and tier.bandwidth.value == pytest.approx(7 * 153.6e9)
    assert s.interconnect.tiers[1].bandwidth.value == 400e9 / 8  # one 400G NIC per GPU


def test_fp4_fp6_peaks_are_catalog_keys_and_an_unknown_format_is_refused(s, tmp_path):
    # AMD MI355X: MXFP4 / MXFP6 10.1 PFLOPS dense (2 x the 5033.2 TFLOPS fp8), MXFP8 at the fp8 rate (issue 37)
    assert "MXFP4 10.1" in s.notes and "MXFP6 10.1" in s.notes
    p = s.matrix_peak_flops_per_s
    assert p["mxfp4"].value == p["mxfp6"].value == pytest.approx(10066.4e12) and p["mxfp8"].value == p["fp8"].value
    text = (CATALOG_DIR / "mi355x.toml").read_text()
    bad = tmp_path / "x.toml"
    bad.write_text(text.replace("[matrix_peak_flops_per_s.fp8]", '[matrix_peak_flops_per_s.fp3]\nvalue = 1.00664e16\n'
                                'kind = "datasheet_dense"\nsource = "x"\n\n[matrix_peak_flops_per_s.fp8]', 1))
    with pytest.raises(opmap.errors.OpmapError, match="fp3"):
        load_spec_file(bad)


# The published measurements behind the entry's achievable figures, each as its source prints the time (2 M N K / t):
FP8_HIPBLASLT = 2 * 16384 ** 3 / 2.67096e-3  # HipKittens mi355x_fp8_gemm.json: hipBLASLt 16384^3 in 2.67096 ms
MXFP4_AITER = 2 * 16384 * 8192 * 28672 / 1325.5902e-6  # aiter a4w4_blockscale_tuned_gemm.csv, gfx950: 1325.5902 us
MXFP6_AITER = 2 * 8192 * 8192 * 16384 / 527.5759e-6  # aiter a6w6_blockscale_tuned_gemm.csv, gfx950: 527.5759 us
GEMV_STREAM = 16384 * 26624 / 71.1231e-6  # aiter fp8 GEMV M 1, N 16384, K 26624: 436.2 MB of weights in 71.1231 us


def test_measured_rates_per_format_are_the_sources_times(s):
    ach = s.achievable_matrix_flops_per_s
    assert ach["fp8"].value == pytest.approx(FP8_HIPBLASLT, rel=1e-5)  # 3293.23 TFLOPS
    assert ach["mxfp4"].value == pytest.approx(MXFP4_AITER, rel=1e-5)  # 5806.15
    assert ach["mxfp6"].value == pytest.approx(MXFP6_AITER, rel=1e-5)  # 4168.16
    assert all(ach[f].kind == "measured" for f in ("bf16", "fp8", "mxfp4", "mxfp6"))
    bw = s.fields["achievable_memory_bandwidth_bytes_per_s"]
    assert bw.kind == "measured" and bw.value == pytest.approx(GEMV_STREAM, rel=1e-3)  # 6.134 TB/s of 8
    assert s.datasheet_only == ()
    # none reaches the datasheet's 2x / 4x of bf16: fp8 2.10x, MXFP4 3.71x (AMD: 5.0 / 10.1 against 2.5 PFLOPS)
    assert ach["fp8"].value / ach["bf16"].value == pytest.approx(2.104, abs=1e-3)
    assert ach["mxfp4"].value / ach["bf16"].value == pytest.approx(3.710, abs=1e-3)
    # fp16, int8 and MXFP8 have no figure of their own: their dense peaks x bf16's measured fraction (1565 / 2516.6)
    assert "fp16" not in ach and "int8" not in ach and "mxfp8" not in ach


@pytest.mark.parametrize("fmt, rate", [("bf16", 1565.0e12), ("fp8", FP8_HIPBLASLT), ("mxfp4", MXFP4_AITER),
                                       ("mxfp6", MXFP6_AITER), ("fp16", 2516.6e12 * 1565.0 / 2516.6),
                                       ("int8", 5033.2e12 * 1565.0 / 2516.6)])
def test_the_time_model_runs_each_format_at_its_measured_rate(s, fmt, rate):
    """The rate precision.resolve_precision hands the roofline and the tiler: the measured one where the catalog has
    it, else the dense peak x bf16's measured fraction; an 8192^3 GEMM, compute-bound everywhere (2,730 FLOP per
    byte at bf16, more at narrower formats), runs through the GPU tile model at 90-100% of it."""
    from opmap.costs.base import OpCost
    from opmap.hardware.curves import Curves
    from opmap.mapping.tilers import choose_tile
    from opmap.ops import MatrixFamily, MatrixProblem
    from opmap.precision import resolve_precision

    prec = resolve_precision(s, fmt)
    assert prec.matrix == fmt and prec.matrix_rate_flops_per_s == pytest.approx(rate, rel=1e-5)
    assert prec.rate_basis == (f"measured achievable {fmt} rate" if fmt in s.achievable_matrix_flops_per_s else
                               f"{fmt} dense peak x the measured achievable bf16 fraction 0.62")
    p = MatrixProblem(MatrixFamily.GEMM, 1, 8192, 8192, 8192)
    c = choose_tile(OpCost(matrix_flops=p.flops, problem=p), s, prec, Curves())
    assert 0.9 * rate <= p.flops / c.compute_s <= rate * (1 + 1e-9)


def test_llama_decode_prices_fp8_gemms_off_aiters_grid_and_weight_reads_at_the_measured_rate():
    """llama-3-8b decode at fp8 on an MI355X (zoo model): the precision carries the measured 3293.23 TFLOP/s (not
    5033.2 x 0.622 = 3130) and the weights are read at the measured 6.134 TB/s (not DRAM_EFFICIENCY 0.896 x 8 TB/s =
    7.16); a weight GEMM's time comes from AITER's tuned fp8 grid (mi355x.gemm.json) at its own shape, and at batch 1
    (2 FLOP per weight byte, far under the ridge 3293 / 6.134 = 537) the kernel is named memory-bound."""
    from opmap.analyze import analyze
    from opmap.hardware import get_hardware
    from opmap.ops import MatrixFamily
    from opmap.workloads import build_zoo
    from opmap.workloads.phases import decode_workload

    hw = get_hardware("mi355x")
    a = analyze(decode_workload(build_zoo("llama-3-8b", 1, 16, "fp8"), 16), hw, "fp8")
    d = a.to_dict()["assumptions"]
    assert d["matrix_rate_flops_per_s"]["value"] == pytest.approx(FP8_HIPBLASLT, rel=1e-5)
    assert d["memory_rate_bytes_per_s"]["value"] == pytest.approx(GEMV_STREAM, rel=1e-3)
    # the largest fp8 weight GEMM (an MLP projection, 4096 x 14336 = 58.7 MB at one byte a weight; the lm_head stays
    # bf16): its read outlasts the 4 us launch
    fp8 = [r for r in a.results if r.node.op == "aten.mm.default"
           and r.cost.param_bytes_read == pytest.approx(r.cost.matrix_flops / 2)]
    gemm = max(fp8, key=lambda r: r.cost.param_bytes_read)
    p = gemm.cost.problem
    assert gemm.cost.param_bytes_read == pytest.approx(4096 * 14336 * 1.0, rel=1e-3) and p.m == 1
    grid = hw.curves.tables[MatrixFamily.GEMM, "fp8"]
    assert gemm.pred.matrix_s == pytest.approx(p.flops / grid.rate(1, p.n, p.k), rel=1e-12)
    assert gemm.pred.memory_s == pytest.approx(gemm.cost.bytes / 6.134e12, rel=1e-9)
    # AITER's GEMV streams this 58.7 MB slower than its 436 MB one (6.134 TB/s): the measured time is the longer
    assert gemm.pred.matrix_s > gemm.pred.memory_s
    kernel = next(k for k in a.kernel_results if k.kernel.anchor == gemm.node.id)
    assert kernel.bound == "memory" and "bytes-bound by its arithmetic intensity" in kernel.why


# Llama-3-8B's and Qwen3-8B's MXFP4 GEMMs at M 64 as AITER timed them (aiter/configs/a4w4_blockscale_tuned_gemm.csv @
# e4048607, gfx950, cu_num 256, the us column): N x K 4096 x 4096 in 9.9442 us, 1024 x 4096 in 8.9889, 12288 x 4096 in
# 10.0, 4096 x 14336 in 23.3334
A4W4_M64_US = {(4096, 4096): 9.9442, (1024, 4096): 8.9889, (12288, 4096): 10.0, (4096, 14336): 23.3334}


def _mxfp4_gemm_kernels(a):
    """(N, K) -> the kernel of each weight GEMM that runs in mxfp4 (the lm_head a checkpoint keeps in bf16 aside)."""
    from opmap.ops import MatrixFamily

    res = {r.node.id: r for r in a.results}
    out = {}
    for k in a.kernel_results:
        r = res[k.kernel.anchor]
        p = r.cost.problem
        if p is not None and p.family == MatrixFamily.GEMM and r.node.id not in a.kept_gemms:
            out[p.n, p.k] = (p, k)
    return out


def _check_decode_gemms_on_the_grid(a, hw, measured):
    from opmap.ops import MatrixFamily

    grid = hw.curves.tables[MatrixFamily.GEMM, "mxfp4"]
    kernels = _mxfp4_gemm_kernels(a)
    assert a.precision.matrix == "mxfp4" and kernels
    for (n, k), (p, kr) in kernels.items():
        assert p.m == 64
        # every mxfp4 GEMM is priced off the grid at its shape, far below the 5806 TFLOP/s ceiling at M 64
        assert kr.time.matrix_s == pytest.approx(p.flops / grid.rate(64, n, k), rel=1e-12)
        assert kr.time.matrix_s > 5 * p.flops / MXFP4_AITER
        assert "measured shape curve" in kr.why and kr.bound == "memory"
    for nk, us in measured.items():  # where AITER timed the shape, its time
        assert kernels[nk][1].time.matrix_s == pytest.approx(us * 1e-6, rel=1e-9), nk
    return kernels


def test_hf_config_decode_prices_mxfp4_gemms_off_aiters_grid(tmp_path):
    """Qwen3-8B from its published config.json (two of 36 layers), a decode step of 64 sequences at mxfp4 on an
    MI355X: q / o (4096 x 4096), k / v (1024 x 4096) and gate / up (12288 x 4096) run AITER's timed times; the
    down projection (4096 x 12288, a shape AITER did not tune) the grid's fill, read by the same formula."""
    import json
    import sys
    from pathlib import Path

    pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from hf_family_configs import QWEN3_8B, shallow
    from opmap.analyze import analyze
    from opmap.hardware import get_hardware
    from opmap.workloads.phases import PhaseSpec, check_phase, phase_workload

    path = tmp_path / "config.json"
    path.write_text(json.dumps(shallow(QWEN3_8B, 2)))
    w = phase_workload(str(path), check_phase(PhaseSpec("decode", kv_len=512), str(path), 64), 64, None, "mxfp4")
    hw = get_hardware("mi355x")
    measured = {nk: us for nk, us in A4W4_M64_US.items() if nk != (4096, 14336)}
    kernels = _check_decode_gemms_on_the_grid(analyze(w, hw, "mxfp4"), hw, measured)
    assert set(kernels) == {(4096, 4096), (1024, 4096), (12288, 4096), (4096, 12288)}


def test_zoo_llama_decode_prices_mxfp4_gemms_off_aiters_grid():
    """llama-3-8b (zoo) decode of 64 sequences at mxfp4 on an MI355X: q / o, k / v and the down projection run AITER's
    timed times at M 64; gate / up (14336 x 4096, not tuned) the grid's fill."""
    from opmap.analyze import analyze
    from opmap.hardware import get_hardware
    from opmap.workloads import build_zoo
    from opmap.workloads.phases import decode_workload

    hw = get_hardware("mi355x")
    a = analyze(decode_workload(build_zoo("llama-3-8b", 64, 16, "mxfp4"), 16), hw, "mxfp4")
    measured = {nk: us for nk, us in A4W4_M64_US.items() if nk != (12288, 4096)}
    kernels = _check_decode_gemms_on_the_grid(a, hw, measured)
    assert set(kernels) == {(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)}


def test_hf_config_prefill_runs_mxfp4_at_aiters_measured_rate(tmp_path):
    """Qwen3-8B from its published config.json (two of 36 layers), prefill of 2 x 512 tokens at mxfp4 on an MI355X:
    the analysis prices its matrix work at AITER's measured 5806.15 TFLOP/s, 0.577 of the 10066.4 dense peak."""
    import json
    import sys
    from pathlib import Path

    pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from hf_family_configs import QWEN3_8B, shallow
    from opmap.analyze import analyze
    from opmap.hardware import get_hardware
    from opmap.workloads.phases import PhaseSpec, check_phase, phase_workload

    path = tmp_path / "config.json"
    path.write_text(json.dumps(shallow(QWEN3_8B, 2)))
    w = phase_workload(str(path), check_phase(PhaseSpec("prefill"), str(path), 2), 2, 512, "mxfp4")
    a = analyze(w, get_hardware("mi355x"), "mxfp4")
    rate = a.to_dict()["assumptions"]["matrix_rate_flops_per_s"]
    assert a.precision.matrix == "mxfp4" and rate["value"] == pytest.approx(MXFP4_AITER, rel=1e-5)
    assert rate["kind"] == "measured" and rate["of_peak"] == pytest.approx(MXFP4_AITER / 10066.4e12, abs=1e-3)
