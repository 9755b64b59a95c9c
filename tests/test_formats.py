"""The format registry (opmap.formats, data in formats.toml): bytes per element from the format specifications,
every per-format view derived from it, and a new format added as one table, with no code change."""

from __future__ import annotations

import json

import pytest

from opmap.cli import main  # imported here, with the shipped registry: its help lines are read at import
from opmap.errors import OpmapError
from opmap.formats import FORMATS_TOML, load_formats, parse_formats, registry, use
from opmap.hardware import get_hardware
from opmap.precision import FORMATS, check_requestable, format_bytes, policy, requestable, resolve_precision


@pytest.mark.parametrize("name, bits, block, scale_bits, expected", [
    # OCP Microscaling Formats (MX) Specification v1.0, sec. 5.1 Table 1: k = 32 elements share one 8-bit E8M0
    # scale; MXFP8 E4M3 (8 bits), MXFP6 E2M3 (6 bits), MXFP4 E2M1 (4 bits)
    ("mxfp8", 8, 32, 8, (8 + 8 / 32) / 8),  # 8.25 bits = 1.03125 bytes
    ("mxfp6", 6, 32, 8, (6 + 8 / 32) / 8),  # 6.25 bits = 0.78125 bytes
    ("mxfp4", 4, 32, 8, (4 + 8 / 32) / 8),  # 4.25 bits = 0.53125 bytes
    # NVIDIA NVFP4: E2M1 elements, one FP8 E4M3 scale per 16 (4.5 bits), plus a per-tensor FP32 scale (amortised)
    ("nvfp4", 4, 16, 8, (4 + 8 / 16) / 8),  # 0.5625 bytes
])
def test_block_scaled_bytes_follow_the_spec_formula(name, bits, block, scale_bits, expected):
    f = registry().get(name)
    assert (f.bits, f.scale_block, f.scale_bits) == (bits, block, scale_bits)
    assert f.scaled and f.bytes == pytest.approx(expected) and format_bytes(name) == pytest.approx(expected)
    assert {"mxfp4": 0.53125, "nvfp4": 0.5625}.get(name, f.bytes) == f.bytes
    # data only until the catalog lists their peaks (issue 37): not requestable, not a catalog peak key
    assert name not in requestable() and name not in FORMATS
    with pytest.raises(OpmapError, match=f"unknown dtype '{name}'"):
        check_requestable(name)


def test_nvfp4_scales_are_fp8_and_a_per_tensor_fp32():
    f = registry().get("nvfp4")
    assert f.scale_format == "fp8 e4m3" and f.tensor_scale_bits == 32
    assert {registry().get(n).scale_format for n in ("mxfp8", "mxfp6", "mxfp4")} == {"e8m0"}


