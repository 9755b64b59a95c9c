"""The serving layout search: candidates by hand, the choice by the figure of merit, a real cell's choice at least
as good as every layout it tried."""

from __future__ import annotations

from dataclasses import replace

import pytest

from opmap.explore.layouts import (
    BOUND_SLACK,
    candidates,
    choose,
    figure_of_merit,
)
from opmap.explore.results import LayoutResult
from opmap.record import record


def test_candidates_split_each_device_count_into_tp_x_pp():
    # tp the powers of two up to the span and the budget; pp up to PP_HEADROOM (2) x the stages the weights need (1
    # when not given), within the budget; by devices per replica, highest tp first
    assert candidates(8, 8) == [(1, 1), (2, 1), (1, 2), (4, 1), (2, 2), (8, 1), (4, 2)]
    assert candidates(4, 8) == [(1, 1), (2, 1), (1, 2), (4, 1), (2, 2), (4, 2)]  # a 4-device node: pp across nodes
    assert candidates(8, 2) == [(1, 1), (2, 1), (1, 2)]  # a budget of two devices
    assert candidates(8, 8, devices=4) == [(4, 1), (2, 2)]
    # a model whose weights need 2 devices at tp1 (Llama 3 70B's 141 GB in bf16 on 80 GB cards): pp up to 4 at tp1
    need = {1: 2}
    assert candidates(8, 8, stages_needed=lambda tp: need.get(tp, 1)) == [
        (1, 1), (2, 1), (1, 2), (4, 1), (2, 2), (1, 4), (8, 1), (4, 2)]


def test_choose_ranks_by_tokens_per_device_of_the_budget():
    def lay(tp, pp, rate, per_device):
        return replace(LayoutResult.of(tp, pp, 8), rate_per_s=rate, per_device_tokens_per_s=per_device)

    tried = [lay(1, 1, 5.0, 90.0), lay(2, 1, 9.0, 120.0),
             lay(1, 2, None, None),  # no rate: not chosen
             lay(4, 1, 15.0, 120.0)]  # a tie: the earlier wins
    best, second = choose(tried)
    assert best is tried[1] and second is tried[3]
    assert choose([tried[2]]) == (None, None)


def test_the_chosen_layout_is_at_least_as_good_as_every_layout_tried():
    """gpt2 on a budget of two H100s: 2 x tp1, 1 x tp2 (and 1 x pp2 where pricing takes pp). Ranked by output
    tokens per second per device of the budget, the chosen one beats or ties each; the runner-up is the best of
    the rest; each figure is replicas x one replica's output tokens per second over the 2 devices."""
    from opmap.explore.fit import fit_cell
    from opmap.serve.metrics import Slo

    cell = fit_cell("gpt2", "h100-sxm", Slo(0.5, 0.05), "128", "16", 1000, devices_budget=2)
    tried = [lay for lay in cell.layouts if lay.rate_per_s]
    pruned = [lay for lay in cell.layouts if lay.limited_by == "pruned"]
    # 2 x tp1, 1 x tp2, 1 x pp2; a layout is searched or pruned by its saturation bound
    assert len(tried) + len(pruned) == 3 and len(tried) >= 2
    for lay in pruned:  # capacity <= saturation, so a bound under the runner-up's figure cannot beat it
        assert lay.bound_per_device_tokens_per_s * (1 + BOUND_SLACK) < cell.runner_up.per_device_tokens_per_s
    for lay in tried:
        assert lay.per_device_tokens_per_s <= lay.bound_per_device_tokens_per_s * (1 + BOUND_SLACK)
    best = cell.layout
    for lay in tried:
        assert best.per_device_tokens_per_s >= figure_of_merit(lay)
        assert lay.per_device_tokens_per_s == pytest.approx(lay.output_tokens_per_s / 2)
        assert lay.rate_per_s <= lay.saturation_per_s
    rest = [lay for lay in tried if (lay.tp, lay.pp) != (best.tp, best.pp)]
    assert cell.runner_up.per_device_tokens_per_s == max(figure_of_merit(lay) for lay in rest)
    assert cell.chosen.devices == best.devices_used == 2
    assert cell.throughput_per_device == best.per_device_tokens_per_s
    # fit.json's form of the cell: the chosen layout and the runner-up in brief, the layouts whole
    d = record(cell)
    assert d["layout"]["per_device_tokens_per_s"] == best.per_device_tokens_per_s and "capacity" not in d["layout"]
    assert d["devices"] == 2 and [x["tp"] for x in d["layouts"]] == [lay.tp for lay in cell.layouts]


