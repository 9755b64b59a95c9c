"""opmap.explore.plan: the layouts searched (every vp dividing the layers per stage, every cp the sequence splits
over), and a plan's header (sequence, global batch)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from opmap.errors import OpmapError
from opmap.explore.plan import cp_candidates, layouts, plan, vp_candidates
from opmap.hardware import get_hardware
from opmap.workloads import load_workload


@pytest.mark.parametrize("layers, pp, want", [
    (80, 4, [1, 2, 4, 5, 10, 20]),  # 20 layers per stage
    (80, 16, [1, 5]),  # 5 per stage: the old search (vp 1-2) tried 2, which does not divide
    (126, 16, [1, 2, 4, 8]),  # Llama 3 405B: ceil(126 / 16) = 8 per stage
    (12, 1, [1]),  # no pipeline, no virtual stages
])
def test_vp_candidates_are_the_divisors_of_the_layers_per_stage(layers, pp, want):
    assert vp_candidates(layers, pp) == want


def test_layouts_try_exactly_those_vp():
    geo = SimpleNamespace(layers=24, experts=0)
    seen: dict[int, set[int]] = {}
    for p in layouts(16, 8, geo, 32, True, (1,), (1, 2)):
        seen.setdefault(p.pp, set()).add(p.vp)
    # layers per stage: 24 / pp; its divisors
    assert seen == {1: {1}, 2: {1, 2, 3, 4, 6, 12}, 4: {1, 2, 3, 6}, 8: {1, 3}, 16: {1, 2}}


@pytest.mark.parametrize("devices, seq, causal, want", [
    (8, 64, True, [1, 2, 4, 8]),  # 64 tokens into 2 cp chunks: cp up to 32
    (8, 24, True, [1, 2, 4]),  # 24 is not 16 chunks
    (8, 24, False, [1, 2, 4, 8]),  # bidirectional: cp chunks
    (8, 64, None, [1]),  # no fused attention: no ring
])
def test_cp_candidates(devices, seq, causal, want):
    assert cp_candidates(devices, seq, causal) == want


def test_layouts_multiply_cp_into_the_devices():
    geo = SimpleNamespace(layers=12, experts=0)
    ps = list(layouts(8, 8, geo, 16, False, (1,), (1, 2, 4)))
    assert {p.cp for p in ps} == {1, 2, 4}
    assert all(p.tp * p.cp * p.pp * p.dp == 8 for p in ps)


@pytest.fixture(scope="module")
def gpt2_plan():
    hw = get_hardware("h100-sxm")
    return plan(lambda mb: load_workload("gpt2", mb, 64, "bf16", "meta"), hw, 4, "train", microbatches=(1, 2))


def test_plan_states_sequence_and_global_batch(gpt2_plan):
    assert gpt2_plan["seq"] == 64 and gpt2_plan["global_batch"] == 8  # default 2 x devices
    assert "sequence 64 tokens; 512 tokens per step" in gpt2_plan["assumptions"]
    assert gpt2_plan["capture"].startswith("captured 2 of 12 identical blocks")


def test_plan_ranks_cp_layouts(gpt2_plan):
    ranked = gpt2_plan["ranked"]
    assert {c["cp"] for c in ranked} == {1, 2, 4}
    # a cp layout moves the same tokens per step as any other
    tps = {round(c["tokens_per_s"] * c["step_s"]) for c in ranked}
    assert tps == {8 * 64}


def test_plan_refuses_a_cp_the_sequence_does_not_split_over():
    hw = get_hardware("h100-sxm")

    def never(mb):
        raise AssertionError("built before the layout was checked")

    with pytest.raises(OpmapError, match="--cp 3 does not divide the 8 devices"):
        plan(never, hw, 8, "train", cp=3)
    with pytest.raises(OpmapError, match="--cp 3 is not one of"):
        plan(lambda mb: load_workload("gpt2", mb, 64, "bf16", "meta"), hw, 3, "train", microbatches=(1,), cp=3)
