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
