"""Collectives: golden values from the nccl-tests formulas (doc/PERFORMANCE.md) and hand-computed alpha-beta
times; monotonicity; edge cases. Catalog figures used by hand: H100 SXM NVLink 900 GB/s bidirectional
(450e9 B/s per direction), one 50e9 B/s NIC per GPU, hop latencies 0.6 us (NVLink) and 2.7 us (network) from
NCCL's tuner; protocol constants from NCCL's tuner (LL base 6.6 us, Simple base 8.4 us, hop factor 3.4/0.6)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from opmap.errors import OpmapError
from opmap.hardware import get_hardware
from opmap.mapping.collectives import Collective, bus_factor, collective_roofline, collective_time
from opmap.roofline import Bound


def model_only(hw):
    """``hw`` without its measured collective grid: these tests check the first-principles model
    (tests/hardware/test_comm_grid.py checks the measured times)."""
    return replace(hw, calibration={k: v for k, v in hw.calibration.items() if k != "comm_grid"})


H100 = model_only(get_hardware("h100-sxm"))
A100 = model_only(get_hardware("a100-sxm-80gb"))
GIB = 2**30


def test_bus_factors_are_nccl_tests():
    # doc/PERFORMANCE.md: all-reduce 2(n-1)/n; reduce-scatter, all-gather, all-to-all (n-1)/n
    assert bus_factor("all_reduce", 8) == 14 / 8
    assert bus_factor("all_gather", 8) == bus_factor("reduce_scatter", 8) == bus_factor("all_to_all", 8) == 7 / 8
    assert bus_factor("send_recv", 2) == 1.0


def test_small_all_reduce_is_ring_ll_by_hand():
    # A100 ring LL: 6.6 us + 2(n-1) = 14 steps x 0.6 us + 2(7/8) x 8 B / (300e9 x 1/2)
    t, algo, d = collective_time(A100, Collective("all_reduce", 8, 8))
    hand = 6.6e-6 + 14 * 0.6e-6 + 1.75 * 8 / (300e9 * 0.5)
    assert (algo, d["protocol"]) == ("ring", "LL")
    assert math.isclose(t, hand, rel_tol=1e-9)


def test_large_all_reduce_without_switch_reduction_is_the_ring_bound():
    # A100 DGX (no NVLink SHARP): ring Simple, 8.4 us + 14 x 3.4 us + 1.75 x S / 300e9 (600 GB/s bidirectional)
    s = 8 * GIB
    t, algo, d = collective_time(A100, Collective("all_reduce", s, 8))
    assert (algo, d["protocol"]) == ("ring", "Simple")
    assert math.isclose(t, 8.4e-6 + 14 * 3.4e-6 + 1.75 * s / 300e9, rel_tol=1e-9)
    # busbw = algbw x 2(n-1)/n reaches the per-direction link rate from below
    assert d["busbw_bytes_per_s"] < 300e9 and d["busbw_bytes_per_s"] > 0.99 * 300e9


def test_in_switch_all_reduce_beats_the_ring_bound_on_h100():
    s = 8 * GIB
    t, algo, d = collective_time(H100, Collective("all_reduce", s, 8))
    assert algo == "in_switch"
    assert math.isclose(t, 23e-6 + s / H100.in_switch_bandwidth_bytes_per_s, rel_tol=1e-9)
    assert d["busbw_bytes_per_s"] > 450e9  # above the ring bound (published.md: 479.84 GB/s measured)


def test_all_gather_and_reduce_scatter_by_hand():
    s = GIB
    for kind in ("all_gather", "reduce_scatter"):
        t, algo, d = collective_time(A100, Collective(kind, s, 8))
        assert (algo, d["protocol"]) == ("ring", "Simple")
        assert math.isclose(t, 8.4e-6 + 7 * 3.4e-6 + 7 / 8 * s / 300e9, rel_tol=1e-9)


def test_all_to_all_and_send_recv_by_hand():
    s = GIB
    t, algo, _ = collective_time(H100, Collective("all_to_all", s, 8))
    assert algo == "direct" and math.isclose(t, 8.4e-6 + 3.4e-6 + 7 / 8 * s / 450e9, rel_tol=1e-9)
    t, _, _ = collective_time(H100, Collective("send_recv", s, 2))
    assert math.isclose(t, 8.4e-6 + 3.4e-6 + s / 450e9, rel_tol=1e-9)
    # across nodes: the NIC, 50e9 B/s, 2.7 us x 3.4/0.6 per hop
    t, _, _ = collective_time(H100, Collective("send_recv", s, 2, link="scale_out"))
    assert math.isclose(t, 8.4e-6 + 2.7e-6 * 3.4 / 0.6 + s / 50e9, rel_tol=1e-9)


def test_full_mesh_pair_gets_one_link():
    # MI300X: 896 GB/s bidirectional over 7 links -> one peer link 64 GB/s per direction
    mi = get_hardware("mi300x")
    s = GIB
    t, _, _ = collective_time(mi, Collective("send_recv", s, 2))
    assert math.isclose(t, 8.4e-6 + 3.4e-6 + s / 64e9, rel_tol=1e-9)
    # but a collective over all 8 uses every link (seven rings)
    t8, _, _ = collective_time(mi, Collective("all_gather", s, 8))
    assert t8 < t


def test_group_of_one_costs_nothing():
    t, algo, _ = collective_time(H100, Collective("all_reduce", GIB, 1))
    assert t == 0.0 and algo == "none"


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
def test_monotone_in_message_size(kind):
    times = [collective_time(H100, Collective(kind, 2**e, 8)).seconds for e in range(3, 34)]
    assert all(a <= b for a, b in zip(times, times[1:], strict=False)), times


def test_effective_bandwidth_rises_with_message_size():
    bws = [collective_time(H100, Collective("all_reduce", 2**e, 8)).detail["busbw_bytes_per_s"]
           for e in range(3, 34)]
    assert all(a <= b for a, b in zip(bws, bws[1:], strict=False))
    assert bws[0] < 1e9 and bws[-1] > 400e9


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter"])
def test_monotone_in_group_size(kind):
    times = [collective_time(A100, Collective(kind, 256 * 2**20, n)).seconds for n in (1, 2, 4, 8, 16, 32, 64)]
    assert all(a < b for a, b in zip(times, times[1:], strict=False)), times


def test_scale_out_is_slower_than_scale_up():
    for kind in ("all_reduce", "all_gather", "all_to_all"):
        up = collective_time(H100, Collective(kind, GIB, 8, link="scale_up")).seconds
        out = collective_time(H100, Collective(kind, GIB, 8, link="scale_out")).seconds
        assert out > 5 * up, kind


def test_spanning_nodes_by_devices_per_node():
    t8, _, d8 = collective_time(H100, Collective("all_reduce", GIB, 8))
    t16, algo, d16 = collective_time(H100, Collective("all_reduce", GIB, 16))
    assert d8["nodes"] == 1 and d16["nodes"] == 2 and d16["devices_per_node"] == 8
    assert t16 > t8
    assert "hierarchical/Simple" in d16["candidates_s"]
    # flat ring across nodes: one ring per GPU through its own NIC, min(450e9, 8 x 50e9) = 400e9 per direction
    assert math.isclose(d16["candidates_s"]["ring/Simple"],
                        8.4e-6 + (30 - 4) * 3.4e-6 + 4 * 2.7e-6 * 3.4 / 0.6 + 30 / 16 * GIB / 400e9, rel_tol=1e-9)


def test_roofline_bound_is_interconnect():
    r = collective_roofline(H100, Collective("all_reduce", GIB, 8))
    assert r.bound == Bound.INTERCONNECT and r.predicted_s == r.interconnect_s > 0


@pytest.mark.parametrize(("args", "match"), [
    (("all_sum", 1024, 8), "kind 'all_sum' is not one of"),
    (("all_reduce", -1, 8), "message_bytes"),
    (("all_reduce", 0, 8), "message_bytes"),
    (("all_reduce", float("nan"), 8), "message_bytes"),
    (("all_reduce", 1024, 0), "group_size"),
    (("all_reduce", 1024, 2.5), "group_size"),
    (("send_recv", 1024, 4), "between two devices"),
    (("all_reduce", 1024, 8, "nvlink"), "link 'nvlink'"),
])
def test_bad_input_is_an_opmap_error(args, match):
    with pytest.raises(OpmapError, match=match):
        Collective(*args)


def test_impossible_placements_are_opmap_errors():
    with pytest.raises(OpmapError, match="does not fit one node of 8"):
        collective_time(H100, Collective("all_reduce", 1024, 16, link="scale_up"))
    with pytest.raises(OpmapError, match="whole nodes of 8"):
        collective_time(H100, Collective("all_reduce", 1024, 12))
    with pytest.raises(OpmapError, match="NVLink bridge joins two cards"):
        collective_time(get_hardware("h100-pcie"), Collective("all_reduce", 1024, 4))
    with pytest.raises(OpmapError, match="no scale_out_bandwidth"):
        collective_time(get_hardware("l4"), Collective("all_reduce", 1024, 16))


def test_group_with_fewer_members_a_node_rings_over_their_nics():
    """A group of 32 with 4 members in each of 8 DGX H100 nodes (a DP group beside tp 2): a ring per member, each
    crossing nodes through its own 50 GB/s NIC: bandwidth min(450 GB/s NVLink a direction, 4 x 50 GB/s) = 200 GB/s,
    all-reduce t >= 2 (n - 1) / n x S / 200 GB/s; a per_node outside link auto is refused."""
    hw = get_hardware("h100-sxm")
    s = 8e9
    t = collective_time(hw, Collective("all_reduce", s, 32, "auto", 4)).seconds
    floor = 2 * 31 / 32 * s / 200e9
    assert floor <= t <= 1.05 * floor
    with pytest.raises(OpmapError, match="per_node must be an integer of at least 1 under link auto"):
        Collective("all_reduce", s, 32, "scale_out", 4)
