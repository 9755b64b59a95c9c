"""Context parallelism (opmap.mapping.context through opmap.mapping.sharding): the ring's bytes by formula, the
overlap with the attention of the chunk in hand, activations / cp, the gradient reduction over dp x cp.

Golden values: K and V of one layer are 2 x b x s x h_kv x d x 2 bytes (bf16); a ring of cp ranks passes cp - 1
chunks of 1 / cp of them per layer (Megatron-Core / TransformerEngine p2p context parallelism)."""

from __future__ import annotations

import functools
from dataclasses import asdict

import pytest

from opmap.analyze import analyze_graph
from opmap.capture import capture
from opmap.errors import OpmapError
from opmap.hardware import get_hardware
from opmap.mapping.sharding import Parallelism, Sharder, saved_per_block, sharded_memory
from opmap.workloads import build_zoo

B, S = 2, 64
LAYERS, HEADS, HEAD_DIM = 12, 12, 64  # gpt2 small: 12 layers, 12 heads (MHA: h_kv = 12) of 64
BF16 = 2


@functools.cache
def gpt2_train() -> Sharder:
    w = build_zoo("gpt2", B, S, "bf16")
    g = capture(w.module, w.inputs, train=True)
    return Sharder(analyze_graph(g, w, get_hardware("h100-sxm"), "bf16"))


def _ring(r, stage: str):
    return [c for c in r.collectives if c.purpose.startswith("CP") and c.stage == stage]


@pytest.mark.parametrize("cp, tp", [(2, 1), (4, 1), (2, 4)])
def test_ring_bytes_per_layer_by_formula(cp, tp):
    s = gpt2_train()
    r = s.shard(Parallelism(tp=tp, cp=cp))
    fwd = _ring(r, "forward")
    assert len(fwd) == 1 and fwd[0].collective.kind == "send_recv" and fwd[0].collective.group_size == 2
    assert fwd[0].count == (cp - 1) * LAYERS  # cp - 1 ring steps per layer
    # K and V per layer: 2 x (cp - 1) / cp x b s h_kv d x 2 bytes, each rank holding h_kv / tp heads
    per_layer = 2 * (cp - 1) / cp * B * S * HEADS * HEAD_DIM * BF16 / tp
    assert fwd[0].collective.message_bytes * fwd[0].count / LAYERS == pytest.approx(per_layer)


def test_backward_sends_kv_and_their_gradients():
    s = gpt2_train()
    r = s.shard(Parallelism(cp=2))
    (f,), (b,) = _ring(r, "forward"), _ring(r, "backward")
    assert b.count == f.count and b.collective.message_bytes == 2 * f.collective.message_bytes  # K,V + dK,dV
    # recomputation runs the forward's ring again in the backward
    rc = _ring(s.shard(Parallelism(cp=2, recompute="full")), "backward")
    assert sorted(c.collective.message_bytes for c in rc) == [f.collective.message_bytes, b.collective.message_bytes]


def test_only_the_send_past_the_attention_step_is_exposed():
    """A ring step's send overlaps the attention of the chunk in hand: 1 / cp of one layer's attention on one
    rank, whose time is the fused kernel's roofline terms / cp (the tokens it holds) + its launch."""
    s = gpt2_train()
    cp = 2
    sdpa = [k for k in s.a.kernel_results if s.a.graph.nodes[k.kernel.anchor].op ==
            "aten.scaled_dot_product_attention.default" and not s.a.graph.nodes[k.kernel.anchor].args.get("phase")]
    assert len(sdpa) == LAYERS
    per_layer = sum((k.time.predicted_s - k.time.overhead_s) / cp + k.time.overhead_s for k in sdpa) / LAYERS
    (f,) = _ring(s.shard(Parallelism(cp=cp)), "forward")
    assert f.exposed == pytest.approx(max(0.0, f.predicted_s - per_layer / cp))
    assert f.link == "scale_up"
    # the ring's neighbours are tp ranks apart: tp 4 x cp 4 spans 16 ranks, past one 8-GPU node: the NIC
    (g,) = _ring(s.shard(Parallelism(tp=4, cp=4)), "forward")
    assert g.link == "scale_out" and 0.0 <= g.exposed <= g.predicted_s


