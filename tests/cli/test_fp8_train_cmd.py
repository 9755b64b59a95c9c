"""opmap analyze / plan --phase train --dtype fp8: priced as Transformer Engine runs it on a device with an fp8
matrix engine, refused in one line (before any capture) on one without."""

from __future__ import annotations

import json

NEEDLE = "fp8 training needs an fp8 matrix engine (Hopper, Ada or later"


def test_fp8_training_refused_on_a100_before_capture(refused, fail_if_called):
    fail_if_called("opmap.phases.step.capture_phase")
    line = refused("analyze", "gpt2", "--phase", "train", "--dtype", "fp8", "-H", "a100-sxm-80gb", "--no-store",
                   needle=NEEDLE)
    assert line.endswith("accepted for training on it: bf16, fp16, tf32, fp32")


def test_fp8_plan_refused_on_a100_before_capture(refused, fail_if_called):
    fail_if_called("opmap.explore.plan.plan")
    refused("plan", "gpt2", "--dtype", "fp8", "-H", "a100-sxm-80gb", "--devices", "8", "--no-store", needle=NEEDLE)


def test_fp8_inference_on_a100_still_weight_only(tmp_path, cli):
    rc, out, err = cli("analyze", "gpt2", "--seq", "32", "--dtype", "fp8", "-H", "a100-sxm-80gb", "--no-store")
    assert rc == 0, err
    assert "weight-only" in out


def test_fp8_training_writes_what_is_fp8(tmp_path, cli):
    rc, out, err = cli("analyze", "gpt2", "--phase", "train", "--dtype", "fp8", "--seq", "128", "--out", tmp_path,
                       "--no-store")
    assert rc == 0, err
    d = json.loads((tmp_path / "analysis.json").read_text())
    f = d["assumptions"]["fp8_training"]
    # GPT-2: 12 blocks of 4 Linear layers (c_attn, c_proj, c_fc, mlp c_proj), three GEMMs each; the tied LM head
    # and the attention core stay bf16
    assert f["fp8_gemms"] == 12 * 4 * 3
    assert any(x.startswith("LM head") for x in f["bf16"]) and any(x.startswith("attention core") for x in f["bf16"])
    casts = [k for k in d["kernels"] if str(k.get("format", "")).startswith("bf16 -> fp8")]
    # per block: 4 activation casts (c_attn, attn c_proj, c_fc, mlp c_proj each read a distinct input), 4 output
    # gradients, 4 weights
    assert len(casts) == 12 * (4 + 4 + 4)  # activation, output-gradient and weight casts per block
    assert d["phase"]["fp8"]["cast_kernels"] == len(casts)
    assert "fp8 GEMMs" in d["phase"]["text"] and "fp8: fp8 training (Transformer Engine)" in out
    assert d["memory"]["per_device"]["weights_bytes"] == 4.0 * d["totals"]["params"]
