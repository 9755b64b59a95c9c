"""Collectives priced from first principles: ring, double binary tree, in-switch reduction, hierarchical.

A collective is a kernel of its own (class ``collective``, bound ``interconnect``). Its time is the
alpha-beta model NCCL's own tuner uses (NVIDIA/nccl ``src/graph/tuning.cc``), per algorithm and protocol::

    t = base_s + hops x alpha x hop_factor + wire_bytes / (bandwidth x efficiency)

and, as NCCL does, the fastest legal (algorithm, protocol) pair is taken and named.

Units. ``message_bytes`` S is what nccl-tests calls the size: the all-reduce buffer, the all-gather *output*,
the reduce-scatter *input*, the all-to-all buffer, the send / recv payload, per device. Bandwidths are bytes
per second **per device, per direction**: the catalog's ``scale_up_bandwidth_bytes_per_s`` is the
bidirectional total (H100: 900 GB/s = 18 NVLink 4 links x 25 GB/s each way), so one direction is half of it
(450 GB/s); ``scale_out_bandwidth_bytes_per_s`` is already per direction (one 400 Gb/s NIC per GPU = 50 GB/s).
nccl-tests reports algbw = S / t and busbw = algbw x factor (``bus_factor``): 2(n-1)/n for all-reduce,
(n-1)/n for all-gather, reduce-scatter and all-to-all, 1 for send / recv. A ring all-reduce's busbw cannot
pass the per-direction link rate; an in-switch all-reduce's can (each device sends S once and receives S
once, the switch does the reduction), which is why a DGX H100 shows busbw 480 GB/s against a 450 GB/s link.

Wire bytes per device, per direction (n devices):

- ring all-reduce (reduce-scatter then all-gather): 2(n-1)/n x S over 2(n-1) steps;
- ring all-gather / reduce-scatter: (n-1)/n x S over n-1 steps;
- double binary tree all-reduce: 2 S (an interior node of one tree takes S/2 from each of two children and
  sends S/2 up, then takes S/2 down and sends it to both children; it is a leaf of the other tree), with
  2 x (depth) steps: a chain of n_local - 1 hops inside a node and log2(nodes) hops across nodes;
- in-switch all-reduce (NVLink SHARP, NCCL's NVLS): S each way at the catalog's measured in-switch rate;
- all-to-all: (n-1)/n x S, the in-node share over the scale-up link and the rest over the NIC, concurrently;
- send / recv: S over one link (on a full mesh a pair has one link's share of the device's bandwidth).

The links are the catalog's interconnect tiers (opmap.hardware.interconnect), innermost first: a group uses the
innermost tier whose domain holds it, and one that spans tiers crosses each of them. A node is a domain of the
innermost tier (``devices_per_node``). Across nodes a ring runs one ring per GPU, each crossing domains through
its own link, so its bandwidth is the least over the tiers crossed of (the group's devices in one domain below
that tier) x that tier's rate (two tiers: min(scale-up per direction, devices per node x NIC rate)); of its hops,
one per domain and pass crosses each tier's boundary. The hierarchical all-reduce runs reduce-scatter in the node,
all-reduce of S / n_local across the tiers above (itself ring, tree or hierarchical again one tier up), all-gather
in the node, in sequence. The in-switch all-reduce is priced for a group inside one domain of the innermost tier.
A group whose members stride over other splits (``stride``: a PP pair tp ranks apart, a DP group beside TP) holds
min(n, D / stride) members in a domain of D devices at each tier, so it crosses a tier only where its members do.

Message-size-dependent bandwidth comes from two places, both first principles: the alpha terms (latency
dominates small messages) and NCCL's three protocols, which trade wire efficiency for latency:

- LL: 8-byte stores carrying 4 bytes of data and a 4-byte flag (efficiency 1/2), the lowest latency;
- LL128: 128-byte lines carrying 120 bytes of data and an 8-byte flag (efficiency 120/128);
- Simple: bulk copies, then a memory fence and a flag per chunk (efficiency 1), the highest latency.

The protocol constants (base latency per collective, hop latency relative to LL) are NCCL's tuner's; the
per-hop alpha of each link is the catalog's (``scale_up_latency_s``, ``scale_out_latency_s``).

Measured. Datasheet link rates overstate what collectives reach, most on PCIe (8 x RTX PRO 6000: NCCL all-gather
algbw 26 GB/s at 128 MiB against 64 GB/s a direction). Where the catalog device carries a measured grid
(``[calibration] comm_grid``, opmap.hardware.comm_grid: NCCL's times per kind and GPU count of one node) and the
group sits inside one domain of the innermost tier at a GPU count the grid holds, the collective takes the
measured time, interpolated log-log over message size (beyond the largest size at its bandwidth), algorithm
``measured``; the first-principles time stays in the detail beside it. A GPU count the grid lacks (8, 16 or 72
on a GB200 NVL72, measured on 2 and 4 GPUs of a tray), a group across domains and a send / recv keep the model
above, unscaled: an efficiency read at 4 GPUs is not carried to an NVLS all-reduce over 72.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from opmap.errors import OpmapError
from opmap.hardware.comm_grid import load_comm_grid
from opmap.hardware.interconnect import Interconnect, Tier
from opmap.hardware.spec import HardwareSpec
from opmap.roofline import Roofline, roofline

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
# auto: the group fills nodes of devices_per_node; scale_up: the group is inside one node; scale_out: one
# member per node (every hop crosses a NIC)
LINKS = ("auto", "scale_up", "scale_out")
KERNEL_CLASS = "collective"

NCCL_TUNING = "NVIDIA/nccl src/graph/tuning.cc (commit b6475625)"


@dataclass(frozen=True)
class Protocol:
    """One of NCCL's wire protocols. ``efficiency``: data bytes per wire byte (first principles);
    ``base_s``: the per-collective latency NCCL's tuner charges (baseLat, Ring); ``hop_factor``: its per-hop
    latency over LL's (hwLat NVLINK Ring: LL 0.6, LL128 1.9, Simple 3.4 us)."""

    name: str
    efficiency: float
    base_s: float
    hop_factor: float


