"""Serving metrics from a SimResult, named as vLLM's benchmark_serving and MLPerf LoadGen name them.

- e2e: finish - arrival; ttft: first token - arrival (queueing included; ``queue`` = start - arrival shown
  apart); tpot: (e2e - ttft) / (output_len - 1), requests with more than one output token (MLPerf's TPOT);
  itl: the gap between consecutive tokens of a request, pooled over all tokens (vLLM's ITL).
  Each as mean / p50 / p90 / p95 / p99 in seconds (linear-interpolated percentiles).
- throughput over the run's span (first arrival to last finish): requests, all tokens, output tokens per s.
- SLO: per request, ttft <= ttft_s and tpot <= tpot_s (LLM Server), or e2e <= p99_s (--slo-p99).
  slo_attainment: the fraction of requests meeting it; goodput: those requests per second (DistServe).
- queueing_share: mean queueing / mean e2e.
- cdf: the latency distributions in compact form, each metric's value (s) at the quantiles 0, 0.01, ..., 1
  (101 points, linear interpolation; e2e, ttft, queue per request, tpot per multi-token request): the
  dashboard's CDFs (opmap report) without the raw samples.
- preemptions (policy engine: requests evicted when KV blocks ran out, recomputed later): total, requests
  preempted at least once, most for one request; zero under the other policies, which never preempt.
- scheduler: the step limits as engines name them (max_num_seqs, max_num_batched_tokens, kv_block,
  chunked_prefill), None where the policy has no such limit; kv_cache (engine): the paged KV of a replica.
- The summary is a ``ServeReport``, a frozen value (percentiles, rates, the step limits read once from the typed
  policy); its record (``opmap.record.record``) is serve.json's body, made where the file (or a capacity record) is
  written.
- validity (MLPerf Server style): VALID when p99 TTFT <= the TTFT limit and p99 TPOT <= the TPOT limit
  (or p99 e2e <= the latency limit). MLPerf v4 llama2-70b Server: TTFT 2 s, TPOT 200 ms, both at p99.
  The real rule also asks for a 600 s minimum run and a minimum query count, which a simulation is not
  checked against; the verdict says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import numpy as np

from opmap.errors import OpmapError
from opmap.record import key
from opmap.serve.policies import Policy, SchedulerLimits
from opmap.serve.prefix import PrefixCache
from opmap.serve.run_stats import NO_PREEMPTIONS, Disaggregation, EngineStats, PagedKv, Preemptions, SteadyState
from opmap.serve.sim import SimResult

SCHEMA_VERSION = 1
PCTS = (50, 90, 95, 99)
CDF_POINTS = 101  # quantiles 0, 0.01, ..., 1: a CDF drawn at 1% steps, about 4 kB per metric in serve.json


@dataclass(frozen=True)
class Slo:
    """Latency limits (s). Default: MLPerf Inference v4 llama2-70b Server, TTFT 2 s and TPOT 200 ms at p99. Its
    record: its ``kind``, then the limits of that kind (an end-to-end limit replaces the per-token ones)."""

    RECORD: ClassVar[tuple[str, ...]] = ("kind", ...)
    ttft_s: float | None = field(default=2.0, metadata=key(when="per_token"))
    tpot_s: float | None = field(default=0.2, metadata=key(when="per_token"))
    # an end-to-end p99 limit instead (MLPerf's non-LLM Server scenarios)
    p99_s: float | None = field(default=None, metadata=key(omit="none"))

    @property
    def per_token(self) -> bool:
        """The LLM Server limits (TTFT and TPOT), not an end-to-end one."""
        return self.p99_s is None

    @property
    def kind(self) -> str:
        return "ttft_tpot_p99" if self.per_token else "e2e_p99"


def stats(x: np.ndarray, w: np.ndarray | None = None) -> dict[str, float | None]:
    """mean and p50/p90/p95/p99 (s) of x, weighted by w (each x[k] counted w[k] times) when given."""
    keys = ["mean_s"] + [f"p{p}_s" for p in PCTS]
    if x.size == 0 or (w is not None and w.sum() <= 0):
        return dict.fromkeys(keys)
    if w is None:
        vals = [float(x.mean())] + [float(v) for v in np.percentile(x, PCTS)]
    else:
        order = np.argsort(x, kind="stable")
        xs, ws = x[order], w[order]
        cum = np.cumsum(ws)
        tot = cum[-1]
        # the k-th smallest token (0-based rank r) has value xs[searchsorted(cum, r, 'right')]
        def pick(p: float) -> float:
            r = p / 100 * (tot - 1)
            lo, hi = int(np.floor(r)), int(np.ceil(r))
            a = xs[np.searchsorted(cum, lo, side="right")]
            b = xs[np.searchsorted(cum, hi, side="right")]
            return float(a + (r - lo) * (b - a))
        vals = [float((xs * ws).sum() / tot)] + [pick(p) for p in PCTS]
    return dict(zip(keys, vals, strict=True))


@dataclass(frozen=True)
class Cdf:
    """The latency distributions in compact form: each named metric's value (s) at ``quantiles`` (None: no
    sample), in the order given."""

    quantiles: tuple[float, ...]
    series: tuple[tuple[str, tuple[float, ...] | None], ...]

    @classmethod
    def of(cls, values: dict[str, np.ndarray], points: int = CDF_POINTS) -> Cdf:
        """Each metric's value at ``points`` evenly spaced quantiles (linear interpolation)."""
        qs = np.linspace(0.0, 1.0, points)
        return cls(tuple(round(float(q), 6) for q in qs),
                   tuple((k, tuple(float(v) for v in np.quantile(x, qs)) if x.size else None)
                         for k, x in values.items()))

    def to_dict(self) -> dict[str, list[float] | None]:
        return {"quantiles": list(self.quantiles), **{k: None if v is None else list(v) for k, v in self.series}}


