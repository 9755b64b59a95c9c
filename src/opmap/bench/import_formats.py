"""One reader per tool's result format (opmap.bench.imports has the formats' sources and the shared checks): each
maps a parsed file onto an ``Imported``. Units as each tool writes them: vLLM's summary in ms and its detailed lists
in s, AIPerf in ms (ns timestamps), GuideLLM's request_latency in s and its *_ms metrics in ms, inference-perf in
s."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opmap.bench.imports import (
    FORMATS,
    SOURCES,
    TOOLS,
    Imported,
    Stat,
    Summary,
    _accepted,
    _jsonl,
    _loads,
    _read,
    count,
    detect,
    num,
    record,
)
from opmap.errors import OpmapError

MS = 1e-3


def read_result(path: str | Path, fmt: str | None = None, index: int = 0) -> Imported:
    """The run in ``path`` (a file; an AIPerf artifact folder or an inference-perf report folder), its format
    detected from the content unless ``fmt`` names it; one line (OpmapError) for a file none of the readers takes."""
    if fmt is not None and fmt not in FORMATS:
        raise OpmapError(f"--format {fmt!r}: accepted: {', '.join(FORMATS)}")
    p = Path(path)
    if p.is_dir():
        p = _in_folder(p)
    text, digest = _read(p)
    stripped = text.lstrip()
    doc = _jsonl(text, str(p)) if stripped.startswith("{") and "\n{" in text.strip() and p.suffix == ".jsonl" \
        else _loads(text, str(p))
    found = detect(doc)
    if found is None:
        raise OpmapError(f"{p}: not a result file of a known tool: accepted: {_accepted()}")
    if fmt is not None and fmt != found:
        raise OpmapError(f"{p} is a {TOOLS[found]} file, not {TOOLS[fmt]} (--format {fmt}): give --format {found} "
                         "or leave it out")
    reader = {"vllm": vllm, "aiperf": aiperf, "guidellm": guidellm, "inference-perf": inference_perf}[found]
    try:
        return reader(doc, p, digest, index)
    except (KeyError, TypeError, AttributeError, IndexError) as e:
        raise OpmapError(f"{p}: a malformed {TOOLS[found]} file ({type(e).__name__}: {str(e)[:80]}): expected "
                         f"the format of {SOURCES[found]}") from None


def _in_folder(d: Path) -> Path:
    """The file to read in a tool's output folder: AIPerf's summary (its JSONL is read beside it), inference-perf's
    summary report."""
    for name in ("profile_export_aiperf.json", "profile_export.jsonl", "per_request_lifecycle_metrics.json",
                 "summary_lifecycle_metrics.json"):
        if (d / name).is_file():
            return d / name
    raise OpmapError(f"{d} holds no profile_export_aiperf.json (AIPerf) or summary_lifecycle_metrics.json "
                     f"(inference-perf): give the result file itself ({_accepted()})")


def _stat(get, where: str, scale: float) -> Stat:
    """A Stat from ``get(name)`` for mean, p50, p90, p95, p99 (scaled to s)."""
    vals = {}
    for k in ("mean", "p50", "p90", "p95", "p99"):
        v = num(get(k), f"{where} {k}")
        vals[f"{k}_s"] = None if v is None else v * scale
    return Stat(**vals)


def _rate(v: Any) -> float | None:
    """vLLM's request_rate: "inf" (all at once) or a number of requests/s."""
    if v in (None, "inf") or (isinstance(v, float) and v == float("inf")):
        return None
    return num(v, "request_rate", lo=1e-12)


# ---- vLLM bench serve ------------------------------------------------------------------------------------------


