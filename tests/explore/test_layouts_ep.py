"""fit's layout search with expert parallelism (opmap.explore.layouts): a MoE model's layouts are tried with the
experts tensor-parallel and, beside each, over the replica's tp group (ep = tp, priced by serve's --ep) and, on one
stage, under DP attention (serve's --dp-attention); a dense model's are not. The label and fit.json name the split."""

from __future__ import annotations

from opmap.explore.layouts import _with_ep, label, layout_candidates, model_geometry
from opmap.explore.results import LayoutResult
from opmap.hardware import get_hardware
from opmap.record import record


def test_moe_layouts_are_tried_with_experts_over_the_tp_group():
    geo = model_geometry("mixtral-8x7b")
    assert geo.n_experts == 8  # Mixtral 8x7B: 8 experts a layer
    todo = _with_ep(layout_candidates("mixtral-8x7b", get_hardware("h200"), 4, "bf16"), geo)
    assert (2, 1, 1, False) in todo and (2, 1, 2, False) in todo and (4, 1, 4, False) in todo
    assert all(ep in (1, tp) for tp, _, ep, _ in todo) and (1, 1, 1, False) == todo[0]
    dense = _with_ep(layout_candidates("llama-3-8b", get_hardware("h200"), 4, "bf16"), model_geometry("llama-3-8b"))
    assert all(ep == 1 and not dpa for _, _, ep, dpa in dense)


def test_moe_layouts_are_tried_with_dp_attention_and_dense_ones_not():
    """Beside each one-stage ep = tp layout of a MoE, its DP-attention twin (tp attention ranks of one device, E / tp
    experts a device); never on several stages, never with ep below tp, never for a dense model."""
    geo = model_geometry("mixtral-8x7b")
    todo = _with_ep(layout_candidates("mixtral-8x7b", get_hardware("h200"), 8, "bf16"), geo)
    dpa = [(tp, pp, ep) for tp, pp, ep, d in todo if d]
    assert (2, 1, 2) in dpa and (4, 1, 4) in dpa and (8, 1, 8) in dpa
    assert all(pp == 1 and ep == tp > 1 for tp, pp, ep in dpa)
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
