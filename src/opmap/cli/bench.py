"""``opmap bench URL --model NAME``: drive a real OpenAI-compatible endpoint under an open- or closed-loop load
and measure TTFT, TPOT, ITL, end-to-end latency, throughput and goodput (opmap.bench)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from opmap.cli.common import console, print_wrote
from opmap.errors import OpmapError
from opmap.record import record as json_record
from opmap.report.bench_text import print_summary
from opmap.report.text import safe
from opmap.tags import Tags
from opmap.validate import INT_GE0, INT_GE1, SEED, json_text, options, plausible, positive_in

if TYPE_CHECKING:
    import numpy as np

    from opmap.serve.arrivals import Length
    from opmap.serve.cost import TableCost

DEFAULT_REQUESTS = 100


# the command's options (typer reads them from the signature's defaults)
_URL = typer.Argument(None, help="The server's base URL, with or without /v1 (http://localhost:8000); none with "
                                 "--launch.")
_MODEL = typer.Option(None, "--model", help="The model name the server serves (as /v1/models lists it); none with "
                                            "--launch.")
_ARRIVAL = typer.Option(None, help="Open loop: poisson:RATE, constant:RATE, gamma:RATE,CV, offline or trace:FILE (as "
                                   "opmap serve); sends keep this schedule whatever the server does.")
_CONCURRENCY = typer.Option(None, "--concurrency", help="Closed loop: C requests in flight, each sent when one ends "
                                                        "(default 1 without --arrival).")
_REQUESTS = typer.Option(None, "--requests", help=f"Requests measured (default {DEFAULT_REQUESTS} without --duration; "
                                                  "a trace: at most this many rows, as opmap serve).")
_DURATION = typer.Option(None, "--duration", help="Send for this long, s (in-flight requests still finish).")
_WARMUP = typer.Option(0, "--warmup", help="Requests sent first and kept out of the figures.")
_INPUT_LEN = typer.Option("128", "--input-len", help="Prompt tokens: N, uniform:A,B, normal:MEAN,STD, "
                                                     "lognormal:MEDIAN,SIGMA ([,MAX]) or trace.")
_OUTPUT_LEN = typer.Option("128", "--output-len", help="Output tokens (max_tokens), as --input-len.")
_API = typer.Option("completions", "--api", help="completions (/v1/completions) or chat (/v1/chat/completions).")
_TIMEOUT = typer.Option(600.0, "--timeout", help="Limit on one request, send to end of stream, s.")
_IGNORE_EOS = typer.Option(True, "--ignore-eos/--no-ignore-eos", help="Send ignore_eos (vLLM, SGLang) so outputs run "
                                                                      "to max_tokens.")
_SLO_TTFT = typer.Option(None, "--slo-ttft", help="Goodput: TTFT limit per request, ms.")
_SLO_TPOT = typer.Option(None, "--slo-tpot", help="Goodput: TPOT limit per request, ms.")
_MIN_DURATION = typer.Option(600.0, "--min-duration", help="Validity: the shortest valid run, s (MLPerf: 600).")
_MIN_QUERIES = typer.Option(24576, "--min-queries", help="Validity: the fewest measured requests (MLPerf LLM: 24576).")
_SEED = typer.Option(0, "--seed", help="Seeds arrivals, lengths and prompts.")
_OUT = typer.Option(None, help="Write bench.json and requests.parquet here.")
_STORE = typer.Option(None, "--store", help="Run store file (default $OPMAP_STORE).")
_NO_STORE = typer.Option(False, "--no-store", help="Do not record this run in the run store.")
_LAUNCH = typer.Option(None, "--launch", help="Start a local transformers serve on a random-weight model from this "
                                              "Hugging Face config (config.json, a folder holding one, or hf:NAME in "
                                              "the local cache), bench it, stop it.")
_DEVICE = typer.Option("cpu", "--device", help="--launch: cpu, cuda or cuda:N.")
_THREADS = typer.Option(None, "--threads", help="--launch: torch threads (default: the cores available minus one, "
                                                "left to the web process).")
_KV_BLOCKS = typer.Option(None, "--kv-blocks", help="--launch: KV cache blocks of 256 tokens (default 64).")
_TOKENIZER = typer.Option(None, "--tokenizer", help="A local tokenizer folder: prompts of exact token counts (the "
                                                    "launched model's with --launch).")
_PREDICT = typer.Option(False, "--predict", help="Run the same workload (send times, token counts) through opmap "
                                                 "serve's simulator and print measured / predicted; recorded as a "
                                                 "serve run.")
_HARDWARE = typer.Option(None, "--hardware", help="--predict: the device the server runs on (default with --launch: "
                                                  "local, after opmap calibrate).")
_CONFIG = typer.Option(None, "--config", help="--predict against a URL: the served model's Hugging Face config.")
_DTYPE = typer.Option(None, "--dtype", help="--predict: the served precision (default: the launched model's, else "
                                            "bf16).")
_RUNTIME = typer.Option("engine", "--runtime", help="--predict: the runtime steps are priced under (eager, graphs, "
                                                    "engine; as opmap serve).")
_STACK = typer.Option(None, "--stack", help="--predict with a stack profile (opmap calibrate --from-bench) in place "
                                            "of the overhead probes.")
_METRICS_URL = typer.Option("auto", "--metrics-url", help="The server's Prometheus page, scraped while the run lasts "
                                                          "(vLLM, SGLang): auto (the URL's /metrics), a URL, or none.")
_METRICS_INTERVAL = typer.Option(1.0, "--metrics-interval", help="Seconds between two scrapes.")
_FROM_FILE = typer.Option(None, "--from", help="Import another tool's result file instead of measuring: vllm bench "
                                               "serve --save-result JSON, a GuideLLM JSON report, AIPerf's profile "
                                               "export (JSON, JSONL or its folder), an inference-perf summary report; "
                                               "the format is read from the content.")
_FMT = typer.Option(None, "--format", help="--from: the file's tool (vllm, guidellm, aiperf, inference-perf), checked "
                                           "against its content.")
_INDEX = typer.Option(0, "--index", help="--from a GuideLLM report: which of its benchmarks (0-based).")


def bench(
    url: str | None = _URL,
    model: str | None = _MODEL,
    arrival: str | None = _ARRIVAL,
    concurrency: int | None = _CONCURRENCY,
    requests: int | None = _REQUESTS,
    duration: float | None = _DURATION,
    warmup: int = _WARMUP,
    input_len: str = _INPUT_LEN,
    output_len: str = _OUTPUT_LEN,
    api: str = _API,
    timeout: float = _TIMEOUT,
    ignore_eos: bool = _IGNORE_EOS,
    slo_ttft: float | None = _SLO_TTFT,
    slo_tpot: float | None = _SLO_TPOT,
    min_duration: float = _MIN_DURATION,
    min_queries: int = _MIN_QUERIES,
    seed: int = _SEED,
    out: Path | None = _OUT,
    store: Path | None = _STORE,
    no_store: bool = _NO_STORE,
    launch: str | None = _LAUNCH,
    device: str = _DEVICE,
    threads: int | None = _THREADS,
    kv_blocks: int | None = _KV_BLOCKS,
    tokenizer: Path | None = _TOKENIZER,
    predict: bool = _PREDICT,
    hardware: str | None = _HARDWARE,
    config: str | None = _CONFIG,
    dtype: str | None = _DTYPE,
    runtime: str = _RUNTIME,
    stack: Path | None = _STACK,
    metrics_url: str = _METRICS_URL,
    metrics_interval: float = _METRICS_INTERVAL,
    from_file: Path | None = _FROM_FILE,
    fmt: str | None = _FMT,
    index: int = _INDEX,
) -> None:
    """Measure a serving endpoint under load: streaming requests, timed per event; TTFT, TPOT, ITL and e2e
    percentiles, throughput, goodput, errors per kind, the open loop's own lag, MLPerf-style validity. An
    endpoint that wants a key gets $OPENAI_API_KEY as a bearer token (read from the environment, never written
    or recorded). A failing request (an HTTP error, a redirect, an answer that is not an event stream, a broken
    or oversized stream, a timeout) is counted and the run goes on. Exit status: 0; 1 when every measured request
    failed (the run is still printed, written and recorded); 2 for bad input or an endpoint that cannot be
    reached (nothing sent); 130 when stopped by Ctrl-C, 143 by SIGTERM. ``--from FILE`` imports another tool's
    result file instead (opmap.bench.imports): per-request rows where the file has them, its percentiles where
    it has only those (bench.json's ``imported.granularity`` says which)."""
    options({"--index": (index, INT_GE0)})  # its range first, whatever else is given
    if from_file is not None or fmt is not None:
        _from(from_file, fmt, index, url, launch, predict, config, hardware, dtype, runtime, min_duration,
              min_queries, out, store, no_store)
        return
    o = _Options(url, model, arrival, concurrency, requests, duration, warmup, input_len, output_len, api, timeout,
                 ignore_eos, slo_ttft, slo_tpot, min_duration, min_queries, seed, out, launch, device, threads,
                 kv_blocks, tokenizer, predict, hardware, config, dtype, runtime, stack, metrics_url,
                 metrics_interval)
    load = _parse(o)
    target = _prediction_target(o, load)
    srv, result, plan, policy, overhead = _drive_load(o, load, target.cost)
    _render(o, srv, result, plan, policy, overhead, target, store, no_store)


def _from(path, fmt, index, url, launch, predict, config, hardware, dtype, runtime, min_duration, min_queries, out,
          store, no_store) -> None:
    """``--from FILE`` (opmap.cli.bench_import)."""
    from opmap.cli import bench_import as bi

    if path is None:
        raise OpmapError("--format names the tool of a --from FILE: give --from FILE")
    bi.check(url, launch, predict, config, hardware)
    options({"--index": (index, INT_GE0), "--min-queries": (min_queries, INT_GE0),
             "--min-duration": (min_duration, plausible("s"))})
    if out is not None:
        from opmap.report.outputs import check_out_dir

        check_out_dir(out)
    cost = None
    if predict:  # priced first: a bad --hardware or config costs nothing
        from opmap.cli import bench_predict as bp

        cost = bp.price(config, hardware, dtype or "bf16", runtime, None)
    run, result, fig, body = bi.load(path, fmt, index, min_duration, min_queries)
    print_summary(console, fig, result, body["spec"])
    if out is not None:
        write_outputs(out, body, result)
    tags = record(body, store, no_store)
    if predict:
        bi.predict(run, result, fig, cost, tags, out, store, no_store,
                   {"model": config, "hardware": hardware, "dtype": dtype or "bf16", "runtime": runtime,
                    "server": f"imported from {run.tool}"})
    if fig.all_failed:
        raise typer.Exit(1)  # as a measured run: printed, written and recorded; none of it is a measurement


@dataclass(frozen=True)
class _Options:
    """The command's options as given (checked by ``_parse`` before any connection is tried)."""

    url: str | None
    model: str | None
    arrival: str | None
    concurrency: int | None
    requests: int | None
    duration: float | None
    warmup: int
    input_len: str
    output_len: str
    api: str
    timeout: float
    ignore_eos: bool
    slo_ttft: float | None
    slo_tpot: float | None
    min_duration: float
    min_queries: int
    seed: int
    out: Path | None
    launch: str | None
    device: str
    threads: int | None
    kv_blocks: int | None
    tokenizer: Path | None
    predict: bool
    hardware: str | None
    config: str | None
    dtype: str | None
    runtime: str
    stack: Path | None = None
    metrics_url: str = "auto"
    metrics_interval: float = 1.0


@dataclass(frozen=True)
class _Load:
    """The load the options ask for (load_plan's arguments): open loop on ``arrival``'s schedule or closed loop
    at ``concurrency``, the request count (None: by ``duration``), warm-up, the parsed lengths, the seed."""

    arrival: str | None
    concurrency: int | None
    requests: int | None
    duration: float | None
    warmup: int
    ilen: Length
    olen: Length
    seed: int


@dataclass(frozen=True)
class _Target:
    """--predict's model (a config), device, dtype and, with --predict, the step cost priced for them."""

    config: str | None
    hardware: str | None
    dtype: str
    cost: TableCost | None  # None without --predict
    stack: Any = None  # opmap.calibrate.stack_profile.StackProfile with --stack


def _parse(o: _Options) -> _Load:
    """Every option checked; the load (load_plan's arguments: the lengths parsed, the default request count)."""
    from opmap.cli import bench_predict as bp
    from opmap.serve.arrivals import parse_length
    from opmap.validate import count

    _check_options(o.concurrency, o.requests, o.warmup, o.seed, o.min_queries, o.duration, o.timeout,
                   o.min_duration, o.slo_ttft, o.slo_tpot, o.api, o.arrival)
    bp.check_target(o.url, o.model, o.launch, o.predict, o.hardware, o.config)
    for name, v in (("--threads", o.threads), ("--kv-blocks", o.kv_blocks)):  # before any connection is tried
        if v is not None:
            count(v, name, hi=1 << 20)
    _metrics_url(o.metrics_url, "http://x")  # a bad --metrics-url fails before anything is sent
    options({"--metrics-interval": (o.metrics_interval, positive_in("s").but(lo=0.05, lo_open=False, hi=3600))})
    ilen, olen = parse_length(o.input_len), parse_length(o.output_len)
    requests = DEFAULT_REQUESTS if o.requests is None and o.duration is None else o.requests
    if o.out is not None:
        from opmap.report.outputs import check_out_dir

        check_out_dir(o.out)
    return _Load(o.arrival, o.concurrency, requests, o.duration, o.warmup, ilen, olen, o.seed)


def _prediction_target(o: _Options, load: _Load) -> _Target:
    """--predict's model, device and dtype and, with --predict, the step cost: priced before the server starts (a
    bad --hardware or config costs nothing)."""
    from opmap.cli import bench_predict as bp

    if o.stack is not None and not o.predict:
        raise OpmapError("--stack applies a stack profile to --predict's prediction: add --predict")
    stack = None
    if o.stack is not None:
        from opmap.calibrate.stack_profile import read_stack_profile

        stack = read_stack_profile(o.stack)  # a bad profile fails before the server starts
    config = o.launch or o.config
    hw = o.hardware or ("local" if o.launch else None)
    dtype = o.dtype or (bp.launched_dtype(o.launch) if o.launch else "bf16")
    cost = bp.price(config, hw, dtype, o.runtime, None, load.ilen.longest()) if o.predict else None
    return _Target(config, hw, dtype, cost, stack)


def _drive_load(o: _Options, load: _Load, cost):
    """(the launched server or None, the run's result, its plan, the engine policy, the overhead): the load driven
    against the endpoint (a launched one started and stopped around it)."""
    from opmap.cli import bench_predict as bp

    url, model, ignore_eos, tokenizer = o.url, o.model, o.ignore_eos, o.tokenizer
    with bp.launched(o.launch, o.device, o.threads, o.kv_blocks) as srv:
        if srv is not None:  # transformers serve refuses ignore_eos (HTTP 422); its model has no EOS instead
            url, model, ignore_eos = srv.base_url, srv.model_id, False
            tokenizer = tokenizer or srv.tokenizer_dir
        scrape = {"metrics_url": _metrics_url(o.metrics_url, url), "metrics_interval_s": o.metrics_interval}
        result, plan, policy, overhead = _measure(srv, url, model, tokenizer, o.api, o.timeout, ignore_eos, cost,
                                                  o.predict, load, probe_overhead=o.stack is None, scrape=scrape)
    return srv, result, plan, policy, overhead


def _render(o: _Options, srv, result, plan, policy, overhead, target: _Target, store: Path | None,
            no_store: bool) -> None:
    """The run printed, written and recorded; with --predict its prediction beside; the exit status."""
    from opmap.cli import bench_predict as bp

    figures, body = finish(result, plan, o.slo_ttft, o.slo_tpot, o.min_duration, o.min_queries, launched=srv)
    print_summary(console, figures, result, plan.spec)
    if o.out is not None:
        write_outputs(o.out, body, result)
    tags = record(body, store, no_store)
    if o.predict:
        bp.predict_and_report(result, figures, target.cost, policy, overhead, target.stack,
                              {"model": target.config, "hardware": target.hardware, "dtype": target.dtype,
                               "runtime": o.runtime, "server": "launched" if srv is not None else o.url},
                              tags, o.out, store, no_store)
    if result.interrupted:
        # what was measured is kept (printed, written, recorded); the exit says it stopped, and by which signal
        raise typer.Exit(128 + (result.stop_signal or signal.SIGINT))
    if figures.all_failed:
        raise typer.Exit(1)  # printed, written and recorded as any run; the exit says none of it is a measurement


def _check_options(concurrency, requests, warmup, seed, min_queries, duration, timeout, min_duration, slo_ttft,
                   slo_tpot, api, arrival) -> None:
    """The numeric options against their ranges, the API and the one load (open or closed loop)."""
    from opmap.bench.client import APIS
    from opmap.serve.arrivals import MAX_REQUESTS

    options({"--concurrency": (concurrency, INT_GE1), "--requests": (requests, INT_GE1.but(hi=MAX_REQUESTS)),
             "--warmup": (warmup, INT_GE0), "--seed": (seed, SEED), "--min-queries": (min_queries, INT_GE0),
             "--duration": (duration, positive_in("s")), "--timeout": (timeout, positive_in("s")),
             "--min-duration": (min_duration, plausible("s")),
             **{k: (v, positive_in("ms")) for k, v in (("--slo-ttft", slo_ttft), ("--slo-tpot", slo_tpot))}})
    if api not in APIS:
        raise OpmapError(f"--api {api!r}: accepted: {', '.join(APIS)}")
    if arrival is not None and concurrency is not None:
        raise OpmapError("--arrival (open loop) and --concurrency (closed loop) are two loads: give one")


def _measure(srv, url: str, model: str, tokenizer, api: str, timeout: float, ignore_eos: bool, cost, predict: bool,
             load: _Load, probe_overhead: bool = True, scrape: dict | None = None):
    """(the run's result, its load plan, the engine policy and the overhead --predict prices it with): the load
    (``load``: load_plan's arguments) driven against the endpoint; with --predict, the server probed before and
    after it (an interrupted run keeps the probe before it), unless a stack profile stands for them
    (``probe_overhead`` False)."""
    from opmap.bench.client import endpoint_root
    from opmap.cli import bench_predict as bp

    root = endpoint_root(url)
    prompt = None
    if tokenizer is not None:
        from opmap.bench.prompts import ExactPrompts

        prompt = ExactPrompts(tokenizer, api)
    plan = load_plan(load.arrival, load.concurrency, load.requests, load.duration, load.warmup, load.ilen, load.olen,
                     load.seed, prompt=prompt)
    policy = overhead = before = None
    if predict:
        from opmap.bench.predict import engine_policy

        probe = dict(api=api, ignore_eos=ignore_eos, timeout_s=timeout, batch=plan.concurrency or bp.PROBE_BATCH)
        before = bp.probe(root, model, prompt, when="before", **probe) if probe_overhead else None
        s = srv.settings if srv is not None else None  # a URL: the engine policy's defaults (8192, blocks of 16)
        policy = engine_policy(s.max_batch_tokens if s else 8192, s.page_tokens if s else 16)
    result = drive(root, model, plan, api=api, timeout_s=timeout, ignore_eos=ignore_eos, **(scrape or {}))
    if predict and before is not None:  # an interrupted run keeps the probe before it
        after = ((), ()) if result.interrupted else bp.probe(root, model, prompt, when="after", **probe)
        overhead = bp.overhead(cost, before, after, probe["batch"])
    return result, plan, policy, overhead


def client_host() -> dict:
    """The machine the client ran on: its name, OS, CPU model and count (a busy or small client host shows in the
    figures it measured)."""
    import os
    import platform

    from opmap.hardware.host import cpu_model

    return {"name": platform.node(), "os": platform.platform(), "cpu": cpu_model(), "cpus": os.cpu_count()}


def _metrics_url(value: str, url: str | None) -> str | None:
    """--metrics-url: auto (the endpoint's root + /metrics), none, or an http(s) URL."""
    from opmap.bench.client import endpoint_root

    if value == "none":
        return None
    if value == "auto":
        return f"{endpoint_root(url)}/metrics" if url else None
    if not value.startswith(("http://", "https://")) or len(value) > 2048:
        raise OpmapError(f"--metrics-url {safe(value[:200])!r}: accepted: auto, none, or an http:// or https:// URL "
                         "(the server's Prometheus page, such as http://host:8000/metrics)")
    return value


@dataclass
class LoadPlan:
    """What to send: the specs (lazy), how many (None: until the duration ends), the loop (concurrency None:
    open), the duration, the spec as bench.json records it; an open loop's schedule too (send times s, input
    and output lengths: what --predict simulates), None in a closed loop."""

    specs: Iterator
    total: int | None
    concurrency: int | None
    duration_s: float | None
    spec: dict
    times: np.ndarray | None = None
    input_len: np.ndarray | None = None
    output_len: np.ndarray | None = None


def load_plan(arrival: str | None, concurrency: int | None, requests: int | None, duration: float | None,
              warmup: int, ilen, olen, seed: int, prompt=None) -> LoadPlan:
    """The load of the options: open loop on ``arrival``'s schedule, else closed loop at ``concurrency``
    (default 1). ``prompt``: a prompt builder (index, tokens, rng) -> str (default: opmap.bench.workload's
    word prompts)."""
    from opmap.bench import workload as w

    kw = {"prompt": prompt} if prompt is not None else {}
    n = None if requests is None else requests + warmup
    spec = {"arrival": None, "concurrency": None, "requests": requests, "duration_s": duration, "warmup": warmup,
            "input_len": ilen.spec(), "output_len": olen.spec(), "seed": seed}
    if arrival is not None:
        arr = w.parse_load_arrival(arrival)
        times, ins, outs = w.schedule(arr, ilen, olen, n, duration, seed)
        spec["arrival"] = arr.spec()
        return LoadPlan(w.open_specs(times, ins, outs, warmup, seed, **kw), len(times), None, duration, spec, times,
                        ins, outs)
    c = concurrency or 1
    spec["concurrency"] = c
    return LoadPlan(w.closed_specs(ilen, olen, n, warmup, seed, **kw), n, c, duration, spec)


def drive(root: str, model: str, plan: LoadPlan, **kw):
    """Run the load with a progress bar (requests ended / total, elapsed); $OPENAI_API_KEY, when set, as the
    bearer token."""
    import os

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from opmap.bench.client import run_load

    what = (f"open loop {plan.spec['arrival']}" if plan.concurrency is None
            else f"closed loop, concurrency {plan.concurrency}")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task(safe(f"bench {root}: {what}"), total=plan.total)

        def progress(done: int, total: int | None) -> None:
            bar.update(task, completed=done, total=total)

        kw.setdefault("api_key", os.environ.get("OPENAI_API_KEY") or None)
        return run_load(root, model, plan.specs, concurrency=plan.concurrency, duration_s=plan.duration_s,
                        total=plan.total, progress=progress, **kw)


def finish(result, plan: LoadPlan, slo_ttft: float | None, slo_tpot: float | None, min_duration: float,
           min_queries: int, launched=None):
    """(figures, bench.json body) of a run (``launched``: the server started for it, or None)."""
    from opmap.bench.metrics import summarize
    from opmap.bench.outputs import bench_file

    o = result.options
    plan.spec.update(api=result.api, timeout_s=o.get("timeout_s"), ignore_eos=o.get("ignore_eos"),
                     slo_ttft_ms=slo_ttft, slo_tpot_ms=slo_tpot)
    figures = summarize(result.records, slo_ttft_s=None if slo_ttft is None else slo_ttft / 1e3,
                        slo_tpot_s=None if slo_tpot is None else slo_tpot / 1e3, min_duration_s=min_duration,
                        min_queries=min_queries, interrupted=result.interrupted)
    return figures, json_record(bench_file(result, figures, plan.spec, launched=launched, host=client_host()))


def write_outputs(out: Path, body: dict, result) -> None:
    from opmap.bench.outputs import requests_parquet
    from opmap.report.outputs import write_set

    print_wrote(write_set(out, {"bench.json": json_text(body, indent=2) + "\n",
                                "requests.parquet": requests_parquet(result)}))


def record(body: dict, store: Path | None, no_store: bool) -> Tags:
    """The run into the store, tagged (opmap.bench.outputs.bench_tags): endpoint, server and model as
    /v1/models reports them, workload spec, client version."""
    from opmap.bench.outputs import bench_tags
    from opmap.cli.common import record_run

    tags = bench_tags(body)
    record_run("bench", body, tags, store, no_store)
    return tags
