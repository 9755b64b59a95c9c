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

from opmap.hardware.trust import Confidence
from opmap.record import key

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
    # serve's --dp-attention: the tp devices are ep = tp attention ranks, each its own batch (not written when False)
    dp_attention: bool = field(default=False, metadata=key(omit="default"))

    @classmethod
    def of(cls, tp: int, pp: int, budget: int, ep: int = 1, dp_attention: bool = False) -> LayoutResult:
        """The layout of ``tp`` x ``pp`` devices a replica, as many replicas as the ``budget`` holds; ``ep``: the
        experts over the tp group; ``dp_attention``: the attention data-parallel over them (ep = tp)."""
        d = tp * pp
        return cls(tp, pp, d, budget // d, budget // d * d, ep=ep, dp_attention=dp_attention)

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
    settings: dict[tuple[int, int, int, bool], Any] | None = None  # (tp, pp, ep, dp_attention) -> its EngineSetting


@dataclass(frozen=True)
class LayoutBrief:
    """A layout's name and figures without its search record: fit.json's ``layout`` and ``runner_up``; ``ep``
    only where experts are spread (ep > 1)."""

    tp: int
    pp: int
    devices_per_replica: int
    replicas: int
    devices_used: int
    rate_per_s: float | None
    saturation_per_s: float | None
    output_tokens_per_s: float | None
    per_device_tokens_per_s: float | None
    latency_p99_s: float | None
    limited_by: str | None
    ep: int = field(default=1, metadata=key(omit="default"))
    dp_attention: bool = field(default=False, metadata=key(omit="default"))

    @classmethod
    def of(cls, lay: LayoutResult | None) -> LayoutBrief | None:
        return None if lay is None else cls(*(getattr(lay, f.name) for f in fields(cls)))


@dataclass(frozen=True)
class ChosenLayout:
    """The chosen layout's figures a cell carries (``FitCell.chosen``), written at the cell's end (schema 3: a
    cell with no layout chosen has none of these keys, never a null ``devices``)."""

    devices: int  # the devices the chosen layout uses (replicas x devices per replica)
    rate_at_slo_per_s: float | None
    capacity: dict[str, Any] | None  # one replica's capacity search (its record)
    memory: dict[str, Any] | None
    power_limited: str | None


@dataclass(frozen=True)
class QualityCited:
    """A quality file covering the cell's workload in its format (``opmap.explore.fit_quality``): where it is and
    its end-to-end figures against fp32."""

    format: str
    file: str
    snr_db: float | None  # None: exact
    agreement: float
    agreement_kind: str
    kl: float | None
    weights: str
    rel_error: float


@dataclass(frozen=True)
class QualityMissing:
    """A cell whose format needs quality evidence (block-scaled, 4-bit float) and has none."""

    RECORD: ClassVar[tuple[str, ...]] = ("format", "file", "note")
    file: ClassVar[None] = None
    format: str
    note: str


@dataclass(frozen=True)
class FitCell:
    """One (model, platform) cell: its search's layouts, the chosen one's figures (``chosen``: None where none was
    chosen, ``excluded_reason`` why, or where a constraint struck it), modelled power, price, rank and quality
    evidence. Its record is fit.json's cell (``RECORD``): the layouts whole, the chosen one and the runner-up in
    brief, the chosen layout's figures at the end."""

    RECORD: ClassVar[tuple[Any, ...]] = (
        "model", "hardware", "fits", "throughput_at_slo", "throughput_per_device", "latency_p99_s", "perf_per_watt",
        "energy_per_token_j", "power_w", "power_method", "perf_per_dollar", "cost_per_million_output_tokens", "bound",
        "risk", "risk_source", "datasheet_only", "devices_budget", ("layout_brief", key("layout")),
        ("runner_up_brief", key("runner_up")), "layouts", "rank", "excluded_reason", "runtime", "devices_tried",
        "dtype", "dtype_line", "engine_preset", "confidence", "chosen", "quality")
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
    dtype: str = ""  # the format priced on this platform (--dtype fp4 resolves per platform)
    dtype_line: str = ""  # that format, how an alias resolved and why it fell back (opmap.precision.DtypeChoice)
    # the engine stack of the cell (record(EngineSetting)), written if set
    engine_preset: dict[str, Any] | None = field(default=None, metadata=key(omit="none"))
    confidence: Confidence | None = field(default=None, metadata=key(omit="none"))
    chosen: ChosenLayout | None = field(default=None, metadata=key(flatten=True, omit="none"))
    # the quality evidence of the cell's format (opmap.explore.fit_quality.attach), written if set
    quality: QualityCited | QualityMissing | None = field(default=None, metadata=key(omit="none"))

    @property
    def layout_brief(self) -> LayoutBrief | None:
        return LayoutBrief.of(self.layout)

    @property
    def runner_up_brief(self) -> LayoutBrief | None:
        return LayoutBrief.of(self.runner_up)


@dataclass(frozen=True)
class FitStop:
    """A fit stopped by a signal: the signal's name, the cells finished of all, the cells not run (model on
    platform)."""

    signal: str
    cells_done: int
    cells_total: int
    cells_not_run: tuple[str, ...]


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
    interrupted: FitStop | None = field(default=None, metadata=key(omit="none"))  # a stop: the cells kept
