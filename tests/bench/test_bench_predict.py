"""opmap.bench.predict: a measured run joined to the simulation of the same workload. The join's parts against
values worked out by hand; the bench client's timing against an independent client on the real server; the
prediction of the launched CPU server at concurrency 1 and near saturation against what it measures.

The machine's 2 cores are shared with other work: a run on it can lose a whole timeslice (tens of ms) where
another did not, so the timing tests take the best of up to ATTEMPTS rounds (each round is a fresh measurement of
both sides; the ratios seen are printed with -s), and where the cores are oversubscribed by other work
(launched_server.oversubscribed) a failed ratio is a skip that quotes the ratios, not a pass."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
from launched_server import oversubscribed
from line_proxy import BlockingClient, LineProxy

from opmap.bench.predict import (
    Workload,
    engine_policy,
    figures,
    join,
    predict_run,
    simulate_workload,
    with_step_overhead,
    workload,
)
from opmap.bench.records import BenchResult, RequestRecord, RequestSpec
from opmap.record import record
from opmap.serve.cost import TableCost

ATTEMPTS = 3
PREDICT_ATTEMPTS = 4  # a round is a probe (20 requests) and 52 requests: seconds


def _rec(i, sent, first, end, n_out=11, warmup=False, status="ok"):
    times = tuple(np.linspace(first, end, n_out)) if first is not None else ()
    return RequestRecord(i, None, sent, first, times, end, 10, n_out, 10, n_out, n_out + 2, status, warmup=warmup)


def _flat_cost(prefill_s=0.01, decode_s=0.001):
    """A step cost independent of the step's size: every prefill step prefill_s, every decode step decode_s."""
    return TableCost([1, 1000], [prefill_s, prefill_s], [1, 2], [0, 1e6], [[decode_s, decode_s]] * 2)


def test_closed_loop_slots_follow_the_measured_ends():
    """Concurrency 2: r0 and r1 start the two slots; r1 ends first (t = 3), so r2 (sent at 3.1) took its slot
    (turnaround 0.1 s); r0 ends at 5 before r2 (9), so r3 (sent at 5.2) took r0's (turnaround 0.2 s)."""
    recs = [_rec(0, 0.0, 1.0, 5.0), _rec(1, 0.0, 1.0, 3.0), _rec(2, 3.1, 4.0, 9.0), _rec(3, 5.2, 6.0, 8.0),
            _rec(4, 5.3, None, 6.0, status="timeout")]
    w = workload(recs, "closed", 2)
    assert w.closed and list(w.pred) == [-1, -1, 1, 0]
    assert np.allclose(w.turnaround_s, [0, 0, 0.1, 0.2])
    assert list(w.input_len) == [10] * 4  # the failed request is not part of the simulated workload


def test_closed_loop_sends_follow_the_simulated_ends():
    """One client (concurrency 1), 5 requests of 10 prompt and 11 output tokens, 2 ms of client turnaround; each
    prefill step 10 ms, each decode step 1 ms: a request takes 10 + 10 x 1 = 20 ms, so the k-th is sent at
    k x 22 ms whatever the measured sends were (52 ms apart here); TTFT 10 ms, TPOT 1 ms, output tokens/s
    5 x 11 / (4 x 22 + 20 ms) = 509.3."""
    recs = [_rec(k, 0.052 * k, 0.052 * k + 0.02, 0.052 * k + 0.05) for k in range(5)]
    w = workload(recs, "closed", 1)
    sent, first, finish, res = simulate_workload(w, engine_policy(1024, 256), _flat_cost())
    assert np.allclose(sent, 0.022 * np.arange(5), atol=1e-9)
    f = figures(sent, first, finish, w.output_len, res.itl_gap_s, res.itl_weight)
    assert f.latency.ttft.p50_s == pytest.approx(0.010)
    assert f.latency.tpot.p50_s == pytest.approx(0.001)
    assert f.latency.e2e.p99_s == pytest.approx(0.020)
    assert f.throughput.output_tokens_per_s == pytest.approx(55 / 0.108)


