"""serve with DP attention (``model_table_cost(..., ep=N, dp_attention=True)`` and opmap.serve.lockstep): N attention
ranks of one device each, as SGLang --enable-dp-attention and TensorRT-LLM enable_attention_dp run a MoE.

On Qwen3-30B-A3B cut to 2 layers (its published config.json) and the zoo's Mixtral 8x7B: each rank's KV pool is one
device's free memory over the whole KV bytes per token (2 x layers x KV heads x head dim x 2 bytes: no split by TP),
each device holds the dense weights whole and E / N of the experts (the parameter counts written out from the
configs), a request served alone takes what one rank's step prices, N ranks at saturation serve N times one rank's
tokens, and a rank's step is a single device's plus at most the dispatch and combine all-to-all of its MoE layers."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from opmap.errors import OpmapError
from opmap.hardware import get_hardware
from opmap.mapping.collectives import Collective, collective_time
from opmap.serve import parse_policy, simulate
from opmap.serve.arrivals import Requests
from opmap.serve.model_cost import model_table_cost

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hf_family_configs import QWEN3_30B_A3B, shallow  # noqa: E402

Q = QWEN3_30B_A3B


def _qwen_params() -> tuple[int, int]:
    """(dense, expert) parameters of Qwen3-30B-A3B cut to 2 layers, from its config: embedding and head (untied),
    per layer q / k / v / o, q and k norms (head_dim each), two RMSNorms, the router (hidden x experts) and the
    experts (3 x hidden x moe_intermediate each), the final norm."""
    h, hd, layers = Q["hidden_size"], Q["head_dim"], 2
    heads, kv, e = Q["num_attention_heads"], Q["num_key_value_heads"], Q["num_experts"]
    per_layer = h * hd * (heads + 2 * kv) + heads * hd * h + 2 * hd + 2 * h + h * e
    dense = 2 * Q["vocab_size"] * h + layers * per_layer + h
    return dense, layers * e * 3 * h * Q["moe_intermediate_size"]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    p = tmp_path_factory.mktemp("qwen") / "config.json"
    p.write_text(json.dumps(shallow(Q, 2)))
    dpa = model_table_cost(str(p), "h100-sxm", "bf16", 2, ep=2, ep_imbalance=1.0, dp_attention=True)
    one = model_table_cost(str(p), "h100-sxm", "bf16", 1)
    return dpa, one


def test_each_rank_holds_its_own_kv_pool_and_half_the_experts(qwen):
    dpa, one = qwen
    kv_per_token = 2 * 2 * Q["num_key_value_heads"] * Q["head_dim"] * 2  # K and V, 2 layers, bf16: 4096 B
    assert dpa.kv_bytes_per_token == kv_per_token == one.kv_bytes_per_token  # whole on every rank: no TP split
    m = dpa.memory
    assert dpa.kv_capacity_tokens == int(m["usable_bytes"] // kv_per_token)
    assert m["usable_bytes"] == pytest.approx(m["capacity_bytes"] * 0.9 - m["weights_bytes"] - m["reserve_bytes"])
    dense, experts = _qwen_params()
    assert m["weights_bytes"] == pytest.approx((dense + experts / 2) * 2, rel=1e-9)  # bf16, E / 2 experts a device
    assert one.memory["weights_bytes"] == pytest.approx((dense + experts) * 2, rel=1e-9)
    expert_bytes = 3 * Q["hidden_size"] * Q["moe_intermediate_size"] * 2 * 2  # one expert, 2 layers, bf16
    assert dpa.floor.expert_bytes == pytest.approx(expert_bytes) and dpa.floor.ranks == 2
    assert dpa.attention_ranks == 2 and dpa.layout["dp_attention"] and dpa.layout["attention_ranks"] == 2


MEASURED_SPREAD = 1.05  # 49.08 / 47.38 = 1.036: a DEP2 rank's measured MoE layer over one device's at 1 token


def test_a_rank_step_is_a_device_step_plus_at_most_its_all_to_all(qwen):
    """At imbalance 1 a rank's kernels are a single device's or less (E / 2 experts: their weights halved, the same
    routed tokens), and its MoE layers add a dispatch and a combine all-to-all each of the rank's tokens x top_k x
    hidden x 2 bytes between the 2 ranks (NVLink). The H100 SXM prices its MoE layers off NVIDIA's measured
    TensorRT-LLM times (h100-sxm.moe.json), where a DEP2 rank's layer routes and permutes the EP group's 2 b tokens:
    a little over one device's at b (Qwen3-30B-A3B bf16: 47.38 us at 1 token on one GPU, 49.08 us at 2 tokens at
    moe_ep 2, the file's values), so the MoE part may exceed one device's by up to MEASURED_SPREAD."""
    dpa, one = qwen
    hw = get_hardware("h100-sxm")
    for b in (1, 16, 256, 4096):
        msg = b * Q["num_experts_per_tok"] * Q["hidden_size"] * 2
        a2a = 2 * 2 * collective_time(hw, Collective("all_to_all", msg, 2, "scale_up")).seconds
        t = dpa.decode_s(b, b * 256)  # a priced point: b sequences of 256 KV tokens on one rank
        assert a2a < t <= one.decode_s(b, b * 256) * MEASURED_SPREAD + a2a * (1 + 1e-9)


def _offline(n: int, inp: int, out: int) -> Requests:
    return Requests(np.zeros(n), np.full(n, inp), np.full(n, out), "offline")


@pytest.mark.parametrize("policy", ["engine", "continuous", "chunked:512"])
def test_a_request_alone_takes_what_one_ranks_step_prices(qwen, policy):
    """Requests 10 s apart: each runs alone on its rank (round-robin), the other rank idle: its TTFT is one prefill
    step of its prompt and its tokens come as one rank's decode steps price them, as on a lone rank."""
    dpa = qwen[0]
    n = 6
    reqs = Requests(np.arange(n) * 10.0, np.full(n, 256), np.full(n, 32), "poisson")
    group = simulate(reqs, parse_policy(policy), dpa)
    alone = simulate(reqs, parse_policy(policy), replace(dpa, attention_ranks=1))
    assert np.allclose(group.first_s - group.arrival_s, dpa.prefill_s(256, 1), rtol=1e-12)
    assert np.allclose(group.first_s, alone.first_s, rtol=1e-12)
    assert np.allclose(group.finish_s, alone.finish_s, rtol=1e-12)