def vllm(d: dict, path: Path, digest: str, index: int) -> Imported:
    """``vllm bench serve --save-result`` (opmap.bench.imports): per-request rows with --save-detailed, else the
    percentiles it saved (--metric-percentiles, default 99, with mean and median)."""
    names = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e": "e2el"}
    lat = {m: _stat(lambda k, n=n: d.get(f"{'median' if k == 'p50' else k}_{n}_ms"), f"{n}", MS)
           for m, n in names.items()}
    dur = num(d["duration"], "duration")
    n = count(d.get("num_prompts"), "num_prompts")
    ok = count(d["completed"], "completed")
    conc = count(d.get("max_concurrency"), "max_concurrency")
    rate = _rate(d.get("request_rate"))
    mode = "closed" if conc is not None and rate is None else "open"
    summ = Summary(lat, n if n is not None else ok, ok, count(d.get("total_input_tokens"), "total_input_tokens"),
                   count(d.get("total_output_tokens"), "total_output_tokens"), dur,
                   num(d.get("request_throughput"), "request_throughput"),
                   num(d.get("output_throughput"), "output_throughput"),
                   num(d.get("total_token_throughput"), "total_token_throughput"))
    notes = ["vLLM's file has no send times: per-request latencies are its own, rates are its own over its "
             "duration", "e2e = TTFT + the sum of the request's ITLs (the last token's arrival; vLLM's own latency, "
             "to the stream's end, is not saved per request)"]
    records: tuple = ()
    ins = outs = None
    if isinstance(d.get("ttfts"), list):
        records = _vllm_records(d)
        ins = sum(r.input_tokens_asked for r in records) / max(1, len(records))
        outs = sum(r.output_tokens_asked for r in records) / max(1, len(records))
    elif summ.ok:
        ins = (summ.input_tokens or 0) / summ.ok
        outs = (summ.output_tokens or 0) / summ.ok
    return Imported("vllm", d.get("vllm_version") if isinstance(d.get("vllm_version"), str) else None, str(path),
                    digest, "per-request" if records else "percentiles",
                    str(d.get("model_id")) if d.get("model_id") is not None else None, None,
                    str(d.get("backend") or d.get("endpoint_type") or "") or None, mode, conc, rate, ins, outs,
                    records, summ, 0.0, dur or 0.0, tuple(notes))


def _vllm_records(d: dict) -> tuple:
    """--save-detailed's lists, one record per request; sends spaced as the file's load allows (closed loop or
    all at once: 0; an open loop at rate R: i / R, vLLM drawing its own gaps)."""
    ttfts, itls, ins, outs, errs = d["ttfts"], d["itls"], d["input_lens"], d["output_lens"], d["errors"]
    n = len(ttfts)
    if not all(isinstance(x, list) and len(x) == n for x in (itls, ins, outs, errs)):
        raise OpmapError("vLLM result: ttfts, itls, input_lens, output_lens and errors are lists of one length "
                         "(--save-detailed)")
    rate = _rate(d.get("request_rate"))
    out = []
    for i in range(n):
        sent = i / rate if rate else 0.0
        n_in, n_out = count(ins[i], f"input_lens[{i}]") or 0, count(outs[i], f"output_lens[{i}]") or 0
        err = errs[i] if isinstance(errs[i], str) else str(errs[i])[:300]
        if err:
            out.append(record(i, sent, None, [], None, n_in, n_out, None, None, err[:300], "http_error"))
            continue
        gaps = [num(g, f"itls[{i}]") for g in itls[i]]
        out.append(record(i, sent, num(ttfts[i], f"ttfts[{i}]"), gaps, None, n_in, n_out, n_in, n_out))
    return tuple(out)


# ---- AIPerf ----------------------------------------------------------------------------------------------------


def aiperf(doc: Any, path: Path, digest: str, index: int) -> Imported:
    """AIPerf's profile export: the JSONL's records where present (beside the summary, or given), else the
    summary's percentiles."""
    if isinstance(doc, list):
        rows, summary_path = doc, path.with_name("profile_export_aiperf.json")
        summary = _side(summary_path)
    else:
        summary, rows = doc, None
        jl = path.with_name("profile_export.jsonl")
        if jl.is_file():
            rows = _jsonl(_read(jl)[0], str(jl))
    cfg = (summary or {}).get("input_config") or {}
    phase = next((p for p in cfg.get("phases") or [] if p.get("kind") == "profiling"), {})
    conc = count(phase.get("concurrency"), "phases.concurrency")
    rate = num(phase.get("request_rate"), "phases.request_rate") if phase.get("request_rate") else None
    ep = cfg.get("endpoint") or {}
    models = ((cfg.get("models") or {}).get("items") or [{}])
    prompts = ((cfg.get("datasets") or [{}])[0].get("prompts") or {})
    osl = num((prompts.get("osl") or {}).get("mean"), "osl.mean")
    isl = num((prompts.get("isl") or {}).get("mean"), "isl.mean")
    records = _aiperf_records(rows, isl, osl) if rows else ()
    summ = _aiperf_summary(summary) if summary else None
    start = min((r["metadata"]["request_start_ns"] for r in rows), default=0) / 1e9 if rows else 0.0
    wall = (max((r["metadata"].get("request_end_ns") or 0 for r in rows), default=0) / 1e9 - start) if rows else (
        summ.window_s or 0.0)
    return Imported("aiperf", (summary or {}).get("aiperf_version"), str(path), digest,
                    "per-request" if records else "percentiles", models[0].get("name"),
                    (ep.get("urls") or [None])[0], ep.get("type"),
                    "closed" if conc is not None else "open", conc, rate, isl, osl, records, summ, start, wall,
                    () if summary else ("profile_export_aiperf.json not beside the records: the load (concurrency "
                                        "or rate) and the lengths asked are not known",))


