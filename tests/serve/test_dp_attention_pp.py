"""serve with DP attention over pipeline stages (``model_table_cost(..., ep=N, dp_attention=True, pp=P)``), as
TensorRT-LLM's developer-guide tables run Qwen3 MoE at DEP2 PP2 on RTX PRO 6000: N attention ranks, each a pipeline
of P devices, every stage's layers priced under the DP-attention layout.

On Qwen3-30B-A3B (its published config.json cut to 4 and 3 layers and narrowed: hidden 256, 8 experts of 128) and
the zoo's Mixtral 8x7B: at pp 2 a microbatch passes every stage plus one activation send (b s hidden x 2 bytes, bf16,
to the next stage's device, 2 further on), the slowest stage is its layers' DP-attention pp 1 times summed (the
embedding on the first stage, the head on the last) plus that send, and each device holds half the weights and
half the KV a token that pp 1 holds."""

from __future__ import annotations

import functools
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from opmap.hardware import get_hardware
from opmap.mapping.collectives import Collective, collective_time
from opmap.mapping.layout_collectives import placement
from opmap.serve import parse_policy, simulate
from opmap.serve.arrivals import Requests
from opmap.serve.model_cost import DECODE_KV, KV_GRID, model_table_cost
from opmap.serve.pricer import Pricer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hf_family_configs import QWEN3_30B_A3B, shallow  # noqa: E402

SMALL = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
         "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128, "vocab_size": 1024,
         "max_position_embeddings": 4096}


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """``qwen(layers)``: the narrowed Qwen3 config.json cut to ``layers``, written once for the module's tests."""
    root = tmp_path_factory.mktemp("qwen")

    @functools.cache
    def write(layers: int) -> str:
        p = root / f"qwen{layers}" / "config.json"
        p.parent.mkdir()
        p.write_text(json.dumps({**shallow(QWEN3_30B_A3B, layers), **SMALL}))
        return str(p)

    return write


@functools.cache
def _dep(model: str, pp: int):
    """The DP-attention table over 2 ranks at ``pp`` on H100s (the default expert load imbalance), priced once for
    the module's tests (a TableCost they only read)."""
    return model_table_cost(model, "h100-sxm", "bf16", 2, ep=2, dp_attention=True, pp=pp)


@functools.cache
def _priced(model: str, hw: str, pp: int):
    """The DP-attention table over 2 ranks at ``pp`` (experts evenly loaded) and, per priced point in pricing order,
    the parts the pricer split it into: (before the blocks, each layer, after them, the activation bytes a stage
    sends). Priced once for the module's tests (they only read it)."""
    parts = []
    stages = Pricer._stages

    def record(self, pre, layer_s, post, act):
        parts.append((pre, list(layer_s), post, act))
        return stages(self, pre, layer_s, post, act)

    Pricer._stages = record
    try:
        c = model_table_cost(model, hw, "bf16", 2, ep=2, ep_imbalance=1.0, dp_attention=True, pp=pp)
    finally:
        Pricer._stages = stages
    return c, parts


def _line(pts: list[tuple[float, float]]) -> list[float]:
    """A decode row on KV_GRID through two (total KV tokens, time) points (model_cost._kv_line at a bf16 KV)."""
    (x0, y0), (x1, y1) = pts
    slope = (y1 - y0) / (x1 - x0)
    return [y0 - slope * x0 + slope * kv for kv in KV_GRID]


def _check_stages(one, parts, two, hw_name: str, hidden: int, layers: int):
    """``two`` (pp 2) against the pp 1 parts: one microbatch's latency is pp 1's plus a send, the slowest stage the
    larger of (embedding + the first ceil(L / 2) layers, the other layers + head) plus the send."""
    hw = get_hardware(hw_name)
    link, stride = placement(hw, 4, 2)  # 2 ranks x 2 stages: the next stage's device 2 further on
    step = one.runtime["per_step_s"]
    per = math.ceil(layers / 2)
    seqs = [int(x) for x in one.prefill_tokens]
    tokens = [(1, s) for s in seqs] + [(b, 1) for b in one.decode_batch for _ in DECODE_KV]
    assert len(parts) == len(tokens)
    lat1, lat2, stage2 = [], [], []
    for (b, s), (pre, layer_s, post, act) in zip(tokens, parts):
        assert len(layer_s) == layers and act == b * s * hidden * 2  # bf16 activations, one rank's tokens
        send = collective_time(hw, Collective("send_recv", act, 2, link, stride=stride)).seconds
        lat1.append(pre + sum(layer_s) + post + step)
        lat2.append(lat1[-1] + send)
        stage2.append(max(pre + sum(layer_s[:per]), sum(layer_s[per:]) + post) + send + step)
    n = len(seqs)
    assert one.prefill_time_s == pytest.approx(lat1[:n], rel=1e-12)  # the parts are pp 1's times
    assert two.prefill_time_s == pytest.approx(lat2[:n], rel=1e-9)
    assert two.stage_prefill_time_s == pytest.approx(stage2[:n], rel=1e-9)
    for i, b in enumerate(one.decode_batch):
        at = [b * k for k in DECODE_KV]
        j = n + 2 * i
        assert one.decode_time_s[i] == pytest.approx(_line(list(zip(at, lat1[j:j + 2]))), rel=1e-9)
        assert two.decode_time_s[i] == pytest.approx(_line(list(zip(at, lat2[j:j + 2]))), rel=1e-9)
        assert two.stage_decode_time_s[i] == pytest.approx(_line(list(zip(at, stage2[j:j + 2]))), rel=1e-9)


