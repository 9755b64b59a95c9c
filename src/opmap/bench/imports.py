"""Result files of other load tools read into opmap's bench record (``opmap bench --from FILE``): parsed with
``json`` only, bounded in size (opmap.safeio) and depth, never executed. Each reader returns an ``Imported``: the
requests as RequestRecords where the file has one row per request (granularity "per-request": the figures are then
computed by opmap.bench.metrics exactly as for ``opmap bench``), else the tool's own percentiles (granularity
"percentiles"). The formats, each from the code that writes it:

- vllm: ``vllm bench serve --save-result`` (vLLM v0.11.0, vllm/benchmarks/serve.py ``benchmark()`` and ``main()``,
  https://github.com/vllm-project/vllm/blob/v0.11.0/vllm/benchmarks/serve.py): model_id, backend, num_prompts,
  request_rate ("inf" or a number), max_concurrency, duration (s), completed, request_throughput,
  output_throughput, total_token_throughput, total_input_tokens, total_output_tokens, then per metric (ttft,
  tpot, itl, e2el) mean_/median_/std_/pNN_ METRIC _ms; with --save-detailed also input_lens, output_lens, ttfts (s),
  itls (lists, s) and errors per request. The file has no send times: its rows are per-request latencies, and the
  rates are the file's (``duration``).
- aiperf: AIPerf's profile export (aiperf 0.13.0): profile_export.jsonl, one record per request (metadata
  request_start_ns / request_end_ns, metrics time_to_first_token, inter_chunk_latency, request_latency in ms,
  usage_prompt_tokens, usage_completion_tokens; an ``error`` object on a failed one; e2e here is request_end_ns -
  request_start_ns, the stream's end as opmap's, where AIPerf's request_latency stops at the last chunk), beside
  profile_export_aiperf.json (the summary: aiperf_version, input_config, and per metric unit, avg, p50, p90, p95,
  p99). Either file, or the artifact folder.
- guidellm: GuideLLM's JSON report (guidellm 0.8.1, guidellm/benchmark/schemas/report.py
  GenerativeBenchmarksReport): benchmarks[i].metrics with StatusDistributionSummary values (successful.mean,
  .percentiles.p50 ... p99): request_latency (s), time_to_first_token_ms, time_per_output_token_ms,
  inter_token_latency_ms, requests_per_second, output_tokens_per_second, request_totals; one benchmark is read
  (``index``); its ``requests`` (GenerativeRequestStats: request_start_time, time_to_first_token_ms,
  info.timings.last_token_iteration, request_end_time, prompt_tokens, output_tokens) as records where it kept
  every request.
- inference-perf: per_request_lifecycle_metrics.json (``report.request_lifecycle.per_request``: a list of
  RequestLifecycleMetric, inference_perf/apis/base.py: start_time, end_time (s, monotonic), error, info.request_metrics
  .text.input_tokens, info.response_metrics.{output_tokens, chunk_times, output_token_times, server_usage}), else
  its summary report (inference-perf 0.7.0, inference_perf/reportgen/base.py ``summarize_requests``,
  written as summary_lifecycle_metrics.json or stage_N_lifecycle_metrics.json): load_summary, successes (count,
  latency.{request_latency, time_to_first_token, time_per_output_token, inter_token_latency} with mean, median,
  p90, p95, p99 in s; throughput), failures.count.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from opmap.bench.records import RequestRecord, usage_counts
from opmap.errors import OpmapError
from opmap.record import key

if TYPE_CHECKING:
    from opmap.bench.metrics import BenchFigures

FORMATS = ("vllm", "guidellm", "aiperf", "inference-perf")
TOOLS = {"vllm": "vllm bench serve", "guidellm": "GuideLLM", "aiperf": "AIPerf", "inference-perf": "inference-perf"}
SOURCES = {
    "vllm": ("https://github.com/vllm-project/vllm/blob/v0.11.0/vllm/benchmarks/serve.py (benchmark(), main(); "
             "tag v0.11.0, commit f71952c1c as the release wheel's vllm/_version.py names it)"),
    "aiperf": "aiperf 0.13.0 (PyPI): profile_export.jsonl and profile_export_aiperf.json as `aiperf profile` writes",
    "guidellm": "guidellm 0.8.1 (PyPI): guidellm/benchmark/schemas/report.py GenerativeBenchmarksReport",
    "inference-perf": "inference-perf 0.7.0 (PyPI): inference_perf/reportgen/base.py summarize_requests"}
LIMIT_BYTES = 256 << 20  # a detailed vLLM file or an AIPerf JSONL of a million requests is a few hundred MB
MAX_DEPTH = 32  # the deepest of these formats nests about 8 levels
STATS = ("mean_s", "p50_s", "p90_s", "p95_s", "p99_s")
METRICS = ("ttft", "tpot", "itl", "e2e")


@dataclass(frozen=True)
class Stat:
    """One latency's statistics as a tool reported them (s; None where it reported none)."""

    mean_s: float | None = None
    p50_s: float | None = None
    p90_s: float | None = None
    p95_s: float | None = None
    p99_s: float | None = None

    def to_dict(self) -> dict[str, float | None]:
        return {k: getattr(self, k) for k in STATS}


