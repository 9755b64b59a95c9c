"""Closed loops simulated directly (a user sends its next request when its previous one finishes, plus its think
time), checked against the interactive response-time law R = N / X - Z (Lazowska et al., Quantitative System
Performance, ch. 3): one server at batch 1 with a fixed service time S is saturated once N S >= S + Z, so
X = 1 / S and every request in steady state takes R = N S - Z."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from opmap.errors import OpmapError
from opmap.serve import Requests, parse_policy
from opmap.serve.cost import ServiceTime
from opmap.serve.policies import Engine
from opmap.serve.sim import ClosedLoop, simulate

ROOT = Path(__file__).resolve().parents[2]


def _reqs(n, inp=10, out=2):
    return Requests(np.zeros(n), np.full(n, inp), np.full(n, out), "closed")


@pytest.mark.parametrize("users,think_s", [(1, 0.0), (4, 0.0), (5, 0.02)])
def test_closed_loop_on_one_server_follows_the_response_time_law(users, think_s):
    """S = 10 ms, 200 requests. Throughput 1 / S: the last of n requests ends at n S (the server never idles
    once N S >= S + Z). Every request after the users' first ones takes R = N S - Z: N = 4, Z = 0: 40 ms;
    N = 5, Z = 20 ms: 30 ms; N = 1: 10 ms (and each request is sent when the one before it ends)."""
    s, n = 0.01, 200
    res = simulate(_reqs(n), parse_policy("none"), ServiceTime("fixed", s), closed=ClosedLoop(users, think_s))
    assert res.finish_s.max() == pytest.approx(n * s)
    lat = (res.finish_s - res.arrival_s)[users:]
    np.testing.assert_allclose(lat, users * s - think_s)
    assert n / res.finish_s.max() == pytest.approx(1 / s)


def test_a_lag_delays_each_arrival_and_a_think_time_per_request_each_send():
    """One user, S = 10 ms of service at batch 1: request k is sent think_s[k] after request k - 1 ends and
    arrives lag 2 ms later, so it ends at end[k - 1] + think_s[k] + 2 ms + 10 ms (the first sent at 0)."""
    s, lag, think = 0.01, 0.002, (0.0, 0.005, 0.0, 0.02)
    res = simulate(_reqs(4), parse_policy("none"), ServiceTime("fixed", s), closed=ClosedLoop(1, think, lag_s=lag))
    end = np.cumsum(np.array(think) + lag + s)
    np.testing.assert_allclose(res.finish_s, end, rtol=0, atol=1e-12)
    np.testing.assert_allclose(res.arrival_s, end - s, rtol=0, atol=1e-12)


@pytest.mark.parametrize("model", ["examples/tiny-llama.json", "gpt2"])
def test_one_user_sends_each_request_when_the_last_one_ends(model):
    """A Hugging Face config and a zoo model priced by model_table_cost, policy engine: with one user and no
    think time, request i + 1 is sent at request i's last token, so requests never overlap."""
    from opmap.serve.model_cost import model_table_cost

    cost = model_table_cost(str(ROOT / model) if model.endswith(".json") else model, "h100-sxm")
    res = simulate(_reqs(30, 64, 16), Engine(), replace(cost), closed=ClosedLoop(1))
    np.testing.assert_array_equal(res.arrival_s[1:], res.finish_s[:-1])
    np.testing.assert_array_equal(res.start_s, res.arrival_s)
    assert res.arrival_s[0] == 0.0


def test_bad_closed_loops_are_refused():
    with pytest.raises(OpmapError, match="users"):
        ClosedLoop(0)
    with pytest.raises(OpmapError, match="think time"):
        ClosedLoop(2, float("nan"))
    with pytest.raises(OpmapError, match="earlier one"):
        ClosedLoop(1, after=(-1, 2, 1))
    with pytest.raises(OpmapError, match="one next request"):
        ClosedLoop(1, after=(-1, 0, 0))
    with pytest.raises(OpmapError, match="2 first requests"):
        ClosedLoop(2, after=(-1, 0, 1))
    with pytest.raises(OpmapError, match="think_s has 2 entries for 3 requests"):
        simulate(_reqs(3), parse_policy("none"), ServiceTime("fixed", 0.01), closed=ClosedLoop(1, (0.0, 0.0)))


def _flat(prefill_s=0.010, decode_s=0.001):
    """Every step with a prompt in it 10 ms (mixed steps too: opmap.serve.cost.mixed_s adds the decodes' KV read,
    0 on a flat table), every decode-only step 1 ms."""
    from opmap.serve.cost import TableCost

    return TableCost([1, 1000], [prefill_s, prefill_s], [1, 2], [0, 1e6], [[decode_s, decode_s]] * 2)


@pytest.mark.parametrize("think_s,lag_s,first,finish", [
    # r0 prefill 0-10 ms; r1 (arrived at 1 ms) prefills beside r0's decode 10-20; one decode step 20-21 ends r1
    # (2 tokens); r2 sent 0.5 ms later arrives inside r0's lone decode step 21-22, prefills beside it 22-32; r0's
    # sixth token at 33, r2's third at 34
    (0.0005, 0.0, (0.010, 0.020, 0.032), (0.033, 0.021, 0.034)),
    # sent at r1's end (21 ms) with no lag: queued before the replica forms its next step, as an open loop's
    # arrival at 21 ms would be, so r2 prefills beside r0's decode 21-31, then 31-32, 32-33 end both
    (0.0, 0.0, (0.010, 0.020, 0.031), (0.033, 0.021, 0.033)),
    # every request reaches the engine 2 ms after its send: r0 2-12, r1 12-22 beside r0's decode, 22-23 ends r1;
    # r2 sent at 23.5 arrives at 25.5, while r0 decodes alone (23-24, 24-25, 25-26: its sixth token ends it), so
    # r2 prefills alone 26-36 and decodes 36-37, 37-38
    (0.0005, 0.002, (0.012, 0.022, 0.036), (0.026, 0.023, 0.038)),
])
def test_chains_send_each_request_at_its_predecessors_end(think_s, lag_s, first, finish):
    """Two client slots, three requests (10 prompt tokens; 6, 2 and 3 output tokens): r0 and r1 open the slots
    (sent at 0 and 1 ms), r2 waits on r1 (``after``), sent ``think_s`` after r1's last token."""
    from opmap.serve.policies import Engine

    loop = ClosedLoop(2, (0.0, 0.0, think_s), (-1, -1, 1), (0.0, 0.001, 0.0), lag_s)
    reqs = Requests(np.zeros(3), np.full(3, 10), np.array([6, 2, 3]), "chains")
    res = simulate(reqs, Engine(max_num_batched_tokens=1024, kv_block=256), _flat(), closed=loop)
    assert res.arrival_s == pytest.approx([0.0 + lag_s, 0.001 + lag_s, finish[1] + think_s + lag_s], abs=1e-12)
    assert res.first_s == pytest.approx(first, abs=1e-12)
    assert res.finish_s == pytest.approx(finish, abs=1e-12)
