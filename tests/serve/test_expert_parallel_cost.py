"""serve's step pricing with the experts over the replica's tp group (``model_table_cost(..., ep=)``): the zoo's
Mixtral 8x7B on 2 H200s. Each device holds E / ep = 4 whole experts instead of 8 halves: the same weight bytes
(experts / tp), so the same KV capacity; the busiest rank's expert work x the imbalance, never less; the layout
says so."""

from __future__ import annotations

import pytest

from opmap.errors import OpmapError
from opmap.serve.model_cost import model_table_cost


@pytest.fixture(scope="module")
def costs():
    return {imb: model_table_cost("mixtral-8x7b", "h200", "bf16", 2, ep=2, ep_imbalance=imb) for imb in (1.0, 2.0)}


def test_ep_over_tp_holds_the_same_weights_and_kv(costs):
    tp = model_table_cost("mixtral-8x7b", "h200", "bf16", 2)
    for c in costs.values():
        assert c.memory["weights_bytes"] == tp.memory["weights_bytes"]
        assert c.kv_capacity_tokens == tp.kv_capacity_tokens
    assert costs[2.0].layout == {"tp": 2, "pp": 1, "ep": 2, "ep_imbalance": 2.0}
    assert "ep" not in tp.layout


def test_imbalance_never_speeds_a_step(costs):
    """A small decode batch reads its experts' weights (flat in the tokens): the imbalance leaves it be (to the
    rounding of the KV line's intercept); from 1024 sequences the experts' GEMMs scale with the tokens and it
    shows."""
    even, skew = costs[1.0], costs[2.0]
    for a, b in zip(even.prefill_time_s, skew.prefill_time_s):
        assert b >= a
    for n, ra, rb in zip(even.decode_batch, even.decode_time_s, skew.decode_time_s):
        assert all(y >= x * (1 - 1e-12) for x, y in zip(ra, rb))
        if n >= 1024:
            assert all(y > x for x, y in zip(ra, rb))
    assert skew.prefill_time_s[-1] > even.prefill_time_s[-1]  # a long prompt's expert GEMMs scale with tokens


def test_ep_must_divide_tp():
    with pytest.raises(OpmapError, match="--ep 4 must divide --tp 2"):
        model_table_cost("mixtral-8x7b", "h200", "bf16", 2, ep=4)
