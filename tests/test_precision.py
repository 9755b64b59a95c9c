"""The one dtype table and the precision policy: sizes from the format definitions, unknown names refused."""

from __future__ import annotations

import pytest

from opmap.errors import OpmapError
from opmap.graph import TensorMeta
from opmap.hardware import get_hardware
from opmap.precision import (
    DTYPE_BYTES,
    FORMATS,
    dtype_bytes,
    format_bytes,
    requestable,
    resolve_precision,
    torch_dtype,
)


def test_dtype_table_covers_every_torch_dtype_at_its_itemsize():
    import torch

    every = {str(v).removeprefix("torch."): v for v in vars(torch).values() if isinstance(v, torch.dtype)}
    for name, dt in every.items():
        assert dtype_bytes(name) == dt.itemsize, name
    assert set(DTYPE_BYTES) >= set(every)


def test_unknown_dtype_is_refused_not_defaulted():
    with pytest.raises(OpmapError, match="unknown tensor dtype 'float12'"):
        dtype_bytes("float12")
    with pytest.raises(OpmapError, match="unknown tensor dtype"):
        _ = TensorMeta((4,), "float12", (1,)).nbytes
    with pytest.raises(OpmapError, match="accepted: fp64, fp32"):
        format_bytes("fp6")
    with pytest.raises(OpmapError, match="unknown dtype 'fp6'"):
        torch_dtype("fp6")


def test_format_sizes_and_weight_scales():
    # IEEE / OCP format widths: fp32 32 bits, bf16 and fp16 16, fp8 e4m3 8, int4 4
    assert [format_bytes(f) for f in ("fp32", "bf16", "fp16", "fp8", "int8", "int4")] == [4, 2, 2, 1, 1, 0.5]
    h100 = get_hardware("h100-sxm")
    # int4 groups of 128 with one fp16 scale each: 0.5 + 2/128 bytes a weight, against the bf16 capture's 2
    assert resolve_precision(h100, "int4").weight_scale == pytest.approx((0.5 + 2 / 128) / 2)
    # int8 per output channel (a 16-bit scale per 4096 weights) against bf16
    assert resolve_precision(h100, "int8").weight_scale == pytest.approx((1 + 2 / 4096) / 2)
    assert resolve_precision(h100, "fp32").weight_scale == 1.0
    assert set(requestable()) == {"fp32", "tf32", "bf16", "fp16", "fp8", "int8", "int4", "fp8-block", "nvfp4",
                                  "mxfp8", "mxfp6", "mxfp4", "w4a8-mxfp4"}
    assert set(FORMATS) >= set(requestable()) - {"fp8-block", "w4a8-mxfp4"}  # block-scaled fp8 runs on the fp8 engine


def test_kernel_formats_follow_the_policy():
    a100 = get_hardware("a100-sxm-80gb")  # no fp8 matrix engine: fp8 weight-only, dequantized to bf16 in the GEMM
    p = resolve_precision(a100, "fp8")
    assert p.matrix == "bf16" and "no fp8 matrix engine" in p.note
    assert p.operand_format == "bf16"  # activations reach the tensor cores in bf16; only B is stored in fp8
    assert p.kernel_format("matrix") == ("bf16 compute, weights fp8 (e4m3), weight-only: dequantized to bf16 in the "
                                         "GEMM (W8A16), accumulate fp32")
    assert p.kernel_format("reduction") == "bf16 storage, fp32 compute"
    assert p.kernel_format("vector") == "bf16"
    b = resolve_precision(a100, "bf16")
    assert b.kernel_format("matrix") == "bf16" and b.operand_format == "bf16" and b.weight_operand_bytes is None
    assert resolve_precision(a100, "int4").weight_operand_bytes == pytest.approx(0.5 + 2 / 128)


def test_training_precision_fp8_is_transformer_engine_on_an_fp8_engine():
    from opmap.precision import FP8_TRAINING, resolve_training_precision

    h100 = get_hardware("h100-sxm")
    p = resolve_training_precision(h100, "fp8")
    # the fp8 matrix rate (catalog: measured achievable 1402.6 TFLOP/s), bf16 weights stored (2 B: scale 1)
    assert p.matrix == "fp8" and p.matrix_rate_flops_per_s == h100.achievable_matrix_flops_per_s["fp8"].value
    assert p.format_policy is FP8_TRAINING and p.weight_scale == 1.0 and p.operand_format == "fp8"
    assert p.kernel_format("matrix").startswith("fp8 (fprop e4m3 x e4m3")
    # other formats train as they infer
    assert resolve_training_precision(h100, "bf16") == resolve_precision(h100, "bf16")