def test_plain_formats_are_their_width_and_the_group_scales_sit_in_the_policy():
    # IEEE 754 binary64 / binary32 / binary16, bfloat16, OCP FP8 e4m3: 64, 32, 16, 16, 8 bits; int8, int4
    assert {n: registry().get(n).bytes for n in ("fp64", "fp32", "bf16", "fp16", "fp8", "int8", "int4")} == \
        {"fp64": 8, "fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
    # int4 GPTQ / AWQ groups of 128 with an fp16 scale each; int8 an fp16 scale per output channel of 4096
    assert policy("int4").weight_bytes == 0.5 + 2 / 128 and policy("int8").weight_bytes == 1 + 2 / 4096
    assert registry().get("fp8").is_fp8 and not registry().get("int8").is_fp8
    assert not registry().get("mxfp8").is_fp8  # block-scaled: its own family


def test_views_are_the_registry_s():
    from opmap.mapping.memory import train_formats
    from opmap.serve.model_cost import kv_dtypes

    assert kv_dtypes() == ("bf16", "fp16", "fp8", "int8")
    assert train_formats() == ("fp32", "tf32", "bf16", "fp16", "fp8")
    assert registry().names(quality=True) == ("bf16", "fp16", "fp8", "int8", "int4", "mxfp8", "mxfp6", "mxfp4", "nvfp4",
                                              "fp8-block")
    assert registry().rate_donors() == ("bf16", "fp16", "fp8", "int8", "tf32", "fp32")
    assert [registry().get(n).narrower for n in ("fp32", "bf16", "fp8", "int8")] == ["bf16", "fp8", "nvfp4", None]


def test_a_table_naming_an_unknown_format_or_key_is_refused():
    with pytest.raises(OpmapError, match="unknown format 'fp3'"):
        parse_formats({"x": {"bits": 8, "fallback": ["fp3"]}})
    with pytest.raises(OpmapError, match="takes only"):
        parse_formats({"x": {"bits": 8, "colour": "red"}})
    with pytest.raises(OpmapError, match="needs a fallback chain and a policy"):
        parse_formats({"x": {"bits": 8, "build": "bfloat16"}})


HYPOTHETICAL = """
# a hypothetical 8-bit float, e3m4, with an 8-bit scale per 32 weights: one table, no code
[hyp8]
bits = 8
kind = "float"
encoding = "e3m4"
build = "bfloat16"
fallback = ["hyp8", "bf16"]
rate_donor = 7
kv = true
train = [2.0, 2.0, 12.0]
quality = true

[hyp8.policy]
capture = "bf16"
weights_format = "hyp8"
weight_group = 32
weight_group_scale_bits = 8
weights = "hyp8 (e3m4, blocks of 32)"
activations = "bf16"
accumulate = "fp32"
quantized = true
one_byte_operands = true
"""


@pytest.fixture
def hyp8(tmp_path):
    """The shipped formats.toml plus the hypothetical format, installed as the registry in use."""
    path = tmp_path / "formats.toml"
    path.write_text(FORMATS_TOML.read_text() + HYPOTHETICAL)
    use(load_formats(path))
    try:
        yield registry().get("hyp8")
    finally:
        use(None)


def test_adding_a_format_is_one_table(hyp8):
    from dataclasses import replace

    from opmap.mapping.memory import training_state_bytes
    from opmap.measure.quality import check_dtype
    from opmap.serve.model_cost import check_kv_dtype, kv_dtype_bytes

    assert hyp8.bytes == 1 and "hyp8" in requestable()
    assert policy("hyp8").weight_bytes == 1 + 1 / 32  # 8 bits a weight plus an 8-bit scale per 32
    assert check_kv_dtype("hyp8", "bf16") == "hyp8" and kv_dtype_bytes("hyp8") == 1.0
    assert training_state_bytes(1e9, fmt="hyp8").weights_bytes == 2e9
    check_dtype("hyp8")  # quality accepts it
    # a device listing a hyp8 matrix peak runs it; one without falls back along the chain
    h100 = get_hardware("h100-sxm")
    peaks = {**h100.matrix_peak_flops_per_s, "hyp8": h100.matrix_peak_flops_per_s["fp8"]}
    p = resolve_precision(replace(h100, matrix_peak_flops_per_s=peaks), "hyp8")
    assert p.matrix == "hyp8" and p.weight_scale == (1 + 1 / 32) / 2 and p.operand_format == "fp8"
    a100 = resolve_precision(get_hardware("a100-sxm-80gb"), "hyp8")
    assert a100.matrix == "bf16" and "has no hyp8 matrix peak: used bf16 (tried hyp8, bf16)" in a100.note


@pytest.mark.parametrize("target", ["gpt2", "examples/tiny-llama.json"])
def test_the_cli_accepts_a_registered_format(hyp8, target, tmp_path, capsys):
    """A zoo model and a Hugging Face config analysed at --dtype hyp8 on a device without it: the fallback's
    note and the policy's weights string."""
    root = FORMATS_TOML.parents[2]
    rc = main(["analyze", str(root / target if target.endswith(".json") else target), "--seq", "32", "--dtype",
               "hyp8", "-H", "a100-sxm-80gb", "--no-store", "--out", str(tmp_path)])
    assert rc == 0, capsys.readouterr().err
    a = json.loads((tmp_path / "analysis.json").read_text())
    text = json.dumps(a)
    assert "has no hyp8 matrix peak: used bf16" in text and "hyp8 (e3m4, blocks of 32)" in text


def test_build_bytes_and_reference_come_from_the_build_dtype():
    """A real build holds the build dtype's tensors: fp32 / tf32 in float32 (4 B, the fp32 reference quality
    compares against), bf16 / fp16 and the quantized formats (built in bfloat16) 2 B."""
    from opmap.precision import build_bytes, reference

    assert {f: build_bytes(f) for f in requestable()} == \
        {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 2, "int8": 2, "int4": 2}
    assert [f for f in requestable() if reference(f)] == ["fp32", "tf32"]