def _side(p: Path) -> dict | None:
    if not p.is_file():
        return None
    d = _loads(_read(p)[0], str(p))
    return d if isinstance(d, dict) else None


def _m(metrics: dict, name: str, where: str, scale: float = 1.0):
    v = (metrics.get(name) or {}).get("value")
    if isinstance(v, list):
        return [num(x, f"{where} {name}") * scale for x in v]
    x = num(v, f"{where} {name}")
    return None if x is None else x * scale


def _aiperf_records(rows: list, isl: float | None, osl: float | None) -> tuple:
    """Each JSONL record as a RequestRecord (times s from the first request_start_ns)."""
    rows = [r for r in rows if (r.get("metadata") or {}).get("benchmark_phase", "profiling") == "profiling"]
    t0 = min(count(r["metadata"]["request_start_ns"], "request_start_ns") for r in rows)
    out = []
    for i, r in enumerate(sorted(rows, key=lambda r: r["metadata"]["request_start_ns"])):
        md, m, where = r["metadata"], r.get("metrics") or {}, f"record {i}"
        sent = (count(md["request_start_ns"], f"{where} request_start_ns") - t0) / 1e9
        end_ns = count(md.get("request_end_ns"), f"{where} request_end_ns")
        end = None if end_ns is None else (end_ns - t0) / 1e9
        n_in = int(_m(m, "input_sequence_length", where) or isl or 0)
        n_out = int(osl or _m(m, "output_sequence_length", where) or 0)
        err = r.get("error")
        if err:
            code = err.get("code") if isinstance(err, dict) else None
            msg = err[:300] if isinstance(err, str) else _quoted(err)
            out.append(record(i, sent, None, [], end, n_in, n_out, None, None, msg,
                              "http_error" if code else "stream_error"))
            continue
        ttft = _m(m, "time_to_first_token", where, MS)
        gaps = _m(m, "inter_chunk_latency", where, MS) or []
        out.append(record(i, sent, ttft, gaps if isinstance(gaps, list) else [gaps], end, n_in, n_out,
                          _m(m, "usage_prompt_tokens", where), _m(m, "usage_completion_tokens", where)))
    return tuple(out)


def _aiperf_summary(s: dict) -> Summary:
    def st(name):
        d = s.get(name) or {}
        scale = MS if d.get("unit") == "ms" else 1.0
        return _stat(lambda k: d.get("avg" if k == "mean" else k), name, scale)

    lat = {"ttft": st("time_to_first_token"), "tpot": st("inter_token_latency"), "itl": st("inter_chunk_latency"),
           "e2e": st("request_latency")}
    avg = (lambda k: num((s.get(k) or {}).get("avg"), k))
    ok = int(avg("completed_request_count") if avg("completed_request_count") is not None
             else avg("request_count") or 0)
    errors = sum(count(e.get("count"), "error_summary count") or 0 for e in s.get("error_summary") or []
                 if isinstance(e, dict))
    return Summary(lat, ok + errors, ok,
                   int(avg("total_isl") or 0), int(avg("total_osl") or 0), avg("benchmark_duration"),
                   avg("request_throughput"), avg("output_token_throughput"), avg("total_token_throughput"))


# ---- GuideLLM --------------------------------------------------------------------------------------------------


