"""Where a layout's groups run (opmap.mapping.layout_collectives.placement over the catalog's interconnect tiers)
and what they cost there, by hand from the alpha-beta formulas of opmap.mapping.collectives (NCCL's tuner:
Simple base 8.4 us, hop factor 3.4 / 0.6, efficiency 1; in-switch NVLS 23 us + S / in-switch rate) with the
catalog's figures: GB200 NVL72 and HGX B200 NVLink 5 1.8 TB/s both directions (900e9 B/s a direction), 72 and 8
GPUs a domain, 0.6 us a hop; NVLS 548.4e9 B/s (assumed in the catalog: H100's measured fraction); one 400 Gb/s
ConnectX-7 (50e9 B/s a direction) per GPU, 2.7 us a hop; Trn2 NeuronLink-v3 1,024 GB/s in a 16-chip instance
and 256 GB/s between the four instances of an UltraServer (both directions), EFA 25e9 B/s per chip."""

from __future__ import annotations

from dataclasses import replace

import pytest

from opmap.hardware import get_hardware
from opmap.mapping.collectives import Collective, collective_time
from opmap.mapping.layout_collectives import link_for, placement


def model_only(hw):
    """``hw`` without its measured collective grid: these tests check the first-principles model."""
    return replace(hw, calibration={k: v for k, v in hw.calibration.items() if k != "comm_grid"})


GB200, B200, TRN2 = model_only(get_hardware("gb200")), model_only(get_hardware("b200")), get_hardware("trn2")
BASE, HOP = 8.4e-6, 3.4 / 0.6  # NCCL Simple
NVLINK, NIC = 900e9, 50e9  # per direction
NVLINK_HOP, NET_HOP = 0.6e-6, 2.7e-6
NVLS_S, NVLS_RATE = 23e-6, 548.4e9
S = 256 * 2**20  # a prefill's TP all-reduce: 16k tokens x 8192 hidden x 2 bytes


def test_the_catalog_tiers_are_the_figures_used_by_hand():
    up = GB200.interconnect.scale_up
    assert (up.devices, up.bytes_per_s, up.latency_s, up.in_network_bytes_per_s) == (72, NVLINK, NVLINK_HOP, NVLS_RATE)
    assert B200.interconnect.domain_size == 8 and B200.interconnect.scale_out.bytes_per_s == NIC
    assert [t.devices for t in TRN2.interconnect.tiers] == [16, 64, None]


@pytest.mark.parametrize("hw, span, group, want", [
    (GB200, 16, 16, ("scale_up", None)),  # tp16 inside the 72-GPU NVLink domain
    (GB200, 72, 72, ("scale_up", None)),
    (GB200, 144, 2, ("scale_out", None)),  # a PP pair of tp72 stages: one GPU a rack
    (B200, 16, 16, ("auto", 1)),  # tp16: 8 a node, two nodes over InfiniBand
    (B200, 16, 2, ("scale_out", None)),  # a PP pair of tp8 stages: one a node
    (TRN2, 32, 32, ("auto", 1)),  # tp32: two instances of an UltraServer
    (TRN2, 32, 2, ("auto", 16)),  # a PP pair of tp16 stages: two instances, one UltraServer
    (TRN2, 128, 2, ("scale_out", None)),  # a PP pair of tp64 stages: one chip an UltraServer, over EFA
])
def test_placement_walks_the_tiers(hw, span, group, want):
    assert placement(hw, span, group) == want
    assert link_for(hw, span, group) == want[0]


def test_tp16_on_gb200_is_nvls_on_nvlink():
    """Inside the NVL72 domain the switch reduces: 23 us + S / 548.4e9, faster than a ring's 2 (n-1)/n S / 900e9."""
    c = collective_time(GB200, Collective("all_reduce", S, 16, *placement(GB200, 16)[:1]))
    assert c.algorithm == "in_switch"
    assert c.seconds == pytest.approx(NVLS_S + S / NVLS_RATE, rel=1e-12)
    ring = BASE + 2 * 15 * NVLINK_HOP * HOP + 2 * 15 / 16 * S / NVLINK
    assert c.detail["candidates_s"]["ring/Simple"] == pytest.approx(ring, rel=1e-12)