PROTOCOLS: tuple[Protocol, ...] = (
    Protocol("LL", 4 / 8, 6.6e-6, 1.0),  # 4 B data + 4 B flag per 8-byte store
    Protocol("LL128", 120 / 128, 14.0e-6, 1.9 / 0.6),  # 8 B flag per 128-byte line
    Protocol("Simple", 1.0, 8.4e-6, 3.4 / 0.6),  # fence + flag per chunk, no per-line overhead
)
SIMPLE = PROTOCOLS[-1]
# NCCL's tuner: an NVLS (in-switch) all-reduce costs hwLat NVLINK NVLS Simple = 23 us, base 0
IN_SWITCH_LATENCY_S = 23e-6


@dataclass(frozen=True)
class Collective:
    """One collective. ``message_bytes``: S per device as nccl-tests counts it (module docstring);
    ``group_size``: the devices taking part; ``link``: one of ``LINKS``."""

    kind: str
    message_bytes: float
    group_size: int
    link: str = "auto"
    # link auto across nodes: the group's members in each node (None: devices_per_node, the group fills whole
    # nodes); fewer when the group strides over another split (a DP group beside tp 2 holds 4 of a node's 8)
    per_node: int | None = None
    # link auto: the ranks between consecutive members (1: consecutive ranks, a TP group; tp: a DP or PP group beside
    # tp-wide TP groups); each tier's domain of D devices then holds min(n, D // stride) members (None: per_node's
    # packing, whole innermost domains side by side)
    stride: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise OpmapError(f"collective kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.link not in LINKS:
            raise OpmapError(f"collective link {self.link!r} is not one of {', '.join(LINKS)}")
        b = self.message_bytes
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or b <= 0:
            raise OpmapError(f"collective message_bytes must be a positive finite number, got {b!r}")
        g = self.group_size
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise OpmapError(f"collective group_size must be an integer of at least 1, got {g!r}")
        k = self.per_node
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1 or self.link != "auto"):
            raise OpmapError(f"collective per_node must be an integer of at least 1 under link auto, got {k!r} "
                             f"with link {self.link!r}")
        st = self.stride
        if st is not None and (isinstance(st, bool) or not isinstance(st, int) or st < 1 or self.link != "auto"
                               or k is not None):
            raise OpmapError(f"collective stride must be an integer of at least 1 under link auto without per_node, "
                             f"got {st!r} with link {self.link!r}")
        if self.kind == "send_recv" and g > 2:
            raise OpmapError(f"a send_recv is between two devices; group_size {g} given (accepted: 1 or 2)")


