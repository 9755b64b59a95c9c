"""Attribution of profiler events to graph nodes: the walk, subtree ownership, coverage, device time."""

from __future__ import annotations

import pytest

from opmap.measure.attribute import Event, attribute, match_iteration, profiler_name


def test_profiler_name():
    assert profiler_name("aten.addmm.default") == "aten::addmm"
    assert profiler_name("aten.add.Tensor") == "aten::add"
    assert profiler_name("aten.scaled_dot_product_attention.default") == "aten::scaled_dot_product_attention"


def test_containers_are_entered_and_matched_subtrees_are_owned():
    # aten::linear (a composite container) holds aten::t and aten::addmm; aten::_to_copy owns its copy_;
    # a later aten::copy_ node must match the later event, not the one nested in _to_copy.
    ops = ["aten.t.default", "aten.addmm.default", "aten._to_copy.default", "aten.copy_.default"]
    evs = [Event("aten::linear", 0, 10), Event("aten::t", 1, 2), Event("aten::transpose", 1.2, 1.8),
           Event("aten::addmm", 3, 9), Event("aten::_to_copy", 11, 15), Event("aten::copy_", 12, 14),
           Event("aten::copy_", 16, 20)]
    m = match_iteration(ops, evs)
    assert [(x.node, x.event.start_us) for x in m] == [(0, 1), (1, 3), (2, 11), (3, 16)]


def test_unmatched_events_do_not_derail_the_walk():
    ops = ["aten.mm.default", "aten.relu.default"]
    evs = [Event("aten::empty", 0, 1), Event("aten::mm", 2, 5), Event("aten::zeros", 6, 7), Event("aten::relu", 8, 9)]
    assert [x.node for x in match_iteration(ops, evs)] == [0, 1]


def test_attribute_medians_coverage_and_unattributed():
    ops = ["aten.mm.default", "aten.view.default", "aten.relu.default"]
    its = []
    for _k, (mm, relu) in enumerate(((4.0, 1.0), (6.0, 1.0), (5.0, 3.0))):
        evs = [Event("aten::mm", 0, mm), Event("aten::relu", mm + 1, mm + 1 + relu)]
        its.append(((mm + relu + 2) / 1e6, evs))
    a = attribute(ops, kernel_nodes=[0, 2], iterations=its)
    assert a.timings[0].median_s == pytest.approx(5e-6)
    assert (a.timings[0].min_s, a.timings[0].max_s) == (pytest.approx(4e-6), pytest.approx(6e-6))
    assert a.timings[2].median_s == pytest.approx(1e-6)
    assert 1 not in a.timings  # the view was not in the profile: no timing, and coverage is over kernels
    assert a.coverage == 1.0
    # spans 7, 9, 10 us -> median 9; sums 5, 7, 8 -> median 7; 2 us per iteration between ops
    assert a.iteration_s == pytest.approx(9e-6) and a.attributed_s == pytest.approx(7e-6)
    assert a.unattributed_s == pytest.approx(2e-6)


def test_partial_match_lowers_coverage():
    ops = ["aten.mm.default", "aten.relu.default"]
    a = attribute(ops, [0, 1], [(1e-5, [Event("aten::mm", 0, 3)])])
    assert a.coverage == 0.5


def test_device_timebase_uses_kernel_time():
    # CUDA: the op's CPU span is the launch; the kernels under it (linked by correlation id) are its time
    ops = ["aten.mm.default"]
    ev = Event("aten::mm", 0, 8, device_us=120.0, kernels=("sm90_xmma_gemm",))
    a = attribute(ops, [0], [(2e-4, [ev])], use_device_time=True)
    assert a.timebase == "device"
    assert a.timings[0].median_s == pytest.approx(120e-6)
    assert a.timings[0].kernels == ("sm90_xmma_gemm",)


def test_resynchronises_on_name_and_shape_after_a_divergence():
    # the capture saw linear as t + mm + add; the run took addmm. The walk steps over the missing nodes
    # and picks up at gelu (same first input shape); the run's addmm is not taken for the later addmm node,
    # whose bias has another shape, which matches the later addmm event.
    ops = ["aten.t.default", "aten.mm.default", "aten.add.Tensor", "aten.gelu.default", "aten.addmm.default"]
    shapes = [(64, 32), (8, 32), (8, 64), (8, 64), (128,)]
    evs = [Event("aten::addmm", 0, 5, first_shape=(64,)), Event("aten::gelu", 6, 7, first_shape=(8, 64)),
           Event("aten::addmm", 8, 12, first_shape=(128,))]
    m = match_iteration(ops, evs, skippable=[0], first_shapes=shapes)
    assert [(x.node, x.event.start_us) for x in m] == [(3, 6), (4, 8)]
    a = attribute(ops, [1, 2, 3, 4], [(2e-5, evs)], first_shapes=shapes)
    assert a.coverage == 0.5


def test_template_walk_replays_on_shapeless_iterations():
    from opmap.measure.attribute import match_with_template

    ops = ["aten.t.default", "aten.mm.default", "aten.add.Tensor", "aten.gelu.default", "aten.addmm.default"]
    shapes = [(64, 32), (8, 32), (8, 64), (8, 64), (128,)]
    shaped = [Event("aten::addmm", 0, 5, first_shape=(64,)), Event("aten::gelu", 6, 7, first_shape=(8, 64)),
              Event("aten::addmm", 8, 12, first_shape=(128,))]
    bare = [Event("aten::addmm", 100, 104), Event("aten::gelu", 105, 108), Event("aten::addmm", 109, 115)]
    # by name alone the bare iteration would take its first addmm for the last node; the template knows better
    assert [(x.node, x.event.start_us) for x in match_with_template(bare, _template(ops, shaped, shapes))] == [
        (3, 105), (4, 109)]
    a = attribute(ops, [1, 2, 3, 4], [(2e-5, bare)], first_shapes=shapes, template_events=shaped)
    assert a.timings[4].median_s == pytest.approx(6e-6) and a.coverage == 0.5
    # an iteration that does not follow the template falls back to the walk by name
    other = [Event("aten::relu", 0, 1)]
    assert match_with_template(other, _template(ops, shaped, shapes)) is None


def _template(ops, events, shapes):
    from opmap.measure.attribute import _walk

    return _walk(ops, events, [0], shapes)[1]
