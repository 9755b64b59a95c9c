"""opmap sweep: the sweep.json contract, the knee and Pareto marks, bad input in one line."""

from __future__ import annotations

import json

import pytest


def test_sweep_writes_the_contract(tmp_path, cli):
    rc, out, err = cli("sweep", "gpt2", "--batch", "1,2,8", "--seq", "32,64", "--out", tmp_path)
    assert rc == 0, err
    d = json.loads((tmp_path / "sweep.json").read_text())
    assert len(d["points"]) == 6 and d["points_per_s"] > 0 and {"knee", "pareto"} <= set(d)
    keys = {"batch", "seq", "phase", "latency_s", "latency_p50_s", "latency_p95_s", "latency_p99_s",
            "throughput_per_s", "tokens_per_s", "bound_mix", "mfu", "fits", "method", "energy_j", "energy_window_s",
            "power_w", "energy_per_token_j", "tokens_per_j", "power_method"}
    assert all(keys <= set(p) for p in d["points"])
    # a larger batch at one sequence length is never faster in latency and never lower in throughput here
    for s in (32, 64):
        ps = sorted((p for p in d["points"] if p["seq"] == s), key=lambda p: p["batch"])
        assert all(a["latency_s"] <= b["latency_s"] for a, b in zip(ps, ps[1:]))
    assert "pareto" in out and (tmp_path / "sweep.md").exists()


def test_measured_sweep_reports_its_energy_or_why_not(tmp_path, cli, session_calibration):
    rc, out, err = cli("sweep", "gpt2", "--batch", "1", "--seq", "8", "--measure", "--repeats", "2", "--out", tmp_path,
                       "--hardware", session_calibration)
    assert rc == 0, err
    (p,) = json.loads((tmp_path / "sweep.json").read_text())["points"]
    assert p["power_method"].startswith(("measured (RAPL", "modelled: ", "not measured: "))
    assert (p["energy_j"] is None) == p["power_method"].startswith("not measured")
    assert "energy: " in out and "J/token" in out


def test_sweep_refuses_bad_input(refused):
    refused("sweep", "gpt2", "--batch", "1,x", needle="--batch takes comma-separated positive integers")
    refused("sweep", "gpt2", "--engine", "spark", needle="unknown engine 'spark'; accepted: local, ray")
    refused("sweep", "resnet50", "--phase", "decode", "--batch", "1", "--seq", "8",
            needle="vision model: it has no decode phase")


def test_a_measured_batch_beyond_memory_is_refused_before_it_is_built(refused, fail_if_called, session_calibration):
    """gpt2 at batch 100000 x seq 64: the logits alone are 100000 x 64 x 50257 x 4 B = 1.29 TB; refused from the
    meta capture's sizes, before a real tensor is allocated (it was killed by the OOM killer)."""
    fail_if_called("opmap.explore.sweep._measure")
    refused("sweep", "gpt2", "--measure", "--batch", "100000", "--seq", "64", "--repeats", "2",
            "--hardware", session_calibration, needle="sweep --measure at batch 100000 x seq 64 needs at least")


def test_sweep_refuses_a_layout_or_runtime_it_cannot_measure(refused):
    refused("sweep", "gpt2", "--measure", "--tp", "2", needle="--measure times one local device: --tp 2 x --pp 1")
    refused("sweep", "gpt2", "--measure", "--runtime", "graphs", needle="--runtime graphs is for predicted sweeps")
    refused("sweep", "gpt2", "--pp", "0", needle="--pp")


TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}


@pytest.mark.parametrize("kind", ["zoo", "hf-config"])
def test_measured_rows_carry_the_dtype_run_and_the_hardware_of_each_figure(tmp_path, cli, session_calibration, kind):
    """`sweep --measure` labelled its fp32 runs bf16 (the predicted default) and set the H100's prediction beside a
    CPU's timing. Each measured row now names the dtype run and this CPU, its prediction the same CPU's calibrated
    profile at that dtype; the table shows both."""
    pytest.importorskip("transformers")
    target = "gpt2"
    if kind == "hf-config":
        (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
        target = str(tmp_path / "config.json")
    rc, out, err = cli("sweep", target, "--batch", "1,2", "--seq", "8", "--measure", "--repeats", "2",
                       "--hardware", session_calibration, "--out", tmp_path / "o")
    assert rc == 0, err
    d = json.loads((tmp_path / "o" / "sweep.json").read_text())
    assert d["dtype"] == "fp32" and d["hardware"] == "local" and d["measured_on"].startswith("this CPU (")
    for p in d["points"]:
        assert p["dtype"] == "fp32" and p["hardware"] == d["measured_on"]
        assert p["predicted"]["hardware"] == "local" and p["predicted"]["dtype"] == "fp32"
    text = " ".join(out.split())
    assert f"on {d['measured_on']}, measured beside its prediction on local (prefill, fp32" in text
    md = (tmp_path / "o" / "sweep.md").read_text()
    assert f"| 1 | 8 | {d['measured_on']} | fp32 |" in md and "| local |" in md


def test_a_measured_sweep_predicts_this_cpu_by_default_and_refuses_another_device(empty_cache_sweep, cli, refused,
                                                                                  stand_in_calibration):
    refused("sweep", "gpt2", "--measure", "--hardware", "h100-sxm", "--batch", "1", "--seq", "8",
            needle="--measure times this CPU: the prediction beside it must be for this CPU, not h100-sxm (gpu)")
    refused("sweep", "gpt2", "--measure", "--dtype", "int8", needle="--measure runs torch dtypes on this CPU")
    assert stand_in_calibration == []
    rc, out, err = cli("sweep", "gpt2", "--measure", "--batch", "1", "--seq", "8", "--repeats", "1",
                       "--out", empty_cache_sweep / "o")
    assert rc == 0, err
    assert stand_in_calibration == [("cpu", False)] and "no calibration for cpu yet" in out
    d = json.loads((empty_cache_sweep / "o" / "sweep.json").read_text())
    assert d["hardware"] == "local" and d["points"][0]["predicted"]["hardware"] == "local"


@pytest.fixture
def empty_cache_sweep(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path