def _fixed_point(w, policy, cost, lag_s, seed=0):
    """The independent oracle: opmap bench --predict's closed loop as it was solved before it was simulated
    directly (d6b0b42, bench/predict.py simulate_workload): simulate open-loop arrivals at the sends (+ lag),
    move each send to its predecessor's simulated end + turnaround, repeat until the sends stop moving."""
    from opmap.serve.arrivals import Requests
    from opmap.serve.sim import simulate

    sent = w.sent_s.copy()
    for _ in range(10_000):
        arr_s = sent + lag_s
        order = np.argsort(arr_s, kind="stable")
        res = simulate(Requests(arr_s[order], w.input_len[order], w.output_len[order], "oracle"), policy, cost, 1,
                       "round_robin", seed)
        first, finish = np.empty(len(arr_s)), np.empty(len(arr_s))
        first[order], finish[order] = res.first_s, res.finish_s
        new = sent.copy()
        has = w.pred >= 0
        new[has] = finish[w.pred[has]] + w.turnaround_s[has]
        if np.allclose(new, sent, rtol=0, atol=1e-9):
            break
        sent = new
    return sent, first, finish, res


@pytest.mark.parametrize("turn_s", [0.0005, 0.0])
def test_three_requests_in_two_slots_by_hand_and_by_the_fixed_point(turn_s):
    """Two slots: r0 (6 output tokens) and r1 (2) sent at 0 and 1 ms, r2 (3) in r1's slot sent turn_s after r1's
    end, measured at 50 ms. Flat steps (a step with a prompt 10 ms, a decode step 1 ms): r0 prefills 0-10, r1
    beside r0's decode 10-20, 20-21 ends r1; r2 sent at 21.5 ms prefills beside r0 from 22 (r0 decoded alone
    21-22), first token 32, r0 ends at 33, r2 at 34. Sent at 21 ms (turn 0), r2 is queued before the 21 ms step
    forms: 21-31, then 32 and 33. The old fixed point and the direct simulation give these times."""
    w = Workload(np.array([0.0, 0.001, 0.05]), np.full(3, 10), np.array([6, 2, 3]), np.zeros(3, dtype=bool),
                 np.array([-1, -1, 1]), np.array([0.0, 0.0, turn_s]), True, 2)
    r2_first, r2_end = (0.032, 0.034) if turn_s else (0.031, 0.033)
    for sent, first, finish, _ in (_fixed_point(w, engine_policy(1024, 256), _flat_cost(), 0.0),
                                   simulate_workload(w, engine_policy(1024, 256), _flat_cost())):
        assert sent == pytest.approx([0.0, 0.001, 0.021 + turn_s], abs=1e-12)
        assert first == pytest.approx([0.010, 0.020, r2_first], abs=1e-12)
        assert finish == pytest.approx([0.033, 0.021, r2_end], abs=1e-12)


def _measured_closed_loop(n, c, seed):
    """Records of a closed loop of ``c`` clients as a bench run measures one: each request sent a turnaround
    (0 to 2 ms; a third exactly 0) after the slot freed first, taking 5-80 ms; 16-300 prompt and 1-40 output
    tokens."""
    import heapq

    rng = np.random.default_rng(seed)
    free = [(0.0, s) for s in range(c)]
    recs = []
    for k in range(n):
        t, s = heapq.heappop(free)
        sent = t + (0.0 if rng.random() < 1 / 3 else float(rng.uniform(0, 0.002)))
        end = sent + float(rng.uniform(0.005, 0.08))
        n_out = int(rng.integers(1, 41))
        recs.append(RequestRecord(k, None, sent, sent + 0.004, (end,), end, int(rng.integers(16, 301)), n_out,
                                  None, None, 0, "ok", warmup=k < 2))
        heapq.heappush(free, (end, s))
    return recs


@pytest.mark.parametrize("model", ["examples/tiny-llama.json", "gpt2"])
@pytest.mark.parametrize("c,with_overhead", [(1, False), (3, True), (8, False), (8, True)])
def test_the_direct_closed_loop_is_the_old_fixed_point_to_the_bit(model, c, with_overhead):
    """A Hugging Face config and a zoo model priced on an H100 (model_table_cost), 40 requests in a closed loop
    of c clients, with and without a measured server overhead (a step, per-sequence and per-request lag): the
    one direct simulation gives the first and last tokens, inter-token gaps and step count the fixed point
    converged to, bit for bit, and its sends to the fixed point's own tolerance (1 ns). Not to the bit: the fixed
    point stopped once the sends moved less than 1 ns and returned the sends of its last pass, which can be an
    ulp off the ends that pass produced (an arrival 1e-17 s later joins the same step); the direct sends are
    exactly each predecessor's end plus the turnaround."""
    from pathlib import Path

    from opmap.bench.predict import ServerOverhead
    from opmap.serve.model_cost import model_table_cost

    root = Path(__file__).resolve().parents[2]
    cost = model_table_cost(str(root / model) if model.endswith(".json") else model, "h100-sxm")
    ov = ServerOverhead(0.0004, 0.003, {}, 0.00005, 0.005, 4) if with_overhead else None
    if ov is not None:
        cost = with_step_overhead(cost, ov.step_s, ov.per_seq_s)
    pol = engine_policy(256, 16)
    w = workload(_measured_closed_loop(40, c, seed=c), "closed", c)
    assert (w.pred >= 0).sum() == 40 - c
    lag = ov.lag_s(c - 1) if ov is not None else 0.0
    want = _fixed_point(w, pol, cost, lag)
    got = simulate_workload(w, pol, cost, ov)
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-9)
    has = w.pred >= 0
    np.testing.assert_array_equal(got[0][has], got[2][w.pred[has]] + w.turnaround_s[has])
    np.testing.assert_array_equal(got[0][~has], w.sent_s[~has])
    np.testing.assert_array_equal(want[1], got[1])
    np.testing.assert_array_equal(want[2], got[2])
    np.testing.assert_array_equal(want[3].itl_gap_s, got[3].itl_gap_s)
    np.testing.assert_array_equal(want[3].itl_weight, got[3].itl_weight)
    assert want[3].steps == got[3].steps
    assert not np.array_equal(got[0], w.sent_s)  # the sends moved from the measured ones