@dataclass(frozen=True)
class Summary:
    """A run's figures as the tool computed them: latency statistics by metric (ttft, tpot, itl, e2e), requests
    measured and ok, token totals (None: not in the file), the window (s) and the rates (per s)."""

    latency: dict[str, Stat]
    measured: int
    ok: int
    input_tokens: int | None
    output_tokens: int | None
    window_s: float | None
    requests_per_s: float | None
    output_tokens_per_s: float | None
    tokens_per_s: float | None


@dataclass(frozen=True)
class Imported:
    """One imported run. ``granularity``: "per-request" (``records`` hold every request, times in s from the
    first send; ``summary`` may hold the file's own rates where it has no send times) or "percentiles"
    (``summary`` only). ``mode`` open / closed with ``concurrency`` or ``rate_per_s`` (None: all at once);
    ``input_len`` / ``output_len``: the mean lengths asked (tokens); ``notes``: what was approximated. Its record
    is bench.json's ``imported`` block: where the run came from and how it was read (``RECORD``)."""

    RECORD: ClassVar[tuple[str, ...]] = ("tool", "fmt", "version", "format_source", "file", "sha256", "granularity",
                                         "requests_in_file", "notes")
    fmt: str = field(metadata=key("format"))
    version: str | None = field(metadata=key("tool_version"))
    file: str
    sha256: str
    granularity: str
    model: str | None
    base_url: str | None
    api: str | None
    mode: str
    concurrency: int | None
    rate_per_s: float | None
    input_len: float | None
    output_len: float | None
    records: tuple[RequestRecord, ...]
    summary: Summary | None
    started_unix_s: float
    wall_s: float
    notes: tuple[str, ...] = ()

    @property
    def tool(self) -> str:
        return TOOLS[self.fmt]

    @property
    def format_source(self) -> str:
        """The code that writes the format, where opmap read it from (SOURCES)."""
        return SOURCES[self.fmt]

    @property
    def requests_in_file(self) -> int:
        """The requests the file holds: its rows, else those its statistics cover (0: neither)."""
        return len(self.records) if self.records else (self.summary.measured if self.summary else 0)


@dataclass(frozen=True)
class ImportedSpec:
    """bench.json's ``spec`` of an imported run: the load as the file states it (opmap.bench.outputs.bench_tags
    reads it): the arrival (None: a closed loop; "rate:R" or "offline"), concurrency, requests, the mean lengths
    asked (tokens, as text), the API and the tool; a file states no duration, warm-up or seed (None, 0, None)."""

    arrival: str | None
    concurrency: int | None
    requests: int | None
    duration_s: None
    warmup: int
    input_len: str | None
    output_len: str | None
    seed: None
    api: str | None
    imported_from: str


# ---- reading --------------------------------------------------------------------------------------------------


def _depth_ok(v: Any) -> bool:
    """Whether ``v`` nests at most MAX_DEPTH levels (iterative: a hostile file cannot exhaust the stack)."""
    stack = [(v, 0)]
    while stack:
        x, d = stack.pop()
        if d > MAX_DEPTH:
            return False
        if isinstance(x, dict):
            stack.extend((y, d + 1) for y in x.values() if isinstance(y, (dict, list)))
        elif isinstance(x, list):
            stack.extend((y, d + 1) for y in x if isinstance(y, (dict, list)))
    return True


