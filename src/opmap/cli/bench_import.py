"""``opmap bench --from FILE``: another tool's result file (vllm bench serve, GuideLLM, AIPerf, inference-perf) read
into the bench record (opmap.bench.imports), printed, written and recorded as ``opmap bench`` does; with
``--predict`` joined to the prediction of the same workload."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from opmap.cli.common import console
from opmap.errors import OpmapError
from opmap.report.text import safe


def check(url, launch, predict: bool, config, hardware) -> None:
    """One line where --from meets options that name another source, or --predict lacks its target."""
    if url is not None or launch is not None:
        raise OpmapError("--from reads a result file: give --from FILE, a URL or --launch CONFIG, one of them")
    if predict and (config is None or hardware is None):
        raise OpmapError("--predict with --from needs --config (the served model's Hugging Face config) and "
                         "--hardware (the catalog device it ran on)")


def load(path: Path, fmt: str | None, index: int, min_duration: float, min_queries: int):
    """(the Imported run, its BenchResult, its BenchFigures, bench.json's body): the file read
    (opmap.bench.import_formats) and the figures made; what was read, and how, printed."""
    from opmap.bench import imports
    from opmap.bench.import_formats import read_result
    from opmap.bench.outputs import bench_file
    from opmap.record import record

    run = read_result(path, fmt, index)
    result = imports.as_result(run)
    fig = imports.figures(run, min_duration, min_queries)
    body = record(bench_file(result, fig, imports.spec(run), imported=run))
    console.print(f"imported {safe(run.tool)} {safe(run.version or '')} result {safe(str(path))}: "
                  f"{run.granularity}" + (f" ({len(run.records)} requests)" if run.records else
                                          " (the tool's statistics; no per-request rows in the file)"),
                  highlight=False)
    for n in run.notes:
        console.print(f"  note: {safe(n)}", highlight=False)
    return run, result, fig, body


def workload_result(run, result):
    """The run as --predict simulates it: its own records where they carry send times (AIPerf), else requests
    made from the file's load (a closed loop at its concurrency: the sends follow the simulated ends; an open
    loop at its rate, evenly spaced; all at once without one) and its lengths (per request where the file has
    them, else its means). The file's own figures stay the measured side."""
    from dataclasses import replace

    from opmap.bench.records import RequestRecord

    if run.records and run.fmt != "vllm":
        return result
    if run.records:
        n = len(run.records)
        lens = [(r.input_tokens_asked, r.output_tokens_asked, r.ok) for r in run.records]
    else:
        n = run.summary.ok if run.summary else 0
        lens = [(int(round(run.input_len or 1)), int(round(run.output_len or 1)), True)] * n
    if n == 0:
        raise OpmapError("--predict needs at least one answered request: the file has none")
    rate = run.rate_per_s if run.mode == "open" else None
    sent = np.arange(n) / rate if rate else np.zeros(n)
    recs = tuple(RequestRecord(i, None if run.mode == "closed" else float(sent[i]), float(sent[i]), float(sent[i]),
                               (), float(sent[i]), max(1, a), max(1, o), max(1, a), max(1, o), 1, "ok")
                 for i, (a, o, ok) in enumerate(lens) if ok)
    return replace(result, records=recs)


def predict(run, result, fig, cost, tags, out, store, no_store, assumptions) -> None:
    """--predict: the file's figures joined to a simulation of its workload (``workload_result``), printed,
    written (bench_predict.json) and recorded as a serve run (opmap.cli.bench_predict.predict_and_report)."""
    from opmap.bench.predict import engine_policy
    from opmap.cli import bench_predict as bp

    sim = workload_result(run, result)
    if sim is not result:
        console.print("  --predict: the workload simulated is the file's load and lengths (its send times are "
                      "not in the file)", highlight=False)
    policy = engine_policy(8192, 16)  # a URL's defaults (opmap bench --predict against a URL)
    bp.predict_and_report(sim, fig, cost, policy, None, None, assumptions, tags, out, store, no_store)
