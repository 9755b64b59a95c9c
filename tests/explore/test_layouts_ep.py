"""fit's layout search with expert parallelism (opmap.explore.layouts): a MoE model's layouts are tried with the
experts tensor-parallel and, beside each, over the replica's tp group (ep = tp, priced by serve's --ep); a dense
model's are not. The label and fit.json name the split."""

from __future__ import annotations

from opmap.explore.layouts import _with_ep, label, layout_candidates, model_geometry
from opmap.explore.results import LayoutResult
from opmap.hardware import get_hardware
from opmap.record import record


def test_moe_layouts_are_tried_with_experts_over_the_tp_group():
    geo = model_geometry("mixtral-8x7b")
    assert geo.n_experts == 8  # Mixtral 8x7B: 8 experts a layer
    todo = _with_ep(layout_candidates("mixtral-8x7b", get_hardware("h200"), 4, "bf16"), geo)
    assert (2, 1, 1) in todo and (2, 1, 2) in todo and (4, 1, 4) in todo
    assert all(ep in (1, tp) for tp, _, ep in todo) and (1, 1, 1) in todo and (1, 1, 1) == todo[0]
    dense = _with_ep(layout_candidates("llama-3-8b", get_hardware("h200"), 4, "bf16"), model_geometry("llama-3-8b"))
    assert all(ep == 1 for _, _, ep in dense)


def test_an_ep_layout_is_named_and_written():
    lay = LayoutResult.of(4, 1, 8, ep=4)
    assert label(lay) == "2 x tp4 ep4" and record(lay)["ep"] == 4
    assert label(record(lay)) == "2 x tp4 ep4"
    plain = LayoutResult.of(4, 1, 8)
    assert label(plain) == "2 x tp4" and "ep" not in record(plain)