def cdf(values: dict[str, np.ndarray], points: int = CDF_POINTS) -> dict[str, list[float] | None]:
    """``Cdf.of(values, points)`` as written (opmap.bench.metrics writes its measured CDFs so)."""
    return Cdf.of(values, points).to_dict()


@dataclass(frozen=True)
class Percentiles:
    """mean and p50 / p90 / p95 / p99 (s) of a latency (``stats``); None each for an empty one."""

    mean_s: float | None
    p50_s: float | None
    p90_s: float | None
    p95_s: float | None
    p99_s: float | None

    @classmethod
    def of(cls, x: np.ndarray, w: np.ndarray | None = None) -> Percentiles:
        return cls(**stats(x, w))


@dataclass(frozen=True)
class Latency:
    """Each latency's percentiles: e2e, ttft, tpot (multi-token requests), itl (pooled over tokens), queue."""

    e2e: Percentiles
    ttft: Percentiles
    tpot: Percentiles
    itl: Percentiles
    queue: Percentiles


@dataclass(frozen=True)
class Throughput:
    """Rates over the run's span (first arrival to last finish), or over ``window`` where one is named (a capacity
    run's departures between its first and last measured arrival: opmap.serve.capacity.departure_rates)."""

    requests_per_s: float
    tokens_per_s: float
    output_tokens_per_s: float
    window: str | None = field(default=None, metadata=key(omit="none"))  # None: the run's span (not written)


@dataclass(frozen=True)
class Goodput:
    """The rates of the requests meeting the SLO (DistServe's goodput)."""

    requests_per_s: float
    output_tokens_per_s: float


@dataclass(frozen=True)
class RequestCounts:
    count: int
    input_tokens: int
    output_tokens: int
    span_s: float
    steps: int


@dataclass(frozen=True)
class Validity:
    valid: bool
    verdict: str
    reason: str
    rule: str


VALIDITY_RULE = ("MLPerf Server: the latency limits hold at p99 (LLM: TTFT and TPOT; llama2-70b 2 s and 200 ms); the "
                 "600 s minimum duration and minimum query count are not checked in simulation")


@dataclass(frozen=True)
class ServeReport:
    """A simulated run's summary: what serve.json holds (its record) but for the command's assumptions. Every
    latency and throughput figure is finite (checked on construction: ``check_finite``). The record's blocks in
    serve.json's order (``RECORD``): the preemptions always (none but the engine policy's), the engine's paged KV
    cache and prefix cache, a disaggregated run's pools and a capacity run's steady state only where set."""

    RECORD: ClassVar[tuple[Any, ...]] = (
        "schema_version", "policy", "arrival", "router", "replicas", "cost", "requests", "throughput", "latency", "cdf",
        "goodput", "slo", "slo_attainment", "queueing_share", "utilization", "preemptions", "scheduler", "validity",
        ("kv_cache", key(omit="none")), ("prefix_cache", key(omit="none")), "disaggregation", "steady_state")
    schema_version: ClassVar[int] = SCHEMA_VERSION
    policy: Policy
    arrival: str
    router: str
    replicas: int
    cost: dict[str, Any]
    requests: RequestCounts
    throughput: Throughput
    latency: Latency
    cdf: Cdf
    goodput: Goodput
    slo: Slo
    slo_attainment: float
    queueing_share: float
    utilization: tuple[float, ...]
    scheduler: SchedulerLimits
    validity: Validity
    # the engine policy's preemptions, paged KV and prefix cache (written as the blocks above)
    engine: EngineStats | None = None
    # a disaggregated run's pools
    disaggregation: Disaggregation | None = field(default=None, metadata=key(omit="none"))
    # a capacity run's measured window (opmap.serve.capacity.RateProbe)
    steady_state: SteadyState | None = field(default=None, metadata=key(omit="none"))

    def __post_init__(self) -> None:
        check_finite(self)

    @property
    def preemptions(self) -> Preemptions:
        return self.engine.preemptions if self.engine is not None else NO_PREEMPTIONS

    @property
    def kv_cache(self) -> PagedKv | None:
        return self.engine.kv_cache if self.engine is not None else None

    @property
    def prefix_cache(self) -> PrefixCache | None:
        return self.engine.prefix_cache if self.engine is not None else None


