"""Collectives walk the interconnect's tiers (opmap.mapping.collectives): a group uses the innermost tier whose
domain holds it, and a group spanning tiers is priced tier by tier. Golden numbers worked by hand below from the
alpha-beta formulas (ring all-reduce: base + 2(g-1) hops x alpha x hop factor + 2(g-1)/g x S / (bw x efficiency))
on a hypothetical 3-tier device; NCCL's Simple protocol: base 8.4 us, hop factor 3.4 / 0.6, efficiency 1."""

from __future__ import annotations

import math

import pytest

from opmap.errors import OpmapError
from opmap.hardware.spec import CATALOG_DIR, parse_spec_toml
from opmap.mapping.collectives import Collective, collective_time

BASE = (CATALOG_DIR / "h100-sxm.toml").read_text().split("\n[calibration]")[0].split(
    "# the interconnect, innermost tier first")[0]


def _value(key: str, value: float) -> str:
    return f'\n[interconnect.tier.{key}]\nvalue = {value}\nkind = "assumed"\nsource = "a hypothetical tier"\n'


# tier 0: 4 devices on a switch, 400 GB/s both directions (200e9 per direction), 1 us a hop;
# tier 1: 16 devices (4 domains of 4), 100e9 per direction, 2 us; tier 2: any number, 25e9 per direction, 5 us
THREE = BASE + (
    '\n[[interconnect.tier]]\nname = "inner"\nbandwidth_directions = 2\n' + _value("size", 4)
    + _value("bandwidth_bytes_per_s", 400e9) + _value("latency_s", 1e-6)
    + '\n[interconnect.tier.topology]\nvalue = "switch"\nkind = "assumed"\nsource = "a hypothetical tier"\n'
    + '\n[[interconnect.tier]]\nname = "rack"\n' + _value("size", 16) + _value("bandwidth_bytes_per_s", 100e9)
    + _value("latency_s", 2e-6)
    + '\n[[interconnect.tier]]\nname = "network"\nsize = "any"\n' + _value("bandwidth_bytes_per_s", 25e9)
    + _value("latency_s", 5e-6))
HW = parse_spec_toml(THREE, "three-tier.toml")
S = 1e9
HOP = 3.4 / 0.6  # Simple's hop latency over LL's (NCCL tuner)


def _simple(kind: str, group: int, algorithm: str = "ring") -> tuple[float, dict]:
    t = collective_time(HW, Collective(kind, S, group))
    return t.detail["candidates_s"][f"{algorithm}/Simple"], t.detail


def test_a_group_inside_the_inner_tier_rings_on_it():
    t, d = _simple("all_reduce", 4)
    # 8.4 us + 2(4-1) = 6 hops x 1 us x 3.4/0.6 + 2(3/4) x 1e9 / 200e9 = 8.4e-6 + 34e-6 + 7.5e-3
    assert math.isclose(t, 8.4e-6 + 34e-6 + 7.5e-3, rel_tol=1e-12)
    assert (d["nodes"], d["devices_per_node"], d["scale_up_bytes_per_s"]) == (1, 4, 200e9)


def test_a_group_of_the_middle_tier_crosses_it_not_the_network():
    t, d = _simple("all_reduce", 16)
    # 30 steps; 2 x 4 domains = 8 of them cross the rack tier (2 us), 22 stay inside (1 us):
    # 8.4e-6 + (22 x 1e-6 + 8 x 2e-6) x 3.4/0.6 = 8.4e-6 + 215.33e-6; bandwidth min(200e9, 4 x 100e9) = 200e9:
    # 2 x 15/16 x 1e9 / 200e9 = 9.375e-3
    assert math.isclose(t, 8.4e-6 + 38e-6 * HOP + 9.375e-3, rel_tol=1e-12)
    assert (d["nodes"], d["devices_per_node"], d["scale_out_bytes_per_s"]) == (4, 4, 100e9)  # the rack's, not 25e9
    # hierarchical: reduce-scatter in the 4 (8.4e-6 + 3 x 1e-6 x HOP + 3/4 x 1e9 / 200e9), the same all-gather,
    # between them the faster of a ring (8.4e-6 + 6 x 2e-6 x HOP + 2 x 3/4 x 2.5e8 / 100e9) and a tree
    # (8.4e-6 + 2 x log2(4) x 2e-6 x HOP + 2 x 2.5e8 / 100e9) over the rack of S / 4 = 2.5e8
    intra = 8.4e-6 + 3e-6 * HOP + 3.75e-3
    ring = 8.4e-6 + 12e-6 * HOP + 3.75e-3
    tree = 8.4e-6 + 8e-6 * HOP + 5e-3
    h, _ = _simple("all_reduce", 16, "hierarchical")
    assert math.isclose(h, 2 * intra + min(ring, tree), rel_tol=1e-12)


