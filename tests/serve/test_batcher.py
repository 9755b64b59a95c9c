"""The harness batcher in front of the replicas (router batched:SIZE,WAIT_MS, opmap.serve.batcher): its groups by
hand from AMD's v4.1 SyncServer loop (sync_sut.py ``batch_samples_loop``), its mean hold against a closed form
for Poisson arrivals, and the simulator timing latencies from the arrival, the hold included."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from opmap.errors import OpmapError
from opmap.serve import Requests, TableCost, make_requests, simulate
from opmap.serve.batcher import Batcher, dispatch, parse_batcher
from opmap.serve.policies import Engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hf_family_configs import QWEN3_8B, shallow  # noqa: E402


def test_groups_leave_at_size_or_at_the_first_check_a_wait_after_the_last():
    """WAIT 0.3 s, arrivals 0, 0.1, 0.2, 0.35, 0.4, 1.5, 3.0, 3.05, two replicas. The clock starts at the first
    (0). Checks at each arrival: 0.35 is the first at least 0.3 after 0, so 0, 0.1, 0.2, 0.35 leave then, to
    replica 0. 0.4 is held; no query for 0.3 s, so the get times out at 0.7, 0.35 after the last group: it leaves
    at 0.7 (replica 1). 1.5 and 3.0 arrive more than 0.3 s after the last group: each leaves at once (replicas
    0, 1). 3.05 is held until the timeout at 3.35 (replica 0). With SIZE 2: 0 and 0.1 leave at 0.1 (two held),
    0.2 and 0.35 at 0.35; replicas dealt over three."""
    arr = np.array([0, 0.1, 0.2, 0.35, 0.4, 1.5, 3.0, 3.05])
    t, r = dispatch(arr, Batcher(96, 0.3), 2)
    np.testing.assert_allclose(t, [0.35, 0.35, 0.35, 0.35, 0.7, 1.5, 3.0, 3.35])
    np.testing.assert_array_equal(r, [0, 0, 0, 0, 1, 0, 1, 0])
    t, r = dispatch(arr, Batcher(2, 0.3), 3)
    np.testing.assert_allclose(t[:4], [0.1, 0.1, 0.35, 0.35])
    np.testing.assert_array_equal(r, [0, 0, 1, 1, 2, 0, 1, 2])


def test_mean_hold_under_poisson_arrivals():
    """Poisson arrivals at lambda = 100/s, WAIT 0.3 s, SIZE never reached: a group leaves with the first arrival
    at least WAIT after the last group, so a cycle holds the lambda WAIT arrivals of the WAIT window, spread
    uniformly over it, plus the one that ends it. The cycle lasts WAIT + 1/lambda (memoryless overshoot). Mean
    hold per request = lambda WAIT (WAIT / 2 + 1/lambda) / (lambda WAIT + 1) = 30 x 0.16 / 31 = 0.1548 s;
    mean group size lambda WAIT + 1 = 31."""
    lam, wait = 100.0, 0.3
    arr = make_requests(f"poisson:{lam:g}", "1", "1", 200_000, seed=3).arrival_s
    t, r = dispatch(arr, Batcher(10_000, wait), 1)
    assert float(np.mean(t - arr)) == pytest.approx(lam * wait * (wait / 2 + 1 / lam) / (lam * wait + 1), rel=0.02)
    assert len(arr) / len(np.unique(t)) == pytest.approx(lam * wait + 1, rel=0.02)
    assert np.all(np.diff(t) >= 0) and np.all(t >= arr)


def _reqs(arr, inp, out):
    return Requests(np.asarray(arr, float), np.asarray(inp), np.asarray(out), "trace:hand")


def test_ttft_runs_from_the_arrival_the_hold_included():
    """Prefill 1 ms/token, decode 10 ms; three 10-token prompts (1 token out) at 0, 0.1, 0.35, one replica.
    Without the batcher each runs on arrival: TTFT 0.010 s each. batched:96,300 hands all three over at 0.35:
    one 30-token prompt step, 0.35 -> 0.38, TTFTs 0.38, 0.28, 0.03."""
    cost = TableCost([1000], [1.0], [1], [0, 1000], [[0.01, 0.01]])
    reqs = _reqs([0, 0.1, 0.35], [10, 10, 10], [1, 1, 1])
    plain = simulate(reqs, Engine(), cost)
    np.testing.assert_allclose(plain.first_s - plain.arrival_s, [0.01] * 3)
    held = simulate(reqs, Engine(), cost, router="batched:96,300")
    np.testing.assert_allclose(held.first_s - held.arrival_s, [0.38, 0.28, 0.03])
    np.testing.assert_allclose(held.arrival_s, [0, 0.1, 0.35])
    assert held.router == "batched:96,300"


@pytest.mark.parametrize("model", ["qwen3-hf", "gpt2"])
def test_on_priced_models_each_group_reaches_its_replica(tmp_path, model):
    """A Hugging Face config (Qwen3-8B cut to 2 layers) and a zoo model priced on an H100: with batched:8,50 over
    three replicas every request starts on the replica its group went to, no earlier than the group left."""
    from opmap.serve.model_cost import model_table_cost

    if model == "qwen3-hf":
        p = tmp_path / "config.json"
        p.write_text(json.dumps(shallow(QWEN3_8B, 2)))
        model = str(p)
    cost = model_table_cost(model, "h100-sxm")
    reqs = make_requests("poisson:200", "uniform:16,400", "uniform:1,100", 400, seed=2)
    deliver, where = dispatch(reqs.arrival_s, Batcher(8, 0.05), 3)
    res = simulate(reqs, Engine(), cost, replicas=3, router="batched:8,50")
    np.testing.assert_array_equal(res.replica, where)
    assert np.all(res.start_s >= deliver - 1e-12)
    assert np.all(np.isfinite(res.finish_s))


@pytest.mark.parametrize("router,match", [("batched:0,300", "integer SIZE >= 1"), ("batched:96", "WAIT_MS > 0"),
                                          ("batched:96,-1", "WAIT_MS > 0"), ("batch:96,300", "accepted")])
def test_bad_batcher_specs_say_what_is_accepted(router, match):
    with pytest.raises(OpmapError, match=match) as e:
        simulate(_reqs([0], [10], [1]), Engine(), TableCost([1000], [1.0], [1], [0], [[0.01]]), router=router)
    assert "\n" not in str(e.value)
    assert parse_batcher("round_robin") is None