def test_training_precision_fp8_refused_without_an_fp8_engine():
    from opmap.precision import resolve_training_precision

    a100 = get_hardware("a100-sxm-80gb")
    with pytest.raises(OpmapError, match="fp8 training needs an fp8 matrix engine") as e:
        resolve_training_precision(a100, "fp8")
    assert "\n" not in str(e.value) and str(e.value).endswith("accepted for training on it: bf16, fp16, tf32, fp32")
    assert resolve_precision(a100, "fp8").matrix == "bf16"  # inference keeps the weight-only fallback


@pytest.mark.parametrize("device, fmt, peak, why", [
    # HGX B200: FP4 Tensor Core 18 PFLOPS with sparsity, 9 dense: NVIDIA with an nvfp4 engine -> nvfp4
    ("b200", "nvfp4", 9e15, "b200 runs nvfp4 at 9 PFLOP/s dense"),
    # MI355X: MXFP4 10.1 PFLOPS dense (2 x the 5033.2 TFLOPS fp8), no nvfp4 (E8M0 scales only) -> mxfp4
    ("mi355x", "mxfp4", 2 * 5033.2e12, "mi355x lists no nvfp4 matrix peak"),
    # H100 SXM: no fp4 engine; its narrowest float engine is fp8 (1,979 TFLOPS dense: 3,958 sparse / 2)
    ("h100-sxm", "fp8", 3958e12 / 2, "h100-sxm has no fp4 matrix engine (no nvfp4 or mxfp4 peak): fp8, the narrowest"),
    # A100: no fp8 either: bf16 (312 TFLOPS dense), the first of the 2-byte float formats in table order
    ("a100-sxm-80gb", "bf16", 312e12, "a100-sxm-80gb has no fp4 matrix engine"),
])
def test_fp4_resolves_per_device(device, fmt, peak, why):
    from opmap.precision import resolve_dtype

    hw = get_hardware(device)
    c = resolve_dtype(hw, "fp4")
    assert c.format == fmt and c.resolved and why in c.reason
    p = resolve_precision(hw, c.format)
    assert p.matrix == fmt and p.matrix_peak_flops_per_s == pytest.approx(peak, rel=1e-3)
    assert resolve_dtype(hw, "bf16").format == "bf16" and not resolve_dtype(hw, "bf16").resolved


def test_an_alias_is_not_a_format_until_a_device_resolves_it():
    from opmap.precision import build_dtype, check_requestable, policy

    assert check_requestable("fp4") == "fp4" and build_dtype("fp4") == "bfloat16"
    with pytest.raises(OpmapError, match="alias resolved per device"):
        policy("fp4")


def test_fp4_on_hopper_is_weight_only_w4a16():
    """--dtype nvfp4 on H100: the nvfp4 weights (0.5 + 1/16 B: an e4m3 scale per 16) stay in memory, dequantized to
    bf16 in the GEMM (vLLM's NVFP4 Marlin), at the bf16 rate; mxfp4 (0.5 + 1/32 B) likewise."""
    h100 = get_hardware("h100-sxm")
    p = resolve_precision(h100, "nvfp4")
    assert p.matrix == "bf16" and p.weight_operand_bytes == pytest.approx(0.5 + 1 / 16)
    assert p.weight_scale == pytest.approx((0.5 + 1 / 16) / 2) and p.operand_format == "bf16"
    assert "W4A16" in p.kernel_format("matrix") and "no nvfp4 matrix engine" in p.note and "Marlin" in p.note
    m = resolve_precision(h100, "mxfp4")
    assert m.weight_operand_bytes == pytest.approx(0.5 + 1 / 32) and m.matrix == "bf16"
    # on Blackwell nvfp4 runs on its own engine: W4A4, operands at 0.5625 B with their scales
    b = resolve_precision(get_hardware("b200"), "nvfp4")
    assert b.matrix == "nvfp4" and b.note == "" and b.weight_operand_bytes is None
    assert format_bytes(b.operand_format) == pytest.approx(0.5 + 1 / 16)


def test_nvfp4_kv_only_where_the_device_has_an_nvfp4_engine():
    """TensorRT-LLM and vLLM ship an NVFP4 KV cache on Blackwell only."""
    from opmap.precision import check_kv_format

    assert check_kv_format(get_hardware("b200"), "nvfp4") == "nvfp4"
    assert check_kv_format(get_hardware("h100-sxm"), "fp8") == "fp8"
    with pytest.raises(OpmapError, match="h100-sxm lists no nvfp4 matrix peak; accepted on h100-sxm: bf16, fp16, fp8"):
        check_kv_format(get_hardware("h100-sxm"), "nvfp4")
    with pytest.raises(OpmapError, match="mi355x lists no nvfp4"):
        check_kv_format(get_hardware("mi355x"), "nvfp4")


