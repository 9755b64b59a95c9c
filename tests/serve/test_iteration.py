"""The continuous policy's counting scheduler (iteration.py: decodes counted, their finishes in a heap) held equal
to the reference that visits every request every iteration (serve/reference.py ``reference_continuous``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from opmap.serve import TableCost, make_requests, simulate
from opmap.serve.policies import Continuous
from opmap.serve.reference import reference_continuous

ROOT = Path(__file__).resolve().parents[2]


def _same_as_reference(reqs, pol, cost):
    """The same start, first-token and finish times, and the same inter-token gaps (their count and sum)."""
    res = simulate(reqs, pol, cost)
    ref = reference_continuous(reqs, pol, cost)
    np.testing.assert_allclose(res.start_s, ref.start)
    np.testing.assert_allclose(res.first_s, ref.first)
    np.testing.assert_allclose(res.finish_s, ref.finish)
    assert res.itl_weight.sum() == len(ref.gaps) == int((reqs.output_len - 1).sum())
    assert float((res.itl_gap_s * res.itl_weight).sum()) == pytest.approx(sum(ref.gaps))


def test_by_hand_a_prefill_iteration_runs_alone_and_decodes_wait_for_it():
    """Prefill 1 ms per prompt token, decode 10 ms a step. A (10 + 3 tokens) at 0: prefill 0-0.010, decodes end at
    0.020 and 0.030. B (20 + 2) arrives at 0.015, during A's first decode: admitted at 0.020, its prefill runs
    alone 0.020-0.040 (A waits), then one decode of both 0.040-0.050: A's last token and B's."""
    from opmap.serve.arrivals import Requests

    reqs = Requests(np.array([0.0, 0.015]), np.array([10, 20]), np.array([3, 2]), "given")
    cost = TableCost([1000], [1.0], [1], [0, 1000], [[0.01, 0.01]])
    ref = reference_continuous(reqs, Continuous(), cost)
    np.testing.assert_allclose(ref.start, [0.0, 0.020])
    np.testing.assert_allclose(ref.first, [0.010, 0.040])
    np.testing.assert_allclose(ref.finish, [0.050, 0.050])
    np.testing.assert_allclose(sorted(ref.gaps), [0.010, 0.010, 0.030])  # A: 0.010, then 0.030 across B's prefill
    _same_as_reference(reqs, Continuous(), cost)


@pytest.mark.parametrize("seed,cap,pol", [(1, None, Continuous(8192)), (2, 3000, Continuous(512, max_seqs=8)),
                                          (3, 1200, Continuous(300, max_seqs=64))])
def test_the_counting_scheduler_is_the_plain_one(seed, cap, pol):
    """Random traces, with and without a KV cache that holds back admissions, synthetic step costs."""
    reqs = make_requests("poisson:30", "uniform:1,300", "uniform:1,200", 250, seed=seed)
    cost = TableCost([16, 100, 4000], [0.0025, 0.02, 0.5], [1, 64], [0, 1e5], [[0.008, 0.02], [0.012, 0.03]],
                     kv_capacity_tokens=cap)
    _same_as_reference(reqs, pol, cost)


@pytest.mark.parametrize("model", ["examples/tiny-llama.json", "gpt2"])
def test_the_counting_scheduler_is_the_plain_one_on_priced_models(model):
    """A Hugging Face config and a zoo model priced by opmap's cost model on an H100 (model_table_cost)."""
    from dataclasses import replace

    from opmap.serve.model_cost import model_table_cost

    cost = replace(model_table_cost(str(ROOT / model) if model.endswith(".json") else model, "h100-sxm"),
                   kv_capacity_tokens=4000)
    reqs = make_requests("poisson:200", "uniform:16,400", "uniform:1,300", 200, seed=7)
    _same_as_reference(reqs, Continuous(2048, max_seqs=32), cost)