def test_tp16_on_b200_crosses_infiniband():
    """Two nodes of 8: a ring per GPU through its own NIC, bandwidth min(900e9, 8 x 50e9) = 400e9; of its 30 steps 4
    cross nodes (one per node and pass). Hierarchical: reduce-scatter in the node (7 steps), an all-reduce of S / 8
    over 2 nodes (2 hops at 50e9: 2 (1/2) S/8 / 50e9), all-gather in the node; the faster is taken."""
    link, stride = placement(B200, 16)
    c = collective_time(B200, Collective("all_reduce", S, 16, link, stride=stride))
    ring = BASE + (26 * NVLINK_HOP + 4 * NET_HOP) * HOP + 2 * 15 / 16 * S / 400e9
    assert c.detail["candidates_s"]["ring/Simple"] == pytest.approx(ring, rel=1e-12)
    intra = BASE + 7 * NVLINK_HOP * HOP + 7 / 8 * S / NVLINK
    across = BASE + 2 * NET_HOP * HOP + (S / 8) / NIC
    hier = 2 * intra + across
    assert c.detail["candidates_s"]["hierarchical/Simple"] == pytest.approx(hier, rel=1e-12)
    assert c.algorithm == "hierarchical" and c.seconds == pytest.approx(min(ring, hier), rel=1e-12)
    assert c.detail["nodes"] == 2 and c.detail["scale_out_bytes_per_s"] == NIC
    gb = collective_time(GB200, Collective("all_reduce", S, 16, "scale_up")).seconds
    assert c.seconds > 2 * gb  # the NVL72 rack keeps tp16 on NVLink


def test_trn2_tp32_crosses_the_ultraserver_links_not_efa():
    """32 chips: two 16-chip instances on the UltraServer's NeuronLink (256e9 / 2 = 128e9 a direction, 16 members an
    instance: 16 x 128e9 = 2048e9 > the instance's 512e9), so the ring runs at 512e9; EFA (25e9) is not crossed."""
    link, stride = placement(TRN2, 32)
    c = collective_time(TRN2, Collective("all_reduce", S, 32, link, stride=stride))
    assert c.detail["scale_out_bytes_per_s"] == 128e9 and c.detail["nodes"] == 2
    hop = 1e-6  # the catalog's assumed NeuronLink hop
    ring = BASE + (60 * hop + 2 * hop) * HOP + 2 * 31 / 32 * S / 512e9
    assert c.detail["candidates_s"]["ring/Simple"] == pytest.approx(ring, rel=1e-12)
    efa = collective_time(TRN2, Collective("all_reduce", S, 32, "scale_out")).seconds
    assert c.seconds < efa / 10


def test_a_strided_pair_inside_an_ultraserver():
    """A PP send of tp16 stages on Trn2: ranks 16 apart, two instances of one UltraServer: S at 128e9 a direction,
    one NeuronLink hop (1 us) x Simple's factor; the pair of tp64 stages goes over EFA (25e9)."""
    link, stride = placement(TRN2, 32, 2)
    c = collective_time(TRN2, Collective("send_recv", S, 2, link, stride=stride))
    assert c.seconds == pytest.approx(BASE + 1e-6 * HOP + S / 128e9, rel=1e-12)
    far = collective_time(TRN2, Collective("send_recv", S, 2, link_for(TRN2, 128, 2)))
    assert far.seconds == pytest.approx(BASE + NET_HOP * HOP + S / 25e9, rel=1e-12)


def test_ep8_all_to_all_on_nvlink():
    """Mixtral's EP 8 on a GB200 rack: (n-1)/n S over NVLink, one hop: base + alpha x hop factor + 7/8 S / 900e9."""
    c = collective_time(GB200, Collective("all_to_all", S, 8, link_for(GB200, 8)))
    assert c.algorithm == "direct"
    assert c.seconds == pytest.approx(BASE + NVLINK_HOP * HOP + 7 / 8 * S / NVLINK, rel=1e-12)


def test_a_collective_kernel_records_a_kernel_row():
    from opmap.mapping.layout_collectives import CollectiveKernel
    from opmap.record import record

    # a TP all-reduce of S bytes over 8 devices, 2 a microbatch, 3 us a call of which 1 us is not hidden
    ck = CollectiveKernel("c0", Collective("all_reduce", S, 8, "scale_up"), "tp", "forward", 2, 3e-6, "ring/simple",
                          "scale_up", exposed_s=1e-6)
    d = record(ck)
    assert list(d) == ["id", "kernel_class", "collective", "message_bytes", "group_size", "link", "predicted_s",
                       "interconnect_s", "matrix_s", "vector_s", "memory_s", "overhead_s", "bound", "algorithm",
                       "purpose", "phase", "count", "total_s", "exposed_s", "exposed_total_s"]
    assert d == {"id": "c0", "kernel_class": "collective", "collective": "all_reduce", "message_bytes": S,
                 "group_size": 8, "link": "scale_up", "predicted_s": 3e-6, "interconnect_s": 3e-6, "matrix_s": 0.0,
                 "vector_s": 0.0, "memory_s": 0.0, "overhead_s": 0.0, "bound": "interconnect",
                 "algorithm": "ring/simple", "purpose": "tp", "phase": "forward", "count": 2, "total_s": 2 * 3e-6,
                 "exposed_s": 1e-6, "exposed_total_s": 2 * 1e-6}
    assert record(replace(ck, exposed_s=None))["exposed_total_s"] == 2 * 3e-6  # None: all of it exposed
