"""The closure memo of fit, plan, sweep and serve runs: findings that make sense for each, owners by the rule."""

from __future__ import annotations

from dataclasses import replace

import pytest

from opmap.errors import OpmapError
from opmap.report.memo import memo_markdown, memo_parts
from opmap.store.source import Run


def _run(kind, payload, **tags):
    return Run("r9", kind, "2026-12-04T00:00:00+00:00",
               {"workload": "gpt2", "hardware": "h100-sxm", "phase": "serve", "precision": "bf16", **tags}, payload,
               True)


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
    assert "h100-sxm ranks first" in first.finding and "x3 the runner-up a100-pcie-40gb" in first.finding
    assert first.owner == "ML compiler" and first.expected_gain.startswith("x3 tokens/s")
    assert struck.finding == "gpt2 on l4 struck: does not fit on up to 8 devices in a node: weights 40 GB"
    assert struck.owner == "runtime"
    assert "p99 TTFT 2000 ms, p99 TPOT 200 ms" in slo.finding and "leaves 2 of 3 platforms" in slo.finding
    checks = {c.check: c.verdict for c in pits}
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
    assert "why: ahead of the best other shape tp2 pp1 dp4 mb2 z1 (x1.25 tokens/s)" in best.finding
    assert "MFU 30.0% vs 24.0%" in best.finding and best.expected_gain_s == pytest.approx(0.25)
    assert best.owner == "runtime"
    # a 20% bubble of a 1 s step: 0.2 s to win back with more microbatches
    assert bubble.expected_gain_s == pytest.approx(0.2) and "(--vp)" in bubble.fix
    assert memory.finding.startswith("1 of 1 rejected layouts fail on memory")
    checks = {c.check: c.verdict for c in pits}
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
    assert "knee at batch 4, seq 128" in knee.finding and "x2.66 the tokens/s of batch 1 for x1.5" in knee.finding
    assert knee.owner == "runtime" and knee.expected_gain_s == pytest.approx(3.5e-3)
    assert bound.finding == "at the knee 70% of the time is memory-bound" and bound.owner == "ML compiler"
    assert unfit.finding.startswith("1 of 3 points do not fit memory, from batch 16")
    assert [c.verdict[:4] for c in pits] == ["flag", "flag", "flag"]


def test_serve_memo_gives_the_slo_verdict_and_the_tail():
    lat = {"e2e": {"p50_s": 1.0, "p99_s": 3.0}, "ttft": {"p99_s": 2.0}, "queue": {"p99_s": 1.5}}
    run = _run("serve", {"validity": {"verdict": "INVALID", "reason": "p99 TPOT 250 ms > 200 ms"}, "latency": lat,
                         "utilization": [0.95], "requests": {"count": 2000},
                         "assumptions": {"kv_cache": "reserved in full (input + output) at admission, no preemption"}})
    fs, pits = memo_parts(run)
    slo, tail = fs
    # a TPOT miss: the decode step, memory-bound -> the ML compiler owner
    assert slo.finding == "SLO INVALID: p99 TPOT 250 ms > 200 ms" and slo.owner == "ML compiler"
    # queueing 1.5 s of a 2 s p99 TTFT: 75%, a queueing tail -> the runtime owner
    assert "x3 the p50" in tail.finding and "queueing is 75% of the p99 TTFT" in tail.finding
    assert tail.owner == "runtime" and "replicas" in tail.fix and tail.expected_gain_s == 1.5
    checks = {c.check: c.verdict for c in pits}
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
    run = Run("out/b", "bench", None, {"workload": "Qwen/Qwen2.5-7B", "hardware": None, "phase": "bench"}, {}, False)
    fs, pits = memo_parts(run)
    text = memo_markdown(run, fs, pits, "opmap memo out/b", folder=True)
    assert "None" not in text
    assert text.splitlines()[0] == "# Closure memo: Qwen/Qwen2.5-7B (bench)"
    assert "Evidence: the bench output in out/b; reproduce" in text
    bare = memo_markdown(Run("r1", "serve", None, {}, {}, True), [], [], "opmap memo r1")
    assert bare.splitlines()[0] == "# Closure memo: a serve run" and "run r1 (serve) in the run store" in bare


