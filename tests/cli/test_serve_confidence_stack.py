"""serve's confidence label and --stack (issue 39). The label follows the kinds of the catalog figures that priced
the run (DESIGN.md: calibrated / anchored / datasheet, naming the weakest input): H100 SXM's bf16 GEMM rate and
memory bandwidth are published measurements (mamf-finder; its catalog file), B300's bf16 rate is the datasheet's
dense peak. A stack profile fitted on this device makes it calibrated, and its decode scale multiplies every decode
step: at a load where requests never overlap, TPOT doubles with decode x2 (prefill x1, no host times)."""

from __future__ import annotations

import json

import pytest

from opmap.calibrate.stack_profile import FitRun, StackProfile, write_stack_profile
from opmap.cli import main

TINY = "examples/tiny-llama.json"
LIGHT = ["--requests", "8", "--arrival", "poisson:0.05", "--input-len", "64", "--output-len", "32", "--policy",
         "continuous", "--no-store"]


def _serve(tmp_path, name, *args):
    out = tmp_path / name
    assert main(["serve", TINY, *LIGHT, "--out", str(out), *map(str, args)]) == 0
    return json.loads((out / "serve.json").read_text())


def _profile(tmp_path, device, decode_scale=2.0):
    p = StackProfile(device, TINY, "bf16", "engine", 0.0, 0.0, 0.0, decode_scale, 1.0, None, None, None,
                     (FitRun("c1", "closed", 1, None, 8),), source="test profile")
    return write_stack_profile(p, tmp_path / f"{device}.json")


def test_the_label_names_the_weakest_catalog_figure(tmp_path):
    h100 = _serve(tmp_path, "h100", "--hardware", "h100-sxm")["assumptions"]["confidence"]
    assert h100["label"] == "anchored" and h100["weakest"]["kind"] == "measured"
    assert h100["line"].startswith("confidence: anchored (weakest input: ")
    b300 = _serve(tmp_path, "b300", "--hardware", "b300")["assumptions"]["confidence"]
    assert b300["label"] == "datasheet"
    assert (b300["weakest"]["name"], b300["weakest"]["kind"]) == ("matrix rate bf16", "datasheet_dense")


def test_a_stack_profile_scales_the_steps_and_calibrates_the_label(tmp_path):
    base = _serve(tmp_path, "base", "--hardware", "h100-sxm")
    prof = _serve(tmp_path, "prof", "--hardware", "h100-sxm", "--stack", _profile(tmp_path, "h100-sxm"))
    assert prof["latency"]["tpot"]["p50_s"] == pytest.approx(2 * base["latency"]["tpot"]["p50_s"], rel=0.01)
    c = prof["assumptions"]["confidence"]
    assert c["label"] == "calibrated" and c["weakest"]["name"] == "stack profile"
    other = _serve(tmp_path, "other", "--hardware", "h100-sxm", "--stack", _profile(tmp_path, "b200"))
    assert other["assumptions"]["confidence"]["label"] == "datasheet"  # fitted on another device: an assumption
    assert "another device than h100-sxm" in other["assumptions"]["confidence"]["weakest"]["source"]


def test_a_stack_with_a_service_time_is_one_line(tmp_path, capsys):
    rc = main(["serve", TINY, "--service-time", "fixed:10", "--policy", "none", "--stack",
               str(_profile(tmp_path, "h100-sxm")), "--no-store"])
    assert rc == 2 and "--stack scales the cost model's steps" in capsys.readouterr().err
