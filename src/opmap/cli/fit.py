"""``opmap fit``: the workload fit matrix across platforms, served under an SLO."""

from __future__ import annotations

from pathlib import Path

import typer

from opmap.cli.common import console, exit_if_stopped, kept, print_wrote
from opmap.errors import OpmapError
from opmap.formats import registry, spoken
from opmap.phases.runtime import RUNTIME_HELP, check_runtime
from opmap.record import record
from opmap.serve.capacity import CAPACITY_REQUESTS
from opmap.validate import INT_GE1, Rule, json_text, options, positive, positive_in

_KV = spoken(registry().names(kv=True))  # --kv-dtype accepts the registry's KV formats

MAX_BUDGET = 10_000  # devices a budget may name: the simulator's replica limit (opmap.serve.sim.MAX_REPLICAS)


def _prices(items: list[str]) -> dict[str, float]:
    from opmap.hardware import get_hardware

    out = {}
    for it in items:
        name, _, usd = it.partition("=")
        try:
            price = float(usd)
        except ValueError:
            raise OpmapError(f"--price takes NAME=USD_PER_HOUR (per device), got {it!r}") from None
        out[get_hardware(name.strip()).name] = positive(price, f"--price {name.strip()}", unit="USD per hour")
    return out


def fit(
    models: str = typer.Option(..., "--models", help="Decoders, comma-separated: zoo names (opmap models list), "
                                                     "path/to/config.json, hf:NAME or path/to/file.py:factory."),
    hardware: str = typer.Option(..., "--hardware", "-H", help="Catalog names, comma-separated."),
    slo_ttft: float | None = typer.Option(None, "--slo-ttft", help="p99 time to first token limit, ms."),
    slo_tpot: float | None = typer.Option(None, "--slo-tpot", help="p99 time per output token limit, ms."),
    slo_p99: float | None = typer.Option(None, "--slo-p99", help="p99 end-to-end limit, ms (instead of TTFT/TPOT)."),
    power_budget: float | None = typer.Option(None, "--power-budget", help="Watts a cell may draw at its SLO rate: "
                                                                           "each layout keeps the replicas it powers."),
    price: list[str] = typer.Option([], "--price", help="NAME=USD per device-hour (repeatable): cost per million "
                                                        "output tokens, and the ranking by it."),
    input_len: str = typer.Option("512", help="Prompt tokens: N or a distribution (uniform:A,B, normal:M,S)."),
    output_len: str = typer.Option("128", help="Generated tokens: N or a distribution."),
    requests: int = typer.Option(CAPACITY_REQUESTS, help="Requests per capacity run (at least; serve's default: "
                                                          "both search capacity alike)."),
    devices: int | None = typer.Option(None, help="Devices per replica (default: search TP up to the "
                                                  "scale-up domain, PP across, opmap.explore.layouts)."),
    devices_budget: int | None = typer.Option(None, "--devices-budget", help="Devices the replicas fill (default "
                                                                             "one node of the platform)."),
    runtime: str = typer.Option("engine", "--runtime", help=RUNTIME_HELP + "; default engine."),
    kv_dtype: str | None = typer.Option(None, "--kv-dtype", help=f"KV cache format, as serve: {_KV} "
                                                                 "(default: the model dtype's activations')."),
    max_num_seqs: int | None = typer.Option(None, "--max-num-seqs", help="engine: most sequences running in a step, "
                                                                         "as serve (default 256, vLLM's)."),
    max_num_batched_tokens: int | None = typer.Option(None, "--max-num-batched-tokens",
                                                      help="engine: tokens per step, as serve (default 8192)."),
    engine_preset: str | None = typer.Option(None, "--engine-preset",
                                             help="The engine stack: NAME[@VERSION] for every platform (vllm, "
                                                  "sglang, trtllm, trtllm-bench) or one per vendor "
                                                  "(nvidia=trtllm,amd=vllm); each cell sized and scheduled as that "
                                                  "engine would, and named in its cell."),
    gpu_memory_utilization: float | None = typer.Option(None, "--gpu-memory-utilization",
                                                        help="Fraction of each device's memory the engine takes "
                                                             "(0 < u <= 1; default 0.9), as serve (with "
                                                             "--engine-preset, in that engine's sense)."),
    include_datasheet_only: bool = typer.Option(False, "--include-datasheet-only",
                                                help="Rank devices whose catalog lacks achievable figures with the "
                                                     "others (by default after them)."),
    dtype: str = typer.Option("bf16", help="Precision."),
    quality: list[Path] = typer.Option([], "--quality", help="quality.json from opmap quality (repeatable): a cell "
                                                             "in that workload and format cites it."),
    engine: str = typer.Option("local", help="Where the cells run, one task each: local (a process pool here) or "
                                             "ray (a Ray cluster, the ray extra)."),
    out: Path | None = typer.Option(None, help="Write fit.json and fit.md here."),
    store: Path | None = typer.Option(None, "--store", help="Run store file (default $OPMAP_STORE)."),
    no_store: bool = typer.Option(False, "--no-store", help="Do not record this run in the run store."),
) -> None:
    """Rows workloads, columns platforms: throughput at the SLO, p99 latency, memory fit, perf per watt, energy
    per token, cost per token, bottleneck; platforms that break a constraint kept, struck out, with the reason;
    ranked per workload (by cost per token where prices are given), under the engine settings stated."""
    a = _parse(models, hardware, slo_ttft, slo_tpot, slo_p99, power_budget, price, requests, devices,
               devices_budget, runtime, kv_dtype, max_num_seqs, max_num_batched_tokens, gpu_memory_utilization,
               dtype, engine, out, engine_preset)
    from opmap.explore.fit_quality import attach, read_evidence

    evidence = read_evidence(quality, a["models"])  # read and matched before any cell runs
    m, stop = _run(a, input_len, output_len, requests, devices, power_budget, runtime, devices_budget,
                   include_datasheet_only, dtype, engine, kv_dtype, gpu_memory_utilization)
    r = record(attach(m, evidence))  # fit.json's body
    _print(r, a["models"])
    if out is not None:
        _write(out, r, stop)
    from opmap.cli.common import record_run
    from opmap.tags import Tags

    record_run("fit", r, Tags("sweep", workload=",".join(a["models"]), hardware=",".join(r["hardware"]),
                              phase="serve", precision=dtype), store, no_store)
    exit_if_stopped(stop)