def _loads(text: str, where: str) -> Any:
    try:
        v = json.loads(text, parse_constant=lambda c: None)  # NaN / Infinity: not a measurement
    except (ValueError, RecursionError) as e:
        raise OpmapError(f"{where} is not JSON ({type(e).__name__}): accepted: {_accepted()}") from None
    if not _depth_ok(v):
        raise OpmapError(f"{where} nests deeper than {MAX_DEPTH} levels: not a result file of {_accepted()}")
    return v


def _accepted() -> str:
    return "the result files of " + ", ".join(f"{TOOLS[f]} (--format {f})" for f in FORMATS)


def _read(path: Path) -> tuple[str, str]:
    """(text, sha256) of a file, bounded."""
    from opmap.safeio import read_bounded

    data = read_bounded(path, LIMIT_BYTES, "result file")
    try:
        return data.decode("utf-8-sig"), hashlib.sha256(data).hexdigest()
    except UnicodeDecodeError:
        raise OpmapError(f"{path} is not UTF-8 text: accepted: {_accepted()}") from None


def _jsonl(text: str, where: str) -> list[Any]:
    return [_loads(line, f"{where} line {i + 1}") for i, line in enumerate(text.splitlines()) if line.strip()]


def detect(doc: Any) -> str | None:
    """The format of a parsed file, from its content (None: none of FORMATS)."""
    if isinstance(doc, list) and doc and isinstance(doc[0], dict):
        m = doc[0].get("metadata")
        if isinstance(m, dict) and "request_start_ns" in m and isinstance(doc[0].get("metrics"), dict):
            return "aiperf"
        if {"start_time", "end_time", "info"} <= doc[0].keys():
            return "inference-perf"
        return None
    if not isinstance(doc, dict):
        return None
    if "aiperf_version" in doc:
        return "aiperf"
    if isinstance(doc.get("benchmarks"), list) and ("metadata" in doc or "config" in doc):
        return "guidellm"
    if {"load_summary", "successes", "failures"} <= doc.keys():
        return "inference-perf"
    if {"completed", "duration", "request_throughput"} <= doc.keys() and ("backend" in doc or "model_id" in doc):
        return "vllm"
    return None


# ---- helpers the format readers share ---------------------------------------------------------------------------


def num(v: Any, where: str, *, lo: float = 0.0) -> float | None:
    """A finite number >= ``lo`` (None where absent); anything else is one line naming the field."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < lo:
        raise OpmapError(f"{where}: {str(v)[:40]!r} is not a number >= {lo:g}")
    return float(v)


def count(v: Any, where: str) -> int | None:
    x = num(v, where)
    if x is None:
        return None
    if x != int(x):
        raise OpmapError(f"{where}: {v!r} is not a count")
    return int(x)


def _whole(v: Any) -> Any:
    """A count a tool wrote as a float (AIPerf's 16.0) as an int; anything else as it is (usage_counts judges)."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def record(i: int, sent: float, ttft: float | None, gaps: list[float], end: float | None, n_in: int, n_out: int,
           usage_in: Any, usage_out: Any, error: str = "", status: str = "ok") -> RequestRecord:
    """One request's RequestRecord from a tool's per-request times (s): send, time to first token, the gaps
    between its text events after the first (zero gaps merged: one event carried several tokens), end."""
    if status != "ok" or ttft is None:
        return RequestRecord(i, None, sent, None, (), sent if end is None else end, n_in, n_out, None, None, 0,
                             status if status != "ok" else "stream_error", error or "no first token")
    times = [sent + ttft]
    for g in gaps:
        if g > 0:
            times.append(times[-1] + g)
    end_s = times[-1] if end is None else max(end, times[-1])
    p, c, why = usage_counts(_whole(usage_in), _whole(usage_out), n_in, n_out)
    return RequestRecord(i, None, sent, times[0], tuple(times), end_s, n_in, n_out, p, c, len(times), "ok",
                         usage_error=why)


# ---- onto opmap's bench record ----------------------------------------------------------------------------------


def as_result(run: Imported):
    """The run as a BenchResult (its records; none for a percentiles-only file)."""
    from opmap.bench.records import BenchResult

    return BenchResult(run.records, run.base_url or f"(imported from {run.tool})", run.model or "(not in the file)",
                       run.api or "completions", run.mode, run.concurrency, run.started_unix_s, run.wall_s,
                       options={"imported_from": run.tool})


