"""The roofline-plus-overhead model against hand calculation with datasheet numbers."""

from __future__ import annotations

import math

import pytest

from opmap.analyze import stored_weights
from opmap.costs.base import OpCost
from opmap.errors import OpmapError
from opmap.hardware import get_hardware
from opmap.ops import MatrixFamily, MatrixProblem
from opmap.precision import power_limited, resolve_precision
from opmap.predict import TRANSCENDENTAL_SLOTS, mfu, predict_cost, ridge_point

H100 = get_hardware("h100-sxm")


def test_large_gemm_is_compute_bound_at_the_achievable_rate():
    # 8192^3 bf16 GEMM on an H100 SXM: 2*8192^3 FLOPs at the 794.5 TFLOP/s an H100 SXM sustains (Bekman's
    # Maximum Achievable Matmul FLOPS table, the catalog's achievable rate) = 1.384 ms; MFU keeps the
    # 989.4 TFLOP/s dense peak (H100 SXM datasheet) as its denominator
    prec = resolve_precision(H100, "bf16")
    assert prec.matrix_rate_flops_per_s == 794.5e12 and prec.matrix_peak_flops_per_s == 989.4e12
    n = 8192
    c = OpCost(matrix_flops=2.0 * n ** 3, bytes_read=2 * n * n * 2, bytes_written=n * n * 2)
    p = predict_cost(c, H100, prec)
    assert p.bound == "compute" and p.limiter == "matrix"
    assert p.predicted_s == pytest.approx(2 * n ** 3 / 794.5e12 + H100.launch_overhead_s, rel=1e-9)
    assert mfu(2.0 * n ** 3, 2 * n ** 3 / 794.5e12, prec) == pytest.approx(794.5 / 989.4)


def test_without_a_measured_rate_the_dense_peak_stands_for_it():
    # the catalog lists no measured matrix rate at all for the MI250X: the 383 TFLOP/s dense bf16 peak stands
    mi250x = get_hardware("mi250x")
    prec = resolve_precision(mi250x, "bf16")
    assert prec.matrix_rate_flops_per_s == prec.matrix_peak_flops_per_s and prec.rate_basis.startswith("dense peak")


def test_a_format_without_a_measured_rate_takes_another_formats_measured_fraction():
    # H100 PCIe: bf16 measured at 495.93 TFLOP/s of its 756.5 dense peak (catalog: a crowd-sourced torch.mm run);
    # fp8 has no figure of its own, so it runs at its 1513 TFLOP/s dense peak x 495.93 / 756.5
    pcie = get_hardware("h100-pcie")
    assert "fp8" not in pcie.achievable_matrix_flops_per_s
    prec = resolve_precision(pcie, "fp8")
    assert prec.matrix_rate_flops_per_s == pytest.approx(1513e12 * 495.93e12 / 756.5e12)
    assert "bf16 fraction" in prec.rate_basis


def test_power_limited_cards_blend_boost_and_sustained_rates():
    # L4: boost bf16 70.89 TFLOP/s (a 2048^3 loop), sustained 56.90 (10240^3), power window 30 ms (catalog).
    # A run of boost-time B past the window takes tau + (B - tau) r_b / r_s: for B = 1 s,
    # r_eff = 70.89 * 1 / (0.03 + 0.97 * 70.89 / 56.90)
    l4 = get_hardware("l4")
    prec = resolve_precision(l4, "bf16")
    assert prec.matrix_rate_flops_per_s == 70.89e12
    assert power_limited(prec, l4, 0.02) is prec  # inside the window: boost
    long = power_limited(prec, l4, 1.0)
    assert long.matrix_rate_flops_per_s == pytest.approx(70.89e12 / (0.03 + 0.97 * 70.89 / 56.90))
    assert long.sustained and prec.matrix_peak_flops_per_s == long.matrix_peak_flops_per_s  # MFU keeps the peak


def test_steady_load_runs_at_the_sustained_rate_and_every_format_follows_the_clock():
    # H100 SXM (catalog): boost bf16 794.5 TFLOP/s (mamf-finder best shape), sustained 719.72 (zzc0721 issue 79,
    # a 10240^3 loop of about 89 ms), power window 30 ms. 10 s busy: 794.5 x 10 / (0.03 + 9.97 x 794.5 / 719.72);
    # steady load (a serving run): 719.72 itself; fp8 under steady load: 1290.1 (Azure AI-benchmarking-guide, cuBLASLt
    # 8192^3 after 10,000 warm-up iterations). MI300X bf16 has no sustained figure: its achievable 668.4 (mamf-finder)
    # x the fp8 sustained / achievable ratio 1159.23 / 1273 (the power limit lowers the clock every format shares)
    prec = resolve_precision(H100, "bf16")
    assert prec.matrix_rate_flops_per_s == 794.5e12
    assert power_limited(prec, H100, 0.02) is prec
    assert power_limited(prec, H100, 10.0).matrix_rate_flops_per_s == pytest.approx(
        794.5e12 * 10 / (0.03 + 9.97 * 794.5 / 719.72))
    assert power_limited(prec, H100, math.inf).matrix_rate_flops_per_s == pytest.approx(719.72e12)
    assert power_limited(resolve_precision(H100, "fp8"), H100, math.inf).matrix_rate_flops_per_s == 1290.1e12
    mi = get_hardware("mi300x")
    bf16 = power_limited(resolve_precision(mi, "bf16"), mi, math.inf)
    assert bf16.matrix_rate_flops_per_s == pytest.approx(668.4e12 * 1159.23 / 1273)
    assert "sustained / achievable fp8 ratio 0.911" in bf16.rate_basis