def check_finite(r: ServeReport) -> None:
    """Every latency and throughput figure of ``r`` a finite number, shown in ms as well as s; else OpmapError
    naming the first that is not. The inputs are bounded (opmap.validate.CEILINGS, the hardware ranges), so this
    is the last guard: a figure that overflowed is refused, never printed as a value."""
    figures = [(f"{m.name} {k.name.removesuffix('_s')}", v * 1e3 if v is not None else None)
               for m in fields(r.latency) for k in fields(Percentiles)
               for v in (getattr(getattr(r.latency, m.name), k.name),)]
    figures += [(f"throughput {k.name}", getattr(r.throughput, k.name)) for k in fields(Throughput)
                if k.name.endswith("_per_s")]
    for name, v in figures:
        if v is not None and not math.isfinite(v):
            raise OpmapError(f"serve: {name} came out {v:g}, not a finite figure (a float overflowed): the run is "
                             "refused, not printed; accepted: inputs inside their ranges (opmap serve --help)")


def _validity(slo: Slo, e2e: np.ndarray, ttft: np.ndarray, tpot: np.ndarray,
              multi: np.ndarray) -> tuple[np.ndarray, Validity]:
    """(which requests meet ``slo``, the run's MLPerf-style verdict at p99)."""
    n = len(e2e)
    if slo.p99_s is not None:
        ok = e2e <= slo.p99_s
        p99 = float(np.percentile(e2e, 99))
        valid = p99 <= slo.p99_s
        reason = f"p99 e2e {p99 * 1e3:.1f} ms {'<=' if valid else '>'} limit {slo.p99_s * 1e3:g} ms"
    else:
        ok = np.ones(n, dtype=bool)
        parts, valid = [], True
        if slo.ttft_s is not None:
            ok &= ttft <= slo.ttft_s
            p = float(np.percentile(ttft, 99))
            valid &= p <= slo.ttft_s
            parts.append(f"p99 TTFT {p * 1e3:.1f} ms {'<=' if p <= slo.ttft_s else '>'} {slo.ttft_s * 1e3:g} ms")
        if slo.tpot_s is not None and tpot.size:
            tp_all = np.zeros(n)
            tp_all[multi] = tpot
            ok &= tp_all <= slo.tpot_s
            p = float(np.percentile(tpot, 99))
            valid &= p <= slo.tpot_s
            parts.append(f"p99 TPOT {p * 1e3:.1f} ms {'<=' if p <= slo.tpot_s else '>'} {slo.tpot_s * 1e3:g} ms")
        reason = "; ".join(parts) or "no latency limit"
    return ok, Validity(bool(valid), "VALID" if valid else "INVALID", reason, VALIDITY_RULE)


def summarize(res: SimResult, slo: Slo | None = None) -> ServeReport:
    """The run's summary (serve.json's body but for the command's assumptions: the ``ServeReport``'s record); one whose
    figures overflowed is refused (``check_finite``)."""
    slo = slo or Slo()
    n = len(res.arrival_s)
    e2e = res.finish_s - res.arrival_s
    ttft = res.first_s - res.arrival_s
    queue = res.start_s - res.arrival_s
    multi = res.output_len > 1
    tpot = (e2e - ttft)[multi] / (res.output_len[multi] - 1) if res.streams_tokens else np.empty(0)
    span = float(res.finish_s.max() - res.arrival_s.min()) if n else 0.0
    rate = (lambda k: k / span) if span > 0 else (lambda k: 0.0)
    out_tok = int(res.output_len.sum())
    in_tok = int(res.input_len.sum())
    ok, validity = _validity(slo, e2e, ttft, tpot, multi)
    met = int(ok.sum())
    mean_e2e = float(e2e.mean()) if n else 0.0
    return ServeReport(
        policy=res.policy, arrival=res.arrival, router=res.router, replicas=res.replicas, cost=res.cost,
        requests=RequestCounts(n, in_tok, out_tok, span, res.steps),
        throughput=Throughput(rate(n), rate(in_tok + out_tok), rate(out_tok)),
        latency=Latency(Percentiles.of(e2e), Percentiles.of(ttft), Percentiles.of(tpot),
                        Percentiles.of(res.itl_gap_s, res.itl_weight), Percentiles.of(queue)),
        cdf=Cdf.of({"e2e_s": e2e, "ttft_s": ttft, "queue_s": queue, "tpot_s": tpot}),
        goodput=Goodput(rate(met), rate(int(res.output_len[ok].sum()))),
        slo=slo, slo_attainment=met / n if n else 0.0,
        queueing_share=float(queue.mean()) / mean_e2e if mean_e2e > 0 else 0.0,
        utilization=tuple(b / span if span > 0 else 0.0 for b in res.busy_s),
        scheduler=res.policy.limits, validity=validity, engine=res.engine, disaggregation=res.disaggregation)
