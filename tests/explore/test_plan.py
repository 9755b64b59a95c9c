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
    assert gpt2_plan.seq == 64 and gpt2_plan.global_batch == 8  # default 2 x devices
    assert "sequence 64 tokens; 512 tokens per step" in gpt2_plan.assumptions
    assert gpt2_plan.capture.startswith("captured 2 of 12 identical blocks")


def test_plan_ranks_cp_layouts(gpt2_plan):
    ranked = gpt2_plan.ranked
    assert {c.parallelism.cp for c in ranked} == {1, 2, 4}
    # a cp layout moves the same tokens per step as any other
    tps = {round(c.tokens_per_s * c.step_s) for c in ranked}
    assert tps == {8 * 64}


def test_plan_refuses_a_cp_the_sequence_does_not_split_over():
    hw = get_hardware("h100-sxm")

    def never(mb):
        raise AssertionError("built before the layout was checked")

    with pytest.raises(OpmapError, match="--cp 3 does not divide the 8 devices"):
        plan(never, hw, 8, "train", cp=3)
    with pytest.raises(OpmapError, match="--cp 3 is not one of"):
        plan(lambda mb: load_workload("gpt2", mb, 64, "bf16", "meta"), hw, 3, "train", microbatches=(1,), cp=3)


def test_plan_prices_each_layout_with_its_activations_per_device():
    """Every ranked layout's memory is the model state of its parameters (ZeRO over dp: Rajbhandari et al. 2020,
    2 + 2 + 12 bytes a parameter) plus Korthikanti et al. 2022's activations per device (fused attention, dropout
    0.1: s b h (10 + 24 / t) per layer, 34 s b h / t with SP, plus the flash log-sum-exp and the LayerNorm
    statistics; what is saved outside the layers) and the 1 GiB workspace; data parallelism leaves the activations
    alone. Before the fix a layout's activations were read off the graph's non-view tensors only, about a third of
    these (llama-3-8b's dp8 mb8 ZeRO-2 ranked first, "81.7 GB", with about 100 GiB of activations)."""
    import torch

    from opmap.workloads.gpt2 import GPT2, GPT2Config
    from opmap.workloads.zoo import Workload

    s, h, a, layers, vocab = 96, 128, 4, 2, 256
    cfg = GPT2Config(vocab_size=vocab, block_size=128, n_layer=layers, n_head=a, n_embd=h, dropout=0.1)

    def build(mb):
        with torch.device("meta"):
            m = GPT2(cfg).to(torch.bfloat16)
        return Workload("gpt", m, (torch.zeros(mb, s, dtype=torch.long, device="meta"),), mb, s)

    params = vocab * h + 128 * h + layers * (12 * h * h + 13 * h) + 2 * h  # tied head; positions; 2 LNs a layer
    res = plan(build, get_hardware("h100-sxm"), 8, "train", global_batch=16, microbatches=(1, 2))
    checked = 0
    for c in res.ranked:
        q = c.parallelism
        if q.pp > 1 or q.cp > 1 or q.recompute != "none":
            continue
        t, dp, z, b = q.tp, q.dp, q.zero, q.microbatch
        sbh, sb, rep = s * b * h, s * b, t if q.sp else 1
        per_layer = 34 * sbh / t + (4 * a * sb + 16 * sb) / t if q.sp else \
            sbh * (10 + 24 / t) + 4 * a * sb / t + 16 * sb
        outside = (4 * sbh + 16 * sb + 8 * s + 8 * sb + 4) / rep + 4 * sb * vocab / t  # embedding, final LN, loss
        p = params / t
        state = 2 * p / (dp if z >= 3 else 1) + 2 * p / (dp if z >= 2 else 1) + 12 * p / (dp if z >= 1 else 1)
        assert c.memory_bytes == pytest.approx(state + layers * per_layer + outside + 2**30, rel=1e-6), c.layout
        checked += 1
    assert checked >= 10
