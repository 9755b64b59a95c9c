"""Typed results of the layout search and the fit matrix: frozen values handed between the search
(``opmap.explore.layouts``), the cell (``opmap.explore.fit``) and the file; recorded (``opmap.record``) only where
fit.json is written (its keys and their order as schema 3 has them).

- ``LayoutResult``: one (tp, pp) layout of a model on a platform as the search left it: skipped (``reason``),
  priced (``memory``), bounded by its saturation run, pruned or searched (``capacity``, the figures at the SLO),
  and under a power budget cut to the replicas it powers. A field left None was not reached: it is not written.
- ``LayoutSearch``: every layout tried, the chosen one and the runner-up (by output tokens/s per device of the
  budget), the runtime they were priced under.
- ``FitCell``: one (model, platform) cell of the matrix: the chosen layout's figures, power, price, rank.
- ``FitMatrix``: every cell ranked, with what the cells ran under (fit.json).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

from opmap.record import key, record

if TYPE_CHECKING:
    from opmap.serve.metrics import Slo

# a LayoutResult's fields from ``memory`` on are written only once reached (None: that stage did not run)
_LATER = key(omit="none")


@dataclass(frozen=True)
class LayoutResult:
    """One layout tried: ``replicas`` of ``tp`` x ``pp`` devices filling the budget (``devices_used`` of it);
    ``rate_per_s`` one replica's capacity at the SLO (None: not found, ``reason`` why); ``output_tokens_per_s``
    all replicas', ``per_device_tokens_per_s`` over the budget's devices (the figure of merit). Its record is
    fit.json's layout: the fields in order, those from ``memory`` on only where their stage ran."""

    tp: int
    pp: int
    devices_per_replica: int
    replicas: int
    devices_used: int
    fits: bool = False
    rate_per_s: float | None = None
    reason: str = ""
    # per device, as serve sizes it (the KV format, weights, KV tokens)
    memory: dict[str, Any] | None = field(default=None, metadata=_LATER)
    # the saturation run's output tokens/s per device
    bound_per_device_tokens_per_s: float | None = field(default=None, metadata=_LATER)
    saturation_per_s: float | None = field(default=None, metadata=_LATER)
    # the capacity search's record (steady_capacity)
    capacity: dict[str, Any] | None = field(default=None, metadata=_LATER)
    limited_by: str | None = field(default=None, metadata=_LATER)
    output_tokens_per_s: float | None = field(default=None, metadata=_LATER)
    per_device_tokens_per_s: float | None = field(default=None, metadata=_LATER)
    latency_p99_s: float | None = field(default=None, metadata=_LATER)
    # each replica's busy fraction in the run at the SLO rate
    utilization: list[float] | None = field(default=None, metadata=_LATER)
    power_limited: str | None = field(default=None, metadata=_LATER)
    power_w: float | None = field(default=None, metadata=_LATER)
    over_power_budget: bool | None = field(default=None, metadata=_LATER)
    # a MoE model's experts over the replica's tp group (serve's --ep), 1: tensor-parallel experts (not written)
    ep: int = field(default=1, metadata=key(omit="default"))

    @classmethod
    def of(cls, tp: int, pp: int, budget: int, ep: int = 1) -> LayoutResult:
        """The layout of ``tp`` x ``pp`` devices a replica, as many replicas as the ``budget`` holds; ``ep``: the
        experts over the tp group."""
        d = tp * pp
        return cls(tp, pp, d, budget // d, budget // d * d, ep=ep)

    @property
    def figure_of_merit(self) -> float:
        """Output tokens per second per device of the budget (0 without a rate at the SLO)."""
        return self.per_device_tokens_per_s or 0.0



@dataclass(frozen=True)
class LayoutSearch:
    """The layout search of one model on one platform (``opmap.explore.layouts.search``)."""

    tried: tuple[LayoutResult, ...]
    chosen: LayoutResult | None
    runner_up: LayoutResult | None
    runtime: dict[str, Any] | None  # the runtime the layouts were priced under (its record), None if none was
    settings: dict[tuple[int, int], Any] | None = None  # (tp, pp) -> its EngineSetting under an engine preset


# a layout's name and figures without its search record: fit.json's ``layout`` and ``runner_up``
BRIEF = ("tp", "pp", "devices_per_replica", "replicas", "devices_used", "rate_per_s", "saturation_per_s",
         "output_tokens_per_s", "per_device_tokens_per_s", "latency_p99_s", "limited_by")


# a FitCell's fields written only where a layout was chosen (schema 3: ``devices`` absent, never null, otherwise)
_CELL_CHOSEN = ("devices", "rate_at_slo_per_s", "capacity", "memory", "power_limited")


@dataclass(frozen=True)
class FitCell:
    """One (model, platform) cell: its search's layouts, the chosen one's figures (None where none was chosen,
    ``excluded_reason`` why, or where a constraint struck it), modelled power, price and rank."""

    model: str
    hardware: str
    fits: bool = False
    throughput_at_slo: float | None = None
    throughput_per_device: float | None = None
    latency_p99_s: float | None = None
    perf_per_watt: float | None = None
    energy_per_token_j: float | None = None
    power_w: float | None = None
    power_method: str = ""
    perf_per_dollar: float | None = None
    cost_per_million_output_tokens: float | None = None
    bound: str | None = None
    risk: str = ""
    risk_source: str = ""
    datasheet_only: tuple[str, ...] = ()
    devices_budget: int = 0
    layout: LayoutResult | None = None
    runner_up: LayoutResult | None = None
    layouts: tuple[LayoutResult, ...] = ()
    rank: int | None = None
    excluded_reason: str = ""
    runtime: dict[str, Any] | None = None
    devices_tried: tuple[int, ...] = ()
    chosen: bool = field(default=False)  # a layout was chosen: the fields of _CELL_CHOSEN are written
    devices: int | None = None
    rate_at_slo_per_s: float | None = None
    capacity: dict[str, Any] | None = None
    memory: dict[str, Any] | None = None
    power_limited: str | None = None
    dtype: str = ""  # the format priced on this platform (--dtype fp4 resolves per platform)
    dtype_line: str = ""  # that format, how an alias resolved and why it fell back (opmap.precision.DtypeChoice)
    engine_preset: dict[str, Any] | None = None  # the engine stack of the cell (record(EngineSetting)), written if set
    # how far to trust the cell's figures (opmap.hardware.trust: label, weakest input, line), written if set
    confidence: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """fit.json's cell: the layouts whole, the chosen one and the runner-up in brief (``BRIEF``). A computed
        shape: the brief is a subset of another class's fields, and the chosen-only fields depend on ``chosen``."""
        skip = {"chosen", *_CELL_CHOSEN}
        d: dict[str, Any] = {}
        for f in fields(self):
            if f.name in skip or (f.name in ("engine_preset", "confidence") and getattr(self, f.name) is None):
                continue
            v = getattr(self, f.name)
            if f.name in ("layout", "runner_up"):
                v = None if v is None else {k: getattr(v, k) for k in BRIEF} | ({"ep": v.ep} if v.ep > 1 else {})
            elif f.name == "layouts":
                v = [record(lay) for lay in v]
            elif f.name in ("datasheet_only", "devices_tried"):
                v = list(v)
            d[f.name] = v
        if self.chosen:
            d.update({k: getattr(self, k) for k in _CELL_CHOSEN})
        return d


@dataclass(frozen=True)
class FitMatrix:
    """The fit matrix: every (model, platform) cell ranked per workload, with what every cell ran under;
    its record: fit.json (``schema_version``: the fit's, ``opmap.explore.fit.SCHEMA_VERSION``), its keys in schema
    3's order (``RECORD``), ``interrupted`` only after a stop."""

    RECORD: ClassVar[tuple[Any, ...]] = (
        "schema_version", "models", "hardware", "slo", "input_len", "output_len", "requests", "dtype", "runtime",
        "devices_budget", "include_datasheet_only", "cells", "engine", "assumptions", ...)
    schema_version: int
    models: tuple[str, ...]
    hardware: tuple[str, ...]  # the catalog names
    slo: Slo
    input_len: str  # a length spec (fixed or a distribution), as given
    output_len: str
    requests: int  # per capacity run
    dtype: str
    runtime: str
    devices_budget: int | None
    include_datasheet_only: bool
    cells: tuple[FitCell, ...]  # ranked (opmap.explore.fit.rank)
    engine: str  # where the cells ran: local or ray
    engine_settings: dict[str, Any]  # the serving engine's settings (opmap.explore.fit.engine_settings)
    power_budget_w: float | None
    prices_usd_per_device_hour: dict[str, float]
    assumptions: tuple[str, ...] = ()
    # a stop's record (opmap.errors.Interrupted.note): cells kept
    interrupted: dict[str, Any] | None = field(default=None, metadata=key(omit="none"))
