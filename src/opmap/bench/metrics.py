"""The figures of a load run, from its records, named and computed as ``opmap serve`` computes them
(opmap.serve.metrics: the same ``stats``, linear-interpolated percentiles), so a measured run and its simulation
compare like for like.

Per request (warm-up requests excluded; latencies from the actual send, s):
- ttft: first event carrying text - send; e2e: end of stream - send;
- tpot: (e2e - ttft) / (output tokens - 1), requests with more than one output token (MLPerf's TPOT); output
  tokens from the server's usage (the stream's text events where it sent none: an event may merge tokens);
- itl: the gap between consecutive text events of a request, pooled over all requests (vLLM's ITL: an event
  that merges k tokens is one gap, so ITL and TPOT differ on such a server and both are shown).
Each as mean / p50 / p90 / p95 / p99. Latency figures use the requests that ended ok.

Rates over the measured window (first measured send to last measured end): requests/s (ok requests), output
tokens/s, total tokens/s (prompt + output, usage counts where sent). Offered rate (open loop): the measured
requests over the span of their scheduled times; achieved: ok requests over the window.

Goodput (DistServe): requests that ended ok with ttft <= slo_ttft_s and tpot <= slo_tpot_s, per second.

Scheduler lag (open loop): actual send - scheduled send, s; the run "fell behind" when its p99 exceeds
LAG_LIMIT_S.

Validity in the MLPerf LoadGen spirit: the run is VALID when it lasted at least ``min_duration_s`` (mlperf.conf
``*.*.min_duration = 600000`` ms), measured at least ``min_queries`` requests (24,576 for llama2-70b, its
dataset size: loadgen's min_query_count for the LLM tests), every measured request ended ok, every usage count the
server sent was plausible (opmap.bench.records.usage_counts), the open loop kept its schedule and the run was not
interrupted; otherwise INVALID with every reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from opmap.bench.records import STATUSES, RequestRecord
from opmap.record import key, record
from opmap.serve.metrics import Cdf, Percentiles

SCHEMA_VERSION = 1
# A scheduler whose p99 send lag exceeds 10 ms has fallen behind: the TTFT figures a run reports are tens of
# ms and up, so a client late by more than that would shift them; a healthy asyncio loop lags well under 1 ms.
LAG_LIMIT_S = 0.010
MLPERF_MIN_DURATION_S = 600.0  # mlperf.conf: *.*.min_duration = 600000 (ms)
MLPERF_MIN_QUERIES = 24576  # llama2-70b's dataset size, LoadGen's min_query_count for the LLM Server tests


def output_tokens(r: RequestRecord) -> int:
    """A request's output tokens: the server's usage count, else its text events (those timed and those past the
    client's cap on times kept)."""
    if r.usage_completion_tokens is not None:
        return r.usage_completion_tokens
    return len(r.token_times_s) + r.token_times_dropped


def input_tokens(r: RequestRecord) -> int:
    """A request's prompt tokens: the server's usage count, else the count asked."""
    return r.usage_prompt_tokens if r.usage_prompt_tokens is not None else r.input_tokens_asked


def per_request(records: Sequence[RequestRecord]) -> dict[str, np.ndarray]:
    """The per-request latency arrays (s) of the ok records, and the pooled ITL gaps."""
    ok = [r for r in records if r.ok and r.first_token_s is not None]
    ttft = np.array([r.first_token_s - r.sent_s for r in ok])
    e2e = np.array([r.end_s - r.sent_s for r in ok])
    n_out = np.array([output_tokens(r) for r in ok], dtype=np.int64)
    multi = n_out > 1
    tpot = (e2e - ttft)[multi] / (n_out[multi] - 1) if ok else np.empty(0)
    gaps = [np.diff(r.token_times_s) for r in ok if len(r.token_times_s) > 1]
    itl = np.concatenate(gaps) if gaps else np.empty(0)
    tpot_all = np.full(len(ok), 0.0)
    if ok:
        tpot_all[multi] = tpot
    return {"ttft": ttft, "e2e": e2e, "tpot": tpot, "itl": itl, "tpot_per_request": tpot_all}


@dataclass(frozen=True)
class UsageCheck:
    """The server's usage counts against what was asked (ok requests): requests without usage, those whose usage
    was implausible and set aside (records.usage_counts) with the first reason, mismatches and differences
    (tokens). Written in bench.json as ``usage_check``."""

    requests_without_usage: int | None  # None (and the mismatches): an imported run's tool did not say
    implausible: int
    implausible_example: str | None
    output_mismatches: int | None
    input_mismatches: int | None
    output_diff_mean: float | None
    input_diff_mean: float | None
    input_diff_max_abs: int | None
    output_diff_max_abs: int | None


def _usage(measured: Sequence[RequestRecord]) -> UsageCheck:
    """The run's UsageCheck."""
    ok = [r for r in measured if r.ok]
    no_usage = sum(1 for r in ok if (r.usage_completion_tokens is None or r.usage_prompt_tokens is None)
                   and not r.usage_error)
    implausible = [r.usage_error for r in ok if r.usage_error]
    out_diff = [r.usage_completion_tokens - r.output_tokens_asked for r in ok if r.usage_completion_tokens is not None]
    in_diff = [r.usage_prompt_tokens - r.input_tokens_asked for r in ok if r.usage_prompt_tokens is not None]
    return UsageCheck(no_usage, len(implausible), implausible[0] if implausible else None,
                      sum(1 for d in out_diff if d != 0), sum(1 for d in in_diff if d != 0),
                      float(np.mean(out_diff)) if out_diff else None, float(np.mean(in_diff)) if in_diff else None,
                      int(np.max(np.abs(in_diff))) if in_diff else None,
                      int(np.max(np.abs(out_diff))) if out_diff else None)


@dataclass(frozen=True)
class SchedulerLag:
    """Open loop: actual send - scheduled send (s), its percentiles and maximum, and whether its p99 passed
    LAG_LIMIT_S (the run fell behind); a closed loop has no schedule (``open_loop`` False, nothing else)."""

    open_loop: bool
    behind: bool = False
    stats: Percentiles | None = None
    max_s: float | None = None
    limit_s: float = LAG_LIMIT_S

    def to_dict(self) -> dict[str, bool | float | None]:
        if not self.open_loop or self.stats is None:
            return {"open_loop": False, "behind": False}
        return {"open_loop": True, **record(self.stats), "max_s": self.max_s, "limit_s": self.limit_s,
                "behind": self.behind}


def _lag(measured: Sequence[RequestRecord]) -> SchedulerLag:
    lag = np.array([r.sent_s - r.scheduled_s for r in measured if r.scheduled_s is not None])
    if lag.size == 0:
        return SchedulerLag(False)
    s = Percentiles.of(lag)
    return SchedulerLag(True, bool(s.p99_s > LAG_LIMIT_S), s, float(lag.max()))


@dataclass(frozen=True)
class BenchRequests:
    """What the run measured: requests (warm-up apart), ok and failed, tokens (ok requests), the window (s)."""

    measured: int
    warmup: int
    ok: int
    failed: int
    input_tokens: int | None  # None: an imported run's tool did not report it (opmap.bench.imports)
    output_tokens: int | None
    window_s: float  # first measured send to last measured end
    window_start_s: float
    window_end_s: float


@dataclass(frozen=True)
class BenchLatency:
    """Each latency's percentiles (s), over the ok requests (module docstring)."""

    ttft: Percentiles
    tpot: Percentiles
    itl: Percentiles
    e2e: Percentiles


@dataclass(frozen=True)
class BenchRates:
    """Per second over the window: ok requests, output tokens, prompt + output tokens (bench.json
    ``throughput``; None: an imported run's tool did not report it, opmap.bench.imports)."""

    requests_per_s: float | None
    output_tokens_per_s: float | None
    tokens_per_s: float | None


@dataclass(frozen=True)
class Slo:
    """The limits a request's TTFT and TPOT must meet to count as goodput (s; None: no limit)."""

    ttft_s: float | None
    tpot_s: float | None


@dataclass(frozen=True)
class BenchGoodput:
    """The ok requests within the SLO (DistServe's goodput), per second over the window, and their share."""

    requests_per_s: float | None  # None: an imported run's tool did not report its rates
    output_tokens_per_s: float | None
    slo: Slo
    attainment: float  # requests within the SLO over those measured


@dataclass(frozen=True)
class BenchRate:
    """bench.json's ``rate``: offered (open loop), achieved (ok requests) and sent requests per second."""

    offered_per_s: float | None
    achieved_per_s: float | None
    sent_per_s: float | None


@dataclass(frozen=True)
class BenchFigures:
    """The figures of a run (``summarize``; the module docstring): what bench.json holds beside the run's spec,
    endpoint and client (opmap.bench.outputs.BenchFile). Its record is those keys: ``rate`` is derived (the achieved
    rate is the throughput's), the errors, their examples and the samples are objects keyed by kind / metric."""

    RECORD: ClassVar[tuple[str, ...]] = (
        "schema_version", "requests", "latency", "cdf", "throughput", "rate", "goodput", "errors", "error_examples",
        "usage_check", "scheduler_lag", "validity", "samples_s")
    schema_version: ClassVar[int] = SCHEMA_VERSION
    requests: BenchRequests
    latency: BenchLatency
    cdf: Cdf  # e2e, ttft and tpot at evenly spaced quantiles
    throughput: BenchRates
    offered_per_s: float | None  # open loop: measured requests over the span of their scheduled sends
    sent_per_s: float | None  # measured requests sent over the window (None: imported without send times)
    goodput: BenchGoodput
    # per failure kind (STATUSES but ok), in that order
    errors: tuple[tuple[str, int], ...] = field(metadata=key(mapping=True))
    # the first failure's reason per kind that failed
    error_examples: tuple[tuple[str, str], ...] = field(metadata=key(mapping=True))
    usage_check: UsageCheck
    scheduler_lag: SchedulerLag
    validity: Validity
    # raw per-request ttft_s, tpot_s, e2e_s (s): the store's samples, compare's rank test runs on them
    samples_s: tuple[tuple[str, tuple[float, ...]], ...] = field(metadata=key("samples", mapping=True))

    @property
    def all_failed(self) -> bool:
        """Every measured request failed (at least one measured): a run with nothing to show."""
        return self.requests.measured > 0 and self.requests.ok == 0

    @property
    def rate(self) -> BenchRate:
        return BenchRate(self.offered_per_s, self.throughput.requests_per_s, self.sent_per_s)


def _offered(measured: Sequence[RequestRecord]) -> float | None:
    """Measured requests over the span of their scheduled send times (requests/s); None in a closed loop."""
    t = sorted(r.scheduled_s for r in measured if r.scheduled_s is not None)
    if len(t) < 2 or t[-1] <= t[0]:
        return None
    return (len(t) - 1) / (t[-1] - t[0])


def summarize(records: Sequence[RequestRecord], *, slo_ttft_s: float | None = None,
              slo_tpot_s: float | None = None, min_duration_s: float = MLPERF_MIN_DURATION_S,
              min_queries: int = MLPERF_MIN_QUERIES, interrupted: bool = False) -> BenchFigures:
    """The figures of a run (see the module docstring): requests, latency, throughput, goodput, errors, usage
    check, scheduler lag, rates, validity. Warm-up records are left out of every figure but the count."""
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    lat = per_request(measured)
    window = ((min(r.sent_s for r in measured), max(r.end_s for r in measured)) if measured else (0.0, 0.0))
    span = window[1] - window[0]
    rate = (lambda k: k / span) if span > 0 else (lambda k: 0.0)
    out_tok = sum(output_tokens(r) for r in ok)
    in_tok = sum(input_tokens(r) for r in ok)
    kinds = Counter(r.status for r in measured)
    good = _good(ok, lat, slo_ttft_s, slo_tpot_s)
    lag = _lag(measured)
    usage = _usage(measured)
    return BenchFigures(
        BenchRequests(len(measured), len(records) - len(measured), len(ok), len(measured) - len(ok), in_tok, out_tok,
                      span, window[0], window[1]),
        BenchLatency(*(Percentiles.of(lat[k]) for k in ("ttft", "tpot", "itl", "e2e"))),
        Cdf.of({"e2e_s": lat["e2e"], "ttft_s": lat["ttft"], "tpot_s": lat["tpot"]}),
        BenchRates(rate(len(ok)), rate(out_tok), rate(in_tok + out_tok)), _offered(measured), rate(len(measured)),
        BenchGoodput(rate(good["met"]), rate(good["tokens"]), Slo(slo_ttft_s, slo_tpot_s),
                     good["met"] / len(measured) if measured else 0.0),
        tuple((k, kinds.get(k, 0)) for k in STATUSES if k != "ok"), tuple(_examples(measured).items()), usage, lag,
        validity(span, len(measured), len(ok), lag.behind, interrupted, min_duration_s, min_queries,
                 implausible_usage=usage.implausible),
        tuple((k, tuple(float(x) for x in lat[k.removesuffix("_s")])) for k in ("ttft_s", "tpot_s", "e2e_s")))


def _examples(measured: Sequence[RequestRecord]) -> dict[str, str]:
    """The first measured request's error of each kind that failed (what the server answered, in a line)."""
    out: dict[str, str] = {}
    for r in measured:
        if not r.ok and r.status not in out:
            out[r.status] = r.error[:300]
    return out


def _good(ok: list[RequestRecord], lat: dict[str, np.ndarray], slo_ttft_s: float | None,
          slo_tpot_s: float | None) -> dict[str, int]:
    """Requests (and their output tokens) that ended ok within both limits; without limits, every ok one."""
    timed = [r for r in ok if r.first_token_s is not None]
    met = np.ones(len(timed), dtype=bool)
    if slo_ttft_s is not None:
        met &= lat["ttft"] <= slo_ttft_s
    if slo_tpot_s is not None:
        met &= lat["tpot_per_request"] <= slo_tpot_s
    return {"met": int(met.sum()), "tokens": int(sum(output_tokens(r) for r, m in zip(timed, met) if m))}


RULE = ("MLPerf LoadGen: minimum duration (600 s) and query count met, every query answered; here also every usage "
        "count plausible, the open loop on schedule and the run not interrupted")


@dataclass(frozen=True)
class Validity:
    """VALID or INVALID with every reason (module docstring), the limits applied and the rule. Written in
    bench.json as ``validity``."""

    valid: bool
    verdict: str
    reason: str
    min_duration_s: float
    min_queries: int
    rule: str = RULE


def validity(span_s: float, measured: int, ok: int, behind: bool, interrupted: bool, min_duration_s: float,
             min_queries: int, implausible_usage: int = 0) -> Validity:
    """VALID or INVALID with every reason (see the module docstring)."""
    reasons = []
    if span_s < min_duration_s:
        reasons.append(f"ran {span_s:.3g} s, under the minimum {min_duration_s:g} s")
    if measured < min_queries:
        reasons.append(f"{measured} requests measured, under the minimum {min_queries}")
    if ok < measured:
        reasons.append(f"{measured - ok} of {measured} requests failed")
    if implausible_usage:
        reasons.append(f"{implausible_usage} of {ok} ok requests reported implausible usage counts (set aside: "
                       "their text events counted instead)")
    if behind:
        reasons.append(f"the sends fell behind schedule (p99 lag over {LAG_LIMIT_S * 1e3:g} ms)")
    if interrupted:
        reasons.append("interrupted")
    valid = not reasons
    return Validity(valid, "VALID" if valid else "INVALID",
                    "; ".join(reasons) if reasons else f"{measured} requests over {span_s:.3g} s, all ok, on schedule",
                    min_duration_s, min_queries)
