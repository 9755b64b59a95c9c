"""The capacity search: probes fixed by the starting rate alone (so any engine gives the same answer), worked by
hand against a step function whose edge is known."""

from __future__ import annotations

import pytest

from opmap.errors import OpmapError
from opmap.serve.metrics import find_capacity


def _step(capacity: float):
    """A run whose SLO holds exactly up to ``capacity`` requests/s."""
    def run(rate: float) -> dict:
        return {"validity": {"valid": rate <= capacity, "reason": f"{rate:g} vs {capacity:g}"}}
    return run


def test_capacity_search_by_hand():
    # rate0 = 1, edge at 3: grid 1/8 .. 16 -> first invalid 4, bracket [2, 4]; four evenly spaced probes a round:
    # 2.4 2.8 | 3.2 3.6 -> [2.8, 3.2]; 2.88 2.96 | 3.04 3.12 -> [2.96, 3.04] (2.7% wide);
    # 2.976 2.992 | 3.008 3.024 -> [2.992, 3.008] (0.53% <= 1%): 8 + 3 x 4 = 20 runs
    c = find_capacity(_step(3.0), 1.0)
    assert c["converged"]
    assert c["rate_per_s"] == pytest.approx(2.992, rel=1e-12)
    assert c["bracket"][1] == pytest.approx(3.008, rel=1e-12)
    assert len(c["runs"]) == 20
    assert [r["rate_per_s"] for r in c["runs"][:8]] == [2.0 ** k for k in range(-3, 5)]


def test_capacity_search_moves_its_grid_and_stays_within_tolerance():
    # edge at 1000 from rate0 = 1: the first grid (to 16) is all valid, the next (32 .. 4096) brackets [512, 1024]
    c = find_capacity(_step(1000.0), 1.0)
    assert c["converged"] and c["rate_per_s"] <= 1000.0 < c["bracket"][1]
    assert 1000.0 - c["rate_per_s"] <= 0.01 * c["rate_per_s"]
    assert [r["rate_per_s"] for r in c["runs"][8:16]] == [2.0 ** k for k in range(5, 13)]
    low = find_capacity(_step(0.001), 1.0)  # the first grid all invalid: it moves down
    assert low["converged"] and 0.001 - low["rate_per_s"] <= 0.01 * low["rate_per_s"]


def test_capacity_search_brackets_an_edge_between_two_grids():
    """Edge at 20 from rate0 = 1: the first grid (1/8 .. 16) is all valid and the next (32 .. 4096) all invalid,
    so the edge lies between the grids: bracket [16, 32], then rounds of four probes: 19.2 22.4 -> [19.2, 22.4];
    19.84 20.48 -> [19.84, 20.48]; ... down to 1%. (Judging each grid alone, it would swing back and forth.)"""
    c = find_capacity(_step(20.0), 1.0)
    assert c["converged"] and c["rate_per_s"] <= 20.0 < c["bracket"][1]
    assert 20.0 - c["rate_per_s"] <= 0.01 * c["rate_per_s"]
    assert [r["rate_per_s"] for r in c["runs"][16:20]] == pytest.approx([19.2, 22.4, 25.6, 28.8])


def test_capacity_search_does_not_depend_on_the_order_probes_finish():
    def backwards(fn, rates):  # evaluates last to first, as a pool might finish them, returns in input order
        return list(reversed([fn(r) for r in reversed(rates)]))

    assert find_capacity(_step(7.7), 5.0, map_fn=backwards) == find_capacity(_step(7.7), 5.0)


def test_capacity_search_refuses_a_zero_start():
    with pytest.raises(OpmapError, match="starting rate > 0"):
        find_capacity(_step(1.0), 0.0)


@pytest.mark.parametrize("spec,want", [
    ("engine:8,64,32", {"max_num_seqs": 8, "max_num_batched_tokens": 64, "kv_block": 32, "chunked_prefill": True}),
    ("continuous:1024", {"max_num_seqs": 256, "max_num_batched_tokens": 1024, "kv_block": None,
                         "chunked_prefill": False}),
    ("chunked:256", {"max_num_seqs": 256, "max_num_batched_tokens": 256, "kv_block": None, "chunked_prefill": True}),
    ("static:4", {"max_num_seqs": 4, "max_num_batched_tokens": None, "kv_block": None, "chunked_prefill": False}),
    ("none", {"max_num_seqs": 1, "max_num_batched_tokens": None, "kv_block": None, "chunked_prefill": False}),
])
def test_summary_names_the_step_limits_and_preemptions(spec, want):
    """serve.json's scheduler block in vLLM's names, from the policy's own parameters (the continuous and chunked
    policies cap a step at 256 sequences, vLLM's max_num_seqs); policies other than engine never preempt."""
    import numpy as np

    from opmap.serve import Requests, TableCost, parse_policy, simulate, summarize

    reqs = Requests(np.zeros(3), np.full(3, 10), np.full(3, 2), "offline")
    s = summarize(simulate(reqs, parse_policy(spec), TableCost([1000], [1.0], [1], [0], [[0.01]])))
    assert s["scheduler"] == want
    assert s["preemptions"] == {"total": 0, "requests_preempted": 0, "max_per_request": 0}
