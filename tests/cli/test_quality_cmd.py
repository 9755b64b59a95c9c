"""opmap quality: bad input refused before the fp32 build (the library's end to end test is in measure/)."""

from __future__ import annotations

import json


def test_bad_dtype_fails_before_the_build(refused, fail_if_called):
    fail_if_called("opmap.workloads.load_workload")
    refused("quality", "gpt2", "--dtype", "fp32",
            needle="accepted: bf16, fp16, fp8, int8, int4, fp8-block, nvfp4, mxfp8, mxfp6, mxfp4 (got 'fp32')")


def test_shape_knob_of_the_wrong_kind(refused, fail_if_called):
    fail_if_called("opmap.workloads.load_workload")
    refused("quality", "resnet50", "--dtype", "int8", "--seq", "16", needle="takes --image-size, not --seq")


def test_writes_quality_json(tmp_path, cli, tiny_model):
    rc, out, err = cli("quality", tiny_model, "--dtype", "int8", "--out", tmp_path)
    assert rc == 0, err
    assert "int8 against fp32 on the same inputs (seed 0)" in out and "wrote " in out
    assert json.loads((tmp_path / "quality.json").read_text())["workload"] == "tiny.py:tiny"


def test_zoo_quality_says_random_weights_and_analyze_repeats_it(tmp_path, cli, monkeypatch):
    """A zoo model's weights are random: quality.json, the quality table and analyze's evidence line say so."""
    import torch

    from opmap.workloads.zoo import Workload

    def small_gpt2(model, batch, seq, image_size, dtype, device):  # a stand-in for the 124M build on the CPU
        net = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50))
        return Workload("gpt2", net, (torch.zeros(batch, seq, dtype=torch.long),), batch, seq, ())

    monkeypatch.setattr("opmap.cli.quality.build_workload", small_gpt2)
    rc, out, err = cli("quality", "gpt2", "--dtype", "int8", "--seq", "8", "--out", tmp_path)
    assert rc == 0, err
    assert "(seed 0), random weights" in out
    assert json.loads((tmp_path / "quality.json").read_text())["weights"] == "random"
    rc, out, err = cli("analyze", "gpt2", "--seq", "8", "--dtype", "int8", "--quality", tmp_path / "quality.json",
                       "--out", tmp_path / "a")
    assert rc == 0, err
    assert "precision evidence: verified on random weights by" in out
    evidence = json.loads((tmp_path / "a" / "analysis.json").read_text())["assumptions"]["precision_evidence"]
    assert evidence.startswith("verified on random weights by")


def test_user_model_quality_names_its_weights(tmp_path, cli, tiny_model):
    rc, out, err = cli("quality", tiny_model, "--dtype", "int8", "--out", tmp_path)
    assert rc == 0, err
    assert json.loads((tmp_path / "quality.json").read_text())["weights"].startswith("as the model file builds")
