"""fit over a MoE prices its DP-attention layouts on several pipeline stages (DEP2 PP2: 2 attention ranks, each a
pipeline of 2 devices) by serve's path: the cell's figures for that layout are those of
``model_table_cost(..., tp=2, ep=2, dp_attention=True, pp=2)`` under the search's arithmetic (opmap.explore.layouts
``_bound``: the memory serve sizes, the saturation run's output tokens/s x replicas / budget)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from opmap.explore.fit import default_policy, fit_cell
from opmap.explore.layouts import label
from opmap.record import record
from opmap.serve.arrivals import Arrival, parse_length
from opmap.serve.capacity import RateProbe
from opmap.serve.metrics import Slo
from opmap.serve.model_cost import model_table_cost

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hf_family_configs import QWEN3_30B_A3B, shallow  # noqa: E402

SLO = Slo(2.0, 0.2)  # fit's and serve's default: p99 TTFT 2 s, TPOT 200 ms
# Qwen3-30B-A3B's published config cut to 4 layers and narrowed (as tests/serve/test_dp_attention_pp.py prices it)
SMALL = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
         "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128, "vocab_size": 1024,
         "max_position_embeddings": 4096}
REQUESTS, ILEN, OLEN = 64, "256", "32"


@pytest.fixture(scope="module")
def qwen_cell(tmp_path_factory):
    p = tmp_path_factory.mktemp("qwen3moe") / "config.json"
    p.write_text(json.dumps({**shallow(QWEN3_30B_A3B, 4), **SMALL}))
    return str(p), fit_cell(str(p), "h200", SLO, ILEN, OLEN, REQUESTS, devices=4, devices_budget=4)


def _saturation_bound(cost, replicas: int, budget: int) -> float:
    """The search's bound: one replica's offline saturation run (all requests at t = 0, serve's engine policy, the
    same requests drawn at seed 0), its output tokens/s x replicas over the budget's devices."""
    probe = RateProbe(Arrival("poisson", 1.0), parse_length(ILEN), parse_length(OLEN), REQUESTS, default_policy(),
                      cost, 1, "round_robin", 0, SLO)
    return probe.saturation().throughput.output_tokens_per_s * replicas / budget


def test_fit_prices_dep2_pp2_by_serves_cost(qwen_cell):
    model, cell = qwen_cell
    # devices=4 on a budget of 4: tp4 and tp2 pp2, each with tensor-parallel experts, ep = tp, and DP attention
    assert [label(lay) for lay in cell.layouts] == [
        "1 x tp4", "1 x tp4 ep4", "1 x tp4 ep4 dpa", "1 x tp2 pp2", "1 x tp2 pp2 ep2", "1 x tp2 pp2 ep2 dpa"]
    dep = cell.layouts[-1]
    assert (dep.tp, dep.pp, dep.ep, dep.dp_attention, dep.replicas) == (2, 2, 2, True, 1) and dep.fits
    # serve's cost of DEP2 PP2 at the longest request drawn (256 + 32 tokens, fixed lengths), as the search prices it
    cost = model_table_cost(model, "h200", "bf16", 2, pp=2, ep=2, dp_attention=True, max_context=256 + 32)
    assert dep.memory == {"kv_dtype": cost.kv_dtype, **{k: v for k, v in cost.memory.items() if k != "reserve"}}
    assert dep.bound_per_device_tokens_per_s == pytest.approx(_saturation_bound(cost, 1, 4), rel=1e-12)
    # not the same layout's figures without DP attention: each rank holds the dense weights whole (per stage)
    plain = cell.layouts[-2]
    assert (plain.pp, plain.ep, plain.dp_attention) == (2, 2, False)
    assert dep.memory["weights_bytes"] > plain.memory["weights_bytes"]
    assert dep.bound_per_device_tokens_per_s != pytest.approx(plain.bound_per_device_tokens_per_s, rel=1e-6)


def test_fit_json_names_the_dep_pp_layout(qwen_cell):
    _, cell = qwen_cell
    written = [lay for lay in record(cell)["layouts"] if lay.get("dp_attention") and lay["pp"] == 2]
    assert len(written) == 1 and written[0]["ep"] == 2 and written[0]["tp"] == 2
    assert label(written[0]) == "1 x tp2 pp2 ep2 dpa"
