"""The interconnect as ordered tiers: each a domain of devices (NVLink inside an HGX board, an NVL72 rack, the
scale-out network), with its per-device bandwidth, hop latency, topology and whether its switches reduce in the
network. mapping/collectives.py walks them: a group uses the innermost tier whose domain holds it.

A device TOML lists its tiers innermost first::

    [[interconnect.tier]]
    name = "nvlink"
    bandwidth_directions = 2     # the bandwidth figure counts both directions (NVLink's 900 GB/s); default 1
    [interconnect.tier.size]     # devices in one domain of this tier
    value = 8
    kind = "datasheet"
    source = "..."
    [interconnect.tier.bandwidth_bytes_per_s]   # per device
    ...
    [interconnect.tier.latency_s]               # per hop, NCCL's LL protocol
    ...
    [interconnect.tier.topology]                # one of TOPOLOGIES
    ...
    [interconnect.tier.in_network_reduction]    # 1: the switch reduces (NVLink SHARP, NVSwitch 3 and later)
    ...
    [interconnect.tier.in_network_bandwidth_bytes_per_s]   # S / t of an in-switch all-reduce
    ...

    [[interconnect.tier]]
    name = "infiniband"
    size = "any"                 # the scale-out network: any number of domains
    ...

The older flat form (``devices_per_node``, ``scale_up_*``, ``scale_out_*``, ``in_switch_*``: a scale-up tier
and a scale-out one) is still read, for device files written before the tiers; ``legacy_fields`` gives a tiered
device's flat fields back (``opmap hardware show`` and the JSON keep listing them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opmap.errors import OpmapError
from opmap.hardware.values import FIELD_RULES, RATE, TEXT_FIELDS, Value, read_text_value, read_value
from opmap.validate import shown

ANY = "any"
# ``switch``: every device has its whole tier bandwidth to a switch (NVSwitch); ``full_mesh``: a direct link to
# each peer (xGMI, Gaudi RoCE), a pair gets one link's share; ``torus``: chip-to-chip links in a 2D / 3D torus (TPU
# ICI); ``pcie``: the host's PCIe lanes; ``bridge_pairs``: an NVLink bridge joins two cards
TOPOLOGIES = TEXT_FIELDS["scale_up_topology"]
# the flat fields of the older form: the scale-up tier's, then the scale-out tier's
SCALE_UP_KEYS = {"size": "devices_per_node", "bandwidth": "scale_up_bandwidth_bytes_per_s",
                 "latency": "scale_up_latency_s", "topology": "scale_up_topology",
                 "in_network_reduction": "in_switch_reduction",
                 "in_network_bandwidth": "in_switch_bandwidth_bytes_per_s"}
SCALE_OUT_KEYS = {"bandwidth": "scale_out_bandwidth_bytes_per_s", "latency": "scale_out_latency_s"}
LEGACY_KEYS = (*SCALE_UP_KEYS.values(), *SCALE_OUT_KEYS.values())
TIER_KEYS = ("name", "size", "bandwidth_directions", "bandwidth_bytes_per_s", "latency_s", "topology",
             "in_network_reduction", "in_network_bandwidth_bytes_per_s")


@dataclass(frozen=True)
class Tier:
    """One tier. ``size``: the catalog's devices per domain (None: any number, the scale-out network; a tier of the
    flat form without ``devices_per_node``: ``size_known`` False); Values keep their kind and source."""

    name: str
    size: Value | None = None
    bandwidth: Value | None = None
    directions: int = 1  # 2 where ``bandwidth`` counts both directions
    latency: Value | None = None
    topology: Value | None = None
    in_network_reduction: Value | None = None
    in_network_bandwidth: Value | None = None
    any_size: bool = False

    @property
    def devices(self) -> int | None:
        """Devices in one domain; None for the scale-out tier (any number) or where the catalog gives none."""
        return None if self.size is None or self.size.value is None else int(self.size.value)

    @property
    def bytes_per_s(self) -> float | None:
        """Per device, per direction."""
        v = None if self.bandwidth is None else self.bandwidth.value
        return None if not v else float(v) / self.directions

    @property
    def latency_s(self) -> float | None:
        return None if self.latency is None or self.latency.value is None else float(self.latency.value)

    @property
    def topology_name(self) -> str | None:
        return None if self.topology is None or self.topology.value is None else str(self.topology.value)

    @property
    def reduces_in_network(self) -> bool:
        return bool(self.in_network_reduction is not None and self.in_network_reduction.value)

    @property
    def in_network_bytes_per_s(self) -> float | None:
        v = None if self.in_network_bandwidth is None else self.in_network_bandwidth.value
        return None if not v else float(v)


@dataclass(frozen=True)
class Interconnect:
    """A device's tiers, innermost first (empty: the catalog gives no interconnect)."""

    tiers: tuple[Tier, ...] = ()

    @property
    def scale_up(self) -> Tier | None:
        """The innermost tier with a bounded domain (an HGX board's NVLink), None if there is none."""
        return self.tiers[0] if self.tiers and not self.tiers[0].any_size else None

    @property
    def scale_out(self) -> Tier | None:
        """The outermost tier when it joins any number of domains (the NICs), None if there is none."""
        return self.tiers[-1] if self.tiers and self.tiers[-1].any_size else None

    @property
    def domain_size(self) -> int | None:
        """Devices in one scale-up domain (the innermost tier's), None where the catalog gives none."""
        return None if self.scale_up is None else self.scale_up.devices

    @property
    def bounded(self) -> tuple[Tier, ...]:
        """The tiers with a known domain size, innermost first (every tier but the scale-out network)."""
        return tuple(t for t in self.tiers if t.devices is not None)

    @property
    def fabric_size(self) -> int | None:
        """Devices one scale-up fabric joins: the outermost bounded tier's domain (an HGX board 8, an NVL72 rack 72,
        a Trn2 UltraServer 64, a TPU pod's ICI torus); a replica's TP x PP x EP group is placed inside it. None
        where the catalog gives no bounded tier."""
        return self.bounded[-1].devices if self.bounded else None

    def legacy_fields(self) -> dict[str, Value]:
        """The flat fields of the older form: the innermost tier as scale-up, the scale-out tier as scale-out."""
        out: dict[str, Value] = {}
        for tier, keys in ((self.scale_up, SCALE_UP_KEYS), (self.scale_out, SCALE_OUT_KEYS)):
            for attr, key in keys.items():
                if tier is not None and (v := getattr(tier, attr)) is not None:
                    out[key] = v
        return out