def test_cp2_halves_activation_memory_within_the_ring_buffers():
    s = gpt2_train()
    saved = saved_per_block(s.a.graph, s.roles, S)
    one = sharded_memory(Parallelism(), s, saved, "bf16", True, S)
    two = sharded_memory(Parallelism(cp=2), s, saved, "bf16", True, S)
    # 4 chunks of K + V (forward double buffer, dK / dV in backward): 4 x 2 x b (s / 2) h_kv d x 2 bytes
    buffers = 4 * 2 * B * (S / 2) * HEADS * HEAD_DIM * BF16
    assert two.activations_bytes == pytest.approx(one.activations_bytes / 2 + buffers)
    # parameters, gradients and optimizer state as without cp
    assert (two.weights_bytes, two.gradients_bytes, two.optimizer_bytes) == (
        one.weights_bytes, one.gradients_bytes, one.optimizer_bytes)


def test_cp2_step_is_half_the_step_within_the_exchange_cost():
    """cp 2 on 2 devices against cp 1 on 1, the same microbatch: at least half the step (the tokens split), at
    most half plus the ring's sends, what does not split (launches, weight reads, the optimizer) and the
    gradient all-reduce over the 2 cp ranks."""
    s = gpt2_train()
    one, two = s.shard(Parallelism()), s.shard(Parallelism(cp=2))
    rows = [r for r in s.rows if r.role != "optimizer"]
    launches = sum(r.overhead_s for r in rows)
    weights = sum(r.weight_fraction * r.memory_s for r in rows)
    opt = sum(t for r, t in zip(s.rows, one.kernel_s) if r.role == "optimizer")
    ring = sum(c.predicted_s * c.count for c in two.collectives if c.purpose.startswith("CP"))
    dp = sum(c.predicted_s for c in two.collectives if c.stage == "iteration")
    assert ring > 0 and dp > 0 and two.cp_exchange_s == pytest.approx(ring)
    assert one.step_s / 2 <= two.step_s <= one.step_s / 2 + ring + (launches + weights + opt) / 2 + dp
    assert two.step_s < one.step_s


def test_gradient_reduction_spans_dp_times_cp():
    s = gpt2_train()
    (ar,) = [c for c in s.shard(Parallelism(dp=2, cp=2)).collectives if c.stage == "iteration"]
    (ref,) = [c for c in s.shard(Parallelism(dp=4)).collectives if c.stage == "iteration"]
    assert ar.collective.group_size == 4 and ar.collective.message_bytes == ref.collective.message_bytes


def test_layout_counts_cp_devices():
    p = Parallelism(tp=2, cp=2, dp=2)
    assert p.devices == 8 and "cp2" in p.label() and asdict(p)["cp"] == 2
    assert p.microbatches == 1  # cp splits sequences, not the batch
    with pytest.raises(OpmapError, match="is not tp x cp x pp x dp"):
        Parallelism(tp=2, cp=2, devices=2)


def test_sequence_must_split_into_2cp_chunks():
    s = gpt2_train()
    with pytest.raises(OpmapError, match="needs the sequence 64 to divide into 6 chunks"):
        s.shard(Parallelism(cp=3))
    with pytest.raises(OpmapError, match="divide into 128 chunks"):
        s.shard(Parallelism(cp=64))


def test_all_gather_variant_gathers_kv_once_per_layer_exposed():
    """Llama 3's context parallelism (arXiv 2407.21783 sec. 3.3.2): K / V all-gathered per layer (the gathered
    output: 2 x b s h_kv d x 2 bytes over the heads a rank holds), not overlapped; the backward gathers again and
    reduce-scatters dK / dV."""
    s = gpt2_train()
    r = s.shard(Parallelism(cp=4, cp_comm="all_gather"))
    cp = [c for c in r.collectives if c.purpose.startswith("CP")]
    assert sorted((c.stage, c.collective.kind) for c in cp) == [
        ("backward", "all_gather"), ("backward", "reduce_scatter"), ("forward", "all_gather")]
    whole = 2 * B * S * HEADS * HEAD_DIM * BF16
    assert all(c.count == LAYERS and c.collective.group_size == 4 for c in cp)
    assert all(c.collective.message_bytes == pytest.approx(whole) for c in cp)
    assert all(c.exposed == c.predicted_s for c in cp)  # the gather sits on the critical path
    assert r.cp_exposed_s == pytest.approx(r.cp_exchange_s) and "cp4 ag" in r.parallelism.label()
    with pytest.raises(OpmapError, match="unknown --cp-comm 'a2a'; accepted: p2p, all_gather"):
        Parallelism(cp=2, cp_comm="a2a")
