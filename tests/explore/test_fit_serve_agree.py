"""fit's figure for a layout of R replicas is the figure serve --find-capacity gives for that layout."""

from __future__ import annotations

import json

import pytest

from opmap.explore.fit import default_policy, fit_cell
from opmap.serve.arrivals import Arrival, parse_length
from opmap.serve.capacity import RateProbe, steady_capacity
from opmap.serve.metrics import Slo
from opmap.serve.model_cost import model_table_cost

SLO = Slo(2.0, 0.2)  # serve's and fit's default: p99 TTFT 2 s, TPOT 200 ms


def _serve(model: str, replicas: int, requests: int):
    """What serve MODEL --hardware h100-sxm --tp 1 --replicas R --find-capacity runs (its defaults: engine policy,
    round_robin, seed 0, the same lengths)."""
    cost = model_table_cost(model, "h100-sxm", "bf16", 1, max_context=256 + 32)
    probe = RateProbe(Arrival("poisson", 10.0), parse_length("256"), parse_length("32"), requests, default_policy(),
                      cost, replicas, "round_robin", 0, SLO)
    return steady_capacity(probe)


@pytest.mark.parametrize("model", ["gpt2", "hf"])
def test_fit_and_serve_give_one_capacity_for_the_same_layout(model, tmp_path):
    """4 x tp1 with 200 requests a run: fit searched one replica of 200 requests and took 4 x its rate, serve
    spread 200 requests over the 4 replicas, and its saturation ceiling (all at t = 0) gave each a batch of 50
    against one of 200: a lower ceiling for the same layout. The ceiling of 4 identical replicas is 4 times one's
    (each gets the same 200 requests of fixed lengths, so the same span): both must give the same requests/s."""
    if model == "hf":
        cfg = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512,
               "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
               "max_position_embeddings": 4096}
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        model = str(tmp_path / "config.json")
    cell = fit_cell(model, "h100-sxm", SLO, "256", "32", 200, devices=1, devices_budget=4)
    serve = _serve(model, 4, 200)
    lay = cell.layout
    assert (lay.tp, lay.pp, lay.replicas) == (1, 1, 4)
    assert serve.saturation_per_s == pytest.approx(4 * lay.saturation_per_s, rel=1e-9)
    assert cell.chosen.rate_at_slo_per_s == pytest.approx(serve.rate_per_s, rel=0.02)


def test_fit_prices_a_long_prompt_run_as_serve_does(tmp_path):
    """8192-token prompts, past the last default prefill point (2048): serve prices a prefill point at the run's
    longest prompt (opmap.serve.model_cost.prefill_lengths), so the quadratic attention of an 8192-token prompt is
    counted; fit's layout search prices the same way, so its saturation rate is serve's for the same layout, and
    not the rate of a table whose prefill stops at 2048 (which pays per token what a 2048-token prompt pays)."""
    cfg = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512,
           "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
           "max_position_embeddings": 16384}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = str(tmp_path / "config.json")
    cell = fit_cell(model, "h100-sxm", SLO, "8192", "16", 50, devices=1, devices_budget=1)

    def saturation(longest_prompt):
        cost = model_table_cost(model, "h100-sxm", "bf16", 1, max_context=8192 + 16, longest_prompt=longest_prompt)
        probe = RateProbe(Arrival("poisson", 10.0), parse_length("8192"), parse_length("16"), 50, default_policy(),
                          cost, 1, "round_robin", 0, SLO)
        return cost, steady_capacity(probe).saturation_per_s

    cost, as_serve = saturation(8192)
    assert max(cost.prefill_tokens) >= 8192  # a point at the longest prompt
    assert cell.layout.saturation_per_s == pytest.approx(as_serve, rel=1e-9)
    _, short_table = saturation(None)
    assert short_table > as_serve * 1.001  # the table without that point undercounts the attention: faster