def from_legacy(fields: dict[str, Value]) -> Interconnect:
    """The tiers the flat form describes: a scale-up tier where any of its fields is given, a scale-out one
    where its bandwidth or latency is."""
    tiers = []
    up = {attr: fields.get(key) for attr, key in SCALE_UP_KEYS.items()}
    if any(v is not None for v in up.values()):
        tiers.append(Tier("scale_up", directions=2, **up))
    out = {attr: fields.get(key) for attr, key in SCALE_OUT_KEYS.items()}
    if any(v is not None for v in out.values()):
        tiers.append(Tier("scale_out", any_size=True, **out))
    return Interconnect(tuple(tiers))


def _read_tier(raw: Any, where: str, last: bool) -> Tier:
    if not isinstance(raw, dict):
        raise OpmapError(f"{where}: expected a table (name, size, bandwidth_bytes_per_s, ...), got {shown(raw)}")
    unknown = set(raw) - set(TIER_KEYS)
    if unknown:
        raise OpmapError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (accepted: {', '.join(TIER_KEYS)})")
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise OpmapError(f"{where}: name must be a non-empty string (got {shown(name)})")
    size, any_size = raw.get("size"), False
    if size == ANY:
        if not last:
            raise OpmapError(f"{where}: size 'any' (the scale-out network) is for the outermost tier only")
        size, any_size = None, True
    elif size is not None:
        size = read_value(size, f"{where}.size", FIELD_RULES["devices_per_node"])
    directions = raw.get("bandwidth_directions", 1)
    if directions not in (1, 2) or isinstance(directions, bool):
        raise OpmapError(f"{where}: bandwidth_directions must be 1 or 2 (got {shown(directions)})")

    def val(key: str, legacy: str) -> Value | None:
        return None if key not in raw else read_value(raw[key], f"{where}.{key}", FIELD_RULES.get(legacy, RATE))

    topology = raw.get("topology")
    return Tier(
        name=name, size=size, directions=int(directions), any_size=any_size,
        bandwidth=val("bandwidth_bytes_per_s", "scale_up_bandwidth_bytes_per_s"),
        latency=val("latency_s", "scale_up_latency_s"),
        topology=None if topology is None else read_text_value(topology, f"{where}.topology", TOPOLOGIES),
        in_network_reduction=val("in_network_reduction", "in_switch_reduction"),
        in_network_bandwidth=val("in_network_bandwidth_bytes_per_s", "in_switch_bandwidth_bytes_per_s"),
    )


def read_interconnect(raw: Any, origin: str) -> Interconnect:
    """``[[interconnect.tier]]`` tables, innermost first: domain sizes growing, only the last one of size any."""
    where = f"{origin}: interconnect"
    if not isinstance(raw, dict) or set(raw) != {"tier"} or not isinstance(raw["tier"], list) or not raw["tier"]:
        raise OpmapError(f"{where}: expected one or more [[interconnect.tier]] tables, innermost first")
    n = len(raw["tier"])
    tiers = tuple(_read_tier(t, f"{where}.tier[{i}]", i == n - 1) for i, t in enumerate(raw["tier"]))
    sizes = [t.devices for t in tiers if t.devices is not None]
    if any(b <= a or b % a for a, b in zip(sizes, sizes[1:])):
        raise OpmapError(f"{where}: each tier's size must be a larger multiple of the one inside it (got "
                         f"{', '.join(map(str, sizes))})")
    return Interconnect(tiers)
