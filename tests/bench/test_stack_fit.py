"""The stack fit (opmap.bench.stack_fit): the parameters applied to a step cost by formula, and recovered from runs
whose 'measured' times were made by the simulator under known parameters (so the truth is known by construction:
runs generated with step 2 ms, 0.4 ms a decoding sequence, 8 ms a request and prefill x1.6 must give back what the
runs can tell of them and predict a held-out load), and a profile written and read back."""

from __future__ import annotations

import json

import numpy as np
import pytest

from opmap.bench.predict import engine_policy, simulate_workload, workload
from opmap.bench.records import BenchResult, RequestRecord
from opmap.bench.stack_fit import Params, Run, apply, fit, params_of, predict, profile
from opmap.calibrate.stack_profile import read_stack_profile, write_stack_profile
from opmap.errors import OpmapError
from opmap.serve.cost import TableCost

# a model whose step times are linear (the table interpolates linearly, so every check below is exact): prefill
# 20 us a token + 1 ms, decode 3 ms + 50 us a sequence + 0.1 us a KV token
COST = TableCost(prefill_tokens=[1, 4096], prefill_time_s=[1e-3 + 20e-6, 1e-3 + 20e-6 * 4096],
                 decode_batch=[1, 256], decode_kv=[0, 1 << 20],
                 decode_time_s=[[3e-3 + 50e-6 * b, 3e-3 + 50e-6 * b + 0.1e-6 * (1 << 20)] for b in (1, 256)])
POLICY = engine_policy(512, 16)
TRUE = Params(step_s=2e-3, per_seq_s=0.4e-3, request_s=8e-3, decode_scale=1.0, prefill_scale=1.6)


def test_apply_by_formula():
    c, ov = apply(COST, TRUE)
    b, kv, n = 8, 4000, 300
    assert c.decode_s(b, kv) == pytest.approx(1.0 * (3e-3 + 50e-6 * b + 0.1e-6 * kv) + 2e-3 + 0.4e-3 * b)
    assert c.prefill_s(n, 1) == pytest.approx(1.6 * (1e-3 + 20e-6 * n) + 2e-3)
    assert ov.request_s == 8e-3 and ov.lag_s(5) == 8e-3


def _run(rate: float, n: int, seed: int) -> BenchResult:
    """An open-loop run at ``rate`` whose times are the simulator's under TRUE (token events evenly spaced from the
    first token to the last)."""
    rng = np.random.default_rng(seed)
    sent = np.cumsum(rng.exponential(1 / rate, n))
    ilen, olen = rng.integers(32, 512, n), rng.integers(8, 64, n)
    stub = [RequestRecord(i, float(sent[i]), float(sent[i]), 0.0, (), 0.0, int(ilen[i]), int(olen[i]), int(ilen[i]),
                          int(olen[i]), 0, "ok") for i in range(n)]
    w = workload(stub, "open", None)
    c, ov = apply(COST, TRUE)
    _, first, finish, _ = simulate_workload(w, POLICY, c, ov)
    recs = []
    for i in range(n):
        times = tuple(np.linspace(first[i], finish[i], int(olen[i])).tolist())
        recs.append(RequestRecord(i, float(sent[i]), float(sent[i]), float(first[i]), times, float(finish[i]),
                                  int(ilen[i]), int(olen[i]), int(ilen[i]), int(olen[i]), len(times), "ok"))
    return BenchResult(tuple(recs), "http://x", "m", "completions", "open", None, 0.0, float(finish.max()))


@pytest.fixture(scope="module")
def runs():
    return [Run.of(f"rate {r}", _run(r, 60, k)) for k, r in enumerate((5.0, 20.0, 60.0))]


