"""``opmap analyze --ep N [--dp-attention] [--ep-imbalance F]`` for inference: the layouts run end to end on the zoo's
Mixtral 8x7B (8 experts, top 2, hidden 4096, bf16) and bad input is one line and exit 2."""

from __future__ import annotations

import json

import pytest

from opmap.mapping.expert_parallel import default_imbalance

MIX = ("mixtral-8x7b", "--phase", "decode", "--kv-len", "256", "--hardware", "h200", "--no-store")


@pytest.mark.parametrize("args,words", [
    (("--dp-attention",), "--dp-attention runs the attention data-parallel over the EP ranks: it needs --ep above 1"),
    (("--ep", "2", "--dp", "2", "--ep-imbalance", "0.5"), "--ep-imbalance must be a number from 1 to 2"),
    (("--ep", "2", "--dp-attention", "--batch", "3"), "--batch 3 must be a multiple of 2"),
    (("--ep", "4", "--tp", "2", "--dp", "2"), "--ep 4 must divide --dp 2"),
])
def test_bad_ep_options_are_one_line(cli, args, words):
    rc, _, err = cli("analyze", *MIX, *args)
    assert rc == 2 and words in err and "Traceback" not in err, err


def test_ep_over_tp_refused_for_training(cli, fail_if_called):
    """Refused from the options alone, before the model is built or captured (that took 50 s for Mixtral)."""
    fail_if_called("opmap.api.Model.phase")
    rc, _, err = cli("analyze", "mixtral-8x7b", "--phase", "train", "--seq", "64", "--tp", "2", "--ep", "2",
                     "--no-store")
    assert rc == 2 and "must divide --dp 1 for training" in err, err


def test_dp_attention_dispatches_each_ranks_tokens(cli, tmp_path):
    """16 sequences over 2 attention ranks: 8 tokens a rank x top 2 x 4096 x 2 bytes, x the default imbalance for
    the busiest rank, one dispatch and one combine per layer (32 layers)."""
    rc, out, err = cli("analyze", *MIX, "--batch", "16", "--ep", "2", "--dp-attention", "--out", tmp_path)
    assert rc == 0, err
    a = json.loads((tmp_path / "analysis.json").read_text())
    a2a = [c for c in a["collectives"] if c["collective"] == "all_to_all"]
    assert len(a2a) == 1 and a2a[0]["count"] == 64 and a2a[0]["group_size"] == 2
    assert a2a[0]["message_bytes"] == pytest.approx(8 * 2 * 4096 * 2 * default_imbalance().value, rel=1e-12)
    assert "dp2 ep2 dpa" in out
    sh = a["parallelism"]
    assert sh["dp_attention"] is True and sh["ep_imbalance"] == default_imbalance().value
    assert any("lmsys.org/blog/2025-05-05-large-scale-ep" in x for x in sh["assumptions"])


def test_ep_over_tp_has_no_all_to_all(cli, tmp_path):
    rc, out, err = cli("analyze", *MIX, "--batch", "16", "--tp", "2", "--ep", "2", "--ep-imbalance", "1.5", "--out",
                       tmp_path)
    assert rc == 0, err
    a = json.loads((tmp_path / "analysis.json").read_text())
    kinds = {c["collective"] for c in a["collectives"]}
    assert "all_to_all" not in kinds and "all_reduce" in kinds
    assert "tp2 pp1 dp1 ep2 imb1.5" in out


def test_plan_prices_inference_ep_layouts(cli, tmp_path):
    """plan --phase prefill of a MoE config (Qwen3-30B-A3B cut to 2 layers) on 4 GPUs lays experts over the dp ranks
    (DP attention, at the default imbalance) and over the tp group; every such layout holds E / ep experts a
    device."""
    from hf_family_configs import QWEN3_30B_A3B, shallow

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(shallow(QWEN3_30B_A3B, 2)))
    rc, _, err = cli("plan", cfg, "--devices", "4", "--phase", "prefill", "--seq", "128", "--rows", "0",
                     "--hardware", "h200", "--no-store", "--out", tmp_path / "p")
    assert rc == 0, err
    doc = json.loads((tmp_path / "p" / "plan.json").read_text())
    rows = doc["ranked"] + doc["rejected"]
    dpa = [r for r in rows if r["ep"] == 4 and r.get("dp_attention")]
    over_tp = [r for r in rows if r["ep"] == 4 and r["tp"] == 4]
    assert dpa and over_tp and all(r["ok"] for r in dpa + over_tp)
    assert all(r["ep_imbalance"] == default_imbalance().value for r in dpa + over_tp)
    assert all("ep_imbalance" not in r for r in rows if r["ep"] == 1)


