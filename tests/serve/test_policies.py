"""Batching by hand: static, dynamic, continuous and chunked on two- and three-request traces whose every
time is worked out in the comments."""

from __future__ import annotations

import json

import numpy as np
import pytest

from opmap.errors import OpmapError
from opmap.record import record
from opmap.serve import (
    Requests,
    TableCost,
    make_requests,
    parse_arrival,
    parse_length,
    parse_policy,
    parse_service_time,
    simulate,
    summarize,
)
from opmap.serve.policies import Chunked, Continuous, Dynamic, Engine, NoBatching, Static


def _reqs(arr, inp, out):
    return Requests(np.asarray(arr, float), np.asarray(inp), np.asarray(out), "trace:hand")


# prefill: 1 ms per prompt token; decode: 10 ms + 5 ms per extra sequence + 10 us per KV token (linear, so the
# bilinear table is exact).
LINEAR = TableCost([1000], [1.0], [1, 2], [0, 1000], [[0.01, 0.02], [0.015, 0.025]])
FLAT = TableCost([1000], [1.0], [1], [0], [[0.01]])  # decode: 10 ms whatever the batch


def test_table_cost_interpolates():
    assert LINEAR.prefill_s(250) == pytest.approx(0.25)
    assert LINEAR.decode_s(2, 302) == pytest.approx(0.01 + 0.005 + 0.00302)
    assert LINEAR.decode_s(4, 0) == pytest.approx(0.025)  # extrapolated along the batch axis
    with pytest.raises(OpmapError, match="increasing"):
        TableCost([2, 1], [1, 2], [1], [0], [[0.1]])


def test_static_batch_waits_for_b_and_holds_slots():
    """static:2. A (in 100, out 3) at 0, B (in 100, out 2) at 0.5. The batch goes at 0.5: prefill of 200
    tokens 0.2 s -> first tokens at 0.7; decodes of 10 ms: B done at 0.71, A at 0.72."""
    res = simulate(_reqs([0, 0.5], [100, 100], [3, 2]), Static(2), FLAT)
    np.testing.assert_allclose(res.start_s, [0.5, 0.5])
    np.testing.assert_allclose(res.first_s, [0.7, 0.7])
    np.testing.assert_allclose(res.finish_s, [0.72, 0.71])
    s = record(summarize(res))
    assert s["latency"]["queue"]["mean_s"] == pytest.approx(0.25)
    assert s["latency"]["itl"]["mean_s"] == pytest.approx(0.01)
    assert s["latency"]["tpot"]["p50_s"] == pytest.approx(0.01)


def test_static_flushes_a_short_batch_when_no_more_requests_come():
    res = simulate(_reqs([0, 0.1, 0.2], [10, 10, 10], [1, 1, 1]), Static(2), FLAT)
    np.testing.assert_allclose(res.start_s, [0.1, 0.1, 0.2])  # batch {0,1} at 0.1 (ends 0.12), {2} alone at 0.2


def test_dynamic_sends_at_b_or_after_the_wait():
    """dynamic:2,100: A at 0, B at 0.05 -> both at 0.05 (B makes 2). C at 1.0 alone -> at 1.1 (waited 100 ms)."""
    res = simulate(_reqs([0, 0.05, 1.0], [10, 10, 10], [1, 1, 1]), parse_policy("dynamic:2,100"), FLAT)
    np.testing.assert_allclose(res.start_s, [0.05, 0.05, 1.1])
    res = simulate(_reqs([0, 0.5], [10, 10], [1, 1]), Dynamic(4, 0.1), FLAT)
    np.testing.assert_allclose(res.start_s, [0.1, 0.6])


def test_none_is_one_at_a_time():
    res = simulate(_reqs([0, 0], [100, 100], [2, 2]), NoBatching(), FLAT)
    np.testing.assert_allclose(res.start_s, [0, 0.11])  # prefill 0.1 + one decode 0.01
    np.testing.assert_allclose(res.finish_s, [0.11, 0.22])