def _bench_records(n=100):
    """n requests one after another, 100 ms apart: request i's first token at 10 + i ms, then 4 more tokens 2 ms
    apart (TPOT 2 ms), 20 prompt and 5 output tokens each by the server's usage."""
    from opmap.bench.records import RequestRecord

    out = []
    for i in range(n):
        sent = 0.1 * i
        first = sent + (10 + i) / 1e3
        times = tuple(first + 0.002 * k for k in range(5))
        out.append(RequestRecord(index=i, scheduled_s=None, sent_s=sent, first_token_s=first, token_times_s=times,
                                 end_s=times[-1], input_tokens_asked=20, output_tokens_asked=5, usage_prompt_tokens=20,
                                 usage_completion_tokens=5, events=5, status="ok"))
    return out


def _pct(xs, q):
    """The linear-interpolated percentile (numpy's default, the one bench and serve use): rank q/100 x (n - 1)."""
    xs = sorted(xs)
    r = q / 100 * (len(xs) - 1)
    lo = int(r)
    return xs[lo] + (r - lo) * (xs[min(lo + 1, len(xs) - 1)] - xs[lo])


def test_a_bench_memo_states_throughput_latency_against_the_slo_and_goodput():
    """A bench memo's findings state what the measured run supports: before, they held only the validity rule and
    the TTFT tail (a run without validity, none at all: "measured load -: "). 100 requests, TTFT 10..109 ms, TPOT
    2 ms, SLO TTFT 100 ms / TPOT 5 ms: TTFT p50 / p95 / p99 = 59.5 / 104.05 / 108.01 ms (rank q x 99), over the
    SLO at p99; 91 of 100 requests (TTFT <= 100 ms) within it; the window from the first send (0 s) to the last
    end (9.9 + 0.109 + 0.008 = 10.017 s): 100 / 10.017 = 9.98 requests/s, 500 / 10.017 = 49.9 output tokens/s,
    2,500 / 10.017 = 250 tokens/s in all."""
    from opmap.bench.metrics import summarize
    from opmap.record import record
    from opmap.report.sheet import si

    ttfts = [(10 + i) / 1e3 for i in range(100)]
    assert [round(_pct(ttfts, q) * 1e3, 4) for q in (50, 95, 99)] == [59.5, 104.05, 108.01]
    payload = record(summarize(_bench_records(), slo_ttft_s=0.1, slo_tpot_s=0.005))  # bench.json's figures
    run = Run("out/b", "bench", None, {"workload": "Qwen/Qwen2.5-7B", "hardware": "http://gpu:8000", "phase": "bench"},
              payload, False)
    fs, pits = memo_parts(run)
    text = {f.finding.split(":")[0]: f for f in fs}
    tput = text["throughput"].finding
    assert f"{100 / 10.017:.4g} requests/s achieved" in tput and "9.983" in tput
    assert "49.9 tokens/s out, 250 tokens/s in all; 100 of 100 requests ok, none failed" in tput
    lat = text["latency"]
    assert ("TTFT p50 / p95 / p99 59.5 ms / 104 ms / 108 ms (over the SLO 100 ms at p99)" in lat.finding)
    assert f"TPOT p50 / p95 / p99 {si(0.002, 's')} / {si(0.002, 's')} / {si(0.002, 's')} (within the SLO 5 ms" \
        in lat.finding
    assert "end to end p50 / p95 / p99 67.5 ms" in lat.finding  # 59.5 + 8 ms
    assert f"goodput {91 / 10.017:.4g} requests/s, 91.0% of requests within the SLO" in lat.finding
    assert lat.owner == "runtime" and "chunked prefill" in lat.fix  # the TTFT is over: admission
    md = memo_markdown(run, fs, pits, "opmap memo out/b", folder=True)
    assert "| throughput: " in md and "| latency: TTFT p50" in md

    bare = memo_parts(replace(run, payload={}))[0]  # a result with no figures gives no finding, not an empty one
    assert bare == []
