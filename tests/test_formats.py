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
from opmap.record import record  # noqa: E402


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
    # catalog peak keys and requestable (issue 37), built in bf16; the stored weights carry the same scales
    assert name in requestable() and name in FORMATS and check_requestable(name) == name
    assert policy(name).weight_bytes == pytest.approx(expected) and policy(name).quantized


def test_fp8_block_bytes_are_deepseek_v3_s():
    """DeepSeek-V3 technical report (arXiv:2412.19437) sec. 3.3.2: E4M3 with an fp32 scale per 1x128 activation
    tile and per 128x128 weight block: activations 1 + 4/128 bytes an element, weights 1 + 4/16384. It runs on the
    fp8 engine: not a catalog peak key, its fallback chain starts at fp8."""
    f = registry().get("fp8-block")
    assert f.bytes == pytest.approx(1 + 4 / 128) and policy("fp8-block").weight_bytes == pytest.approx(1 + 4 / 16384)
    assert "fp8-block" in requestable() and "fp8-block" not in FORMATS and f.fallback[0] == "fp8"
    h100 = get_hardware("h100-sxm")
    p = resolve_precision(h100, "fp8-block")
    assert p.matrix == "fp8" and p.note == "" and p.operand_format == "fp8-block"
    assert p.weight_scale == pytest.approx((1 + 4 / 16384) / 2)  # against the bf16 capture's 2 bytes
    a100 = resolve_precision(get_hardware("a100-sxm-80gb"), "fp8-block")  # no fp8 engine: weight-only
    assert a100.matrix == "bf16" and a100.weight_operand_bytes == pytest.approx(1 + 4 / 16384)
    assert "has no fp8 matrix engine" in a100.note


def test_a_chain_names_catalog_formats_and_an_alias_one_build():
    with pytest.raises(OpmapError, match="not a catalog format"):
        parse_formats({"a": {"bits": 8, "catalog": False}, "b": {"bits": 8, "fallback": ["a"]}})
    pol = {"capture": "x", "weights": "w", "activations": "a", "accumulate": "fp32"}
    with pytest.raises(OpmapError, match="one build dtype"):
        parse_formats({"x": {"bits": 16, "build": "bfloat16", "fallback": ["x"], "alias": "q", "policy": pol},
                       "y": {"bits": 16, "build": "float32", "fallback": ["y"], "alias": "q",
                             "policy": {**pol, "capture": "y"}}})


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

    assert kv_dtypes() == ("bf16", "fp16", "fp8", "int8", "nvfp4")  # nvfp4 on Blackwell only (check_kv_format)
    assert train_formats() == ("fp32", "tf32", "bf16", "fp16", "fp8")
    assert registry().names(quality=True) == ("bf16", "fp16", "fp8", "int8", "int4", "fp8-block", "nvfp4", "mxfp8",
                                              "mxfp6", "mxfp4")
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
        {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 2, "int8": 2, "int4": 2, "fp8-block": 2, "nvfp4": 2,
         "mxfp8": 2, "mxfp6": 2, "mxfp4": 2, "w4a8-mxfp4": 2}
    assert build_bytes("fp4") == 2  # the alias is built as its formats are, before a device resolves it
    assert [f for f in requestable() if reference(f)] == ["fp32", "tf32"]