def test_the_fit_predicts_a_held_out_load_and_recovers_what_the_runs_can_tell(runs):
    """Fitted on the runs at 5 and 60 requests/s, the run at 20/s (held out) is predicted within 5%. The decode
    step's fixed part (scale x 3 ms + step_s) and its part per sequence (scale x 50 us + per_seq_s) are what the
    runs determine (a scale and an offset that trade against each other give the same steps), each within 10% of
    the truth (5 ms, 450 us); the prefill scale and the request's own time, within 10% and 15%."""
    fitted, held = [runs[0], runs[2]], runs[1]
    before = predict(held, COST, POLICY, Params())
    assert abs(before["ttft_p50"] / held.measured["ttft_p50"] - 1) > 0.2  # the model alone is off
    p, evals = fit(fitted, COST, POLICY)
    assert evals <= 2 * 300
    assert p.decode_scale * 3e-3 + p.step_s == pytest.approx(3e-3 + TRUE.step_s, rel=0.1)
    assert p.decode_scale * 50e-6 + p.per_seq_s == pytest.approx(50e-6 + TRUE.per_seq_s, rel=0.1)
    assert p.prefill_scale == pytest.approx(TRUE.prefill_scale, rel=0.1)
    assert p.request_s == pytest.approx(TRUE.request_s, rel=0.15)
    for r in (*fitted, held):
        after = predict(r, COST, POLICY, p)
        for k in ("ttft_p50", "tpot_p50", "output_tokens_per_s"):
            assert after[k] / r.measured[k] == pytest.approx(1.0, abs=0.05), (r.name, k)


def test_a_profile_round_trips_and_names_its_range(runs, tmp_path):
    p = Params(1e-3, 0.2e-3, 5e-3, 1.1, 1.4)
    prof = profile(runs, COST, POLICY, p, device="local", model="tiny.json", dtype="fp32", runtime="eager",
                   kv_blocks=64, page_tokens=256, max_batch_tokens=512)
    write_stack_profile(prof, tmp_path / "stack.json")
    back = read_stack_profile(tmp_path / "stack.json")
    assert params_of(back) == p and back.kv_blocks == 64 and len(back.runs) == 3
    lo, hi = back.rate_range
    assert lo < 10 < hi and back.concurrency_range is None
    assert back.outside(rate_per_s=lo * 0.5).endswith("extrapolated")
    assert back.outside(rate_per_s=(lo + hi) / 2) == ""
    assert "fitted on open-loop runs only" in back.outside(concurrency=4)
    r0 = next(r for r in back.residuals if r.run == "rate 5.0" and r.figure == "ttft_p50")
    assert r0.after == pytest.approx(predict(runs[0], COST, POLICY, p)["ttft_p50"] / runs[0].measured["ttft_p50"])


# a closed loop's way in: 4 ms a request plus 1.1 ms for each other stream in flight (transformers serve on the CPU
# measured ~1.1 ms a stream: benchmarks/README.md, bench_stack_calibration.py)
STREAMS = Params(step_s=1e-3, per_seq_s=0.2e-3, request_s=4e-3, decode_scale=1.0, prefill_scale=1.0,
                 per_stream_s=1.1e-3)


def _closed(concurrency: int, n: int) -> BenchResult:
    """A closed loop of ``concurrency`` clients, no think time, every request 128 prompt and 32 output tokens, its
    times the simulator's under STREAMS (the stub's chain: request k follows k - concurrency)."""
    c = concurrency
    stub = [RequestRecord(i, float(i), float(i), 0.0, (), float(i + c), 128, 32, 128, 32, 0, "ok") for i in range(n)]
    w = workload(stub, "closed", c)
    cost, ov = apply(COST, STREAMS)
    sent, first, finish, _ = simulate_workload(w, POLICY, cost, ov)
    recs = [RequestRecord(i, float(sent[i]), float(sent[i]), float(first[i]),
                          tuple(np.linspace(first[i], finish[i], 32).tolist()), float(finish[i]), 128, 32, 128, 32, 32,
                          "ok") for i in range(n)]
    return BenchResult(tuple(recs), "http://x", "m", "completions", "closed", c, 0.0, float(finish.max()))


