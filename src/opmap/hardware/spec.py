"""HardwareSpec: one device's ceilings, every value carrying its source and kind.

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

import tomllib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from opmap.errors import OpmapError
from opmap.hardware.curves import (
    MAX_BYTES_PER_S,
    MAX_FLOPS_PER_S,
    MIN_BYTES_PER_S,
    MIN_FLOPS_PER_S,
    Curves,
    check_calibration,
)
from opmap.hardware.local import cache_path
from opmap.precision import FORMATS
from opmap.safeio import LIMIT_TOML_BYTES, read_bounded
from opmap.validate import finite_number, shown

KINDS = ("datasheet_dense", "datasheet_sparse", "datasheet", "derived", "measured", "assumed", "estimate", "assessed")

# Format names opmap uses everywhere (CLI, catalog keys, assumptions): the precision module's.
DTYPES = FORMATS
DEVICE_TYPES = ("gpu", "cpu", "tpu", "accelerator")


@dataclass(frozen=True)
class Value:
    """A number with provenance. ``value`` may be None where the vendor publishes nothing; a text field
    (``TEXT_FIELDS``: the scale-up topology) holds one of its accepted words instead."""

    value: float | str | None
    kind: str
    source: str
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"value": self.value, "kind": self.kind, "source": self.source}
        if self.note:
            d["note"] = self.note
        return d


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
RATE = {"lo": 0, "lo_open": True}
FLOPS = {"lo": MIN_FLOPS_PER_S, "hi": MAX_FLOPS_PER_S, "unit": "FLOP/s"}  # every peak, achievable, sustained rate
BANDWIDTH = {"lo": MIN_BYTES_PER_S, "hi": MAX_BYTES_PER_S, "unit": "B/s"}
# memory and caches: Cerebras MemoryX holds up to 1.2 PB for one CS-3, a CPU host tens of TB; 10 PB is past both
CAPACITY = {**RATE, "hi": 1e16, "unit": "B"}
# launch, hop and network latencies are microseconds (the catalog's: 0.6 to 5 us); a second is a hang, not a latency
LATENCY = {**RATE, "hi": 1.0, "unit": "s"}
# a device's draw: a GB300 GPU about 1.4 kW, a Cerebras CS-3 system 23 kW; a megawatt is no one device
POWER = {**RATE, "hi": 1e6, "unit": "W"}
# per compute unit per clock (shared memory bytes, transcendental results): 128 and 16 in the catalog
PER_CLOCK = {**RATE, "hi": 1e6}
FIELD_RULES: dict[str, dict[str, Any]] = {
    "sparsity_factor": {"lo": 1, "hi": 16},  # sparse over dense: 2 for 2:4 (the only structured sparsity sold)
    "memory_bytes": CAPACITY,
    "memory_bandwidth_bytes_per_s": BANDWIDTH,
    "achievable_memory_bandwidth_bytes_per_s": BANDWIDTH,
    "l2_bytes": CAPACITY,
    "sram_per_unit_bytes": CAPACITY,
    "compute_units": {"lo": 1, "hi": 10**7, "integer": True},  # Cerebras WSE-3: 900,000 cores on a wafer
    "clock_hz": {"lo": 1e6, "hi": 1e11, "unit": "Hz"},  # shipping clocks: 0.5 to 6.2 GHz
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
    "power_window_s": {**RATE, "hi": 3600.0, "unit": "s"},  # boost to sustained: 0.03 s on the L4; an hour at most
    "mma_min_m": {"lo": 1, "hi": 4096, "integer": True},  # 64 rows (Hopper wgmma)
    "devices_per_node": {"lo": 1, "hi": 10**6, "integer": True},  # a TPU v5p pod: 8,960 chips on one torus
    "stream_k_gemm": {"lo": 0, "hi": 1, "integer": True},  # a flag: 0 or 1
    "in_switch_reduction": {"lo": 0, "hi": 1, "integer": True},
}
# Fields whose table may leave ``value`` out (TOML has no null): the source then says why there is no figure
EMPTY_ALLOWED = ("idle_power_w",)


@dataclass(frozen=True)
class HardwareSpec:
    """One device. Peaks are per dtype; ``matrix_peak`` is the matrix engine (tensor core, MXU, MME, AMX),
    ``vector_peak`` the vector / CUDA-core / TPC rate used for pointwise and reduction work."""

    name: str
    display_name: str
    vendor: str
    device_type: str  # gpu | cpu | tpu | accelerator
    matrix_peak_flops_per_s: dict[str, Value]
    vector_peak_flops_per_s: dict[str, Value]
    fields: dict[str, Value]
    sparse_matrix_peak_flops_per_s: dict[str, Value] = field(default_factory=dict)
    # what the matrix engine sustains under a long GEMM (clock and power limits), measured and published;
    # the time model runs at it, MFU keeps the dense peak as its denominator
    achievable_matrix_flops_per_s: dict[str, Value] = field(default_factory=dict)
    # what a power-limited card (L4, PCIe parts) sustains once a run has been busy past ``power_window_s``:
    # its power limit, not its boost clock, then sets the rate (measured on long runs of large GEMMs)
    sustained_matrix_flops_per_s: dict[str, Value] = field(default_factory=dict)
    compute_unit_name: str = "compute unit"
    notes: str = ""
    calibration: dict[str, Any] = field(default_factory=dict)  # raw curves of a measured profile

    # -- accessors: typed, one per field (``fields`` keeps each value's kind and source) ------------------
    def _opt(self, key: str) -> float | None:
        v = self.fields.get(key)
        return None if v is None or v.value is None else float(v.value)

    # required fields (the loader refuses a spec without them)
    @property
    def memory_bandwidth_bytes_per_s(self) -> float:
        return float(self.fields["memory_bandwidth_bytes_per_s"].value)

    @property
    def memory_rate_bytes_per_s(self) -> float:
        """The bandwidth the time model streams device memory at: a measured achievable figure where the catalog
        has one; on an accelerator without one, DRAM_EFFICIENCY of the datasheet pin rate (refresh, bank and
        read/write turnaround keep every DRAM below it); on a CPU the datasheet figure (its measured curves take
        over once calibrated)."""
        v = self._opt("achievable_memory_bandwidth_bytes_per_s")
        if v is not None:
            return v
        if self.device_type == "cpu":
            return self.memory_bandwidth_bytes_per_s
        return self.memory_bandwidth_bytes_per_s * DRAM_EFFICIENCY

    @property
    def datasheet_only(self) -> tuple[str, ...]:
        """The achievable figures this device lacks (names from ``ACHIEVABLE_FIGURES``), so that the time model
        runs it on datasheet figures: no achievable matrix rate at all (every format then runs at its dense
        peak; one measured format is enough, its fraction of peak scales the others, ``precision.matrix_rate``),
        and no achievable memory bandwidth (the model then streams at DRAM_EFFICIENCY of the datasheet pin rate,
        a CPU at its datasheet rate). Empty when the device is priced like for like with the rest of the
        catalog; fit marks a cell "datasheet only" and ranks it apart otherwise."""
        missing = []
        if not any(v.value for v in self.achievable_matrix_flops_per_s.values()):
            missing.append("achievable_matrix_flops_per_s")
        if self._opt("achievable_memory_bandwidth_bytes_per_s") is None:
            missing.append("achievable_memory_bandwidth_bytes_per_s")
        return tuple(missing)

    @property
    def memory_rate_basis(self) -> str:
        if self._opt("achievable_memory_bandwidth_bytes_per_s") is not None:
            return self.fields["achievable_memory_bandwidth_bytes_per_s"].source
        if self.device_type == "cpu":
            return "datasheet memory bandwidth"
        return f"datasheet memory bandwidth x {DRAM_EFFICIENCY:.3f} ({DRAM_EFFICIENCY_SOURCE})"

    @property
    def launch_overhead_s(self) -> float:
        return float(self.fields["launch_overhead_s"].value)

    @property
    def memory_bytes(self) -> float:
        return float(self.fields["memory_bytes"].value)

    # optional fields: None where the vendor publishes nothing
    @property
    def transcendental_ops_per_s(self) -> float | None:
        """Special-function-unit rate (exp, log, rsqrt per second) where the catalog lists it per compute unit."""
        per_clk, units, clock = self._opt("sfu_ops_per_clk"), self._opt("compute_units"), self._opt("clock_hz")
        return per_clk * units * clock if per_clk and units and clock else None

    @property
    def stream_k_gemm(self) -> bool:
        """Whether the device's GEMM library deals K iterations evenly to the units (Stream-K) for a partial wave."""
        return bool(self._opt("stream_k_gemm"))

    @property
    def power_window_s(self) -> float | None:
        """Busy time after which a power-limited card runs at its sustained, not its boost, matrix rates."""
        return self._opt("power_window_s")

    @property
    def sram_per_unit_bytes(self) -> float | None:
        """Shared memory (GPU) or per-core L2 (CPU) per compute unit."""
        return self._opt("sram_per_unit_bytes")

    @property
    def compute_units(self) -> int | None:
        v = self._opt("compute_units")
        return None if v is None else int(v)

    @property
    def l2_bytes(self) -> float | None:
        """The last on-chip cache before device memory (a CPU's LLC)."""
        return self._opt("l2_bytes")

    @property
    def sparsity_factor(self) -> float | None:
        """The datasheet's sparse-over-dense factor (2 for 2:4 structured sparsity)."""
        return self._opt("sparsity_factor")

    @property
    def clock_hz(self) -> float | None:
        return self._opt("clock_hz")

    @property
    def sram_bytes_per_s(self) -> float | None:
        """Shared-memory bandwidth per compute unit (bytes per clock x clock); None where either is unknown."""
        per_clk, clock = self._opt("sram_bandwidth_bytes_per_clk"), self.clock_hz
        return per_clk * clock if per_clk and clock else None

    @property
    def mma_min_m(self) -> int:
        """Rows of the smallest matrix instruction: 64 for warpgroup MMA (Hopper, Blackwell), else 16."""
        v = self._opt("mma_min_m")
        return int(v) if v else 16

    @property
    def tdp_w(self) -> float | None:
        return self._opt("tdp_w")

    @property
    def idle_power_w(self) -> float | None:
        """The draw of the powered, idle device (W); None where the catalog gives no figure."""
        return self._opt("idle_power_w")

    @property
    def software_risk(self) -> str | None:
        """One of ``RISK_LEVELS``; None where the catalog does not say."""
        v = self.fields.get("software_risk")
        return None if v is None or v.value is None else str(v.value)

    @property
    def scale_up_bandwidth_bytes_per_s(self) -> float | None:
        return self._opt("scale_up_bandwidth_bytes_per_s")

    @property
    def scale_out_bandwidth_bytes_per_s(self) -> float | None:
        return self._opt("scale_out_bandwidth_bytes_per_s")

    @property
    def devices_per_node(self) -> int | None:
        """Devices in one scale-up domain (a DGX / HGX board, a TPU pod's ICI domain)."""
        v = self._opt("devices_per_node")
        return None if v is None else int(v)

    @property
    def scale_up_topology(self) -> str | None:
        """One of ``TEXT_FIELDS["scale_up_topology"]``; None where the catalog does not say."""
        v = self.fields.get("scale_up_topology")
        return None if v is None or v.value is None else str(v.value)

    @property
    def scale_up_latency_s(self) -> float | None:
        return self._opt("scale_up_latency_s")

    @property
    def scale_out_latency_s(self) -> float | None:
        return self._opt("scale_out_latency_s")

    @property
    def in_switch_reduction(self) -> bool:
        """The scale-up switch reduces in the network (NVLink SHARP on NVSwitch 3 and later)."""
        return bool(self._opt("in_switch_reduction"))

    @property
    def in_switch_bandwidth_bytes_per_s(self) -> float | None:
        return self._opt("in_switch_bandwidth_bytes_per_s")

    @cached_property
    def curves(self) -> Curves:
        """The measured efficiency curves of a calibrated profile (empty for a catalog device), built once."""
        return Curves.from_calibration(self.calibration, self.launch_overhead_s)

    @property
    def tiled(self) -> bool:
        """A GPU-like device whose GEMMs get a tile search: it lists shared memory and compute units."""
        return self.device_type != "cpu" and bool(self.sram_per_unit_bytes) and bool(self.compute_units)

    @property
    def cache_blocked(self) -> bool:
        """A CPU whose GEMMs get cache blocking: it lists its per-core L2 and its cores."""
        return self.device_type == "cpu" and bool(self.sram_per_unit_bytes) and bool(self.compute_units)

    def matrix_dtypes(self) -> list[str]:
        return [d for d in DTYPES if (v := self.matrix_peak_flops_per_s.get(d)) and v.value]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "display_name": self.display_name,
            "vendor": self.vendor,
            "device_type": self.device_type,
            "compute_unit_name": self.compute_unit_name,
            "matrix_peak_flops_per_s": {k: v.to_dict() for k, v in self.matrix_peak_flops_per_s.items()},
            "sparse_matrix_peak_flops_per_s": {
                k: v.to_dict() for k, v in self.sparse_matrix_peak_flops_per_s.items()
            },
            "achievable_matrix_flops_per_s": {
                k: v.to_dict() for k, v in self.achievable_matrix_flops_per_s.items()
            },
            "sustained_matrix_flops_per_s": {
                k: v.to_dict() for k, v in self.sustained_matrix_flops_per_s.items()
            },
            "vector_peak_flops_per_s": {k: v.to_dict() for k, v in self.vector_peak_flops_per_s.items()},
            **{k: v.to_dict() for k, v in self.fields.items()},
            "notes": self.notes,
        }


