"""``opmap bench --launch CONFIG --predict``: a real local server started, benched with exact-length prompts,
stopped; the run joined to its simulation, both in the store, ``opmap compare BENCH SERVE`` printing the join."""

from __future__ import annotations

import json
import os

import pytest

# 2-layer Llama, hidden 128, vocabulary 2048, context 1024: a CPU step of about a millisecond (as tests/bench)
TINY = {"model_type": "llama", "vocab_size": 2048, "hidden_size": 128, "intermediate_size": 352,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 1024,
        "torch_dtype": "float32"}


def test_launch_bench_predict_and_compare(cli, tmp_path, session_calibration):
    pytest.importorskip("duckdb")
    pytest.importorskip("fastapi")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    hw, store, out_dir = session_calibration, tmp_path / "runs.duckdb", tmp_path / "out"
    rc, out, err = cli("bench", "--launch", cfg, "--concurrency", 2, "--requests", 16, "--warmup", 2,
                       "--input-len", 24, "--output-len", 16, "--predict", "--hardware", hw, "--out", out_dir,
                       "--store", store, "--min-duration", 0, "--min-queries", 0)
    assert rc == 0, err
    assert "launched " in out and "stopped the server" in out and "measured vs predicted" in out
    assert "server overhead (probe" in out
    body = json.loads((out_dir / "bench.json").read_text())
    pid = body["launched"]["pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not os.path.exists(body["launched"]["model_dir"])
    u = body["usage_check"]  # exact prompts: the server counted what was asked, and answered max_tokens
    assert u["input_mismatches"] == 0 and u["output_mismatches"] == 0 and body["requests"]["ok"] == 16
    pred = json.loads((out_dir / "bench_predict.json").read_text())
    assert pred["schema_version"] == 1 and pred["workload"]["requests"] == 18 and pred["workload"]["warmup"] == 2
    assert set(pred["predictions"]) == {"model", "model+overhead"}

    rc, listed, _ = cli("runs", "list", "--json", "--store", store)
    runs = {r["kind"]: r for r in json.loads(listed)}
    assert set(runs) >= {"bench", "serve"} and runs["serve"]["tags"]["predicted_from"] == "bench"
    rc, cmp_out, err = cli("compare", runs["bench"]["id"], runs["serve"]["id"], "--store", store, "--json")
    assert rc == 0, err
    joined = json.loads(cmp_out)
    # the store's join is the one bench --predict printed (with the measured overhead)
    assert joined["rows"] == pred["predictions"]["model+overhead"]["rows"]
    rc, cmp_out, err = cli("compare", runs["serve"]["id"], runs["bench"]["id"], "--store", store)
    assert rc == 0 and "measured vs predicted" in cmp_out and "ttft p50" in cmp_out, err


@pytest.mark.parametrize("args, needle", [
    (["http://127.0.0.1:9", "--launch", "x.json"], "give --launch CONFIG or a URL, not both"),
    ([], "needs a URL"),
    (["http://127.0.0.1:9"], "--model is required"),
    (["http://127.0.0.1:9", "--model", "m", "--predict"], "--predict against a URL needs --config"),
    (["--launch", "/nonexistent/config.json"], "does not exist"),
])
def test_bad_targets_are_one_line_errors(refused, fail_if_called, args, needle):
    fail_if_called("opmap.bench.launch.write_model")
    fail_if_called("opmap.bench.client.run_load")
    refused("bench", *args, needle=needle)


def test_the_prediction_is_priced_to_the_loads_longest_prompt(tmp_path):
    """bench --predict prices before the load is drawn: its prefill points reach the longest prompt the length spec
    draws (Length.longest), as serve's do, past the default points (to 2048), so a 6000-token prompt's causal
    attention is priced at its own length (opmap.serve.model_cost.prefill_lengths: 2048, then 6000)."""
    from opmap.cli import bench_predict as bp
    from opmap.serve.arrivals import parse_length

    (tmp_path / "config.json").write_text(json.dumps({**TINY, "max_position_embeddings": 8192}))
    cfg = str(tmp_path / "config.json")
    longest = parse_length("uniform:1000,6000").longest()
    cost = bp.price(cfg, "h100-sxm", "bf16", "engine", None, longest)
    assert max(cost.prefill_tokens) == 6000
    assert max(bp.price(cfg, "h100-sxm", "bf16", "engine", None).prefill_tokens) == 2048
