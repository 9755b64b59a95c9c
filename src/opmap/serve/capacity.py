"""The capacity of a serving configuration: the highest arrival rate meeting the SLO with a stationary queue.

- ``find_capacity`` (``opmap.serve.rate_search``): a geometric grid of rates probed at once, shifted by its width
  while all valid / all invalid, then rounds of evenly spaced probes inside the bracket, to a relative tolerance;
- ``RateProbe``: one run at a rate (the same requests' lengths at every rate, seeded), its warm-up and
  cool-down excluded, lengthened until it spans enough lifetimes to judge its queue stationary or diverging;
  ``saturation()``: the same requests all at t = 0 (offline), whose completions per second cap the search;
- ``steady_capacity``: the search serve --find-capacity and fit both run (one search, one answer), never above
  the saturation rate, with the headline summary of the very run at the rate found: a ``CapacityRecord``, whose
  record (``opmap.record.record``) is the ``capacity`` block serve.json and fit.json write.

Summaries come from ``opmap.serve.metrics.summarize`` (a ``ServeReport``; a probe's carries its ``steady_state``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from opmap.errors import Interrupted, OpmapError
from opmap.record import key
from opmap.serve.metrics import Goodput, ServeReport, Slo, Throughput, Validity, summarize
from opmap.serve.rate_search import CapacitySearch, MapFn, ProbeRun, find_capacity
from opmap.serve.run_stats import QueueTrend, SteadyState
from opmap.serve.sim import SimResult

# The steady-state capacity search (serve --find-capacity and fit use it alike) ------------------------------

CAPACITY_REQUESTS = 1000  # requests per capacity run, serve's and fit's default alike (one search, one answer)
WARMUP_FRACTION = 0.1  # at least the first 10% of a run's requests (by arrival) are warm-up: not in its figures
# A run is diverging when the waiting time (arrival to first scheduled) of the second half of its measured
# requests grows, fitted by least squares against arrival time, by more than both DIVERGE_Z standard errors of
# the fitted growth (not noise) and DIVERGE_SLOPE x that half's arrival span: in an overloaded queue the wait
# grows at rho - 1 seconds per second, so this is a load more than 1% over the service rate. (The wait, not the
# time in system: under iteration-level batching a rising load first grows the batch and every request's decode
# time with it, which raises the service rate until the batch is full; only past that does the queue, and the
# wait, grow without bound. The SLO check catches the slower decode.)
DIVERGE_Z = 3.0
DIVERGE_SLOPE = 0.01
# A run must last RUN_LIFETIMES median end-to-end latencies of arrivals: under iteration-level batching the batch,
# and each request's time with it, grows for several lifetimes before it settles (gpt2 on an H100 at 500 of its
# ~555 requests/s: 1000 requests, 4 lifetimes, still filling; 4000, 18 lifetimes, flat). A shorter run is lengthened
# to that (the same seed, more requests), up to MAX_STEADY_REQUESTS.
RUN_LIFETIMES = 20
MAX_STEADY_REQUESTS = 50_000
LENGTHEN_PASSES = 3
DIVERGE_PLAIN = 0.1
TREND_MIN = 8  # fewer requests than this in the second half: the trend is not judged ("too short")


def warmup_count(n: int, warmup: int | None = None) -> int:
    """Requests excluded as warm-up from a run of ``n``: ``warmup`` when given, else ceil(WARMUP_FRACTION x n);
    at most n - 2, so that two requests are always measured."""
    k = math.ceil(round(n * WARMUP_FRACTION, 9)) if warmup is None else int(warmup)
    return max(0, min(k, n - 2))


def measured_window(res: SimResult, warmup: int | None = None) -> tuple[np.ndarray, int, int, bool]:
    """(indices of the measured requests, warm-up count, cool-down count, too short) of ``res``. Warm-up: given
    ``warmup``, that many first arrivals; otherwise the more of ceil(WARMUP_FRACTION x n) and those arriving
    within one median end-to-end latency of the first (a server fills up over about one request lifetime: by
    Little's law it then holds rate x latency requests). Cool-down (automatic warm-up only): the requests arriving
    within one median e2e of the last arrival, which see the server drain. Too short: warm-up and cool-down
    together would take over half the run (they are then cut to half of it)."""
    n = len(res.arrival_s)
    order = np.argsort(res.arrival_s, kind="stable")
    if warmup is not None or n < 4:
        k = warmup_count(n, warmup)
        return np.sort(order[k:]), k, 0, False
    a = res.arrival_s[order]
    life = float(np.median(res.finish_s - res.arrival_s))
    warm = max(warmup_count(n), int(np.searchsorted(a, a[0] + life, side="right")))
    cool = n - int(np.searchsorted(a, a[-1] - life, side="left"))
    short = warm + cool > n // 2
    if short:
        warm, cool = min(warm, n // 4), min(cool, n // 4)
    return np.sort(order[warm:n - cool]), warm, cool, short


def steady_window(res: SimResult, keep: np.ndarray) -> SimResult:
    """``res`` restricted to the requests ``keep`` (indices): the per-request arrays sliced, the span then running
    from the first kept arrival to the last kept finish. Busy time is scaled to that span so that utilization
    stays the whole run's busy fraction; the inter-token gaps stay pooled over the whole run (they carry no
    request index)."""
    if len(keep) == len(res.arrival_s):
        return res
    whole = float(res.finish_s.max() - res.arrival_s.min())
    part = float(res.finish_s[keep].max() - res.arrival_s[keep].min())
    scale = part / whole if whole > 0 else 1.0
    return replace(res, arrival_s=res.arrival_s[keep], start_s=res.start_s[keep], first_s=res.first_s[keep],
                   finish_s=res.finish_s[keep], input_len=res.input_len[keep], output_len=res.output_len[keep],
                   replica=res.replica[keep], busy_s=[b * scale for b in res.busy_s],
                   preemptions=None if res.preemptions is None else res.preemptions[keep],
                   prefix_hit_tokens=None if res.prefix_hit_tokens is None else res.prefix_hit_tokens[keep])


def queue_trend(arrival_s: np.ndarray, time_s: np.ndarray) -> QueueTrend:
    """Is the queue stationary? Over the second half of the requests (by arrival), the least-squares line of their
    waiting time ``time_s`` (s) against arrival time (s): ``growth_s`` = slope x that half's arrival span, with
    its standard error. ``verdict`` "diverging" when the growth passes both limits above (DIVERGE_*),
    "stationary" otherwise, "too short" with fewer than TREND_MIN requests or no arrival span."""
    order = np.argsort(arrival_s, kind="stable")
    half = order[len(order) // 2:]
    t, w = arrival_s[half], time_s[half]
    window, rule = ("second half of the measured requests", f"diverging when the fitted growth of the waiting time "
                    f"over the window exceeds {DIVERGE_Z:g} standard errors and {DIVERGE_SLOPE:g} x the window's "
                    "span (s per s)")
    dt = float(t.max() - t.min()) if t.size else 0.0
    if t.size < TREND_MIN or dt <= 0:
        return QueueTrend(window, int(t.size), rule, "too short", None, None, float(w.mean()) if w.size else None)
    tc = t - t.mean()
    sxx = float((tc * tc).sum())
    slope = float((tc * (w - w.mean())).sum()) / sxx
    resid = w - w.mean() - slope * tc
    se = float(np.sqrt((resid * resid).sum() / (t.size - 2) / sxx))
    growth, growth_se = slope * dt, se * dt
    diverging = growth > DIVERGE_Z * growth_se and growth > DIVERGE_SLOPE * dt
    return QueueTrend(window, int(t.size), rule, "diverging" if diverging else "stationary", growth, growth_se,
                      float(w.mean()), dt)


def _plainly_diverging(res: SimResult) -> bool:
    """The whole run's wait grows at over DIVERGE_PLAIN s per s (a load over 10% above the service rate): its
    lifetimes only lengthen with the run, so a longer run would not settle it and is not drawn."""
    t = queue_trend(res.arrival_s, res.start_s - res.arrival_s)
    return t.verdict == "diverging" and t.growth_s > DIVERGE_PLAIN * t.span_s


DIVERGING = "queue not stationary (diverging)"
TOO_SHORT = "run too short for a steady state"


def _steady_validity(v: Validity, trend: QueueTrend, n: int) -> Validity:
    """``v`` (the SLO's verdict) made INVALID where the queue diverges or the run of ``n`` requests is too short to
    tell, the reason why first."""
    if trend.verdict == "diverging":
        return replace(v, valid=False, verdict="INVALID", reason=(
            f"{DIVERGING}: the wait grew {trend.growth_s * 1e3:.4g} ms over the measured second half (mean "
            f"{trend.mean_s * 1e3:.4g} ms; a longer run, --requests, settles a queue that is only slow to fill); "
            + v.reason))
    if trend.verdict == "too short":
        return replace(v, valid=False, verdict="INVALID", reason=(
            f"{TOO_SHORT}: filling and draining the server (one median e2e latency of arrivals each) take over half "
            f"of its {n} requests; raise --requests; " + v.reason))
    return v


def departure_rates(res: SimResult, t0: float, t1: float, attainment: float) -> tuple[Throughput, Goodput]:
    """Steady-state throughput of a run measured from ``t0`` to ``t1`` (s, its first and last measured arrivals):
    the requests (and their tokens) of the whole run finishing in that interval, per second of it (in a
    stationary queue: the arrival rate; the filling before t0 and the drain after t1 are left out). Goodput:
    that throughput x the SLO attainment of the measured requests."""
    if not t1 > t0:
        return Throughput(0.0, 0.0, 0.0), Goodput(0.0, 0.0)
    done = (res.finish_s >= t0) & (res.finish_s <= t1)
    dt = t1 - t0
    out_tok = float(res.output_len[done].sum())
    th = Throughput(float(done.sum()) / dt, (float(res.input_len[done].sum()) + out_tok) / dt, out_tok / dt,
                    "departures between the first and the last measured arrival")
    return th, Goodput(th.requests_per_s * attainment, th.output_tokens_per_s * attainment)


@dataclass(frozen=True)
class RateProbe:
    """``probe(rate)``: the summary of a simulated run with the arrival process at ``rate`` and everything else
    (lengths, policy, cost, replicas, router, seed, SLO) fixed, its first ``warmup`` requests (default
    ``warmup_count``) left out of the figures and its queue judged stationary or diverging (``steady_state``; a
    diverging run is INVALID whatever its percentiles). ``probe.saturation()``: the same requests all at t = 0
    (the offline run), summarized whole. A module-level value, so that a worker process or a Ray task can run it
    for ``find_capacity``."""

    arrival: Any  # opmap.serve.arrivals.Arrival (poisson or gamma)
    input_len: Any
    output_len: Any
    requests: int
    policy: Any
    cost: Any
    replicas: int = 1
    router: str = "round_robin"
    seed: int = 0
    slo: Slo | None = None
    disaggregate: tuple[int, int] | None = None  # (prefill, decode) replicas: serve.disagg instead of replicas
    transfer: Any = None  # opmap.serve.disagg.KvTransfer, with disaggregate
    warmup: int | None = None  # requests left out as warm-up (None: WARMUP_FRACTION of them)
    prefix: Any = None  # opmap.serve.prefix.PrefixShare: the prompts' shared prefixes (None: none shared)

    def _requests(self, rate: float, n: int | None = None):
        from opmap.serve.arrivals import make_requests

        reqs = make_requests(self.arrival.with_rate(rate), self.input_len, self.output_len, n or self.requests,
                             self.seed, max_span_s=None)  # the search moves the rate, down to very low ones
        return self.prefix.apply(reqs) if self.prefix is not None else reqs

    def _simulate(self, reqs) -> SimResult:
        from opmap.serve.sim import simulate

        if self.disaggregate is not None:
            from opmap.serve.disagg import simulate_disaggregated

            p, d = self.disaggregate
            return simulate_disaggregated(reqs, self.policy, self.cost, p, d, self.transfer, self.router, self.seed)
        return simulate(reqs, self.policy, self.cost, self.replicas, self.router, self.seed)

    def result(self, rate: float) -> SimResult:
        """The whole simulated run at ``rate`` (the run ``probe(rate)`` summarizes): ``requests`` of them, or more
        where their arrivals span under RUN_LIFETIMES median e2e latencies (see there; a given ``warmup`` keeps
        the length as given)."""
        res = self._simulate(self._requests(rate))
        for _ in range(LENGTHEN_PASSES):  # a longer run holds a fuller batch, whose requests live longer: re-check
            n = len(res.arrival_s)
            if self.warmup is not None or n < 2 or n >= MAX_STEADY_REQUESTS:
                break
            span = float(res.arrival_s.max() - res.arrival_s.min())
            need = RUN_LIFETIMES * float(np.median(res.finish_s - res.arrival_s))
            if span >= need or _plainly_diverging(res):
                break
            more = min(MAX_STEADY_REQUESTS, math.ceil(n * need / max(span, 1e-12) * 1.1))
            res = self._simulate(self._requests(rate, more))
        return res

    def measured(self, rate: float) -> SimResult:
        """The measured requests of the run at ``rate`` (warm-up and cool-down left out): what its summary and
        its latency CDFs describe."""
        res = self.result(rate)
        return steady_window(res, measured_window(res, self.warmup)[0])

    def __call__(self, rate: float) -> ServeReport:
        """The summary of the measured window of the run at ``rate`` (its ``steady_state``; throughput and goodput
        its departures), INVALID where its queue diverges or it is too short to tell."""
        res = self.result(rate)
        n = len(res.arrival_s)
        keep, warm, cool, short = measured_window(res, self.warmup)
        win = steady_window(res, keep)
        s = summarize(win, self.slo)
        trend = queue_trend(win.arrival_s, win.start_s - win.arrival_s)
        if short:  # no steady window: plainly diverging over the whole run, or too short to tell
            whole = queue_trend(res.arrival_s, res.start_s - res.arrival_s)
            trend = (replace(whole, window="second half of the whole run (too short for a steady window)")
                     if _plainly_diverging(res) else replace(trend, verdict="too short"))
        steady = SteadyState(n, warm, cool, len(keep), trend, self._alone(res, trend.verdict))
        th, good = departure_rates(res, float(win.arrival_s.min()), float(win.arrival_s.max()), s.slo_attainment)
        return replace(s, throughput=th, goodput=good, steady_state=steady,
                       validity=_steady_validity(s.validity, trend, n))

    def _alone(self, res: SimResult, verdict: str) -> bool:
        """Every request of ``res`` served alone (each finished before the next arrived) with fixed lengths, a
        step cost (no drawn service times), not lengthened, stationary: then every lower rate (the same gaps,
        longer) serves them alone alike: the same latencies, window and verdict (find_capacity's descent)."""
        n = len(res.arrival_s)
        if (self.input_len.kind != "fixed" or self.output_len.kind != "fixed" or self.disaggregate is not None
                or not hasattr(self.cost, "decode_s") or n != self.requests or n - 1 < RUN_LIFETIMES
                or verdict != "stationary"):
            return False
        order = np.argsort(res.arrival_s, kind="stable")
        return bool(np.all(res.finish_s[order][:-1] < res.arrival_s[order][1:]))

    def saturation(self) -> ServeReport:
        """The offline run: the same requests (the same lengths) all arriving at t = 0, summarized whole; its
        requests per second is the most this configuration completes. Each of the replicas gets ``requests`` of
        them (requests x replicas in all): the ceiling of R replicas is R times one replica's, however many there
        are (1000 requests over 8 replicas left each a batch of 125, under the engine's 256: serve of llama-3-8b
        as 8 x tp1 on H100s capped at 357.9 requests/s where fit's one replica of 1000 gave 8 x 52.7 = 421.7)."""
        share = self.replicas if self.disaggregate is None else 1
        from opmap.serve.arrivals import MAX_REQUESTS

        reqs = self._requests(1.0, min(self.requests * share, MAX_REQUESTS))
        reqs = replace(reqs, arrival_s=np.zeros_like(reqs.arrival_s), arrival="offline")
        return summarize(self._simulate(reqs), self.slo)


@dataclass(frozen=True)
class SaturationRun:
    """The offline run a capacity search is bounded by, as the ``capacity`` block writes it: all requests at t = 0,
    how many, their span (s) and the rates completed (the throughput's keys in place)."""

    RECORD: ClassVar[tuple[str, ...]] = ("arrival", ...)
    arrival: ClassVar[str] = "offline"
    requests: int
    span_s: float
    throughput: Throughput = field(metadata=key(flatten=True))


@dataclass(frozen=True)
class CapacityRun:
    """The run at the capacity found, as the ``capacity`` block writes it (its ``run``): the steady state's keys,
    its ``span_s`` the measured run's (s; written in the trend's place, the trend's window lying inside it)."""

    steady_state: SteadyState = field(metadata=key(flatten=True))
    span_s: float


@dataclass(frozen=True)
class CapacityStop:
    """A capacity search stopped by a signal: the signal's name and the runs made."""

    signal: str
    runs: int


@dataclass(frozen=True)
class CapacityRecord:
    """``steady_capacity``'s answer: the search (``search``: its bracket, runs, convergence), the rate found
    (``rate_per_s``, None where no rate is valid, ``reason`` why) and what limited it ("saturation", "slo",
    "stationarity", "search range", "interrupted"), the offline saturation run (``saturation``, its requests/s
    ``saturation_per_s``), the method in words, and ``headline``: the summary of the run at ``rate_per_s`` (None
    without one), the very run whose figures are reported. Its record is the ``capacity`` block serve.json and
    fit.json write (the headline is not in it: serve.json's body is the headline itself): the search's figures in
    place, the saturation run's summary (``SaturationRun``) and the headline's steady state and measured span
    (``run``, a ``CapacityRun``), the reason and the stop only where set."""

    RECORD: ClassVar[tuple[Any, ...]] = (
        "rate_per_s", "bracket", "converged", "rel_tol", "limited_by", "runs", "saturation_per_s",
        ("saturation_run", key("saturation")), "method", "reason", ("run", key(omit="none")), "interrupted")
    search: CapacitySearch
    rate_per_s: float | None
    limited_by: str
    saturation: ServeReport
    method: str
    headline: ServeReport | None
    reason: str | None = field(default=None, metadata=key(omit="none"))
    # a stopped search: the signal and the runs
    interrupted: CapacityStop | None = field(default=None, metadata=key(omit="none"))

    @property
    def saturation_per_s(self) -> float:
        return float(self.saturation.throughput.requests_per_s)

    @property
    def bracket(self) -> tuple[float | None, float | None]:
        return self.search.bracket

    @property
    def converged(self) -> bool:
        return self.search.converged

    @property
    def rel_tol(self) -> float:
        return self.search.rel_tol

    @property
    def runs(self) -> tuple[ProbeRun, ...]:
        return self.search.runs

    @property
    def saturation_run(self) -> SaturationRun:
        s = self.saturation
        return SaturationRun(s.requests.count, s.requests.span_s, s.throughput)

    @property
    def run(self) -> CapacityRun | None:
        """The headline's steady state and its measured span (the trend's window's before); None without one."""
        h = self.headline
        return CapacityRun(h.steady_state, h.requests.span_s) if h is not None and h.steady_state is not None else None


def steady_capacity(probe: RateProbe, map_fn: MapFn | None = None, rel_tol: float = 0.01, max_runs: int = 64,
                    saturation: ServeReport | None = None, prune: bool = True,
                    floor: float | None = None) -> CapacityRecord:
    """The highest arrival rate (requests/s) whose run meets the SLO with a stationary queue, never above the
    saturation rate of the same configuration (``probe.saturation()``: all requests at t = 0, requests/s
    completed): ``find_capacity`` with that rate as its ceiling. Returns the record (``CapacityRecord``):
    ``rate_per_s`` (None where no rate is valid, with ``reason``), the search, the saturation run and
    ``headline``: the summary of the run at ``rate_per_s``, the very run whose figures are reported (warm-up
    excluded). ``saturation``: ``probe.saturation()`` already run (a layout search bounds each layout by it first),
    else it is run here. ``prune``: first ask ``alone_breaks_slo``; where a request alone already breaks the SLO,
    no rate is searched (the search would probe ever lower rates, down to 2^-31 of saturation, each a run of
    requests served one by one, and find none valid). ``floor`` (requests/s): ``find_capacity``'s: an invalid
    rate under it stops the search, ``limited_by`` "floor", no rate, the reason.

    Stopped (``Interrupted``: Ctrl-C, SIGTERM) after a run, the stop carries as ``partial`` this record of the runs
    so far, ``limited_by`` "interrupted", ``interrupted`` the signal and the runs: ``rate_per_s`` the highest
    valid rate below the lowest invalid one probed (a lower bound of the capacity), None where none was valid."""
    sat = saturation if saturation is not None else probe.saturation()
    sat_rate = float(sat.throughput.requests_per_s)
    if not sat_rate > 0:
        raise OpmapError("the offline run completed no requests in a positive time: no saturation rate to search "
                         "under (check the cost model and the lengths)")
    from opmap.serve.alone import alone_breaks_slo

    why = alone_breaks_slo(probe) if prune else None
    if why is not None:
        return CapacityRecord(CapacitySearch(0.0, (None, None), True, rel_tol, "slo", ()), None, "slo", sat,
                              _method(probe), None, reason=why)
    try:
        cap = find_capacity(probe, sat_rate, rel_tol, max_runs, map_fn, ceiling=sat_rate, skip_alone=prune,
                            floor=floor)
    except Interrupted as e:
        if e.partial is not None:
            part = _steady_record(probe, e.partial, sat)
            e.partial = replace(part, interrupted=CapacityStop(e.name, len(part.search.runs)))
        raise
    out = _steady_record(probe, cap, sat)
    if cap.limited_by == "floor":  # stopped under the caller's floor: no answer, only its bound
        return replace(out, limited_by="floor", rate_per_s=None, headline=None,
                       reason=f"capacity under {cap.bracket[1]:.4g} requests/s (invalid there), below the floor "
                              f"{floor:.4g}: not searched further")
    return out


def _method(probe: RateProbe) -> str:
    return (f"steady state: runs of {probe.requests} requests or more (lengthened to span {RUN_LIFETIMES} median e2e "
            f"latencies of arrivals, at most {MAX_STEADY_REQUESTS}), "
            + (f"the first {probe.warmup}" if probe.warmup is not None else
               f"the first {WARMUP_FRACTION:.0%} or those arriving within one median e2e latency of the "
               "first, whichever is more, and those within one median e2e of the last")
            + " excluded (warm-up, cool-down); a run VALID when the SLO holds at p99 over the rest and "
              "its queue is stationary; throughput = departures between the first and the last measured "
              "arrival; the rate capped at the offline saturation rate (all requests at t = 0)")


def _steady_record(probe: RateProbe, cap: CapacitySearch, sat: ServeReport) -> CapacityRecord:
    """steady_capacity's record of find_capacity's ``cap`` under the saturation run ``sat``."""
    head = cap.summary
    out = CapacityRecord(cap, cap.rate_per_s, cap.limited_by, sat, _method(probe), head)
    if head is None or not cap.rate_per_s:
        low = min(cap.runs, key=lambda r: r.rate_per_s)
        reason = (f"no rate from {low.rate_per_s:.4g} requests/s up to saturation "
                  f"({out.saturation_per_s:.4g}) meets the SLO: {low.reason}")
        if cap.limited_by == "interrupted":
            reason = (f"stopped after {len(cap.runs)} runs, none valid: the lowest, "
                      f"{low.rate_per_s:.4g} requests/s: {low.reason}")
        return replace(out, rate_per_s=None, headline=None, reason=reason)
    if cap.limited_by == "ceiling":
        return replace(out, limited_by="saturation")
    if cap.bracket[1] is not None and cap.limited_by != "interrupted":  # what the rate above it broke
        bad = next(r for r in cap.runs if r.rate_per_s == cap.bracket[1])
        return replace(out, limited_by="stationarity" if bad.reason.startswith((DIVERGING, TOO_SHORT)) else "slo")
    return out
