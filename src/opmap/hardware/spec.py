"""HardwareSpec: one device's ceilings, every value carrying its source and kind (opmap.hardware.values: the
fields, their kinds and rules), and the catalog's loader (one TOML file per device under ``catalog/``)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from opmap.errors import OpmapError
from opmap.hardware.curves import Curves, check_calibration
from opmap.hardware.interconnect import LEGACY_KEYS, Interconnect, from_legacy, read_interconnect
from opmap.hardware.local import cache_path
from opmap.hardware.values import (  # noqa: F401 (re-exported: the catalog's tables, read from here by callers)
    ACHIEVABLE_FIGURES,
    ACHIEVABLE_KINDS,
    DEVICE_TYPES,
    DRAM_EFFICIENCY,
    DRAM_EFFICIENCY_SOURCE,
    DTYPES,
    EMPTY_ALLOWED,
    FIELD_RULES,
    KINDS,
    RATE,
    REQUIRED_FIELDS,
    RISK_LEVELS,
    SCALAR_FIELDS,
    SOFTWARE_STACKS,
    TEXT_FIELDS,
    Value,
    read_peaks,
    read_text_value,
    read_value,
)
from opmap.safeio import LIMIT_TOML_BYTES, read_bounded
from opmap.validate import shown


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
    # the stack its graph / engine runtime runs on (a section of runtimes.toml; "" in a file written before the field:
    # opmap.hardware.runtimes.stack_for then goes by the vendor)
    software_stack: str = ""
    # the tiers collectives walk (opmap.hardware.interconnect); ``fields`` holds their flat form as well
    interconnect: Interconnect = field(default_factory=Interconnect)

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



# the top-level keys of a device TOML besides SCALAR_FIELDS and TEXT_FIELDS
HEADER_KEYS = ("name", "display_name", "vendor", "device_type", "matrix_peak_flops_per_s", "vector_peak_flops_per_s",
               "sparse_matrix_peak_flops_per_s", "achievable_matrix_flops_per_s", "sustained_matrix_flops_per_s",
               "compute_unit_name", "notes", "calibration", "interconnect", "software_stack")


def _check_header(raw: dict[str, Any], origin: str) -> None:
    """The names, the device type and the calibration table; no unknown key."""
    for key in HEADER_KEYS[:6]:
        if key not in raw:
            raise OpmapError(f"{origin}: missing {key!r}")
    for key in ("name", "display_name", "vendor", "compute_unit_name", "notes", "software_stack"):
        if key in raw and not isinstance(raw[key], str):
            raise OpmapError(f"{origin}: {key} must be a string (got {shown(raw[key])})")
    if raw.get("software_stack", SOFTWARE_STACKS[0]) not in SOFTWARE_STACKS:
        raise OpmapError(f"{origin}: software_stack {shown(raw['software_stack'])} is not one of "
                         f"{', '.join(SOFTWARE_STACKS)} (opmap/hardware/runtimes.toml)")
    if raw["device_type"] not in DEVICE_TYPES:
        raise OpmapError(f"{origin}: device_type {shown(raw['device_type'])} is not one of {', '.join(DEVICE_TYPES)}")
    if not isinstance(raw.get("calibration", {}), dict):
        raise OpmapError(f"{origin}: calibration must be a table (got {shown(raw['calibration'])})")
    check_calibration(raw.get("calibration", {}), f"{origin}: calibration")


def _read_fields(raw: dict[str, Any], origin: str, tiered: dict[str, Value]) -> dict[str, Value]:
    """The scalar and text fields, each read by its rule (the interconnect's flat fields from ``tiered`` where
    the file gives tiers); the required ones present; no unknown key."""
    fields = {}
    for key in SCALAR_FIELDS:
        if key in tiered:
            fields[key] = tiered[key]
        elif key in raw:
            r = raw[key]
            if key in EMPTY_ALLOWED and isinstance(r, dict) and "value" not in r:
                r = {**r, "value": None}
            fields[key] = read_value(r, f"{origin}: {key}", FIELD_RULES.get(key, RATE))
    for key, accepted in TEXT_FIELDS.items():
        if key in tiered:
            fields[key] = tiered[key]
        elif key in raw:
            fields[key] = read_text_value(raw[key], f"{origin}: {key}", accepted)
    for key in REQUIRED_FIELDS:
        if key not in fields or fields[key].value is None:
            raise OpmapError(f"{origin}: {key} needs a value")
    unknown = set(raw) - set(SCALAR_FIELDS) - set(TEXT_FIELDS) - set(HEADER_KEYS)
    if unknown:
        raise OpmapError(f"{origin}: unknown field(s) {', '.join(sorted(unknown))}")
    return fields


def _check_rates(spec: HardwareSpec, origin: str) -> None:
    """Dense peaks only as peaks; every achievable or sustained figure of its kinds and at or below its ceiling."""
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


def spec_from_dict(raw: dict[str, Any], origin: str) -> HardwareSpec:
    """Build and validate a spec from parsed TOML. ``origin`` names the file in error messages."""
    _check_header(raw, origin)
    tiers = None
    if "interconnect" in raw:
        if flat := [k for k in LEGACY_KEYS if k in raw]:
            raise OpmapError(f"{origin}: give the interconnect as [[interconnect.tier]] tables or as the flat fields, "
                             f"not both (flat: {', '.join(flat)})")
        tiers = read_interconnect(raw["interconnect"], origin)
    fields = _read_fields(raw, origin, {} if tiers is None else tiers.legacy_fields())

    def peaks(table: str) -> dict[str, Value]:
        return read_peaks(raw.get(table, {}), f"{origin}: {table}")

    spec = HardwareSpec(
        name=str(raw["name"]),
        display_name=str(raw["display_name"]),
        vendor=str(raw["vendor"]),
        device_type=str(raw["device_type"]),
        matrix_peak_flops_per_s=peaks("matrix_peak_flops_per_s"),
        vector_peak_flops_per_s=peaks("vector_peak_flops_per_s"),
        sparse_matrix_peak_flops_per_s=peaks("sparse_matrix_peak_flops_per_s"),
        achievable_matrix_flops_per_s=peaks("achievable_matrix_flops_per_s"),
        sustained_matrix_flops_per_s=peaks("sustained_matrix_flops_per_s"),
        fields=fields,
        compute_unit_name=str(raw.get("compute_unit_name", "compute unit")),
        notes=str(raw.get("notes", "")),
        calibration=dict(raw.get("calibration", {})),
        interconnect=tiers if tiers is not None else from_legacy(fields),
        software_stack=str(raw.get("software_stack", "")),
    )
    _check_rates(spec, origin)
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
