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
                                  "mxfp8", "mxfp6", "mxfp4"}
    assert set(FORMATS) >= set(requestable()) - {"fp8-block"}  # block-scaled fp8 runs on the fp8 engine


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