def test_serve_takes_ep_over_its_tp_group(cli, tmp_path):
    rc, _, err = cli("serve", "mixtral-8x7b", "--hardware", "h200", "--tp", "2", "--ep", "2", "--ep-imbalance", "1.5",
                     "--requests", "20", "--input-len", "128", "--output-len", "16", "--arrival", "poisson:5",
                     "--no-store", "--out", tmp_path)
    assert rc == 0, err
    s = json.loads((tmp_path / "serve.json").read_text())
    assert s["assumptions"]["layout"] == {"tp": 2, "pp": 1, "replicas": 1, "ep": 2, "ep_imbalance": 1.5}
    rc, _, err = cli("serve", "mixtral-8x7b", "--hardware", "h200", "--tp", "2", "--ep", "2", "--ep-imbalance", "3",
                     "--no-store")
    assert rc == 2 and "--ep-imbalance must be a number from 1 to 2" in err


@pytest.mark.parametrize("args,words", [
    (("--tp", "2"), "--dp-attention runs the attention data-parallel over the EP ranks: it needs --ep above 1"),
    (("--tp", "4", "--ep", "2"), "--ep must equal --tp (the replica's devices), got --ep 2 --tp 4"),
    (("--tp", "4", "--ep", "3"), "--ep must equal --tp (the replica's devices), got --ep 3 --tp 4"),
    (("--tp", "2", "--ep", "2", "--pp", "64"), "--pp 64 exceeds the 32 layers of mixtral-8x7b"),
    (("--tp", "2", "--ep", "2", "--policy", "static:4"), "use --policy engine, continuous or chunked, got 'static:4'"),
    (("--tp", "2", "--ep", "2", "--router", "shared"), "use --router round_robin or least_loaded, not shared"),
    (("--tp", "2", "--ep", "2", "--disaggregate", "1:1"), "drop --disaggregate"),
    (("--tp", "2", "--ep", "2", "--service-time", "fixed:10"), "drop --service-time"),
])
def test_serve_dp_attention_bad_input_is_one_line(cli, args, words):
    rc, _, err = cli("serve", "mixtral-8x7b", "--hardware", "h200", "--dp-attention", *args, "--no-store")
    assert rc == 2 and words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_serve_runs_dp_attention_ranks(cli, tmp_path):
    """Mixtral over 2 H200s as 2 attention ranks: the layout and the per-rank KV pool are written, the memory line
    and the DP-attention line printed."""
    rc, out, err = cli("serve", "mixtral-8x7b", "--hardware", "h200", "--tp", "2", "--ep", "2", "--dp-attention",
                       "--requests", "20", "--input-len", "128", "--output-len", "16", "--arrival", "poisson:5",
                       "--no-store", "--out", tmp_path)
    assert rc == 0, err
    s = json.loads((tmp_path / "serve.json").read_text())
    lay = s["assumptions"]["layout"]
    assert lay["dp_attention"] is True and lay["attention_ranks"] == 2 and lay["ep"] == 2 and lay["tp"] == 2
    m = s["assumptions"]["memory"]
    assert m["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2  # Mixtral's whole KV a token on each rank: no TP split
    assert "DP attention: 2 attention ranks a replica" in out and "memory per device" in out


def test_serve_runs_dp_attention_ranks_over_pipeline_stages(cli, tmp_path):
    """Mixtral as DEP2 PP2 (TensorRT-LLM's layout on 4 GPUs): 2 attention ranks of 2 stages each, each device holding
    16 of the 32 layers' KV (2 x 16 x 8 x 128 x 2 bytes a token)."""
    rc, out, err = cli("serve", "mixtral-8x7b", "--hardware", "h200", "--tp", "2", "--ep", "2", "--dp-attention",
                       "--pp", "2", "--requests", "20", "--input-len", "128", "--output-len", "16", "--arrival",
                       "poisson:5", "--no-store", "--out", tmp_path)
    assert rc == 0, err
    s = json.loads((tmp_path / "serve.json").read_text())
    lay = s["assumptions"]["layout"]
    assert lay["dp_attention"] is True and lay["attention_ranks"] == 2 and lay["pp"] == 2 and lay["tp"] == 2
    assert s["assumptions"]["memory"]["kv_bytes_per_token"] == 2 * 16 * 8 * 128 * 2
    assert "DP attention: 2 attention ranks a replica" in out
