"""opmap analyze / profile with an ONNX file: the sheet and JSON of any analysis; bad files and options refused in one
line with exit status 2, nothing written."""

from __future__ import annotations

import json


def test_analyze_onnx_writes_the_usual_outputs(onnx_zoo, cli, tmp_path):
    path = onnx_zoo["gpt2"][0]
    rc, out, err = cli("analyze", path, "--seq", "32", "--batch", "2", "--dtype", "bf16", "-H", "h100-sxm",
                       "--out", tmp_path, "--no-store")
    assert rc == 0, err
    assert {p.name for p in tmp_path.iterdir()} == {"analysis.json", "sheet.csv", "sheet.md", "kernels.csv"}
    d = json.loads((tmp_path / "analysis.json").read_text())
    assert d["schema_version"] >= 1 and d["assumptions"]["workload"] == "gpt2.onnx"
    assert d["assumptions"]["batch"] == 2 and d["assumptions"]["seq"] == 32 and d["assumptions"]["dtype"] == "bf16"
    assert any("dynamic dims bound: batch=2, seq=32" in n for n in d["assumptions"]["workload_notes"])
    assert {n["op"] for n in d["nodes"]} >= {"aten.linear.default", "aten.scaled_dot_product_attention.default"}
    # bf16 pricing: a bf16 activation is 2 bytes
    emb = next(n for n in d["nodes"] if n["op"] == "aten.embedding.default")
    assert emb["outputs"][0]["dtype"] == "bfloat16"
    assert "Kernels (eager)" in out and "Layer types" in out


def test_dim_binds_by_name_and_the_run_is_stored(onnx_zoo, cli, tmp_path):
    store = tmp_path / "runs.duckdb"
    rc, _, err = cli("analyze", onnx_zoo["bert"][0], "--dim", "seq=16", "--dim", "batch=3", "-H", "h100-sxm",
                     "--out", tmp_path, "--store", store)
    assert rc == 0, err
    rc, out, err = cli("runs", "list", "--store", store)
    assert rc == 0 and "bert.onnx" in out, err
    d = json.loads((tmp_path / "analysis.json").read_text())
    assert [n for n in d["nodes"] if n["op"] == "aten.embedding.default"][0]["outputs"][0]["shape"] == [3, 16, 64]
    assert d["assumptions"]["batch"] == 3 and d["assumptions"]["seq"] == 16


def test_bad_onnx_input_one_line_exit_2(onnx_zoo, refused, tmp_path):
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(onnx_zoo["gpt2"][0].read_bytes()[:5000])
    gpt2 = onnx_zoo["gpt2"][0]
    out = tmp_path / "out"
    for args, needle in [
        ((cut, "--seq", "8"), "truncated, malformed or of another format"),
        ((tmp_path / "none.onnx",), "does not exist"),
        ((gpt2,), "dynamic dims 'seq' are unbound"),
        ((gpt2, "--dim", "seq"), "expected NAME=VALUE"),
        ((gpt2, "--dim", "heads=2", "--seq", "8"), "has no dynamic dim of that name"),
        ((gpt2, "--seq", "8", "--phase", "decode"), "--phase decode needs a PyTorch module"),
        ((gpt2, "--seq", "8", "--layout", "channels_last"), "keeps its own layout"),
        (("gpt2", "--dim", "seq=8"), "accepted with path/to/model.onnx only"),
    ]:
        refused("analyze", *args, "-H", "h100-sxm", "--out", out, "--no-store", needle=needle)
        assert not out.exists()


def test_profile_onnx_refusals(onnx_zoo, refused):
    gpt2 = onnx_zoo["gpt2"][0]
    refused("profile", gpt2, "--seq", "8", "-H", "h100-sxm", "--dtype", "fp16", "--no-store",
            needle="stores its weights in fp32 and onnxruntime runs them so: profile it with --dtype fp32")
    refused("profile", gpt2, "--seq", "8", "-H", "h100-sxm", "--train", "--no-store", needle="drop --train")


def test_profile_onnx_writes_profile_json(onnx_zoo, cli, tmp_path):
    rc, out, err = cli("profile", onnx_zoo["resnet50"][0], "-H", "h100-sxm", "--iters", "2", "--profile-iters", "2",
                       "--warmup", "1", "--out", tmp_path, "--no-store")
    assert rc == 0, err
    d = json.loads((tmp_path / "profile.json").read_text())
    assert d["kind"] == "profile" and d["latency"]["p50_s"] > 0
    assert d["profiler"]["coverage"] >= 0.9
    convs = [n for n in d["nodes"] if n["op"] == "aten.convolution.default"]
    assert len(convs) == 53 and all(n["measured"] and n["measured"]["measured_s"] > 0 for n in convs)