def guidellm(d: dict, path: Path, digest: str, index: int) -> Imported:
    """One benchmark (``index``) of a GuideLLM report: its successful requests' distributions."""
    bs = d["benchmarks"]
    if not 0 <= index < len(bs):
        raise OpmapError(f"{path} holds {len(bs)} GuideLLM benchmarks: --index takes 0 to {len(bs) - 1}")
    b = bs[index]
    m = b["metrics"]

    def st(name, scale):
        s = (m.get(name) or {}).get("successful") or {}
        pc = s.get("percentiles") or {}
        return _stat(lambda k: s.get("mean") if k == "mean" else pc.get(k), name, scale)

    lat = {"ttft": st("time_to_first_token_ms", MS), "tpot": st("time_per_output_token_ms", MS),
           "itl": st("inter_token_latency_ms", MS), "e2e": st("request_latency", 1.0)}
    tot = m.get("request_totals") or {}
    ok = count(tot.get("successful"), "request_totals.successful") or 0
    measured = count(tot.get("total"), "request_totals.total") or ok
    mean = (lambda name: num(((m.get(name) or {}).get("successful") or {}).get("mean"), name))
    n_in, n_out = mean("prompt_token_count"), mean("output_token_count")
    sch = b.get("scheduler_metrics") or {}
    window = None
    if sch.get("measure_end_time") is not None and sch.get("measure_start_time") is not None:
        window = num(sch["measure_end_time"] - sch["measure_start_time"], "measure window")
    summ = Summary(lat, measured, ok, None if n_in is None else int(round(n_in * ok)),
                   None if n_out is None else int(round(n_out * ok)), window, mean("requests_per_second"),
                   mean("output_tokens_per_second"), mean("tokens_per_second"))
    strat = (b.get("config") or {}).get("strategy") or {}
    streams = count(strat.get("streams"), "strategy.streams") if isinstance(strat.get("streams"), int) else None
    rate = num(strat.get("rate"), "strategy.rate") if isinstance(strat.get("rate"), (int, float)) else None
    cfg = d.get("config") or {}
    backend = cfg.get("backend") or (cfg.get("spec") or {}).get("backend") or {}
    model = backend.get("model")
    fmt = backend.get("request_format")
    version = (d.get("metadata") or {}).get("guidellm_version")
    records = _guidellm_records(b, measured)
    notes = (("GuideLLM keeps each request's first and last token times, not every token's: ITL is its own "
              "distribution",) if records else
             ("GuideLLM's report holds a sample of the requests (or none): its distributions are read",))
    return Imported("guidellm", version if isinstance(version, str) else None, str(path), digest,
                    "per-request" if records else "percentiles", model if isinstance(model, str) else None,
                    backend.get("target"), "chat" if fmt == "/v1/chat/completions" else "completions" if fmt else None,
                    "closed" if streams else "open", streams, rate, n_in, n_out, records, summ,
                    num(sch.get("start_time"), "start_time") or 0.0, window or 0.0, notes)


def _guidellm_records(b: dict, total: int) -> tuple:
    """The benchmark's requests (``requests.successful``, ``errored``, ``incomplete``: GenerativeRequestStats,
    guidellm/benchmark/schemas/generative/entrypoints) as records, where the report kept all ``total`` of them:
    send = request_start_time, first token = send + time_to_first_token_ms, the last token at
    timings.last_token_iteration, end = request_end_time (the stream's end, as opmap's e2e and GuideLLM's
    request_latency); () where it kept a sample."""
    reqs = b.get("requests") or {}
    rows = [(st, r) for st in ("successful", "errored", "incomplete") for r in reqs.get(st) or []]
    if not rows or len(rows) != total:
        return ()
    t0 = min(num(r["request_start_time"], "request_start_time") for _, r in rows)
    out = []
    for i, (st, r) in enumerate(sorted(rows, key=lambda x: x[1]["request_start_time"])):
        where = f"request {i}"
        sent = num(r["request_start_time"], where) - t0
        tm = (r.get("info") or {}).get("timings") or {}
        last = tm.get("last_token_iteration")
        last = None if last is None else num(last, f"{where} last_token_iteration") - t0
        end = None if r.get("request_end_time") is None else num(r["request_end_time"], where) - t0
        n_in, n_out = count(r.get("prompt_tokens"), where) or 0, count(r.get("output_tokens"), where) or 0
        ttft = num(r.get("time_to_first_token_ms"), f"{where} time_to_first_token_ms")
        if st != "successful" or ttft is None:
            out.append(record(i, sent, None, [], end, n_in, n_out, None, None, f"GuideLLM: {st}",
                              "http_error" if st == "errored" else "dropped"))
            continue
        first = sent + ttft * MS
        gaps = [last - first] if last is not None and last > first else []
        rec = record(i, sent, ttft * MS, gaps, end, n_in, n_out, n_in, n_out)
        out.append(rec)
    return tuple(out)


# ---- inference-perf --------------------------------------------------------------------------------------------