class CollectiveTime(NamedTuple):
    """``seconds``: predicted time; ``algorithm``: the fastest legal one (``ring``, ``tree``, ``in_switch``,
    ``hierarchical``, ``direct`` for all-to-all and send / recv, ``none`` for a group of one), or ``measured``
    (read off the device's measured grid: ``detail`` names it, and the model's time as ``model/...``); ``detail``:
    protocol, nodes, bandwidths used (bytes/s, per device, per direction), algbw / busbw and every
    candidate's time."""

    seconds: float
    algorithm: str
    detail: dict[str, Any]


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests ``doc/PERFORMANCE.md``: busbw = algbw x this factor."""
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def _need(value: float | None, hw: HardwareSpec, field: str, why: str) -> float:
    if not value:
        raise OpmapError(f"{hw.name}: the catalog has no {field}, needed for {why}")
    return value


@dataclass(frozen=True)
class _Level:
    """One tier a collective crosses: ``members``, how many of the level below's domains (level 0: devices) the
    group holds in one domain of this tier; bandwidth per device, per direction, and hop latency (0 where
    ``members`` is 1: the group sends nothing over it)."""

    members: int
    bytes_per_s: float = 0.0
    alpha_s: float = 0.0


@dataclass(frozen=True)
class _Fabric:
    """The tiers one collective uses, innermost first (the module docstring's formulas walk them)."""

    levels: tuple[_Level, ...]

    @property
    def per_node(self) -> int:
        """Group members in one innermost domain (a node)."""
        return self.levels[0].members

    @property
    def nodes(self) -> int:
        """Innermost domains the group spans."""
        return math.prod(lv.members for lv in self.levels[1:])

    @property
    def up_bytes_per_s(self) -> float:
        return self.levels[0].bytes_per_s

    @property
    def out_bytes_per_s(self) -> float:
        """The outermost tier the group crosses (0 inside one node)."""
        return self.levels[-1].bytes_per_s if len(self.levels) > 1 else 0.0

    def above(self) -> _Fabric:
        """The same group seen from the innermost tier up: one member per node (a hierarchical step's across)."""
        return _Fabric((_Level(1), *self.levels[1:]))


def _tier_field(ic: Interconnect, tier: Tier, attr: str) -> str:
    """A tier's field as the catalog's flat form names it (error messages), else by its tier."""
    if tier is ic.scale_up:
        return {"bandwidth": "scale_up_bandwidth_bytes_per_s", "latency": "scale_up_latency_s"}[attr]
    if tier is ic.scale_out:
        return {"bandwidth": "scale_out_bandwidth_bytes_per_s", "latency": "scale_out_latency_s"}[attr]
    return f"interconnect tier {tier.name!r} {attr}"


def _members(hw: HardwareSpec, c: Collective, what: str) -> tuple[list[int], list[Tier | None]]:
    """The group's members per domain at each tier it crosses, innermost first, and those tiers (None past the
    catalog's: the message then names the flat field that is missing)."""
    ic, n = hw.interconnect, c.group_size
    tiers: list[Tier | None] = list(ic.tiers) if ic.scale_up is not None else [None, *ic.tiers]
    per_node = ic.domain_size
    if c.link == "scale_out":
        return [1, n], [tiers[0], ic.scale_out]
    if c.stride is not None:
        return _strided(hw, c)
    if c.link == "scale_up" or (per_node and n <= per_node):
        if c.link == "scale_up" and per_node and n > per_node:
            raise OpmapError(f"{hw.name}: a scale_up group of {n} does not fit one node of {per_node} devices "
                             "(use link 'auto' or 'scale_out')")
        return [n], tiers[:1]
    per_node = c.per_node or int(_need(per_node, hw, "devices_per_node", what))
    if n % per_node:
        raise OpmapError(f"{hw.name}: a group of {n} spanning nodes must fill whole nodes of {per_node} "
                         "devices (accepted: a multiple of devices_per_node, or link 'scale_out')")
    members, rest, inner = [per_node], n // per_node, ic.domain_size
    for tier in tiers[1:]:
        if rest == 1:
            break
        m = rest if tier is None or tier.devices is None else min(rest, tier.devices // inner)
        if rest % m:
            raise OpmapError(f"{hw.name}: a group of {n} does not fill whole {tier.name} domains of "
                             f"{tier.devices} devices")
        members.append(m)
        rest //= m
        inner = inner if tier is None or tier.devices is None else tier.devices
    if rest > 1:  # past the catalog's tiers: no scale-out network
        members.append(rest)
    return members, (tiers + [None] * len(members))[:len(members)]


def _strided(hw: HardwareSpec, c: Collective) -> tuple[list[int], list[Tier | None]]:
    """``_members`` of a group whose members are ``c.stride`` ranks apart: one domain of D devices holds
    min(n, D // stride) of them (at least 1), so each tier holds that many over the tier inside it; the scale-out
    network joins the rest. Trailing tiers the group does not cross are left out."""
    ic, n, stride = hw.interconnect, c.group_size, c.stride
    inside, members, tiers = 1, [], []
    for tier in ic.bounded:
        held = min(n, max(1, tier.devices // stride))
        if held % inside:
            raise OpmapError(f"{hw.name}: a group of {n} every {stride} devices does not fill whole domains of the "
                             f"{tier.name} tier ({tier.devices} devices)")
        members.append(held // inside)
        tiers.append(tier)
        inside = held
    if n % inside:
        raise OpmapError(f"{hw.name}: a group of {n} every {stride} devices does not fill whole domains of "
                         f"{inside} members")
    if n > inside:
        members.append(n // inside)
        tiers.append(ic.scale_out)
    while len(members) > 1 and members[-1] == 1:
        members.pop()
        tiers.pop()
    if not members:  # no bounded tier: every member on the scale-out network
        return [1, n], [None, ic.scale_out]
    return members, tiers


def _fabric(hw: HardwareSpec, c: Collective) -> _Fabric:
    what = f"a {c.kind} over {c.group_size} devices"
    ic = hw.interconnect
    members, tiers = _members(hw, c, what)
    levels = []
    for i, (m, tier) in enumerate(zip(members, tiers, strict=True)):
        if m == 1:
            levels.append(_Level(1))
            continue
        if i == 0:
            topo = hw.scale_up_topology
            if topo is None:
                raise OpmapError(f"{hw.name}: the catalog has no scale_up_topology, needed for {what}")
            if topo == "bridge_pairs" and m > 2:
                raise OpmapError(f"{hw.name}: an NVLink bridge joins two cards; a group of {m} in one node goes "
                                 "over PCIe, whose peer bandwidth the catalog does not give (accepted: 2 per node)")
        if tier is None:
            names = ("scale_up_bandwidth_bytes_per_s", "scale_up_latency_s") if i == 0 else (
                "scale_out_bandwidth_bytes_per_s", "scale_out_latency_s")
            _need(None, hw, names[0], what)
        levels.append(_Level(m, _need(tier.bytes_per_s, hw, _tier_field(ic, tier, "bandwidth"), what),
                             _need(tier.latency_s, hw, _tier_field(ic, tier, "latency"), what)))
    return _Fabric(tuple(levels))


def _ring_bandwidth(f: _Fabric) -> float:
    """A ring's per-device bandwidth: the scale-up link inside one node; across domains one ring per member,
    each through its own link at every tier, so the least over the tiers crossed of (the group's devices in one
    domain below that tier) x that tier's rate (two tiers: min(scale-up, devices per node x NIC))."""
    inside, rates = 1, []
    for lv in f.levels:
        if lv.members > 1:
            rates.append(inside * lv.bytes_per_s)
        inside *= lv.members
    return min(rates)


def _ring(kind: str, s: float, f: _Fabric, p: Protocol) -> float:
    n = f.nodes * f.per_node
    steps = 2 * (n - 1) if kind == "all_reduce" else n - 1
    # hops crossing a boundary of level i - 1's domains: one per domain and pass (two passes for an all-reduce)
    domains = [math.prod(lv.members for lv in f.levels[i:]) for i in range(1, len(f.levels))]
    crossing = [min(steps, 2 * d if kind == "all_reduce" else d - 1) for d in domains] + [0]
    hops = [steps - crossing[0]] + [crossing[i] - crossing[i + 1] for i in range(len(domains))]
    lat = p.base_s + sum(h * lv.alpha_s for h, lv in zip(hops, f.levels, strict=True)) * p.hop_factor
    wire = (2 if kind == "all_reduce" else 1) * (n - 1) / n * s
    return lat + wire / (_ring_bandwidth(f) * p.efficiency)


def _tree(s: float, f: _Fabric, p: Protocol) -> float:
    """Double binary tree all-reduce: a chain inside the node, binary trees across the domains of each tier."""
    depth_up = (f.per_node - 1) * f.levels[0].alpha_s + sum(
        math.ceil(math.log2(lv.members)) * lv.alpha_s for lv in f.levels[1:])
    return p.base_s + 2 * depth_up * p.hop_factor + 2 * s / (_ring_bandwidth(f) * p.efficiency)


def _across(s: float, f: _Fabric, p: Protocol) -> float:
    """An all-reduce of ``s`` over the tiers above the node (one member per node): the faster of a ring and a tree,
    and where it crosses two tiers or more, hierarchical again one tier up."""
    best = min(_ring("all_reduce", s, f, p), _tree(s, f, p))
    up = _Fabric(f.levels[1:])
    if len(up.levels) > 1 and up.per_node > 1:
        best = min(best, _hierarchical(s, up, p))
    return best


def _hierarchical(s: float, f: _Fabric, p: Protocol) -> float:
    """Reduce-scatter inside the node, all-reduce of s / (members a node) across, all-gather inside the node."""
    intra = _Fabric(f.levels[:1])
    return (_ring("reduce_scatter", s, intra, p) + _across(s / f.per_node, f.above(), p)
            + _ring("all_gather", s, intra, p))


def _all_to_all(s: float, f: _Fabric, p: Protocol) -> float:
    """Each device's share to the peers it reaches first at each tier, over that tier's link, all concurrently
    (two tiers: (n_local - 1) / n of S over the scale-up link, (n - n_local) / n over the NIC)."""
    n, inside, wire = f.nodes * f.per_node, 1, 0.0
    for lv in f.levels:
        share = (inside * lv.members - inside) / n * s
        if share:
            wire = max(wire, share / lv.bytes_per_s)
        inside *= lv.members
    alpha = max(lv.alpha_s for lv in f.levels)
    return p.base_s + alpha * p.hop_factor + wire / p.efficiency


def _best(cands: dict[str, float]) -> tuple[str, float]:
    key = min(cands, key=cands.__getitem__)
    return key, cands[key]


def collective_time(hw: HardwareSpec, c: Collective) -> CollectiveTime:
    """Predicted seconds of ``c`` on ``hw``, the algorithm NCCL would pick (the fastest legal one), and the
    detail behind it (see the module docstring for every formula and unit)."""
    n, s = c.group_size, float(c.message_bytes)
    if n == 1:
        return CollectiveTime(0.0, "none", {"why": "a group of one device moves nothing"})
    f = _fabric(hw, c)
    cands: dict[str, float] = {}
    if c.kind in ("all_reduce", "all_gather", "reduce_scatter"):
        for p in PROTOCOLS:
            cands[f"ring/{p.name}"] = _ring(c.kind, s, f, p)
    if c.kind == "all_reduce":
        for p in PROTOCOLS:
            cands[f"tree/{p.name}"] = _tree(s, f, p)
        up = hw.interconnect.scale_up
        if f.nodes == 1 and up is not None and up.reduces_in_network and up.topology_name == "switch":
            rate = up.in_network_bytes_per_s or f.up_bytes_per_s
            cands["in_switch/Simple"] = IN_SWITCH_LATENCY_S + s / rate
        if f.nodes > 1 and f.per_node > 1:
            for p in PROTOCOLS:
                cands[f"hierarchical/{p.name}"] = _hierarchical(s, f, p)
    if c.kind == "all_to_all":
        for p in PROTOCOLS:
            cands[f"direct/{p.name}"] = _all_to_all(s, f, p)
    if c.kind == "send_recv":
        outer = f.levels[-1]
        link, alpha = outer.bytes_per_s, outer.alpha_s
        if f.nodes == 1 and hw.scale_up_topology == "full_mesh" and hw.devices_per_node:
            link /= hw.devices_per_node - 1  # a pair has one of the n - 1 direct links
        for p in PROTOCOLS:
            cands[f"direct/{p.name}"] = p.base_s + alpha * p.hop_factor + s / (link * p.efficiency)
    key, t = _best(cands)
    algorithm, protocol = key.split("/")
    measured = _measured(hw, c, f)
    if measured is not None:
        cands[f"model/{key}"] = t
        (t, algorithm, source), protocol = measured, "nccl-tests"  # the protocols NCCL chose while timed
    algbw = s / t
    detail = {
        "protocol": protocol, "nodes": f.nodes, "devices_per_node": f.per_node,
        "scale_up_bytes_per_s": f.up_bytes_per_s, "scale_out_bytes_per_s": f.out_bytes_per_s,
        "algbw_bytes_per_s": algbw, "busbw_bytes_per_s": algbw * bus_factor(c.kind, n),
        "candidates_s": dict(sorted(cands.items(), key=lambda kv: kv[1])),
        **({"measured_source": source} if measured is not None else {}),
    }
    return CollectiveTime(t, algorithm, detail)


def _measured(hw: HardwareSpec, c: Collective, f: _Fabric) -> tuple[float, str, str] | None:
    """Where ``hw`` has a grid holding ``c``'s kind at its GPU count and the group is inside one domain of the
    innermost tier (module docstring): the measured time, the algorithm's name and the source. None elsewhere (no
    grid, a count it lacks, across domains, a send / recv)."""
    name = hw.calibration.get("comm_grid")
    if not name or len(f.levels) != 1 or c.kind == "send_recv":
        return None
    grid = load_comm_grid(name)
    table = grid.table(c.kind, c.group_size)
    if table is None:
        return None
    return table.seconds(float(c.message_bytes)), "measured", f"{grid.name}: {grid.source}"


def collective_roofline(hw: HardwareSpec, c: Collective) -> Roofline:
    """The collective as a kernel of the one time model: its whole time is the interconnect term (bound
    ``interconnect``); the launch is inside the protocol's base latency, so no separate overhead."""
    return roofline(interconnect_s=collective_time(hw, c).seconds)