def test_fused_attention_softmax_on_the_special_function_units():
    # H100 SXM: 16 exp per clock per SM (CUDA programming guide) x 132 SMs x 1.98 GHz; the softmax's 5 other
    # ops per score at the 66.9 TFLOP/s fp32 vector peak; half the shorter of matrix and vector time exposed
    prec = resolve_precision(H100, "bf16")
    scores = 16 * 16384 ** 2
    c = OpCost(matrix_flops=4.0 * scores * 128, vector_flops=5.0 * scores, transcendental_flops=scores,
               problem=MatrixProblem(MatrixFamily.ATTENTION, 16, 16384, 16384, 128))
    p = predict_cost(c, H100, prec)
    vec = 5.0 * scores / 66.9e12 + scores / (16 * 132 * 1.98e9)
    mat = 4.0 * scores * 128 / 794.5e12
    assert p.vector_s == pytest.approx(vec) and p.matrix_s == pytest.approx(mat)
    assert p.predicted_s == pytest.approx(mat + 0.5 * vec + H100.launch_overhead_s)


def test_elementwise_is_memory_bound_and_tiny_ops_overhead_bound():
    prec = resolve_precision(H100, "bf16")
    # 64M bf16 elements: read 2 inputs, write 1 -> 384 MiB at 2.97 TB/s, the BabelStream Triad an H100 SXM sustains
    # (Azure/AI-benchmarking-guide ND_H100_v5_results.md: the catalog's achievable memory bandwidth)
    n = 64 * 2 ** 20
    c = OpCost(vector_flops=n, bytes_read=2 * n * 2, bytes_written=n * 2)
    p = predict_cost(c, H100, prec)
    assert p.bound == "memory"
    assert p.memory_s == pytest.approx(3 * n * 2 / 2.97e12)
    tiny = predict_cost(OpCost(vector_flops=10, bytes_read=40, bytes_written=40), H100, prec)
    assert tiny.bound == "overhead" and tiny.predicted_s == pytest.approx(H100.launch_overhead_s, rel=1e-3)


def test_transcendentals_take_vector_slots():
    prec = resolve_precision(H100, "fp32")
    c = OpCost(vector_flops=1e9, transcendental_flops=1e9)
    p = predict_cost(c, H100, prec)
    assert p.vector_s == pytest.approx((1e9 + TRANSCENDENTAL_SLOTS * 1e9) / prec.vector_peak_flops_per_s)
    assert p.bound == "compute" and p.limiter == "vector"


def test_views_allocations_and_uncounted():
    prec = resolve_precision(H100, "bf16")
    assert predict_cost(OpCost(is_view=True, kernel=False), H100, prec).predicted_s == 0
    assert predict_cost(OpCost(kernel=False), H100, prec).bound == "alloc"
    u = predict_cost(OpCost(counted=False), H100, prec)
    assert u.bound == "uncounted" and u.predicted_s == H100.launch_overhead_s


def test_ridge_point_and_mfu():
    prec = resolve_precision(H100, "bf16")
    assert ridge_point(prec, H100) == pytest.approx(989.4e12 / 3.35e12, rel=1e-3)  # ~295 FLOP/B
    assert mfu(989.4e12 * 0.5, 1.0, prec) == pytest.approx(0.5, rel=1e-3)


def test_precision_fallback_is_stated():
    tpu = get_hardware("tpu-v5e")
    prec = resolve_precision(tpu, "fp32")  # the MXU lists no fp32 peak
    assert prec.matrix == "bf16" and "no fp32 matrix peak" in prec.note
    assert resolve_precision(H100, "bf16").note == ""
    with pytest.raises(OpmapError, match="accepted"):
        resolve_precision(H100, "fp12")


def test_int4_weight_only_reads_a_quarter_of_the_weights():
    # a GEMM captured in bf16 reading P parameter bytes: int4 stores 0.5 B + a 2-byte scale per 128 weights
    P, act = 2.0 * 4096 * 4096, 2.0 * 16 * 4096 * 2
    cost = OpCost(matrix_flops=2.0 * 16 * 4096 * 4096, bytes_read=act, param_bytes_read=P)
    prec = resolve_precision(H100, "int4")
    assert prec.matrix == "bf16" and "weight-only" in prec.note
    (stored,) = stored_weights([cost], prec)  # the pipeline rescales parameter reads once, before predicting
    assert stored.param_bytes_read == pytest.approx(P * (0.5 + 2 / 128) / 2)
    p = predict_cost(stored, H100, prec)
    assert p.memory_s == pytest.approx((act + P * (0.5 + 2 / 128) / 2) / 2.97e12)  # H100 SXM BabelStream Triad


def test_fp8_falls_back_where_the_device_has_none():
    a100 = get_hardware("a100-sxm-80gb")  # Ampere: no fp8 tensor cores; int8 is listed but is another format
    prec = resolve_precision(a100, "fp8")
    # weight-only fp8 (vLLM's FP8 Marlin W8A16): bf16 compute at the bf16 rate, fp8 weights 1 byte each
    assert prec.matrix == "bf16" and "no fp8 matrix engine" in prec.note and "weight-only" in prec.note
    assert prec.matrix_rate_flops_per_s == 271.2e12  # A100 SXM bf16 MAMF (Bekman), not the 624 TOPS int8 peak
    assert prec.weight_scale == 0.5 and prec.weight_operand_bytes == 1.0
    assert resolve_precision(H100, "fp8").matrix == "fp8"