def inference_perf(d: Any, path: Path, digest: str, index: int) -> Imported:
    """inference-perf's per-request report (a list), else its summary (or per-stage) lifecycle report: its
    successes' distributions (s). The load is read from its config.yaml where it lies beside (not parsed: YAML is
    left alone), so a per-request file's load is its own concurrency only where the summary beside says it."""
    if isinstance(d, list):
        return _ip_requests(d, path, digest)
    s, f, ld = d["successes"], d["failures"], d["load_summary"]
    lt = s.get("latency") or {}

    def st(name):
        x = lt.get(name) or {}
        return _stat(lambda k: x.get("median") if k == "p50" else x.get(k), name, 1.0)

    lat = {"ttft": st("time_to_first_token"), "tpot": st("time_per_output_token"),
           "itl": st("inter_token_latency"), "e2e": st("request_latency")}
    ok = count(s.get("count"), "successes.count") or 0
    failed = count(f.get("count"), "failures.count") or 0
    tp = s.get("throughput") or {}
    mean = (lambda x, k: num((x or {}).get("mean") if isinstance(x, dict) else None, k))
    n_in, n_out = mean(s.get("prompt_tokens"), "prompt_tokens"), mean(s.get("output_len"), "output_len")
    window = num(d.get("benchmark_time_seconds"), "benchmark_time_seconds")
    summ = Summary(lat, ok + failed, ok, None if n_in is None else int(round(n_in * ok)),
                   None if n_out is None else int(round(n_out * ok)), window,
                   num(tp.get("requests_per_sec"), "requests_per_sec"),
                   num(tp.get("output_tokens_per_sec"), "output_tokens_per_sec"),
                   num(tp.get("total_tokens_per_sec"), "total_tokens_per_sec"))
    conc = count(ld.get("concurrency"), "load_summary.concurrency")
    rate = num(ld.get("requested_rate"), "load_summary.requested_rate") if conc is None else None
    return Imported("inference-perf", None, str(path), digest, "percentiles", None, None, None,
                    "closed" if conc else "open", conc, rate, n_in, n_out, (), summ, 0.0, window or 0.0,
                    ("inference-perf's summary report: its distributions are read (the model and server are in "
                     "its config, not its report)",))


def _ip_requests(rows: list, path: Path, digest: str) -> Imported:
    """per_request_lifecycle_metrics.json: one RequestLifecycleMetric a row; the load from a stage report beside
    (stage_0_lifecycle_metrics.json's load_summary), if any."""
    t0 = min(num(r["start_time"], "start_time") for r in rows)
    recs = []
    for i, r in enumerate(sorted(rows, key=lambda r: r["start_time"])):
        where = f"request {i}"
        info = r.get("info") or {}
        n_in = count(((info.get("request_metrics") or {}).get("text") or {}).get("input_tokens"), where) or 0
        rm = info.get("response_metrics") or {}
        sent, end = num(r["start_time"], where) - t0, num(r["end_time"], where) - t0
        err = r.get("error")
        times = [num(t, f"{where} chunk_times") - t0 for t in rm.get("chunk_times") or []]
        n_out = count(rm.get("output_tokens"), f"{where} output_tokens") or 0
        if err or not times:
            msg = (err or {}).get("error_msg") if isinstance(err, dict) else None
            recs.append(record(i, sent, None, [], end, n_in, n_out, None, None,
                               str(msg or "no streamed chunk")[:300], "http_error" if err else "stream_error"))
            continue
        usage = rm.get("server_usage") or {}
        recs.append(record(i, sent, times[0] - sent, [b - a for a, b in zip(times, times[1:])], end, n_in, n_out,
                           usage.get("prompt_tokens"), usage.get("completion_tokens")))
    conc = rate = None
    side = path.with_name("stage_0_lifecycle_metrics.json")
    if side.is_file():
        ld = (_side(side) or {}).get("load_summary") or {}
        conc = count(ld.get("concurrency"), "load_summary.concurrency")
        rate = num(ld.get("requested_rate"), "load_summary.requested_rate") if conc is None else None
    ins = [r.input_tokens_asked for r in recs]
    outs = [r.output_tokens_asked for r in recs]
    return Imported("inference-perf", None, str(path), digest, "per-request", None, None, None,
                    "closed" if conc else "open", conc, rate, sum(ins) / len(ins), sum(outs) / len(outs),
                    tuple(recs), None, 0.0, max(r.end_s for r in recs),
                    ("inference-perf's per-request report: each chunk's arrival is a text event; the lengths asked "
                     "are the tokens it counted",))


def _quoted(v) -> str:
    """A file's error object as the record's message: its JSON (a NaN in it quoted as Python writes it), 300
    characters at most."""
    try:
        return json.dumps(v, allow_nan=False, default=str)[:300]
    except ValueError:
        return repr(v)[:300]
