"""The closure memo of fit, plan, sweep and serve runs: findings that make sense for each, owners by the rule."""

from __future__ import annotations

import pytest

from opmap.errors import OpmapError
from opmap.report.memo import memo_markdown, memo_parts


def _run(kind, payload, **tags):
    return {"id": "r9", "kind": kind, "time_utc": "2026-12-04T00:00:00+00:00",
            "tags": {"workload": "gpt2", "hardware": "h100-sxm", "phase": "serve", "precision": "bf16", **tags},
            "payload": payload}


def _cell(hw, rank, tput, bound="memory", reason="", risk="low"):
    return {"model": "gpt2", "hardware": hw, "devices": 1, "throughput_at_slo": tput, "latency_p99_s": 0.15,
            "bound": bound, "risk": risk, "rank": rank, "excluded_reason": reason, "power_method": "modelled: x"}


def test_fit_memo_ranks_strikes_and_states_the_slo():
    cells = [_cell("h100-sxm", 1, 3000.0), _cell("a100-pcie-40gb", 2, 1000.0, bound="overhead"),
             _cell("l4", None, None, reason="does not fit on up to 8 devices in a node: weights 40 GB")]
    run = _run("fit", {"cells": cells, "requests": 500, "slo": {"kind": "ttft_tpot_p99", "ttft_s": 2.0,
                                                                 "tpot_s": 0.2}})
    fs, pits = memo_parts(run)
    first, struck, slo = fs
    # the winner's throughput over the runner-up's: 3000 / 1000 = x3; its bound (memory) -> the ML compiler owner
    assert "h100-sxm ranks first" in first["finding"] and "x3 the runner-up a100-pcie-40gb" in first["finding"]
    assert first["owner"] == "ML compiler" and first["expected_gain"].startswith("x3 tokens/s")
    assert struck["finding"] == "gpt2 on l4 struck: does not fit on up to 8 devices in a node: weights 40 GB"
    assert struck["owner"] == "runtime"
    assert "p99 TTFT 2000 ms, p99 TPOT 200 ms" in slo["finding"] and "leaves 2 of 3 platforms" in slo["finding"]
    checks = {c["check"]: c["verdict"] for c in pits}
    assert checks["a p99 over too few requests"].startswith("flag: 500 requests")
    assert checks["power modelled, not measured"].startswith("flag: 3 of 3")
    md = memo_markdown(run, fs, pits, "opmap memo r9")
    assert "| x3 tokens/s at the SLO over a100-pcie-40gb (from the model) |" in md


def _layout(layout, tp, pp, tps, step, bubble=0.0, mfu=0.3, mem=2e9):
    return {"layout": layout, "tp": tp, "pp": pp, "dp": 8 // (tp * pp), "ep": 1, "tokens_per_s": tps, "step_s": step,
            "bubble_fraction": bubble, "mfu": mfu, "memory_bytes": mem, "capacity_bytes": 80e9}


def test_plan_memo_says_the_best_layout_and_why():
    ranked = [_layout("tp1 pp2 dp4 mb2 z1", 1, 2, 1000.0, 1.0, bubble=0.2, mem=3e9),
              _layout("tp1 pp2 dp4 mb2 z2", 1, 2, 1000.0, 1.0, bubble=0.2, mem=2e9),
              _layout("tp2 pp1 dp4 mb2 z1", 2, 1, 800.0, 1.25, mfu=0.24)]
    rejected = [{"layout": "tp1 pp1 dp8", "reason": "does not fit: 90 GB of 80 GB memory"}]
    run = _run("plan", {"ranked": ranked, "rejected": rejected, "objective": "throughput",
                        "assumptions": ["TP / SP / EP / PP collectives not overlapped with compute (overlap 0%)"]},
               phase="train")
    fs, pits = memo_parts(run)
    best, bubble, memory = fs
    # why: against the best layout of another (tp, pp, dp, ep) shape: 1000 / 800 = x1.25, the step 1.25 - 1.0 s
    assert "why: ahead of the best other shape tp2 pp1 dp4 mb2 z1 (x1.25 tokens/s)" in best["finding"]
    assert "MFU 30.0% vs 24.0%" in best["finding"] and best["expected_gain_s"] == pytest.approx(0.25)
    assert best["owner"] == "runtime"
    # a 20% bubble of a 1 s step: 0.2 s to win back with more microbatches
    assert bubble["expected_gain_s"] == pytest.approx(0.2) and "(--vp)" in bubble["fix"]
    assert memory["finding"].startswith("1 of 1 rejected layouts fail on memory")
    checks = {c["check"]: c["verdict"] for c in pits}
    assert "2 layouts tie" in checks["ties at the top"] and "tp1 pp2 dp4 mb2 z2 (2 GB)" in checks["ties at the top"]
    assert checks["overlap of collectives assumed"].startswith("flag: TP / SP / EP / PP collectives")