def test_ranks_at_saturation_serve_n_times_one_rank():
    """An offline queue deep enough to fill every rank: 2 and 4 lockstepped ranks of the same (hand-made) step cost
    finish 2 and 4 times one rank's tokens in the same time, to the last partial steps."""
    from opmap.serve.cost import TableCost

    c = TableCost([1, 4096], [0.01, 0.1], [1, 256], [0, 1e6], [[0.005, 0.015], [0.02, 0.03]],
                  kv_capacity_tokens=200_000)
    reqs = _offline(4096, 512, 128)
    for policy in ("engine", "continuous"):
        base = reqs.output_len.sum() / simulate(reqs, parse_policy(policy), c).finish_s.max()
        for n in (2, 4):
            run = simulate(reqs, parse_policy(policy), replace(c, attention_ranks=n))
            got = reqs.output_len.sum() / run.finish_s.max()
            # each rank runs 4096 / n requests: fewer full batches than one rank's 4096, so a little under n x
            assert n * 0.97 < got / base <= n * (1 + 1e-9) / (1 - 1e-3)


def test_qwen_ranks_at_saturation(qwen):
    """The priced Qwen3 ranks: 2 ranks serve twice one rank's output tokens (to 3 %), each rank's step carrying its
    all-to-all."""
    dpa = qwen[0]
    reqs = _offline(1024, 128, 32)
    one = reqs.output_len.sum() / simulate(reqs, parse_policy("engine"), replace(dpa, attention_ranks=1)).finish_s.max()
    two = reqs.output_len.sum() / simulate(reqs, parse_policy("engine"), dpa).finish_s.max()
    assert 2 * 0.97 < two / one <= 2 * (1 + 1e-9)


def test_mixtral_ranks_hold_a_device_of_kv_each():
    """Mixtral 8x7B (32 layers, 8 KV heads of 128, 8 experts of 3 x 4096 x 14336, vocabulary 32000, bf16) over 2
    ranks of an H200: the dense weights whole and 4 experts a device; each rank's KV pool one device's free memory
    over 2 x 32 x 8 x 128 x 2 = 131072 B a token."""
    c = model_table_cost("mixtral-8x7b", "h200", "bf16", 2, ep=2, dp_attention=True)
    h, L = 4096, 32
    dense = 2 * 32000 * h + L * (2 * h * h + 2 * h * 1024 + h * 8 + 2 * h) + h
    experts = L * 8 * 3 * h * 14336
    assert c.memory["weights_bytes"] == pytest.approx((dense + experts / 2) * 2, rel=1e-9)
    assert c.kv_bytes_per_token == 2 * L * 8 * 128 * 2
    assert c.kv_capacity_tokens == int(c.memory["usable_bytes"] // c.kv_bytes_per_token)
    tp = model_table_cost("mixtral-8x7b", "h200", "bf16", 2, ep=2)
    assert tp.kv_bytes_per_token == c.kv_bytes_per_token / 2  # tensor-parallel attention splits the KV heads


@pytest.mark.parametrize("kw,words", [
    ({"tp": 2, "ep": 1}, "--dp-attention runs the attention data-parallel over the EP ranks: it needs --ep above 1"),
    ({"tp": 4, "ep": 2}, "--ep must equal --tp (the replica's devices), got --ep 2 --tp 4"),
    ({"tp": 2, "ep": 2, "pp": 64}, "--pp 64 exceeds the 32 layers of mixtral-8x7b"),
])
def test_bad_layouts_are_refused_before_pricing(kw, words):
    tp = kw.pop("tp")
    with pytest.raises(OpmapError, match=words.replace("(", r"\(").replace(")", r"\)")):
        model_table_cost("mixtral-8x7b", "h200", "bf16", tp, dp_attention=True, **kw)


def test_a_policy_without_iterations_is_refused():
    from opmap.serve.cost import TableCost

    c = TableCost([1, 4096], [0.01, 0.1], [1, 256], [0, 1e6], [[0.005, 0.015], [0.02, 0.03]], attention_ranks=2)
    with pytest.raises(OpmapError, match="use --policy engine, continuous or chunked, got 'static:4'"):
        simulate(_offline(8, 16, 4), parse_policy("static:4"), c)
    with pytest.raises(OpmapError, match="not shared"):
        simulate(_offline(8, 16, 4), parse_policy("engine"), c, router="shared")