def test_open_loop_keeps_the_measured_sends_and_a_request_overhead_delays_each():
    """Open loop: the sends stay as measured; a per-request overhead of 3 ms (HTTP, tokenizing) adds 3 ms to
    each TTFT (10 ms prefill -> 13 ms) and a step overhead of 0.5 ms to every step (TPOT 1 -> 1.5 ms)."""
    from opmap.bench.predict import ServerOverhead

    recs = [_rec(k, 0.1 * k, 0.1 * k + 0.02, 0.1 * k + 0.05) for k in range(4)]
    w = workload(recs, "open", None)
    ov = ServerOverhead(0.0005, 0.003, {})
    cost = with_step_overhead(_flat_cost(), ov.step_s)
    assert cost.prefill_s(37, 1) == pytest.approx(0.0105) and cost.decode_s(2, 500) == pytest.approx(0.0015)
    # per decoding sequence: 0.2 ms each, so a step of 4 costs 1 + 0.5 + 4 x 0.2 = 2.3 ms
    assert with_step_overhead(_flat_cost(), 0.0005, 0.0002).decode_s(4, 100) == pytest.approx(0.0023)
    sent, first, finish, _ = simulate_workload(w, engine_policy(1024, 256), cost, ov)
    assert np.allclose(sent, 0.1 * np.arange(4))
    assert np.allclose(first - sent, 0.0135) and np.allclose(finish - first, 10 * 0.0015)


def test_join_gives_predicted_over_measured():
    m = {"latency": {k: {"p50_s": 0.02, "p90_s": 0.04, "p99_s": 0.08, "mean_s": 0.03} for k in
                     ("ttft", "tpot", "itl", "e2e")}, "throughput": {"output_tokens_per_s": 400.0,
                                                                     "requests_per_s": 10.0}}
    p = {"latency": {k: {"p50_s": 0.01, "p90_s": 0.04, "p99_s": None, "mean_s": 0.03} for k in
                     ("ttft", "tpot", "itl", "e2e")}, "throughput": {"output_tokens_per_s": 600.0,
                                                                     "requests_per_s": 0.0}}
    rows = {(r["metric"], r["stat"]): r["ratio"] for r in join(m, p)}
    assert rows[("ttft", "p50")] == 0.5 and rows[("e2e", "p90")] == 1.0 and rows[("itl", "p99")] is None
    assert rows[("output_tokens", "per_s")] == 1.5 and rows[("requests", "per_s")] == 0.0


def test_warmup_is_simulated_but_not_counted():
    recs = [_rec(k, 0.1 * k, 0.1 * k + 0.02, 0.1 * k + 0.05, warmup=k < 2) for k in range(5)]
    res = BenchResult(tuple(recs), "http://x", "m", "completions", "open", None, 0.0, 0.5)
    rep = predict_run(res, _flat_cost(), engine_policy(1024, 256))
    assert rep.workload.warmup == 2 and rep.predictions[0].name == "model" and rep.predictions[0].figures.requests == 3
    d = record(rep)  # bench_predict.json
    assert d["workload"] == {"requests": 5, "warmup": 2, "mode": "open", "concurrency": None,
                             "closed_loop_sends": "as measured"}
    assert list(d) == ["schema_version", "measured", "workload", "policy", "cost", "predictions"]
    assert d["predictions"]["model"]["figures"]["requests"] == 3 and d["predictions"]["model"]["steps"] > 0


