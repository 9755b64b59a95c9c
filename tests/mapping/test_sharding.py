"""Sharding: roles from graph edges, per-device kernels, collectives, pipeline bubble. Golden values from the
Megatron papers' formulas (Shoeybi et al. 2019, Narayanan et al. 2021, Korthikanti et al. 2022), not the code."""

from __future__ import annotations

import functools

import pytest

from opmap.analyze import analyze_graph
from opmap.capture import capture
from opmap.errors import OpmapError
from opmap.hardware import get_hardware
from opmap.mapping.roles import infer_roles, is_weight_gemm
from opmap.mapping.sharding import DP_OVERLAP, Parallelism, Sharder, bubble_fraction, link_for
from opmap.workloads import build_zoo

B, S = 2, 32


@functools.cache
def sharder(name: str, train: bool = False) -> Sharder:
    w = build_zoo(name, B, S, "bf16")
    g = capture(w.module, w.inputs, train=train)
    return Sharder(analyze_graph(g, w, get_hardware("h100-sxm"), "bf16"))


def _forward_roles(s: Sharder, block: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in s.a.graph.nodes:
        if is_weight_gemm(n) and s.roles.block[n.id] == block and not n.args.get("phase"):
            r = s.roles.role[n.id]
            out[r] = out.get(r, 0) + 1
    return out


@pytest.mark.parametrize("name, want", [
    ("gpt2", {"column": 2, "row": 2}),  # fused c_attn + c_fc column; attn c_proj + mlp c_proj row
    ("llama-3-8b", {"column": 5, "row": 2}),  # q, k, v, gate, up; o, down
    ("mixtral-8x7b", {"column": 3, "row": 1, "router": 1, "expert_column": 16, "expert_row": 8}),  # 8 experts x 3
])
def test_roles_per_layer(name, want):
    s = sharder(name)
    for b in s.roles.blocks[:3]:
        assert _forward_roles(s, b) == want


def test_roles_do_not_use_module_names():
    """Renaming every module leaves the roles as they were: they come from edges and structure."""
    import torch

    class Blk(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.a, self.b = torch.nn.LayerNorm(64), torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)

        def forward(self, x):
            return x + self.b(torch.relu(self.a(self.n1(x))))

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.zz = torch.nn.ModuleList(Blk() for _ in range(3))

        def forward(self, x):
            for m in self.zz:
                x = m(x)
            return x

    with torch.device("meta"):
        g = capture(M(), (torch.zeros(2, 8, 64),))
    r = infer_roles(g)
    got = [r.role[n.id] for n in g.nodes if is_weight_gemm(n)]
    assert got == ["column", "row"] * 3
    assert r.geometry.layers == 3


def test_embedding_and_head_vocab_parallel():
    s = sharder("llama-3-8b")
    g = s.a.graph
    assert all(s.roles.role[n.id] == "vocab" for n in g.nodes if n.packet == "embedding")
    head = [n for n in g.nodes if is_weight_gemm(n) and s.roles.block[n.id] is None]
    assert [s.roles.role[n.id] for n in head] == ["vocab"]


@pytest.mark.parametrize("t", [2, 3, 4])
def test_split_gemm_flops_divide_by_tp(t):
    s = sharder("gpt2")
    r1 = s.shard(Parallelism())
    rt = s.shard(Parallelism(tp=t))
    total = s.a.total.matrix_flops
    assert r1.matrix_flops_per_device == pytest.approx(total)
    # every matrix FLOP of gpt2 sits in a split kernel (column, row, SDPA by heads, vocab head)
    assert rt.matrix_flops_per_device == pytest.approx(total / t)


def test_tp_all_reduce_two_per_layer_forward():
    """Shoeybi et al. 2019: one all-reduce after attention, one after the MLP, of the b s h activation."""
    s = sharder("llama-3-8b")
    r = s.shard(Parallelism(tp=4))
    ar = [c for c in r.collectives if c.collective.kind == "all_reduce" and c.stage == "forward"]
    assert sum(c.count for c in ar) == 2 * 32
    assert all(c.collective.message_bytes == B * S * 4096 * 2 for c in ar)
    assert all(c.collective.group_size == 4 and c.link == "scale_up" for c in ar)


def test_training_adds_backward_all_reduces():
    s = sharder("gpt2", train=True)
    r = s.shard(Parallelism(tp=2))
    fwd = sum(c.count for c in r.collectives if c.stage == "forward" and c.collective.kind == "all_reduce")
    bwd = sum(c.count for c in r.collectives if c.stage == "backward" and c.collective.kind == "all_reduce")
    assert fwd == bwd == 2 * 12


def test_sp_replaces_all_reduce_with_reduce_scatter_and_all_gather():
    """Korthikanti et al. 2022: each all-reduce becomes a reduce-scatter + all-gather of the same bytes."""
    s = sharder("llama-3-8b")
    kinds = {c.collective.kind: c for c in s.shard(Parallelism(tp=4, sp=True)).collectives}
    assert "all_reduce" not in kinds
    assert kinds["reduce_scatter"].count == kinds["all_gather"].count == 2 * 32
    assert kinds["reduce_scatter"].collective.message_bytes == B * S * 4096 * 2


def test_dp_reduction_is_gradient_bytes():
    s = sharder("gpt2", train=True)
    p = Parallelism(tp=2, dp=4)
    dp = [c for c in s.shard(p).collectives if c.stage == "iteration"]
    assert [c.collective.kind for c in dp] == ["all_reduce"]
    assert dp[0].collective.message_bytes == pytest.approx(124_439_808 * 2 / 2)  # bf16 gradients / tp
    for zero in (1, 2):  # a sharded optimizer: gradients reduce-scattered, updated parameters all-gathered
        z = [c.collective.kind for c in s.shard(Parallelism(tp=2, dp=4, zero=zero)).collectives
             if c.stage == "iteration"]
        assert z == ["reduce_scatter", "all_gather"]


def test_ep_all_to_all():
    s = sharder("mixtral-8x7b")
    a2a = [c for c in s.shard(Parallelism(dp=4, ep=4)).collectives if c.collective.kind == "all_to_all"]
    assert sum(c.count for c in a2a) == 2 * 32
    assert a2a[0].collective.message_bytes == B * S * 2 * 4096 * 2  # top-2 routed tokens x h x bf16


@pytest.mark.parametrize("pp, m, vp, want", [(4, 8, 1, 3 / 8), (8, 32, 1, 7 / 32), (4, 8, 2, 3 / 16),
                                             (1, 4, 1, 0.0)])
def test_bubble(pp, m, vp, want):
    assert bubble_fraction(pp, m, vp) == pytest.approx(want)


def test_pipeline_iteration_formula():
    s = sharder("gpt2", train=True)
    p = Parallelism(pp=4, dp=1, global_batch=8 * B, microbatch=B)
    r = s.shard(p)
    assert r.bubble_fraction == pytest.approx(3 / 8)
    opt = sum(t for row, t in zip(s.rows, r.kernel_s) if row.role == "optimizer")
    assert r.step_s == pytest.approx((8 + 3) * r.microbatch_s + opt)
    assert [c.collective.kind for c in r.collectives] == ["send_recv", "send_recv"]


def test_link_scale_out_past_one_node():
    hw = get_hardware("h100-sxm")
    assert hw.devices_per_node == 8
    # a TP group of 16 consecutive ranks holds 8 in each node: it crosses the tiers (auto, stride 1); a PP pair 8 apart
    # has one member a node: every hop crosses the NIC
    assert link_for(hw, 8) == "scale_up" and link_for(hw, 16) == "auto" and link_for(hw, 16, 2) == "scale_out"
    s = sharder("gpt2", train=True)
    dp = [c for c in s.shard(Parallelism(tp=4, dp=4)).collectives if c.stage == "iteration"]
    # the DP group spans tp x dp = 16 ranks, 2 of them in each node: a ring per member, each through its own NIC
    assert (dp[0].link, dp[0].collective.per_node) == ("auto", 2)


@pytest.mark.parametrize("kw, needle", [
    ({"tp": 2, "devices": 4}, "is not tp x pp x dp"),
    ({"sp": True}, "needs --tp above 1"),
    ({"dp": 2, "ep": 4}, "must divide --dp"),
    ({"recompute": "some"}, "unknown recompute"),
])
def test_bad_parallelism(kw, needle):
    with pytest.raises(OpmapError, match=needle):
        Parallelism(**kw)


def test_bad_layout_for_model():
    s = sharder("gpt2")
    with pytest.raises(OpmapError, match="does not divide the 12 attention heads"):
        s.shard(Parallelism(tp=5))
    with pytest.raises(OpmapError, match="exceeds the 12 layers"):
        s.shard(Parallelism(pp=13))
    with pytest.raises(OpmapError, match="--vp 2 does not divide the 3 layers per pipeline stage"):
        s.shard(Parallelism(pp=5, vp=2))


def test_uneven_pipeline_stages_take_ceil_layers():
    # 12 layers on 5 stages (as Llama 3 405B's 126 on 16): stages of ceil(12 / 5) = 3 layers, the last two
    # with 2 and 1; the slowest stage (3 layers) sets the pace, so pp 5 runs no faster per microbatch than pp 4
    s = sharder("gpt2")
    five, four = s.shard(Parallelism(pp=5)), s.shard(Parallelism(pp=4))
    assert max(five.stage_compute_s) == pytest.approx(max(four.stage_compute_s), rel=0.2)
    assert len(five.stage_compute_s) == 5


def test_a_decode_step_counts_every_expert_it_holds():
    # a batch-1 decode step of mixtral-8x7b runs 2 of the 8 experts per layer, yet each device holds all of its
    # experts: 32 layers x 8 experts x 3 x 4096 x 14336 weights (the zoo's config), split over ep
    from opmap.mapping.sharding import Sharder
    from opmap.phases.step import analyze_phase, capture_phase
    from opmap.workloads.phases import PhaseSpec, phase_workload

    spec = PhaseSpec("decode", kv_len=64)
    w = phase_workload("mixtral-8x7b", spec, 1, None, "bf16")
    a = analyze_phase(capture_phase(w, spec), w, get_hardware("h100-sxm"), "bf16", spec).analysis
    s = Sharder(a)
    experts = 32 * 8 * 3 * 4096 * 14336
    assert s.geo.experts == 8 and s.roles.expert_params == experts
    total = a.graph.params
    assert s.params_per_device(Parallelism(dp=2, ep=2)) == (total - experts) + experts / 2


def test_dp_reduction_hides_behind_the_last_microbatch_backward_only():
    """Gradient accumulation runs the first m - 1 microbatches under no_sync; only the last backward launches the
    bucketed DP reduction (Megatron-LM core/pipeline_parallel/schedules.py, forward_backward_no_pipelining). So
    exposed = max(0, t_reduce - DP_OVERLAP x one microbatch's backward), the same at 1 and at 8 microbatches."""
    s = sharder("gpt2", train=True)
    for m in (1, 8):
        r = s.shard(Parallelism(tp=2, dp=16, global_batch=16 * B * m, microbatch=B))
        reduce_s = sum(c.predicted_s * c.count for c in r.collectives if c.stage == "iteration")
        bwd_s = sum(t for row, t in zip(s.rows, r.kernel_s) if row.phase == "backward")
        assert reduce_s > DP_OVERLAP * bwd_s  # tp 2 x dp 16: one NIC per rank, the reduction outlasts a backward
        tp_s = sum(c.exposed * c.count for c in r.collectives if c.stage != "iteration")  # per microbatch
        assert r.exposed_comm_s == pytest.approx(m * tp_s + reduce_s - DP_OVERLAP * bwd_s)
        assert r.step_s == pytest.approx(m * r.microbatch_s + reduce_s - DP_OVERLAP * bwd_s + r.optimizer_s)


def test_sharded_optimizer_gathers_parameters_behind_the_next_forward():
    """ZeRO 1 (Megatron's distributed optimizer, NeMo distributed_fused_adam with overlap_grad_sync and
    overlap_param_sync): the gradient reduce-scatter hides behind the last microbatch's backward, the updated
    parameters' all-gather behind the next iteration's first forward: exposed = max(0, t_rs - 0.8 t_bwd) +
    max(0, t_ag - 0.8 t_fwd), one microbatch's forward and backward on the device."""
    s = sharder("gpt2", train=True)
    r = s.shard(Parallelism(tp=2, dp=16, global_batch=16 * B * 4, microbatch=B, zero=1))
    bwd_s = sum(t for row, t in zip(s.rows, r.kernel_s) if row.phase == "backward")
    fwd_s = sum(t for row, t in zip(s.rows, r.kernel_s) if row.phase not in ("backward", "optimizer"))
    rs = sum(c.predicted_s for c in r.collectives if c.stage == "iteration" and c.collective.kind == "reduce_scatter")
    ag = sum(c.predicted_s for c in r.collectives if c.stage == "iteration" and c.collective.kind == "all_gather")
    tp_s = sum(c.exposed * c.count for c in r.collectives if c.stage != "iteration")  # per microbatch
    want = max(0.0, rs - DP_OVERLAP * bwd_s) + max(0.0, ag - DP_OVERLAP * fwd_s)
    assert want > 0
    assert r.exposed_comm_s == pytest.approx(4 * tp_s + want)


def test_dp_group_across_nodes_runs_one_ring_per_nic():
    """DGX H100 (8 GPUs, 8 x 400 Gb/s NICs a node), dp 16: with tp 1 the group holds every GPU of two nodes, with
    tp 4 two of each of eight nodes (ranks stride by tp). NCCL runs a ring per member, each crossing nodes through
    its own NIC: ring bandwidth min(NVLink 450 GB/s a direction, members a node x 50 GB/s) = 400 GB/s at tp 1,
    100 GB/s at tp 4; all-reduce t >= 2 (n - 1) / n x S / that (nccl-tests' busbw formula; such clusters measure
    400-450 GB/s busbw at 8 GB), not one NIC's 50 GB/s."""
    s = sharder("gpt2", train=True)
    for tp, members, rate in ((1, 8, 8 * 50e9), (4, 2, 2 * 50e9)):
        dp = [c for c in s.shard(Parallelism(tp=tp, dp=16)).collectives if c.stage == "iteration"]
        assert [(c.link, c.collective.per_node) for c in dp] == [("auto", members)]
        size = dp[0].collective.message_bytes
        floor = 2 * 15 / 16 * size / rate
        assert floor <= dp[0].predicted_s <= 1.25 * floor


def test_roles_are_inferred_once_a_graph():
    """A graph's precision rules and its sharder share one inference (by identity: kept for the last few graphs),
    equal to a fresh one; another graph, even of the same model, is inferred anew."""
    import torch

    from opmap.mapping.roles import _infer_roles

    w = build_zoo("llama-3-8b", 1, 8, "bf16")
    w.module.layers = torch.nn.ModuleList(list(w.module.layers)[:2])
    g = capture(w.module, w.inputs)
    r = infer_roles(g)
    assert infer_roles(g) is r
    fresh = _infer_roles(g)
    assert fresh is not r and fresh == r
    # per layer two row-parallel GEMMs (attention's output and the MLP's down projection: Megatron-LM)
    assert r.geometry.layers == 2 and [r.role[n.id] for n in g.nodes if is_weight_gemm(n)].count("row") == 4
    g2 = capture(w.module, w.inputs)
    assert infer_roles(g2) is not r and infer_roles(g2) == r
