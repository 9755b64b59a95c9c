"""opmap quality: bad input refused before the fp32 build (the library's end to end test is in measure/)."""

from __future__ import annotations

import json


def test_bad_dtype_fails_before_the_build(refused, fail_if_called):
    fail_if_called("opmap.workloads.load_workload")
    refused("quality", "gpt2", "--dtype", "fp32", needle="accepted: bf16, fp16, fp8, int8, int4 (got 'fp32')")


def test_shape_knob_of_the_wrong_kind(refused, fail_if_called):
    fail_if_called("opmap.workloads.load_workload")
    refused("quality", "resnet50", "--dtype", "int8", "--seq", "16", needle="takes --image-size, not --seq")


def test_writes_quality_json(tmp_path, cli, tiny_model):
    rc, out, err = cli("quality", tiny_model, "--dtype", "int8", "--out", tmp_path)
    assert rc == 0, err
    assert "int8 against fp32 on the same inputs (seed 0)" in out and "wrote " in out
    assert json.loads((tmp_path / "quality.json").read_text())["workload"] == "tiny.py:tiny"