def test_the_probe_through_a_line_per_chunk_proxy_predicts_the_ttft_an_independent_client_measures():
    """The null server sends its first token 20 ms after the request, then one every 2 ms; the line-per-chunk
    proxy with Nagle on (LineProxy) holds each stream's tail back for the client's delayed ACK (40 ms and more).
    A sequential run and the overhead probe both go through the proxy; with a step cost near zero the predicted
    sequential TTFT is the probe's 1-token time (request_s + prefill + step_s), which must be the time its token
    arrived, not the stream's end: the predicted TTFT p50 is within 15% of a blocking http.client's through the
    same proxy. (Taken from the stream's end, the probe predicted about 65 ms against 21.)"""

    from opmap.bench.client import run_load
    from opmap.bench.nullserver import NullConfig, NullServer, ThreadServer
    from opmap.bench.predict import overhead_from_probe, probe_records

    cost = _flat_cost(prefill_s=1e-5, decode_s=1e-5)
    specs = [RequestSpec(i, None, "one two three", 3, 8) for i in range(8)]
    seen = []
    with ThreadServer(NullServer(NullConfig(first_token_s=0.020, token_s=0.002))) as up, \
            LineProxy(up, nodelay=False, hold_head=True) as port:
        url = f"http://127.0.0.1:{port}"
        for _ in range(ATTEMPTS):
            seq, _ = probe_records(url, "null", "one two three", 3, reps=6, long_out=8)
            ov = overhead_from_probe(seq, cost, 3, 8)
            res = run_load(url, "null", specs, concurrency=1)
            c = BlockingClient(url, "null")
            try:
                theirs = statistics.median(c.send("one two three", 8)[0] for _ in range(8))
            finally:
                c.close()
            rep = predict_run(res, cost, engine_policy(1024, 256), overhead=ov)
            pred = rep.last().figures.latency.ttft.p50_s
            seen.append((round(pred * 1e3, 1), round(theirs * 1e3, 1)))
            if 0.85 <= pred / theirs <= 1.15:
                break
    print("TTFT p50 ms (predicted from the probe, independent client) per attempt:", seen)
    assert theirs >= 0.020
    busy = oversubscribed()
    if busy and 0.67 < pred / theirs < 1.5 and not 0.85 <= pred / theirs <= 1.15:
        pytest.skip(f"{busy}; TTFT p50 ms (predicted, independent) seen: {seen}")
    assert 0.85 <= pred / theirs <= 1.15, seen


# ---- on the real server (the session's one launched transformers serve) ----

def test_run_load_agrees_with_an_independent_client(server):
    """The same requests (the same 32-token prompts, 32 output tokens), sequential, sent in alternate blocks of 4
    by run_load and by the independent client so both meet the same load on the shared cores: TTFT p50 and
    output tokens/s (tokens over the summed end-to-end time) within 15%."""
    from opmap.bench.client import run_load
    from opmap.bench.prompts import build_prompts

    prompts = build_prompts(server.tokenizer_dir, [32] * 16, seed=11)
    seen = []
    for _ in range(ATTEMPTS):
        ours, theirs = [], []
        for b in range(0, len(prompts), 4):
            block = prompts[b:b + 4]
            res = run_load(server.base_url, server.model_id, [RequestSpec(b + i, None, p, 32, 32)
                                                              for i, p in enumerate(block)],
                           concurrency=1, ignore_eos=False)
            for r in res.records:
                assert r.ok and r.usage_completion_tokens == 32 and r.usage_prompt_tokens == 32
                ours.append((r.first_token_s - r.sent_s, r.end_s - r.sent_s, r.usage_completion_tokens))
            ind = BlockingClient(server.base_url, server.model_id)
            try:
                theirs += [ind.send(p, 32) for p in block]
            finally:
                ind.close()
        ttft = statistics.median(x[0] for x in ours) / statistics.median(x[0] for x in theirs)
        tps = (sum(x[2] for x in ours) / sum(x[1] for x in ours)) / (sum(x[2] for x in theirs)
                                                                    / sum(x[1] for x in theirs))
        seen.append((round(ttft, 3), round(tps, 3)))
        if 0.85 <= ttft <= 1.15 and 0.85 <= tps <= 1.15:
            break
    print("run_load / independent (TTFT p50, tokens/s) per attempt:", seen)
    busy = oversubscribed()
    if busy and not (0.85 <= ttft <= 1.15 and 0.85 <= tps <= 1.15):
        pytest.skip(f"{busy}; run_load / independent (TTFT p50, tokens/s) seen: {seen}")
    assert 0.85 <= ttft <= 1.15 and 0.85 <= tps <= 1.15, seen