def test_a_group_spanning_three_tiers_walks_all_of_them():
    t, d = _simple("all_reduce", 64)
    # 126 steps; 2 x 16 = 32 cross a rack-tier boundary, of which 2 x 4 = 8 cross the network:
    # hops 94 x 1 us + 24 x 2 us + 8 x 5 us = 182e-6; bandwidth min(200e9, 4 x 100e9, 16 x 25e9) = 200e9:
    # 2 x 63/64 x 1e9 / 200e9 = 9.84375e-3
    assert math.isclose(t, 8.4e-6 + 182e-6 * HOP + 9.84375e-3, rel_tol=1e-12)
    assert (d["nodes"], d["devices_per_node"], d["scale_out_bytes_per_s"]) == (16, 4, 25e9)
    # hierarchical: in the 4 (as above) + all-reduce of 2.5e8 over 4 racks x 4 domains, the fastest of
    #  ring: 30 steps, 22 at 2 us and 8 at 5 us, bandwidth min(100e9, 4 x 25e9) = 100e9, 2 x 15/16 x 2.5e8
    #  tree: depth log2(4) x 2 us + log2(4) x 5 us = 14 us, 2 x 2.5e8 / 100e9
    #  hierarchical again: reduce-scatter and all-gather in the rack (8.4e-6 + 3 x 2e-6 x HOP + 3/4 x 2.5e8 / 100e9)
    #  around the faster of a ring (8.4e-6 + 6 x 5e-6 x HOP + 2 x 3/4 x 6.25e7 / 25e9) and a tree
    #  (8.4e-6 + 2 x 2 x 5e-6 x HOP + 2 x 6.25e7 / 25e9) over the network of 2.5e8 / 4 = 6.25e7
    intra = 8.4e-6 + 3e-6 * HOP + 3.75e-3
    ring = 8.4e-6 + (22 * 2e-6 + 8 * 5e-6) * HOP + 4.6875e-3
    tree = 8.4e-6 + 2 * 14e-6 * HOP + 5e-3
    rack = 8.4e-6 + 6e-6 * HOP + 1.875e-3
    net = min(8.4e-6 + 30e-6 * HOP + 3.75e-3, 8.4e-6 + 20e-6 * HOP + 5e-3)
    h, _ = _simple("all_reduce", 64, "hierarchical")
    assert math.isclose(h, 2 * intra + min(ring, tree, 2 * rack + net), rel_tol=1e-12)


def test_all_gather_and_all_to_all_over_three_tiers():
    t, _ = _simple("all_gather", 64)
    # 63 steps; 16 domains - 1 = 15 cross the rack tier, of them 4 - 1 = 3 the network: 48 x 1 + 12 x 2 + 3 x 5 us
    assert math.isclose(t, 8.4e-6 + 87e-6 * HOP + 63 / 64 * S / 200e9, rel_tol=1e-12)
    t, _ = _simple("all_to_all", 64, "direct")
    # shares: 3/64 S over 200e9, 12/64 S over 100e9, 48/64 S over 25e9 (the slowest: 3e-2), alpha the largest 5 us
    assert math.isclose(t, 8.4e-6 + 5e-6 * HOP + 48 / 64 * S / 25e9, rel_tol=1e-12)


def test_a_group_that_splits_a_rack_unevenly_is_refused():
    with pytest.raises(OpmapError, match="does not fill whole rack domains of 16 devices"):
        collective_time(HW, Collective("all_reduce", S, 24))