def spec(run: Imported) -> ImportedSpec:
    """The load of an imported run as its file states it (``ImportedSpec``)."""
    arrival = None if run.mode == "closed" else (f"rate:{run.rate_per_s:g}" if run.rate_per_s else "offline")
    n = len(run.records) if run.records else (run.summary.measured if run.summary else None)
    return ImportedSpec(arrival, run.concurrency, n, None, 0, None if run.input_len is None else f"{run.input_len:g}",
                        None if run.output_len is None else f"{run.output_len:g}", None, run.api, run.tool)


def figures(run: Imported, min_duration_s: float, min_queries: int) -> BenchFigures:
    """The figures of bench.json: opmap.bench.metrics.summarize of the records (per-request), the rates the tool
    measured where the file has no send times; the tool's own statistics where it has only those."""
    from dataclasses import replace

    from opmap.bench.metrics import summarize
    from opmap.serve.metrics import Percentiles

    if run.records:
        fig = summarize(run.records, min_duration_s=min_duration_s, min_queries=min_queries)
        if run.fmt == "vllm" and run.summary is not None:  # no send times: the window and rates are vLLM's
            fig = _tool_rates(fig, run.summary, min_duration_s, min_queries)
        if run.fmt == "guidellm" and run.summary is not None:  # first and last token only: ITL is GuideLLM's
            itl = Percentiles(**run.summary.latency["itl"].to_dict())
            fig = replace(fig, latency=replace(fig.latency, itl=itl))
        return fig
    return _percentile_figures(run.summary, min_duration_s, min_queries)


def _tool_rates(fig: BenchFigures, s: Summary, min_duration_s: float, min_queries: int) -> BenchFigures:
    """``fig`` with vLLM's window (its ``duration``) and rates; goodput over that window; validity on it."""
    from dataclasses import replace

    from opmap.bench.metrics import BenchRates, validity

    r, w = fig.requests, s.window_s or 0.0
    good = fig.goodput.attainment * r.measured  # requests within the limits, over vLLM's duration
    goodput = replace(fig.goodput, requests_per_s=good / w if w > 0 else 0.0,
                      output_tokens_per_s=((s.output_tokens_per_s or 0.0) * good / r.ok) if r.ok else 0.0)
    return replace(fig, requests=replace(r, window_s=s.window_s), offered_per_s=None, sent_per_s=None,
                   throughput=BenchRates(s.requests_per_s, s.output_tokens_per_s, s.tokens_per_s), goodput=goodput,
                   validity=validity(w, r.measured, r.ok, False, False, min_duration_s, min_queries))


def _percentile_figures(s: Summary, min_duration_s: float, min_queries: int) -> BenchFigures:
    """The figures from a tool's statistics: those of opmap.bench.metrics.summarize, None where the tool reported
    nothing (token totals, rates, usage), no per-request samples and no CDF (its quantiles only)."""
    import numpy as np

    from opmap.bench import metrics as bm
    from opmap.serve.metrics import Cdf, Percentiles

    w = s.window_s or 0.0
    return bm.BenchFigures(
        bm.BenchRequests(s.measured, 0, s.ok, s.measured - s.ok, s.input_tokens, s.output_tokens, w, 0.0, w),
        bm.BenchLatency(*(Percentiles(**s.latency[m].to_dict()) for m in METRICS)),
        Cdf.of({k: np.empty(0) for k in ("e2e_s", "ttft_s", "tpot_s")}),  # no sample: each series None
        bm.BenchRates(s.requests_per_s, s.output_tokens_per_s, s.tokens_per_s), None, None,
        # without limits every ok request counts (as opmap.bench.metrics.summarize does)
        bm.BenchGoodput(s.requests_per_s, s.output_tokens_per_s, bm.Slo(None, None),
                        s.ok / s.measured if s.measured else 0.0),
        (("failed", s.measured - s.ok),), (),
        bm.UsageCheck(None, 0, None, None, None, None, None, None, None),
        bm.SchedulerLag(False),
        bm.validity(w, s.measured, s.ok, False, False, min_duration_s, min_queries),
        (("ttft_s", ()), ("tpot_s", ()), ("e2e_s", ())))
