"""opmap.explore.depth: a shallow capture of identical blocks prices every layout as the whole model does, and a
model whose blocks differ is captured whole."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from opmap.analyze import analyze_graph
from opmap.capture import capture
from opmap.explore.depth import captured_blocks_match, identical_blocks, shallow
from opmap.hardware import get_hardware
from opmap.mapping.sharding import Parallelism, Sharder, saved_per_block, sharded_memory
from opmap.workloads import load_workload

S = 64


def _sharder(w, depth=None):
    g = capture(w.module, w.inputs, train=True)
    return Sharder(analyze_graph(g, replace(w, module=None, inputs=None), get_hardware("h100-sxm"), "bf16"), depth)


@pytest.fixture(scope="module")
def pair():
    full = _sharder(load_workload("gpt2", 2, S, "bf16", "meta"))
    short, depth = shallow(load_workload("gpt2", 2, S, "bf16", "meta"))
    assert depth.layers == 12 and depth.params == 124_439_808  # GPT-2 small's published parameter count
    s = _sharder(short, depth)
    assert s.L == 2 and captured_blocks_match(s) == ""
    return full, s


@pytest.mark.parametrize("p", [
    Parallelism(), Parallelism(tp=2, pp=2, dp=2, sp=True, zero=1, global_batch=8, microbatch=2),
    Parallelism(pp=4, vp=3, global_batch=16, microbatch=2, recompute="full"),
    Parallelism(tp=2, cp=2, pp=3, dp=2, zero=2, global_batch=4, microbatch=2, recompute="selective"),
], ids=lambda p: p.label())
def test_shallow_capture_prices_as_the_whole_model(pair, p):
    full, s = pair
    a, b = full.shard(p), s.shard(p, per_kernel=False)
    assert b.step_s == pytest.approx(a.step_s, rel=1e-9)
    assert b.latency_s == pytest.approx(a.latency_s, rel=1e-9)
    assert b.matrix_flops_per_device == pytest.approx(a.matrix_flops_per_device, rel=1e-9)
    assert s.model_matrix_flops == pytest.approx(full.a.total.matrix_flops, rel=1e-12)
    ma = sharded_memory(p, full, saved_per_block(full.a.graph, full.roles, S), "bf16", True, S)
    mb = sharded_memory(p, s, saved_per_block(s.a.graph, s.roles, S), "bf16", True, S)
    assert mb.total_bytes == pytest.approx(ma.total_bytes, rel=1e-12)


class _Block(torch.nn.Module):
    def __init__(self, i: int, window: int | None):
        super().__init__()
        self.layer_idx = i  # an index: left out
        self.sliding_window = window
        self.proj = torch.nn.Linear(4, 4)


def test_blocks_that_differ_are_refused():
    same = [_Block(i, None) for i in range(4)]
    assert identical_blocks(same) == ""
    mixed = [_Block(i, 8 if i % 2 else None) for i in range(4)]  # alternating sliding / global attention
    assert "block 1 differs from block 0 at <block>.sliding_window" in identical_blocks(mixed)
    wider = same[:3] + [torch.nn.Module()]
    assert identical_blocks(wider)


def test_a_model_too_shallow_is_captured_whole():
    w = load_workload("gpt2", 1, S, "bf16", "meta")
    lst = w.module.h
    w.module.h = torch.nn.ModuleList(list(lst)[:2])
    short, why = shallow(w)
    assert short is None and "captured whole" in why


class _Counting(torch.nn.Module):
    """A model whose forward needs all its blocks: cut short, it refuses to run."""

    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Module()
        self.inner.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(4))
        self.head = torch.nn.Linear(8, 8)

    def forward(self, x):
        if len(self.inner.layers) != 4:
            raise RuntimeError("expects 4 layers")
        for layer in self.inner.layers:
            x = layer(x)
        return self.head(x)


def test_plan_captures_whole_a_model_that_counts_its_blocks():
    from opmap.explore.plan import plan
    from opmap.workloads.zoo import Workload

    def build(mb):
        with torch.device("meta"):
            return Workload("counting", _Counting(), (torch.zeros(mb, 16, 8),), mb, 16)

    r = plan(build, get_hardware("h100-sxm"), 1, "train", microbatches=(1,))
    assert r.capture == "whole model captured (the model does not run with 4 blocks cut short: RuntimeError)"
    assert r.ranked and r.cp_searched == (1,)  # no fused attention: no context parallelism
