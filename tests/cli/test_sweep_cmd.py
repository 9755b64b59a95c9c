"""opmap sweep: the sweep.json contract, the knee and Pareto marks, bad input in one line."""

from __future__ import annotations

import json


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


def test_measured_sweep_reports_its_energy_or_why_not(tmp_path, cli):
    rc, out, err = cli("sweep", "gpt2", "--batch", "1", "--seq", "8", "--measure", "--repeats", "2", "--out", tmp_path)
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


def test_a_measured_batch_beyond_memory_is_refused_before_it_is_built(refused, fail_if_called):
    """gpt2 at batch 100000 x seq 64: the logits alone are 100000 x 64 x 50257 x 4 B = 1.29 TB; refused from the
    meta capture's sizes, before a real tensor is allocated (it was killed by the OOM killer)."""
    fail_if_called("opmap.explore.sweep._measure")
    refused("sweep", "gpt2", "--measure", "--batch", "100000", "--seq", "64", "--repeats", "2",
            needle="sweep --measure at batch 100000 x seq 64 needs at least")


def test_sweep_refuses_a_layout_or_runtime_it_cannot_measure(refused):
    refused("sweep", "gpt2", "--measure", "--tp", "2", needle="--measure times one local device: --tp 2 x --pp 1")
    refused("sweep", "gpt2", "--measure", "--runtime", "graphs", needle="--runtime graphs is for predicted sweeps")
    refused("sweep", "gpt2", "--pp", "0", needle="--pp")