@pytest.mark.parametrize("hw, fmt, matrix, why", [
    ("b200", "nvfp4", "nvfp4", "b200 runs nvfp4 at 9 PFLOP/s dense"),  # HGX B200: FP4 18 PFLOPS sparse, 9 dense
    ("mi355x", "mxfp4", "mxfp4", "mi355x lists no nvfp4 matrix peak"),  # CDNA 4: MX scales (E8M0) only
    ("h100-sxm", "fp8", "fp8", "h100-sxm has no fp4 matrix engine (no nvfp4 or mxfp4 peak): fp8, the narrowest"),
])
def test_analyze_fp4_names_the_format_per_device(hw, fmt, matrix, why, tmp_path, capsys):
    """llama-3-8b at --dtype fp4: nvfp4 on Blackwell, mxfp4 on CDNA 4, fp8 on Hopper (its narrowest float engine),
    named in analysis.json's assumptions and the sheet's header with the reason."""
    rc = main(["analyze", "llama-3-8b", "--seq", "64", "--dtype", "fp4", "-H", hw, "--no-store", "--out",
               str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    a = json.loads((tmp_path / "analysis.json").read_text())["assumptions"]
    assert (a["dtype"], a["matrix_dtype"], a["dtype_requested"]) == (fmt, matrix, "fp4")
    assert why in a["dtype_resolution"]
    assert f"--dtype fp4 -> {fmt}" in " ".join(out.split())


def test_a_hugging_face_config_at_fp4_with_tp2(tmp_path, capsys):
    """examples/tiny-llama.json, a decode step over --tp 2 on B200 and on H100 at --dtype fp4: nvfp4 weights
    (0.5 + 1/16 B) on B200, fp8 on H100, the alias named in both."""
    root = FORMATS_TOML.parents[2]
    got = {}
    for hw in ("b200", "h100-sxm"):
        out = tmp_path / hw
        rc = main(["analyze", str(root / "examples/tiny-llama.json"), "--phase", "decode", "--kv-len", "64", "--tp",
                   "2", "--dtype", "fp4", "-H", hw, "--no-store", "--out", str(out)])
        assert rc == 0, capsys.readouterr().err
        got[hw] = json.loads((out / "analysis.json").read_text())["assumptions"]
    assert got["b200"]["dtype"] == "nvfp4" and got["b200"]["weights_dtype"].startswith("nvfp4 (e2m1")
    assert got["h100-sxm"]["dtype"] == "fp8" and got["h100-sxm"]["dtype_requested"] == "fp4"


def test_a_fit_cell_names_its_format_and_strikes_an_unshipped_kv_format():
    """fit's cell at --dtype fp4 --kv-dtype nvfp4 on H100: fp8 priced (why said), and struck: no engine ships an
    NVFP4 KV cache off Blackwell."""
    from opmap.explore.fit import fit_cell
    from opmap.report.fit_table import _notes

    c = fit_cell("examples/tiny-llama.json", "h100-sxm", None, "128", "16", 10, "fp4", kv_dtype="nvfp4")
    assert c.dtype == "fp8" and c.dtype_line.startswith("fp8 (--dtype fp4: h100-sxm has no fp4 matrix engine")
    assert "h100-sxm lists no nvfp4 matrix peak" in c.excluded_reason and not c.fits
    d = record(c)
    assert d["dtype"] == "fp8" and _notes(d).startswith("dtype fp8 (--dtype fp4: h100-sxm has no fp4")


def test_serve_names_the_format_and_prices_an_nvfp4_kv_cache(tmp_path, capsys):
    """serve on examples/tiny-llama.json at --dtype fp4 --kv-dtype nvfp4: on B200 the header names nvfp4 and why,
    and a token's KV is 2 layers x (K, V) x 4 heads x 32 dims x (0.5 + 1/16) B = 288 B; on H100 the NVFP4 KV cache
    is refused in one line (engines ship it on Blackwell only)."""
    cfg = str(FORMATS_TOML.parents[2] / "examples/tiny-llama.json")
    rc = main(["serve", cfg, "-H", "b200", "--dtype", "fp4", "--kv-dtype", "nvfp4", "--requests", "20", "--no-store",
               "--out", str(tmp_path)])
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 0 and "dtype: nvfp4 (--dtype fp4: b200 runs nvfp4 at 9 PFLOP/s dense" in out
    a = json.loads((tmp_path / "serve.json").read_text())["assumptions"]
    assert (a["dtype"], a["dtype_requested"], a["kv_dtype"]) == ("nvfp4", "fp4", "nvfp4")
    assert a["memory"]["kv_bytes_per_token"] == pytest.approx(2 * 2 * 4 * 32 * (0.5 + 1 / 16))
    rc = main(["serve", cfg, "-H", "h100-sxm", "--dtype", "fp4", "--kv-dtype", "nvfp4", "--requests", "20",
               "--no-store"])
    err = capsys.readouterr().err
    assert rc == 2 and "h100-sxm lists no nvfp4 matrix peak; accepted on h100-sxm: bf16, fp16, fp8, int8" in err


def test_w4a8_mxfp4_runs_on_the_mxfp8_engine_with_mxfp4_weights():
    """gpt-oss's MoE on Blackwell (TensorRT-LLM's gpt-oss MoE support matrix, PR 6908: mxfp4 weights x mxfp8
    activations): the GEMM at the device's MXFP8 rate (B200: 4.5 PFLOP/s dense, half its 9 PFLOP/s FP4), the weights
    read at MXFP4's 4.25 bits (17/32 B against bf16's 2 B); on an H200 (no MXFP8 engine) the W4A16 fallback: the
    bf16 rate, the same weight bytes."""
    b200 = get_hardware("b200")
    p = resolve_precision(b200, "w4a8-mxfp4")
    assert p.matrix == "mxfp8" and p.fallback_policy is None
    assert p.matrix_peak_flops_per_s == b200.matrix_peak_flops_per_s["mxfp8"].value == 4.5e15
    assert p.weight_scale == pytest.approx((17 / 32) / 2)
    h = resolve_precision(get_hardware("h200"), "w4a8-mxfp4")
    assert h.matrix == "bf16" and h.fallback_policy is not None and h.weight_scale == pytest.approx((17 / 32) / 2)
    assert "W4A16" in h.fallback_policy.weights