def _value(raw: Any, where: str, rule: dict[str, Any] = RATE) -> Value:
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
        val = finite_number(val, f"{where}.value", **rule)
    if not isinstance(raw["source"], str) or not raw["source"].strip():
        raise OpmapError(f"{where}: source must be a non-empty string (got {shown(raw['source'])})")
    return Value(None if val is None else float(val), kind, raw["source"], str(raw.get("note", "")))


def _text_value(raw: Any, where: str, accepted: tuple[str, ...]) -> Value:
    if not isinstance(raw, dict) or "value" not in raw:
        raise OpmapError(f"{where}: expected a table with value, kind and source, got {shown(raw)}")
    if not isinstance(raw["value"], str) or raw["value"] not in accepted:
        raise OpmapError(f"{where}: value {shown(raw['value'])} is not one of {', '.join(accepted)}")
    v = _value({**raw, "value": None}, where, {})
    return Value(str(raw["value"]), v.kind, v.source, v.note)


def _peaks(raw: Any, where: str) -> dict[str, Value]:
    if not isinstance(raw, dict):
        raise OpmapError(f"{where}: expected a table of dtype = {{value, kind, source}} (got {shown(raw)})")
    out = {}
    for dtype, v in raw.items():
        if dtype not in DTYPES:
            raise OpmapError(f"{where}: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        out[dtype] = _value(v, f"{where}.{dtype}", FLOPS)
    return out


def spec_from_dict(raw: dict[str, Any], origin: str) -> HardwareSpec:
    """Build and validate a spec from parsed TOML. ``origin`` names the file in error messages."""
    for key in ("name", "display_name", "vendor", "device_type", "matrix_peak_flops_per_s",
                "vector_peak_flops_per_s"):
        if key not in raw:
            raise OpmapError(f"{origin}: missing {key!r}")
    for key in ("name", "display_name", "vendor", "compute_unit_name", "notes"):
        if key in raw and not isinstance(raw[key], str):
            raise OpmapError(f"{origin}: {key} must be a string (got {shown(raw[key])})")
    if raw["device_type"] not in DEVICE_TYPES:
        raise OpmapError(f"{origin}: device_type {shown(raw['device_type'])} is not one of {', '.join(DEVICE_TYPES)}")
    if not isinstance(raw.get("calibration", {}), dict):
        raise OpmapError(f"{origin}: calibration must be a table (got {shown(raw['calibration'])})")
    check_calibration(raw.get("calibration", {}), f"{origin}: calibration")
    fields = {}
    for key in SCALAR_FIELDS:
        if key in raw:
            r = raw[key]
            if key in EMPTY_ALLOWED and isinstance(r, dict) and "value" not in r:
                r = {**r, "value": None}
            fields[key] = _value(r, f"{origin}: {key}", FIELD_RULES.get(key, RATE))
    for key, accepted in TEXT_FIELDS.items():
        if key in raw:
            fields[key] = _text_value(raw[key], f"{origin}: {key}", accepted)
    for key in REQUIRED_FIELDS:
        if key not in fields or fields[key].value is None:
            raise OpmapError(f"{origin}: {key} needs a value")
    unknown = set(raw) - set(SCALAR_FIELDS) - set(TEXT_FIELDS) - {
        "name", "display_name", "vendor", "device_type", "matrix_peak_flops_per_s",
        "vector_peak_flops_per_s", "sparse_matrix_peak_flops_per_s", "achievable_matrix_flops_per_s",
        "sustained_matrix_flops_per_s", "compute_unit_name", "notes", "calibration"}
    if unknown:
        raise OpmapError(f"{origin}: unknown field(s) {', '.join(sorted(unknown))}")
    spec = HardwareSpec(
        name=str(raw["name"]),
        display_name=str(raw["display_name"]),
        vendor=str(raw["vendor"]),
        device_type=str(raw["device_type"]),
        matrix_peak_flops_per_s=_peaks(raw["matrix_peak_flops_per_s"], f"{origin}: matrix_peak_flops_per_s"),
        vector_peak_flops_per_s=_peaks(raw["vector_peak_flops_per_s"], f"{origin}: vector_peak_flops_per_s"),
        sparse_matrix_peak_flops_per_s=_peaks(
            raw.get("sparse_matrix_peak_flops_per_s", {}), f"{origin}: sparse_matrix_peak_flops_per_s"),
        achievable_matrix_flops_per_s=_peaks(
            raw.get("achievable_matrix_flops_per_s", {}), f"{origin}: achievable_matrix_flops_per_s"),
        sustained_matrix_flops_per_s=_peaks(
            raw.get("sustained_matrix_flops_per_s", {}), f"{origin}: sustained_matrix_flops_per_s"),
        fields=fields,
        compute_unit_name=str(raw.get("compute_unit_name", "compute unit")),
        notes=str(raw.get("notes", "")),
        calibration=dict(raw.get("calibration", {})),
    )
    for d, v in spec.matrix_peak_flops_per_s.items():
        if v.kind == "datasheet_sparse":
            raise OpmapError(f"{origin}: matrix_peak_flops_per_s.{d} is sparse; dense peaks only there "
                             "(sparse figures go under sparse_matrix_peak_flops_per_s)")
    for table in ("achievable_matrix_flops_per_s", "sustained_matrix_flops_per_s"):
        accepted = ACHIEVABLE_KINDS if table == "achievable_matrix_flops_per_s" else ("measured", "derived")
        for d, v in getattr(spec, table).items():
            peak = spec.matrix_peak_flops_per_s.get(d)
            if v.kind not in accepted:
                raise OpmapError(f"{origin}: {table}.{d} must be kind {' or '.join(accepted)} (a rate someone "
                                 f"measured, or one derived from such a rate), got {v.kind}")
            if peak is None or peak.value is None or v.value is None or v.value > peak.value:
                raise OpmapError(f"{origin}: {table}.{d} needs a value at or below the dense peak "
                                 f"({None if peak is None else peak.value})")
    bw = spec.fields.get("achievable_memory_bandwidth_bytes_per_s")
    if bw is not None:
        if bw.kind not in ACHIEVABLE_KINDS:
            raise OpmapError(f"{origin}: achievable_memory_bandwidth_bytes_per_s must be kind "
                             f"{' or '.join(ACHIEVABLE_KINDS)}, got {bw.kind}")
        if bw.value is not None and bw.value > spec.memory_bandwidth_bytes_per_s:
            raise OpmapError(f"{origin}: achievable_memory_bandwidth_bytes_per_s {bw.value:g} B/s is above the "
                             f"datasheet memory_bandwidth_bytes_per_s {spec.memory_bandwidth_bytes_per_s:g} B/s")
    if spec.sustained_matrix_flops_per_s and spec.power_window_s is None:
        raise OpmapError(f"{origin}: sustained_matrix_flops_per_s needs power_window_s (the busy time after "
                         "which the sustained rates hold)")
    idle, tdp = spec.idle_power_w, spec.tdp_w
    if idle is not None and tdp is not None and not idle < tdp:
        raise OpmapError(f"{origin}: idle_power_w {idle:g} W must be below tdp_w {tdp:g} W")
    if not spec.vector_peak_flops_per_s.get("fp32") or spec.vector_peak_flops_per_s["fp32"].value is None:
        raise OpmapError(f"{origin}: vector_peak_flops_per_s.fp32 needs a value")
    return spec


CATALOG_DIR = Path(__file__).with_name("catalog")


def parse_spec_toml(text: str | bytes, origin: str = "hardware TOML") -> HardwareSpec:
    """A spec from the text of a hardware TOML file (no file read, nothing written); OpmapError on bad input.
    ``origin`` names the source in error messages."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise OpmapError(f"cannot read hardware file {origin}: not UTF-8 text (byte {e.start}); "
                             "expected a TOML file") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise OpmapError(f"cannot read hardware file {origin}: {' '.join(str(e).split())}") from None
    except RecursionError:  # tomllib parses arrays and inline tables recursively: ~500 levels exhaust the stack
        raise OpmapError(f"cannot read hardware file {origin}: arrays or tables nested too deep; expected a TOML "
                         "file like the catalog's (tables of value, kind, source)") from None
    return spec_from_dict(raw, origin)


def load_spec_file(path: Path, follow_links: bool = False) -> HardwareSpec:
    """The spec in the TOML file ``path``: a regular file of at most LIMIT_TOML_BYTES (opmap.safeio), a link at
    ``path`` followed only where ``follow_links`` (a path the user typed), never for a profile in the cache."""
    return parse_spec_toml(read_bounded(path, LIMIT_TOML_BYTES, "hardware file", follow_links), str(path))


# the catalog as last parsed, by its files' (path, mtime, size): parsing 16 TOML files took ~0.3 s a call on a quiet
# 2-core host, and a fit cell looks its device up a dozen times
_CATALOG: dict[tuple, dict[str, HardwareSpec]] = {}


def catalog() -> dict[str, HardwareSpec]:
    """All catalog devices by name (parsed again only when a catalog file changes)."""
    paths = sorted(CATALOG_DIR.glob("*.toml"))
    stamp = tuple((str(p), st.st_mtime_ns, st.st_size) for p in paths for st in [p.stat()])
    if stamp in _CATALOG:
        return dict(_CATALOG[stamp])
    specs = {}
    for path in paths:
        spec = load_spec_file(path)
        if spec.name != path.stem:
            raise OpmapError(f"{path}: name {spec.name!r} does not match the file name {path.stem!r}")
        specs[spec.name] = spec
    _CATALOG.clear()
    _CATALOG[stamp] = specs
    return dict(specs)


# Common short names of catalog devices, lower case. A name that could mean another card stays out (l40 is
# not an l40s).
ALIASES: dict[str, str] = {
    "h100": "h100-sxm",
    "a100": "a100-sxm-80gb",
    "mi300": "mi300x",
    "mi250": "mi250x",
}


def alias_note(name: str) -> str:
    """The line to show when ``name`` is an alias of a catalog device ("" when it is not one)."""
    target = ALIASES.get(name.strip().lower())
    return f"hardware {name!r} taken as catalog entry {target!r} (opmap hardware list)" if target else ""


def get_hardware(name: str) -> HardwareSpec:
    """A catalog device by name (any case; ``ALIASES`` resolve: ``alias_note`` says so), ``local`` (the
    profile ``opmap calibrate`` wrote), or a TOML file path."""
    key = name.strip().lower()
    if key in ("local", "local-cuda"):
        path = cache_path("cuda" if key == "local-cuda" else "cpu")
        if not path.exists():
            flag = " --device cuda" if key == "local-cuda" else ""
            raise OpmapError(f"no {key} hardware profile at {path}; run `opmap calibrate{flag}` first")
        return load_spec_file(path)
    p = Path(name)
    if p.suffix == ".toml" and p.exists():
        return load_spec_file(p, follow_links=True)  # the user's own link is theirs to make
    specs = catalog()
    key = ALIASES.get(key, key)
    if key not in specs:
        aliases = ", ".join(f"{a} ({t})" for a, t in ALIASES.items())
        raise OpmapError(f"unknown hardware {name!r}; accepted: {', '.join(specs)} (any case; aliases: {aliases}), "
                         "local / local-cuda (after opmap calibrate), or a .toml file")
    return specs[key]