def test_apply_adds_the_streams_in_flight_to_a_closed_loop_request():
    """lag = request_s + per_stream_s x the other streams (uncapped): 4 + 1.1 x 7 = 11.7 ms at concurrency 8."""
    _, ov = apply(COST, STREAMS)
    assert ov.lag_s(0) == pytest.approx(4e-3) and ov.lag_s(7) == pytest.approx(4e-3 + 7 * 1.1e-3)


def test_the_fit_recovers_the_time_a_stream_in_flight_adds_and_predicts_a_held_out_concurrency():
    """Fitted on closed loops at 1, 4 and 16 clients whose TTFT grows by 1.1 ms a stream, the fit gives that back
    (within 15%) beside the request's own 4 ms, and predicts the held-out 8 clients' TTFT p50 within 5%."""
    runs = {c: Run.of(f"c{c}", _closed(c, 6 * c + 8)) for c in (1, 4, 8, 16)}
    p, _ = fit([runs[1], runs[4], runs[16]], COST, POLICY)
    assert p.per_stream_s == pytest.approx(STREAMS.per_stream_s, rel=0.15)
    assert p.request_s == pytest.approx(STREAMS.request_s, rel=0.15)
    held = predict(runs[8], COST, POLICY, p)
    assert held["ttft_p50"] / runs[8].measured["ttft_p50"] == pytest.approx(1.0, abs=0.05)
    # without the term the held-out TTFT is off by more than the band
    flat = predict(runs[8], COST, POLICY, Params(p.step_s, p.per_seq_s, p.request_s, p.decode_scale, p.prefill_scale))
    assert flat["ttft_p50"] / runs[8].measured["ttft_p50"] < 0.85


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(kind="bench"), "not a stack profile"),
    (lambda d: d["parameters"].update(step_s={"value": -1.0, "kind": "fit"}), "step_s -1.0 is not a number in"),
    (lambda d: d["parameters"].update(decode_scale={"value": float("nan"), "kind": "fit"}), "decode_scale"),
    (lambda d: d.update(runs=[]), "runs must be a list of 1 to 1000 runs"),
    (lambda d: d.update(kv_blocks=0), "kv_blocks must be a whole number >= 1"),
])
def test_a_malformed_profile_is_one_line(runs, tmp_path, edit, message):
    prof = profile(runs[:1], COST, POLICY, Params(), device="local", model="m", dtype="fp32", runtime="eager",
                   kv_blocks=None, page_tokens=None, max_batch_tokens=None)
    d = prof.to_dict()
    edit(d)
    path = tmp_path / "p.json"
    path.write_text(__import__("json").dumps(d))
    with pytest.raises(OpmapError, match=message):
        read_stack_profile(path)


def test_a_profile_anchored_to_an_offline_run_round_trips_and_covers_lower_loads(tmp_path):
    """benchmarks/serving_tails.py anchors a profile to a saturated (Offline) run: mode ``offline``, no rate and no
    concurrency; every load below saturation is inside it, and an unknown mode is refused naming the accepted."""
    from opmap.calibrate.stack_profile import FitRun, StackProfile

    prof = StackProfile("h200", "llama-2-70b", "fp8", "engine-eager", 0.0166, 0.0, 0.0, 1.065, 1.065, None, None,
                        None, (FitRun("mlperf41-h200x8-offline", "offline", None, None, 24576),), source="anchored")
    write_stack_profile(prof, tmp_path / "a.json")
    back = read_stack_profile(tmp_path / "a.json")
    assert back.runs[0].mode == "offline" and back.decode_scale == 1.065 and back.step_s == 0.0166
    assert back.outside(rate_per_s=12.7) == "" and back.outside(concurrency=64) == ""
    d = json.loads((tmp_path / "a.json").read_text())
    d["runs"][0]["mode"] = "burst"
    (tmp_path / "b.json").write_text(json.dumps(d))
    with pytest.raises(OpmapError, match="mode open, closed, offline"):
        read_stack_profile(tmp_path / "b.json")