def test_a_layout_whose_weights_alone_outgrow_memory_is_not_priced():
    """llama-3-70b: 70,553,706,496 parameters (Meta's model card) x 2 bytes (bf16) = 141.1 GB = 131.4 GiB: over one
    H100's 80 GiB, 65.7 GiB each over two; the L4's 24 GiB holds it only over eight (16.4 GiB each; 32.9 over four)."""
    from opmap.explore.layouts import weights_outgrow
    from opmap.hardware import get_hardware
    from opmap.workloads import MODELS

    h100, l4 = get_hardware("h100-sxm"), get_hardware("l4")
    gib = MODELS.get("llama-3-70b").published_params * 2 / 2**30
    why = weights_outgrow("llama-3-70b", h100, "bf16", 1)
    assert why is not None and f"{gib:.1f} GiB per device over 1" in why and "80.0 GiB a h100-sxm" in why
    assert weights_outgrow("llama-3-70b", h100, "bf16", 2) is None
    assert weights_outgrow("llama-3-70b", l4, "bf16", 4) is not None
    assert weights_outgrow("llama-3-70b", l4, "bf16", 8) is None
    assert weights_outgrow("path/to/config.json", h100, "bf16", 1) is None  # not a zoo model: left to the pricing


def test_candidates_come_from_the_interconnect_tiers():
    """A replica's TP spans up to one scale-up fabric (the catalog's outermost bounded tier); the default budget is
    one domain of the innermost tier. Before: a hard-coded (1, 2, 4, 8), ``or 8`` and a cap of 8."""
    from opmap.explore.layouts import candidates, default_budget, replica_span
    from opmap.hardware import get_hardware
    from opmap.hardware.spec import CATALOG_DIR, parse_spec_toml

    # DGX H100: 8 GPUs a board; MI250X: 4 a Frontier node (HPE Cray EX235a); TPU v5e: 256 chips a pod on ICI; GB200
    # NVL72: 72 GPUs on one NVLink domain; Trn2: 16 a trn2-16 instance, 64 a u-trn2x64 UltraServer on NeuronLink; an
    # EPYC socket: no bounded tier, a replica of one device
    names = ("h100-sxm", "mi250x", "tpu-v5e", "gb200", "trn2", "epyc-9654")
    assert [replica_span(get_hardware(n)) for n in names] == [8, 4, 256, 72, 64, 1]
    assert [default_budget(get_hardware(n)) for n in names] == [8, 4, 256, 72, 16, 1]
    # a device whose innermost tier joins 2 devices: replicas of 1 and 2 devices, pp across nodes
    text = (CATALOG_DIR / "h100-sxm.toml").read_text().split("\n[calibration]")[0]
    two = parse_spec_toml(text.replace("[interconnect.tier.size]\nvalue = 8", "[interconnect.tier.size]\nvalue = 2"),
                          "two.toml")
    assert replica_span(two) == 2 and default_budget(two) == 2
    assert candidates(replica_span(two), default_budget(two)) == [(1, 1), (2, 1), (1, 2)]
    assert candidates(6, 8) == [(1, 1), (2, 1), (1, 2), (4, 1), (2, 2), (4, 2)]  # powers of two up to 6


def test_candidates_span_an_nvl72_domain_and_follow_the_heads():
    """Llama 3 70B (64 heads, 8 KV heads, 80 layers; Meta's config.json): on a GB200 NVL72 rack tp runs up to 64 of
    the 72 GPUs; on nine 8-GPU B200 nodes tp stops at a node's 8 and pp 2 puts a replica's second stage on another
    node. Its 70.55e9 parameters x 2 bytes = 141 GB (131.4 GiB) fit one 186 GiB GB200 and one 180 GiB B200 (1
    stage, pp <= 2)."""
    from opmap.explore.layouts import layout_candidates
    from opmap.hardware import get_hardware

    gb200 = layout_candidates("llama-3-70b", get_hardware("gb200"), 72, "bf16")
    assert max(tp for tp, _ in gb200) == 64 and (32, 2) in gb200 and all(tp * pp <= 72 for tp, pp in gb200)
    assert [tp for tp, pp in gb200 if pp == 1] == [1, 2, 4, 8, 16, 32, 64]
    b200 = layout_candidates("llama-3-70b", get_hardware("b200"), 72, "bf16")
    assert max(tp for tp, _ in b200) == 8 and (8, 2) in b200 and max(pp for _, pp in b200) == 2
    # GPT-2's 12 heads: tp 1, 2, 4 (8 does not divide them)
    assert {tp for tp, _ in layout_candidates("gpt2", get_hardware("gb200"), 72, "bf16")} == {1, 2, 4}


def test_candidates_of_a_hugging_face_config_follow_its_heads(tmp_path):
    """A Llama config with 12 heads and 4 KV heads: tp 1, 2 and 4 divide both, 8 divides neither; its 2 layers and
    its few weights (one stage holds them): pp at most 2."""
    import json

    from opmap.explore.layouts import layout_candidates
    from opmap.hardware import get_hardware

    cfg = {"model_type": "llama", "vocab_size": 2048, "hidden_size": 384, "intermediate_size": 1024,
           "num_hidden_layers": 2, "num_attention_heads": 12, "num_key_value_heads": 4,
           "max_position_embeddings": 1024, "torch_dtype": "float32"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    got = layout_candidates(str(path), get_hardware("gb200"), 72, "bf16")
    assert got == [(1, 1), (2, 1), (1, 2), (4, 1), (2, 2), (4, 2)]
