"""fit's layout search with expert parallelism (opmap.explore.layouts): a MoE model's layouts are tried with the
experts tensor-parallel and, beside each, over the replica's tp group (ep = tp, priced by serve's --ep) and under DP
attention (serve's --dp-attention, with --pp at several stages: DEP2 PP2); a dense model's are not. The label and
fit.json name the split."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from opmap.explore.layouts import _with_ep, label, layout_candidates, model_geometry
from opmap.explore.results import LayoutResult
from opmap.hardware import get_hardware
from opmap.record import record

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hf_family_configs import QWEN3_8B, QWEN3_30B_A3B, shallow  # noqa: E402

# The (tp, pp) a budget of 4 H200s tries (layouts.candidates): H200's scale-up fabric is an HGX board of 8
# (catalog), so tp runs over the powers of two up to min(8, 4) = 4, each dividing 32 attention heads and 8 (Mixtral
# 8x7B, Llama 3 8B, Qwen3-8B) or 4 (Qwen3-30B-A3B) KV heads: tp 1, 2, 4. Every model here holds its weights on one
# device (Mixtral's 46.7B parameters x 2 bytes = 93.4 GB, Llama 3 8B's 16.1 GB, under the H200's 141 GiB; a Hugging
# Face config has no published count, so none is known to outgrow), so pp runs over the powers of two up to
# min(layers >= 4, 4 // tp, PP_HEADROOM 2 x 1 stage): tp1 pp 1, 2; tp2 pp 1, 2; tp4 pp 1. By devices, tp first:
BUDGET4 = [(1, 1), (2, 1), (1, 2), (4, 1), (2, 2)]


def _config(tmp_path, cfg: dict, name: str) -> str:
    p = tmp_path / name / "config.json"
    p.parent.mkdir()
    p.write_text(json.dumps(cfg))
    return str(p)


def _moe_rule(pairs, experts: int) -> list[tuple[int, int, int, bool]]:
    """The enumeration rule for a MoE: each (tp, pp) with tensor-parallel experts, then where tp > 1 divides the
    experts its ep = tp twin and that twin under DP attention, at every pp."""
    out = []
    for tp, pp in pairs:
        out.append((tp, pp, 1, False))
        if tp > 1 and experts % tp == 0:
            out += [(tp, pp, tp, False), (tp, pp, tp, True)]
    return out


@pytest.mark.parametrize("which", ["mixtral-8x7b", "qwen3-30b-a3b"])
def test_a_moe_budget_of_4_tries_dep2_pp2(which, tmp_path):
    """Mixtral 8x7B (8 experts) and Qwen3-30B-A3B (its published config cut to 4 layers, 128 experts) on 4 H200s:
    the 5 (tp, pp) above, tp2 and tp4 each with an ep = tp twin and a DP-attention one: 5 + 2 x 3 = 11 layouts, the
    DP-attention ones tp2 pp1 (DEP2), tp4 pp1 (DEP4) and tp2 pp2 (DEP2 PP2, 4 devices, as TensorRT-LLM runs it)."""
    model = which if which == "mixtral-8x7b" else _config(tmp_path, shallow(QWEN3_30B_A3B, 4), "qwen3moe")
    experts = 8 if which == "mixtral-8x7b" else 128
    todo = _with_ep(layout_candidates(model, get_hardware("h200"), 4, "bf16"), model_geometry(model))
    assert layout_candidates(model, get_hardware("h200"), 4, "bf16") == BUDGET4
    assert todo == _moe_rule(BUDGET4, experts) and len(todo) == 11
    assert {(tp, pp) for tp, pp, ep, d in todo if d} == {(2, 1), (4, 1), (2, 2)}
    assert (2, 2, 2, True) in todo
    assert label(LayoutResult.of(2, 2, 4, ep=2, dp_attention=True)) == "1 x tp2 pp2 ep2 dpa"
    # pp 1 as before: each tp > 1 its tp-experts layout, its ep = tp one, its DP-attention one
    assert [x for x in todo if x[1] == 1] == [(1, 1, 1, False), (2, 1, 1, False), (2, 1, 2, False), (2, 1, 2, True),
                                              (4, 1, 1, False), (4, 1, 4, False), (4, 1, 4, True)]


@pytest.mark.parametrize("which", ["llama-3-8b", "qwen3-8b"])
def test_a_dense_budget_of_4_is_its_tp_pp_pairs_alone(which, tmp_path):
    """A dense model (no experts): each (tp, pp) once, tensor-parallel, no EP or DP-attention twin."""
    model = which if which == "llama-3-8b" else _config(tmp_path, shallow(QWEN3_8B, 4), "qwen3")
    todo = _with_ep(layout_candidates(model, get_hardware("h200"), 4, "bf16"), model_geometry(model))
    assert todo == [(tp, pp, 1, False) for tp, pp in BUDGET4]


def test_moe_layouts_are_tried_with_experts_over_the_tp_group():
    geo = model_geometry("mixtral-8x7b")
    assert geo.n_experts == 8  # Mixtral 8x7B: 8 experts a layer
    todo = _with_ep(layout_candidates("mixtral-8x7b", get_hardware("h200"), 4, "bf16"), geo)
    assert (2, 1, 1, False) in todo and (2, 1, 2, False) in todo and (4, 1, 4, False) in todo
    assert all(ep in (1, tp) for tp, _, ep, _ in todo) and (1, 1, 1, False) == todo[0]
    dense = _with_ep(layout_candidates("llama-3-8b", get_hardware("h200"), 4, "bf16"), model_geometry("llama-3-8b"))
    assert all(ep == 1 and not dpa for _, _, ep, dpa in dense)


def test_moe_layouts_are_tried_with_dp_attention_and_dense_ones_not():
    """Beside each ep = tp layout of a MoE, its DP-attention twin (tp attention ranks of one device a stage, E / tp
    experts a device), on one stage or several; never with ep below tp, never for a dense model."""
    geo = model_geometry("mixtral-8x7b")
    todo = _with_ep(layout_candidates("mixtral-8x7b", get_hardware("h200"), 8, "bf16"), geo)
    dpa = [(tp, pp, ep) for tp, pp, ep, d in todo if d]
    assert (2, 1, 2) in dpa and (4, 1, 4) in dpa and (8, 1, 8) in dpa and (2, 2, 2) in dpa and (4, 2, 4) in dpa
    assert all(ep == tp > 1 for tp, pp, ep in dpa)
    assert all((tp, pp, ep, False) in todo for tp, pp, ep in dpa)  # the ep = tp layout it stands beside
    dense = _with_ep(layout_candidates("llama-3-8b", get_hardware("h200"), 8, "bf16"), model_geometry("llama-3-8b"))
    assert not any(d for *_, d in dense)


def test_an_ep_layout_is_named_and_written():
    lay = LayoutResult.of(4, 1, 8, ep=4)
    assert label(lay) == "2 x tp4 ep4" and record(lay)["ep"] == 4
    assert label(record(lay)) == "2 x tp4 ep4"
    plain = LayoutResult.of(4, 1, 8)
    assert label(plain) == "2 x tp4" and "ep" not in record(plain) and "dp_attention" not in record(plain)
    dpa = LayoutResult.of(4, 1, 8, ep=4, dp_attention=True)
    assert label(dpa) == "2 x tp4 ep4 dpa" and record(dpa)["dp_attention"] is True
    assert label(record(dpa)) == "2 x tp4 ep4 dpa" and "dp_attention" not in record(lay)