def _parse(models, hardware, slo_ttft, slo_tpot, slo_p99, power_budget, price, requests, devices, devices_budget,
           runtime, kv_dtype, max_num_seqs, max_num_batched_tokens, gpu_memory_utilization, dtype, engine,
           out, engine_preset=None) -> dict:
    """Every option checked before any cell runs (the engine settings by serve's own checks): the models, the
    platforms, the SLO, the prices and the engine policy."""
    from opmap.cli.serve_args import policy as serve_policy
    from opmap.explore.engine import check_engine
    from opmap.explore.sweep import parse_ints
    from opmap.report.sheet import check_out_dir
    from opmap.serve.arrivals import MAX_REQUESTS
    from opmap.serve.metrics import Slo
    from opmap.serve.model_cost import check_kv_dtype

    check_runtime(runtime)
    options({"--devices-budget": (devices_budget, INT_GE1.but(hi=MAX_BUDGET)),
             "--slo-ttft": (slo_ttft, positive_in("ms")), "--slo-tpot": (slo_tpot, positive_in("ms")),
             "--slo-p99": (slo_p99, positive_in("ms")), "--power-budget": (power_budget, positive_in("W")),
             "--requests": (requests, INT_GE1.but(lo=10, hi=MAX_REQUESTS)), "--devices": (devices, INT_GE1),
             "--gpu-memory-utilization": (gpu_memory_utilization, Rule(lo=0, hi=1, lo_open=True))})
    check_kv_dtype(kv_dtype, dtype)
    ms = [m.strip() for m in models.split(",") if m.strip()]
    hws = [h.strip() for h in hardware.split(",") if h.strip()]
    if not ms or not hws:
        raise OpmapError("--models and --hardware each take at least one name, comma-separated")
    check_engine(engine)
    if slo_p99 is not None and (slo_ttft is not None or slo_tpot is not None):
        raise OpmapError("give --slo-p99, or --slo-ttft and --slo-tpot, not both")
    if devices is not None:
        parse_ints(str(devices), "devices")
    slo = Slo(None, None, slo_p99 / 1e3) if slo_p99 is not None else Slo(
        (slo_ttft if slo_ttft is not None else 2000.0) / 1e3, (slo_tpot if slo_tpot is not None else 200.0) / 1e3)
    prices = _prices(price)
    policy = serve_policy(None, False, max_num_seqs, max_num_batched_tokens, None)  # serve's engine, serve's checks
    if out is not None:
        check_out_dir(out)
    return {"models": ms, "hardware": hws, "slo": slo, "prices": prices, "policy": policy,
            "presets": _presets(engine_preset, gpu_memory_utilization, max_num_seqs, max_num_batched_tokens)}