@pytest.fixture(scope="module")
def priced(tiny_config, local_hw):
    from opmap.serve.model_cost import model_table_cost

    return model_table_cost(str(tiny_config), local_hw, "fp32", runtime="engine")


def _run_and_predict(server, cost, concurrency: int, requests: int, seed: int):
    """A closed-loop run of 32-token prompts and 32-token answers bracketed by two probes of the server's
    overhead (as opmap bench --predict runs them), then its prediction."""
    from opmap.bench.client import run_load
    from opmap.bench.predict import overhead_from_probe, probe_records
    from opmap.bench.prompts import ExactPrompts
    from opmap.bench.workload import closed_specs
    from opmap.serve.arrivals import parse_length

    ep = ExactPrompts(server.tokenizer_dir)
    text = ep.fit(32, np.random.default_rng(seed))

    def probe():
        return probe_records(server.base_url, server.model_id, text, 32, batch=concurrency)

    before = probe()
    specs = list(closed_specs(parse_length("32"), parse_length("32"), requests + 4, 4, seed, prompt=ep))
    res = run_load(server.base_url, server.model_id, specs, concurrency=concurrency, ignore_eos=False)
    after = probe()
    ov = overhead_from_probe(before[0] + after[0], cost, 32, 32, before[1] + after[1], concurrency)
    pol = engine_policy(server.settings.max_batch_tokens, server.settings.page_tokens)
    rep = predict_run(res, cost, pol, overhead=ov)
    rows = {(r["metric"], r["stat"]): r for r in rep.last().rows}
    return rows[("ttft", "p50")]["ratio"], rows[("output_tokens", "per_s")]["ratio"], rep


# The accuracy target (0.67-1.5) is a timing target: benchmarks/bench_predict_cpu.py measures it, round by
# round, interleaved. Here the prediction of the real server must only be of the right order: within SANITY of what
# was measured (a pricing or join broken by a factor, as eager pricing of the tiny model at 40x once was, fails).
SANITY = (0.25, 4.0)


@pytest.mark.parametrize("concurrency", [1, 8])
def test_the_prediction_of_the_cpu_server_is_of_the_right_order(server, priced, concurrency):
    """On the launched CPU server, TTFT p50 and output tokens/s predicted (the model's steps on the calibrated CPU
    plus the server overhead the probes bracketing the run measured) within SANITY of measured, at concurrency 1
    and 8 (saturated: the closed loop keeps 8 sequences in every step); the 0.67-1.5 target is the benchmark's."""
    seen = []
    for attempt in range(PREDICT_ATTEMPTS):
        ttft, tps, rep = _run_and_predict(server, priced, concurrency, 48, seed=attempt)
        seen.append((round(ttft, 2), round(tps, 2)))
        ok = SANITY[0] <= tps <= SANITY[1] and SANITY[0] <= ttft <= SANITY[1]
        if ok:
            break
    print(f"concurrency {concurrency}: predicted / measured (TTFT p50, output tokens/s) per attempt: {seen}")
    assert rep.predictions[0].figures.requests == 48
    assert rep.overhead.step_s >= 0 and ("batch_probe" in rep.overhead.basis) == (concurrency > 1)
    busy = oversubscribed()
    if busy and not ok:
        pytest.skip(f"{busy}; predicted / measured (TTFT p50, output tokens/s) seen: {seen}")
    assert ok, seen


def test_a_request_overhead_measured_under_load_applies_to_a_closed_loop_by_its_concurrency():
    """request_s 3 ms alone, 23 ms among 8 decoding: a closed loop of 5 clients (4 others decoding) gets 3 + 4/8
    x 20 = 13 ms of lag, one of 1 client 3 ms, an open loop 3 ms (no concurrency to read the load from)."""
    from opmap.bench.predict import ServerOverhead

    ov = ServerOverhead(0.0, 0.003, {}, 0.0, 0.023, 8)
    assert ov.lag_s(4) == pytest.approx(0.013) and ov.lag_s(0) == 0.003 and ov.lag_s(20) == pytest.approx(0.023)
    recs = [_rec(k, 0.0, 0.02, 0.05) for k in range(5)]
    for mode, c, lag in (("closed", 5, 0.013), ("closed", 1, 0.003), ("open", None, 0.003)):
        w = workload(recs if c != 1 else recs[:1], mode, c)
        sent, first, _, _ = simulate_workload(w, engine_policy(1024, 256), _flat_cost(), ov)
        assert (first - sent).min() == pytest.approx(lag + 0.010)