def test_continuous_by_hand():
    """continuous, LINEAR cost. A (in 100, out 3) at 0, B (in 200, out 2) at 0.05.
    0 -> 0.1: prefill A (100 tokens). A's first token at 0.1.
    0.1 -> 0.3: prefill B (200 tokens; prefills go first, A's decode waits). B's first token at 0.3.
    0.3 -> 0.31802: decode of 2 holding 101 + 201 = 302 KV tokens: 10 + 5 + 3.02 ms. B done (2 tokens).
    0.31802 -> 0.32904: decode of A alone holding 102: 10 + 1.02 ms. A done.
    TTFT A 0.1, B 0.25; TPOT A (0.32904 - 0.1) / 2 = 0.11452, B 0.01802;
    ITL gaps: A 0.21802 then 0.01102, B 0.01802."""
    res = simulate(_reqs([0, 0.05], [100, 200], [3, 2]), Continuous(), LINEAR)
    np.testing.assert_allclose(res.first_s, [0.1, 0.3])
    np.testing.assert_allclose(res.finish_s, [0.32904, 0.31802])
    s = record(summarize(res))
    assert s["latency"]["ttft"]["mean_s"] == pytest.approx((0.1 + 0.25) / 2)
    assert s["latency"]["tpot"]["mean_s"] == pytest.approx((0.11452 + 0.01802) / 2)
    assert s["latency"]["itl"]["mean_s"] == pytest.approx((0.21802 + 0.01102 + 0.01802) / 3)
    assert s["latency"]["itl"]["p50_s"] == pytest.approx(0.01802)
    assert s["latency"]["itl"]["p99_s"] == pytest.approx(0.01802 + 0.98 * (0.21802 - 0.01802))


def test_continuous_token_budget_and_kv_capacity_limit_admission():
    """Three offline requests of 100 prompt tokens: a budget of 200 admits two in the first prefill; a KV
    capacity of 250 tokens (each needs 100 + 20) admits two at a time."""
    r = _reqs([0, 0, 0], [100, 100, 100], [20, 20, 20])
    res = simulate(r, Continuous(200), FLAT)
    np.testing.assert_allclose(res.start_s, [0, 0, 0.2])
    cap = TableCost([1000], [1.0], [1], [0], [[0.01]], kv_capacity_tokens=250)
    res = simulate(r, Continuous(), cap)
    assert res.start_s[2] == pytest.approx(res.finish_s[:2].min())
    with pytest.raises(OpmapError, match="needs 300 tokens of KV cache"):
        simulate(_reqs([0], [200], [100]), Continuous(), cap)


def test_chunked_by_hand():
    """chunked:128, LINEAR. A (in 100, out 2), B (in 200, out 2), both at 0.
    0 -> 0.128: chunks A 100 + B 28. A's first token at 0.128.
    0.128 -> 0.25701: A's decode + B 127: prefill of 128 tokens + A's KV read (101 tokens, 1.01 ms). A done.
    0.25701 -> 0.30201: B's last 45. B's first token.  0.30201 -> 0.31402: B's decode (kv 201). B done."""
    res = simulate(_reqs([0, 0], [100, 200], [2, 2]), Chunked(128), LINEAR)
    np.testing.assert_allclose(res.first_s, [0.128, 0.30201])
    np.testing.assert_allclose(res.finish_s, [0.25701, 0.31402])
    assert summarize(res).latency.itl.mean_s == pytest.approx((0.12901 + 0.01201) / 2)


@pytest.mark.parametrize("router", ["round_robin", "least_loaded", "shared"])
def test_every_policy_finishes_every_request(router):
    reqs = make_requests("poisson:50", "uniform:10,300", "normal:40,20", 400, seed=3)
    for spec in ("none", "static:4", "dynamic:8,20", "continuous:512", "chunked:256", "engine:8,256,16"):
        res = simulate(reqs, parse_policy(spec), LINEAR, replicas=2, router=router)
        assert np.all(res.finish_s >= res.first_s) and np.all(res.first_s >= res.start_s)
        assert np.all(res.start_s >= res.arrival_s)
    tight = TableCost([1000], [1.0], [1, 2], [0, 1000], [[0.01, 0.02], [0.015, 0.025]], kv_capacity_tokens=1000)
    res = simulate(reqs, Engine(8, 256, 16), tight, replicas=2, router=router)  # preempted ones requeued
    assert res.engine.preemptions.total > 0 and np.all(res.finish_s >= res.first_s)


def test_deterministic_for_a_seed():
    def once(seed):
        reqs = make_requests("gamma:40,2", "normal:200,50", "uniform:5,50", 500, seed=seed)
        res = simulate(reqs, parse_policy("continuous:1024"), LINEAR, 2, "least_loaded")
        return json.dumps(record(summarize(res)))
    assert once(1) == once(1)
    assert once(1) != once(2)


def test_policies_are_named_and_versioned():
    d = record(parse_policy("dynamic:8,5"))
    assert d == {"name": "dynamic", "version": 1, "spec": "dynamic:8,5", "params": {"batch": 8, "wait_s": 0.005}}
    assert record(parse_policy("continuous"))["params"]["token_budget"] == 8192
    assert parse_policy("chunked:256").spec() == "chunked:256"