@pytest.mark.parametrize("layers", [4, 3])
def test_qwen_stage_is_its_layers_dp_attention_times_plus_the_send(qwen, layers):
    """4 layers split 2 / 2, 3 layers 2 / 1 (ceil(L / pp) a stage)."""
    path = qwen(layers)
    one, parts = _priced(path, "h100-sxm", 1)
    two, _ = _priced(path, "h100-sxm", 2)
    _check_stages(one, parts, two, "h100-sxm", SMALL["hidden_size"], layers)
    assert two.pp == 2 and two.attention_ranks == 2 and two.layout["dp_attention"] and two.layout["pp"] == 2


def test_mixtral_stage_is_its_layers_dp_attention_times_plus_the_send():
    one, parts = _priced("mixtral-8x7b", "h200", 1)
    two, _ = _priced("mixtral-8x7b", "h200", 2)
    _check_stages(one, parts, two, "h200", 4096, 32)


def test_qwen_weights_and_kv_per_device_halve(qwen):
    """Qwen3 narrowed, 4 layers, bf16: dense = 2 x vocab x h (untied embedding and head) + per layer q / k / v / o,
    q and k norms, two RMSNorms, the router + the final norm; experts = layers x E x 3 x h x moe_intermediate. A
    device of a rank holds (dense + experts / 2) / pp x 2 bytes and its stage's KV: 2 x L / pp x KV heads x head dim
    x 2 bytes a token."""
    path = qwen(4)
    s, L = SMALL, 4
    h, hd, e = s["hidden_size"], s["head_dim"], s["num_experts"]
    heads, kv = s["num_attention_heads"], s["num_key_value_heads"]
    per_layer = h * hd * (heads + 2 * kv) + heads * hd * h + 2 * hd + 2 * h + h * e
    dense = 2 * s["vocab_size"] * h + L * per_layer + h
    experts = L * e * 3 * h * s["moe_intermediate_size"]
    for pp in (1, 2, 4):
        c = _dep(path, pp)
        assert c.memory["weights_bytes"] == pytest.approx((dense + experts / 2) * 2 / pp, rel=1e-9)
        assert c.kv_bytes_per_token == 2 * (L // pp) * kv * hd * 2
        assert c.kv_capacity_tokens == int(c.memory["usable_bytes"] // c.kv_bytes_per_token)
        assert c.floor.expert_bytes == pytest.approx(3 * h * s["moe_intermediate_size"] * 2 * L / pp)
        assert c.floor.pp == pp and c.floor.ranks == 2


def test_mixtral_weights_and_kv_per_device_halve():
    """Mixtral 8x7B (32 layers, 8 KV heads of 128, 8 experts of 3 x 4096 x 14336, vocabulary 32000, bf16) at DEP2
    PP2 on H200s: half of DEP2's (dense + experts / 2) weights, 16 layers' KV a token."""
    c = model_table_cost("mixtral-8x7b", "h200", "bf16", 2, ep=2, dp_attention=True, pp=2)
    h, L = 4096, 32
    dense = 2 * 32000 * h + L * (2 * h * h + 2 * h * 1024 + h * 8 + 2 * h) + h
    experts = L * 8 * 3 * h * 14336
    assert c.memory["weights_bytes"] == pytest.approx((dense + experts / 2) * 2 / 2, rel=1e-9)
    assert c.kv_bytes_per_token == 2 * (L // 2) * 8 * 128 * 2


def test_a_request_alone_on_piped_ranks(qwen):
    """Requests 10 s apart on DEP2 PP2: each runs alone on its rank, its TTFT one prefill of its prompt (one
    microbatch through both stages, no cheaper than a decode step of one sequence: TableCost._least) and its tokens
    as a lone rank's piped decode steps price them."""
    c = _dep(qwen(4), 2)
    n = 6
    reqs = Requests(np.arange(n) * 10.0, np.full(n, 256), np.full(n, 32), "poisson")
    group = simulate(reqs, parse_policy("engine"), c)
    alone = simulate(reqs, parse_policy("engine"), replace(c, attention_ranks=1))
    assert np.allclose(group.first_s - group.arrival_s, c.prefill_s(256, 1), rtol=1e-12)
    assert c.prefill_s(256, 1) == pytest.approx(c._least(c._prefill(c.prefill_time_s, 256), 256, c.decode_time_s),
                                                rel=1e-12)
    assert np.allclose(group.finish_s, alone.finish_s, rtol=1e-12)


def test_qwen_captured_whole_prices_the_stages_alike(qwen, monkeypatch):
    """The model captured whole (its blocks its layers) gives the stages the 4-layer extrapolation gives: the same
    layers' DP-attention times on each stage."""
    from opmap.serve.resolve import Resolved

    path = qwen(4)
    periodic, _ = _priced(path, "h100-sxm", 2)  # priced before the patch below: from the 4-layer extrapolation
    assert "captured whole" not in periodic.source
    monkeypatch.setattr(Resolved, "stack", lambda self: (None, "test: the whole model"))
    whole = model_table_cost(path, "h100-sxm", "bf16", 2, ep=2, ep_imbalance=1.0, dp_attention=True, pp=2)
    assert "captured whole" in whole.source
    assert whole.stage_prefill_time_s == pytest.approx(periodic.stage_prefill_time_s, rel=1e-9)
    assert whole.prefill_time_s == pytest.approx(periodic.prefill_time_s, rel=1e-9)
    for a, b in zip(whole.stage_decode_time_s, periodic.stage_decode_time_s):
        assert a == pytest.approx(b, rel=1e-9)
    for a, b in zip(whole.decode_time_s, periodic.decode_time_s):
        assert a == pytest.approx(b, rel=1e-9)