def _presets(spec: str | None, fraction, max_num_seqs, max_num_batched_tokens) -> dict | None:
    """--engine-preset as vendor -> the preset with the flags given over it (None without one)."""
    if spec is None:
        return None
    from opmap.engines import parse_presets
    from opmap.engines.apply import Applied

    return {v: Applied(p, fraction, max_num_seqs, max_num_batched_tokens) for v, p in parse_presets(spec).items()}


def _run(a: dict, input_len, output_len, requests, devices, power_budget, runtime, devices_budget,
         include_datasheet_only, dtype, engine, kv_dtype, gpu_memory_utilization) -> tuple:
    """The fit matrix with a progress bar: (the opmap.explore.results.FitMatrix, the stop that ended it early or
    None)."""
    from opmap.cli.common import step_progress
    from opmap.explore.fit import fit_matrix

    try:
        with step_progress("fitting") as progress:
            r = fit_matrix(a["models"], a["hardware"], a["slo"], input_len, output_len, requests, dtype, devices,
                           power_budget, a["prices"], progress=progress, engine=engine, runtime=runtime,
                           devices_budget=devices_budget, include_datasheet_only=include_datasheet_only,
                           policy=a["policy"], kv_dtype=kv_dtype, presets=a["presets"],
                           gpu_memory_utilization=0.9 if gpu_memory_utilization is None else gpu_memory_utilization)
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM: the finished cells shown, written, recorded, marked
        return kept(e)
    return r, None


def _print(r: dict, models: list[str]) -> None:
    """The header (what the fit assumed) and one table per workload, each as wide as the terminal."""
    from opmap.report.fit_table import header, workload_table

    for line in header(r):
        console.print(line, highlight=False, markup=False)
    for m in models:
        console.print(workload_table(r, m))
    notes = sorted({c["runtime"]["note"] for c in r["cells"] if (c.get("runtime") or {}).get("note")})
    for n in notes:
        console.print(f"  runtime: {n}", highlight=False, markup=False)
    for a in r["assumptions"]:
        console.print(f"  {a}", highlight=False, markup=False)


def _write(out: Path, r: dict, stop) -> None:
    """fit.json, fit.md and the trade curve (none after a stop), written as one set."""
    from opmap.report.fit_table import markdown
    from opmap.report.sheet import write_set
    from opmap.report.trade_curve import have_matplotlib, trade_curve_png

    files: dict[str, str | bytes] = {"fit.json": json_text(r, indent=1), "fit.md": markdown(r)}
    png = trade_curve_png(r) if stop is None else None  # a stop writes the data and ends: no plotting
    if png is not None:
        files["trade_curve.png"] = png
    print_wrote(write_set(out, files, remove=["trade_curve.png"]))  # an earlier run's PNG never stays
    if png is None:
        why = ("the fit was interrupted (fit.json holds the cells run)" if stop is not None else
               "no platform has a throughput at the SLO" if have_matplotlib() else
               "matplotlib is not installed (pip install 'opmap[report]')")
        console.print(f"  trade_curve.png not drawn: {why}", highlight=False, markup=False)