def test_a_compute_bound_gemm_in_nvfp4_on_b200_runs_at_the_fp4_rate():
    """8192^3 on B200 in nvfp4: 2 * 8192^3 = 1.1e12 FLOPs over 3 * 8192^2 * 0.5625 B of operands, far past the
    ridge. Without a measured curve the time is the FLOPs over the fp4 rate the precision carries: the datasheet's
    9 PFLOPS dense (HGX B200: 18 sparse) times the measured fraction of peak the catalog holds for bf16 (Bekman's
    mamf-finder: 1745 of 2250 TFLOPS). With the catalog's curves it is NVIDIA's measured time (aiconfigurator-core
    0.12.0, b200_sxm/gemm/trtllm/1.3.0rc20/gemm_perf.parquet, nvfp4 8192 x 8192 x 8192: 0.284556 ms as timed), less
    the activation's fp4_quantize inside that call (2.5625 B an element at the B200's measured 6.84043 TB/s)."""
    from opmap.costs.base import OpCost
    from opmap.ops import MatrixFamily, MatrixProblem
    from opmap.predict import NO_CURVES, predict_cost

    b200 = get_hardware("b200")
    prec = resolve_precision(b200, "nvfp4")
    assert prec.matrix_peak_flops_per_s == 18e15 / 2
    rate = 9e15 * 1745e12 / 2250e12
    assert prec.matrix_rate_flops_per_s == pytest.approx(rate)
    p = MatrixProblem(MatrixFamily.GEMM, 1, 8192, 8192, 8192)
    ab = 2 * 8192 * 8192 * (0.5 + 1 / 16)
    cost = OpCost(matrix_flops=p.flops, bytes_read=ab, bytes_written=8192 * 8192 * 2, problem=p)
    pred = predict_cost(cost, b200, prec, NO_CURVES)
    assert p.flops == 2 * 8192 ** 3
    assert pred.matrix_s == pytest.approx(2 * 8192 ** 3 / rate) and pred.matrix_s > pred.memory_s
    assert pred.predicted_s == pytest.approx(2 * 8192 ** 3 / rate + b200.launch_overhead_s)
    measured = predict_cost(cost, b200, prec, b200.curves)
    assert measured.matrix_s == pytest.approx(284.556e-6 - 2.5625 * 8192 ** 2 / 6.84043e12, rel=1e-3)
    # the fp8 time of the same GEMM is twice as long at the peaks (4.5 PFLOPS dense)
    assert prec.matrix_peak_flops_per_s == 2 * resolve_precision(b200, "fp8").matrix_peak_flops_per_s


@pytest.mark.parametrize("device,dtype,core,peak", [
    # B200 (NVIDIA HGX B200 specifications): FP4 9 PFLOPS dense, FP8 4.5 PFLOPS dense; an nvfp4 or w4a8 run's
    # attention core runs TensorRT-LLM's bf16 / e4m3 context FMHA, never fp4 (precision.ATTENTION_CORE_FLOOR)
    ("b200", "nvfp4", "fp8", 4.5e15),
    ("b200", "mxfp4", "fp8", 4.5e15),
    # MI355X: mxfp4 is sub-byte, its fp8 engine runs the attention (the catalog's fp8 dense peak)
    ("mi355x", "mxfp4", "fp8", None),
])
def test_a_sub_byte_run_prices_its_attention_core_at_fp8(device, dtype, core, peak):
    from opmap.precision import attention_core_precision

    hw = get_hardware(device)
    got = attention_core_precision(hw, resolve_precision(hw, dtype))
    assert got is not None and got.matrix == core
    assert got.matrix_peak_flops_per_s == (peak or float(hw.matrix_peak_flops_per_s["fp8"].value))
    assert "attention core in fp8" in got.note


@pytest.mark.parametrize("device,dtype", [("b200", "fp8"), ("b200", "bf16"), ("b200", "mxfp8"),
                                          ("h100-sxm", "fp8"), ("h100-sxm", "bf16")])
def test_an_8_bit_or_wider_run_keeps_its_attention_core_in_its_own_format(device, dtype):
    """fp8 context FMHA runs e4m3 (the run's own fp8 rate), bf16 runs bf16: nothing to change."""
    from opmap.precision import attention_core_precision

    hw = get_hardware(device)
    assert attention_core_precision(hw, resolve_precision(hw, dtype)) is None
