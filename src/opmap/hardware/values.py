"""Catalog values: a number (or word) with its kind and source, the fields a device TOML may hold, the rule each
value must pass, and the readers of one value table.

The catalog is one TOML file per device under ``catalog/``. Each numeric field is a table::

    [memory_bandwidth_bytes_per_s]
    value = 3.35e12
    kind = "datasheet"
    source = "NVIDIA H100 datasheet (2023), SXM5: 3.35 TB/s HBM3"

Kinds (the README's "Hardware" section; every value carries its source and kind):

- ``datasheet_dense``  a dense (no structured sparsity) peak taken from the vendor datasheet, or the
  datasheet's sparse figure divided by the sparsity factor the datasheet's footnote gives (the source says so);
- ``datasheet_sparse`` a peak that counts 2:4 structured sparsity (never used by predictions);
- ``datasheet``        a non-rate datasheet figure (capacity, bandwidth, clock, power);
- ``derived``          computed from datasheet figures (for example cores x FLOPs per cycle x clock); the
  source gives the formula;
- ``measured``         measured on a real device (calibration or a cited measurement);
- ``assumed``          a typical value where no datasheet gives one (launch overhead); the source says why;
- ``estimate``         a figure reasoned from related published ones where the device has none of its own (an idle
  draw scaled from a sibling's measurement); the source gives the reasoning and the figures it starts from;
- ``assessed``         a judgement read off cited vendor or project pages (the software-stack risk); the source cites
  the pages and says what they show.

Dense peaks are what every prediction uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opmap.errors import OpmapError
from opmap.hardware.curves import MAX_BYTES_PER_S, MAX_FLOPS_PER_S, MIN_BYTES_PER_S, MIN_FLOPS_PER_S
from opmap.precision import FORMATS
from opmap.record import key
from opmap.validate import Rule, shown

KINDS = ("datasheet_dense", "datasheet_sparse", "datasheet", "derived", "measured", "assumed", "estimate", "assessed")

# Format names opmap uses everywhere (CLI, catalog keys, assumptions): the precision module's.
DTYPES = FORMATS
DEVICE_TYPES = ("gpu", "cpu", "tpu", "accelerator")
# the software stacks a device may name (``software_stack``): the sections of opmap/hardware/runtimes.toml
SOFTWARE_STACKS = ("cuda-graphs", "hip-graphs", "hpu-graphs", "xla", "cpu")


@dataclass(frozen=True)
class Value:
    """A number with provenance. ``value`` may be None where the vendor publishes nothing; a text field
    (``TEXT_FIELDS``: the scale-up topology) holds one of its accepted words instead."""

    value: float | str | None
    kind: str
    source: str
    note: str = field(default="", metadata=key(omit="empty"))


# Scalar fields of a spec, in display order, with their unit for rendering.
SCALAR_FIELDS: dict[str, str] = {
    "sparsity_factor": "x",
    "memory_bytes": "B",
    "memory_bandwidth_bytes_per_s": "B/s",
    # what a streaming kernel sustains from device memory (measured); absent: DRAM_EFFICIENCY of the datasheet
    "achievable_memory_bandwidth_bytes_per_s": "B/s",
    "l2_bytes": "B",
    "sram_per_unit_bytes": "B",
    "compute_units": "",
    "clock_hz": "Hz",
    "tdp_w": "W",
    # the board's (or a CPU package's) draw when powered, clocked down and doing nothing; below tdp_w
    "idle_power_w": "W",
    "scale_up_bandwidth_bytes_per_s": "B/s",
    "scale_out_bandwidth_bytes_per_s": "B/s",
    "launch_overhead_s": "s",
    "sram_bandwidth_bytes_per_clk": "B/clk",  # shared memory (LDS) bandwidth per compute unit per clock
    "mma_min_m": "",  # rows of the smallest matrix instruction (a tile's BM is at least this)
    "stream_k_gemm": "",  # 1 where the device's GEMM library schedules Stream-K (persistent tile schedulers)
    "sfu_ops_per_clk": "/clk",  # transcendental (exp2, log2, rsqrt, sin) results per clock per compute unit
    # busy time after which a power-limited card leaves its boost clocks for the sustained rates
    "power_window_s": "s",
    # collectives (mapping/collectives.py). A "node" is one scale-up domain: the devices its scale-up links join
    "devices_per_node": "",
    "scale_up_latency_s": "s",  # per-step (hop) latency of the scale-up path, lowest-latency protocol
    "scale_out_latency_s": "s",  # the same across nodes (NIC, network, remote GPU)
    "in_switch_reduction": "",  # 1 where the scale-up switch reduces in the network (NVLink SHARP), else 0
    "in_switch_bandwidth_bytes_per_s": "B/s",  # per-device rate of an in-switch all-reduce (bytes of S per s)
}
# Text fields: the accepted words of each. ``switch``: every device has its whole scale-up bandwidth to a
# switch (NVSwitch); ``full_mesh``: a direct link to each peer (xGMI, Gaudi RoCE), a pair gets one link's share;
# ``torus``: chip-to-chip links in a 2D / 3D torus (TPU ICI); ``pcie``: the host's PCIe lanes;
# ``bridge_pairs``: an NVLink bridge joins two cards, larger groups go over PCIe.
TEXT_FIELDS: dict[str, tuple[str, ...]] = {
    "scale_up_topology": ("switch", "full_mesh", "torus", "pcie", "bridge_pairs"),
    # how far the serving stack on this device is from the mainline path (explore/fit.py carries it into a cell):
    # ``low`` mainline vLLM / TensorRT-LLM-class support from the vendor and the project; ``medium`` mainline
    # support with gaps, or a vendor-maintained plugin; ``high`` an out-of-tree fork or plugin, or a stack that
    # serves LLMs only through a general framework
    "software_risk": ("low", "medium", "high"),
}
RISK_LEVELS = TEXT_FIELDS["software_risk"]
# The fraction of its datasheet bandwidth an HBM / GDDR device sustains on a streaming kernel, for devices without
# a measured figure of their own: DeepSeek's FlashMLA README (deepseek-ai/FlashMLA) reports "up to 3000 GB/s in
# memory-bound configuration" on an H800 SXM5, whose memory system is the H100 SXM's (80 GB HBM3, 3.35 TB/s).
DRAM_EFFICIENCY = 3000e9 / 3.35e12
DRAM_EFFICIENCY_SOURCE = "FlashMLA README: up to 3000 GB/s memory-bound on an H800 SXM5 of 3.35 TB/s, 0.896"
# The kinds an achievable figure (matrix rate, memory bandwidth) may carry: a published measurement, or a rate
# derived / estimated from one (a sibling part's measured fraction of its datasheet); the source says which.
ACHIEVABLE_KINDS = ("measured", "derived", "estimate")
# The achievable figures that price a device like for like; ``HardwareSpec.datasheet_only`` names those it lacks
ACHIEVABLE_FIGURES = ("achievable_matrix_flops_per_s", "achievable_memory_bandwidth_bytes_per_s")
REQUIRED_FIELDS = ("memory_bytes", "memory_bandwidth_bytes_per_s", "launch_overhead_s")
# What a field's value may be (opmap.validate.finite_number's keywords); a field not listed: RATE. Every value is
# finite (TOML spells nan and inf, and 1e400 reads as inf); zero or a negative means nothing for a rate, a size,
# a time or a power. Each is also plausible: a finite value far past any device (a peak of 1e308 FLOP/s, a launch
# of a year) is a typo that would price absurd figures without a word, so every field has a ceiling well above
# the largest real value of its kind, named beside it (rates: opmap.hardware.curves.MAX_FLOPS_PER_S and
# MAX_BYTES_PER_S, with their reasons).
RATE = Rule(lo=0, lo_open=True)
FLOPS = Rule(lo=MIN_FLOPS_PER_S, hi=MAX_FLOPS_PER_S, unit="FLOP/s")  # every peak, achievable, sustained rate
BANDWIDTH = Rule(lo=MIN_BYTES_PER_S, hi=MAX_BYTES_PER_S, unit="B/s")
# memory and caches: Cerebras MemoryX holds up to 1.2 PB for one CS-3, a CPU host tens of TB; 10 PB is past both
CAPACITY = RATE.but(hi=1e16, unit="B")
# launch, hop and network latencies are microseconds (the catalog's: 0.6 to 5 us); a second is a hang, not a latency
LATENCY = RATE.but(hi=1.0, unit="s")
# a device's draw: a GB300 GPU about 1.4 kW, a Cerebras CS-3 system 23 kW; a megawatt is no one device
POWER = RATE.but(hi=1e6, unit="W")
# per compute unit per clock (shared memory bytes, transcendental results): 128 and 16 in the catalog
PER_CLOCK = RATE.but(hi=1e6)
FIELD_RULES: dict[str, Rule] = {
    "sparsity_factor": Rule(lo=1, hi=16),  # sparse over dense: 2 for 2:4 (the only structured sparsity sold)
    "memory_bytes": CAPACITY,
    "memory_bandwidth_bytes_per_s": BANDWIDTH,
    "achievable_memory_bandwidth_bytes_per_s": BANDWIDTH,
    "l2_bytes": CAPACITY,
    "sram_per_unit_bytes": CAPACITY,
    "compute_units": Rule(lo=1, hi=10**7, integer=True),  # Cerebras WSE-3: 900,000 cores on a wafer
    "clock_hz": Rule(lo=1e6, hi=1e11, unit="Hz"),  # shipping clocks: 0.5 to 6.2 GHz
    "tdp_w": POWER,
    "idle_power_w": POWER,
    "scale_up_bandwidth_bytes_per_s": BANDWIDTH,
    "scale_out_bandwidth_bytes_per_s": BANDWIDTH,
    "in_switch_bandwidth_bytes_per_s": BANDWIDTH,
    "launch_overhead_s": LATENCY,
    "scale_up_latency_s": LATENCY,
    "scale_out_latency_s": LATENCY,
    "sram_bandwidth_bytes_per_clk": PER_CLOCK,
    "sfu_ops_per_clk": PER_CLOCK,
    "power_window_s": RATE.but(hi=3600.0, unit="s"),  # boost to sustained: 0.03 s on the L4; an hour at most
    "mma_min_m": Rule(lo=1, hi=4096, integer=True),  # 64 rows (Hopper wgmma)
    "devices_per_node": Rule(lo=1, hi=10**6, integer=True),  # a TPU v5p pod: 8,960 chips on one torus
    "stream_k_gemm": Rule(lo=0, hi=1, integer=True),  # a flag: 0 or 1
    "in_switch_reduction": Rule(lo=0, hi=1, integer=True),
}
# Fields whose table may leave ``value`` out (TOML has no null): the source then says why there is no figure
EMPTY_ALLOWED = ("idle_power_w",)


def read_value(raw: Any, where: str, rule: Rule = RATE) -> Value:
    """One ``{value, kind, source[, note]}`` table; ``value`` checked by ``rule`` (finite, in range)."""
    if not isinstance(raw, dict):
        raise OpmapError(f"{where}: expected a table with value, kind and source, got {shown(raw)}")
    missing = [k for k in ("value", "kind", "source") if k not in raw]
    if missing:
        raise OpmapError(f"{where}: missing {', '.join(missing)} (every value needs value, kind and source)")
    kind = raw["kind"]
    if not isinstance(kind, str) or kind not in KINDS:
        raise OpmapError(f"{where}: kind {shown(kind)} is not one of {', '.join(KINDS)}")
    val = raw["value"]
    if val is not None:
        val = rule.check(val, f"{where}.value")
    if not isinstance(raw["source"], str) or not raw["source"].strip():
        raise OpmapError(f"{where}: source must be a non-empty string (got {shown(raw['source'])})")
    return Value(None if val is None else float(val), kind, raw["source"], str(raw.get("note", "")))


def read_text_value(raw: Any, where: str, accepted: tuple[str, ...]) -> Value:
    if not isinstance(raw, dict) or "value" not in raw:
        raise OpmapError(f"{where}: expected a table with value, kind and source, got {shown(raw)}")
    if not isinstance(raw["value"], str) or raw["value"] not in accepted:
        raise OpmapError(f"{where}: value {shown(raw['value'])} is not one of {', '.join(accepted)}")
    v = read_value({**raw, "value": None}, where, Rule())
    return Value(str(raw["value"]), v.kind, v.source, v.note)


def read_peaks(raw: Any, where: str) -> dict[str, Value]:
    if not isinstance(raw, dict):
        raise OpmapError(f"{where}: expected a table of dtype = {{value, kind, source}} (got {shown(raw)})")
    out = {}
    for dtype, v in raw.items():
        if dtype not in DTYPES:
            raise OpmapError(f"{where}: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        out[dtype] = read_value(v, f"{where}.{dtype}", FLOPS)
    return out