def test_sweep_memo_finds_the_knee_and_its_bound():
    pts = [{"batch": 1, "seq": 128, "latency_s": 1e-3, "tokens_per_s": 128e3, "bound_mix": {"overhead": 0.9},
            "fits": True, "latency_p99_s": None},
           {"batch": 4, "seq": 128, "latency_s": 1.5e-3, "tokens_per_s": 341e3,
            "bound_mix": {"memory": 0.7, "overhead": 0.3}, "fits": True, "latency_p99_s": None},
           {"batch": 16, "seq": 128, "latency_s": 5e-3, "tokens_per_s": 410e3, "bound_mix": {"compute": 0.6},
            "fits": False, "latency_p99_s": None}]
    run = _run("sweep", {"points": pts, "knee": [{"batch": 4, "seq": 128}], "pareto": pts}, phase="prefill")
    fs, pits = memo_parts(run)
    knee, bound, unfit = fs
    # x(341 / 128) = x2.66 the tokens/s for x1.5 the latency; capping there saves 5 - 1.5 = 3.5 ms against batch 16
    assert "knee at batch 4, seq 128" in knee["finding"] and "x2.66 the tokens/s of batch 1 for x1.5" in knee["finding"]
    assert knee["owner"] == "runtime" and knee["expected_gain_s"] == pytest.approx(3.5e-3)
    assert bound["finding"] == "at the knee 70% of the time is memory-bound" and bound["owner"] == "ML compiler"
    assert unfit["finding"].startswith("1 of 3 points do not fit memory, from batch 16")
    assert [c["verdict"][:4] for c in pits] == ["flag", "flag", "flag"]


def test_serve_memo_gives_the_slo_verdict_and_the_tail():
    lat = {"e2e": {"p50_s": 1.0, "p99_s": 3.0}, "ttft": {"p99_s": 2.0}, "queue": {"p99_s": 1.5}}
    run = _run("serve", {"validity": {"verdict": "INVALID", "reason": "p99 TPOT 250 ms > 200 ms"}, "latency": lat,
                         "utilization": [0.95], "requests": {"count": 2000},
                         "assumptions": {"kv_cache": "reserved in full (input + output) at admission, no preemption"}})
    fs, pits = memo_parts(run)
    slo, tail = fs
    # a TPOT miss: the decode step, memory-bound -> the ML compiler owner
    assert slo["finding"] == "SLO INVALID: p99 TPOT 250 ms > 200 ms" and slo["owner"] == "ML compiler"
    # queueing 1.5 s of a 2 s p99 TTFT: 75%, a queueing tail -> the runtime owner
    assert "x3 the p50" in tail["finding"] and "queueing is 75% of the p99 TTFT" in tail["finding"]
    assert tail["owner"] == "runtime" and "replicas" in tail["fix"] and tail["expected_gain_s"] == 1.5
    checks = {c["check"]: c["verdict"] for c in pits}
    assert checks["a p99 over too few requests"] == "ok: 2000 requests"
    assert checks["the memory tail (KV pressure, preemption)"].startswith("flag")


def test_a_kind_without_rules_is_refused_and_a_bare_result_gives_no_crash():
    with pytest.raises(OpmapError, match="no memo rules for a quality run"):
        memo_parts(_run("quality", {}))
    for kind in ("fit", "plan", "sweep", "serve", "shape-check", "calibrate"):
        fs, pits = memo_parts(_run(kind, {"cells": "?", "ranked": 3, "points": None, "latency": []}))
        assert isinstance(memo_markdown(_run(kind, {}), fs, pits, "opmap memo r9"), str)


def test_the_heading_names_only_what_the_run_has():
    """A bench run names a served model and an endpoint but no phase or precision, and a folder's time may be
    unknown: the heading and the evidence line leave those out instead of printing "None"."""
    run = {"id": "out/b", "kind": "bench", "time_utc": None, "tags": {"workload": "Qwen/Qwen2.5-7B",
                                                                     "hardware": None, "phase": "bench"}}
    fs, pits = memo_parts({**run, "payload": {}})
    text = memo_markdown(run, fs, pits, "opmap memo out/b", folder=True)
    assert "None" not in text
    assert text.splitlines()[0] == "# Closure memo: Qwen/Qwen2.5-7B (bench)"
    assert "Evidence: the bench output in out/b; reproduce" in text
    bare = memo_markdown({"id": "r1", "kind": "serve", "time_utc": None, "tags": {}}, [], [], "opmap memo r1")
    assert bare.splitlines()[0] == "# Closure memo: a serve run" and "run r1 (serve) in the run store" in bare