def test_engine_is_named_with_vllm_defaults():
    """The agreed defaults: 256 sequences (vLLM's max_num_seqs below 70 GiB), 8192 tokens a step (vLLM's
    max_num_batched_tokens for its server on H100-class devices, vllm/engine/arg_utils.py), blocks of 16."""
    e = parse_policy("engine")
    assert e == Engine() and e.spec() == "engine"
    assert record(e) == {"name": "engine", "version": 1, "spec": "engine",
                           "params": {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "kv_block": 16,
                                      "chunked_prefill": True, "no_evict": False, "no_mix": False}}
    assert parse_policy("engine:8,64,32") == Engine(8, 64, 32)
    assert parse_policy("engine:8,64,32").spec() == "engine:8,64,32"
    assert parse_policy(" engine:nochunk ") == Engine(chunked_prefill=False)
    assert parse_policy(Engine(4, 16, 1, False).spec()) == Engine(4, 16, 1, False)


def test_engine_takes_tensorrt_llms_guaranteed_no_evict():
    """``noevict`` (TensorRT-LLM's GUARANTEED_NO_EVICT), alone or after nochunk, with or without sizes; the spec
    reads back as the same policy."""
    assert parse_policy("engine:noevict") == Engine(no_evict=True)
    assert parse_policy("engine:8,64,32,nochunk,noevict") == Engine(8, 64, 32, False, True)
    for e in (Engine(no_evict=True), Engine(chunked_prefill=False), Engine(8, 64, 32, False, True)):
        assert parse_policy(e.spec()) == e
    with pytest.raises(OpmapError, match="engine takes"):
        parse_policy("engine:8,64,32,noevict,noevict")


def test_engine_takes_vllm_v0s_prompt_steps_apart():
    """``nomix`` (vLLM V0's default scheduler: prompt steps apart from decode steps) after nochunk, with or without
    sizes; it needs nochunk (V0 runs whole prompts in its prompt steps) and reads back as the same policy."""
    assert parse_policy("engine:1024,49152,16,nochunk,nomix") == Engine(1024, 49152, 16, False, False, True)
    for e in (Engine(chunked_prefill=False, no_mix=True), Engine(8, 64, 32, False, True, True)):
        assert parse_policy(e.spec()) == e
    with pytest.raises(OpmapError, match="runs whole prompts: add nochunk"):
        parse_policy("engine:nomix")


@pytest.mark.parametrize("fn,spec,match", [
    (parse_policy, "engine:8,4,16", r"--max-num-batched-tokens \(4\) must be >= --max-num-seqs \(8\)"),
    (parse_policy, "engine:0,64,16", "integers >= 1"),
    (parse_policy, "engine:8,64", "engine takes MAX_NUM_SEQS"),
    (parse_policy, "static", "accepted: none, static:B"),
    (parse_policy, "dynamic:8", "WAIT_MS"),
    (parse_policy, "static:0", "integers >= 1"),
    (parse_policy, "fifo", "accepted"),
    (parse_arrival, "poisson:-1", "accepted: poisson:RATE"),
    (parse_arrival, "gamma:1", "accepted"),
    (parse_length, "0", "accepted: N, uniform:A,B"),
    (parse_length, "uniform:5,2", "accepted"),
    (parse_service_time, "exp:0", "accepted: fixed:MS, exp:MS"),
])
def test_bad_specs_name_what_is_accepted(fn, spec, match):
    with pytest.raises(OpmapError, match=match) as e:
        fn(spec)
    assert "\n" not in str(e.value)


def test_service_time_refuses_iteration_policies():
    with pytest.raises(OpmapError, match="use none, static:B or dynamic"):
        simulate(_reqs([0], [1], [1]), Continuous(), parse_service_time("fixed:10"))


@pytest.mark.parametrize("spec, refused", [("none", False), ("static:8", False), ("dynamic:8,5", False),
                                           ("continuous", True), ("chunked:128", True), ("engine", True)])
def test_a_service_time_takes_only_the_policies_that_serve_whole_requests(spec, refused):
    """A service time has no iterations: continuous, chunked and engine are refused with it, by their parsed
    policy, before any simulation."""
    from opmap.serve.policies import check_with_service_time, parse_policy

    if refused:
        with pytest.raises(OpmapError, match="schedules iterations, which a service time does not have"):
            check_with_service_time(parse_policy(spec))
    else:
        check_with_service_time(parse_policy(spec))
