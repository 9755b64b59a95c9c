"""``opmap fit``: the workload fit matrix across platforms, served under an SLO."""

from __future__ import annotations

from pathlib import Path

import typer

from opmap.cli.common import console, exit_if_stopped, kept, print_wrote
from opmap.errors import OpmapError
from opmap.phases.runtime import RUNTIME_HELP, check_runtime
from opmap.report.text import clean, safe
from opmap.serve.capacity import CAPACITY_REQUESTS
from opmap.validate import INT_GE1, json_text, options, positive, positive_in

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
    power_budget: float | None = typer.Option(None, "--power-budget", help="Watts a cell may draw at its SLO rate."),
    price: list[str] = typer.Option([], "--price", help="NAME=USD per device-hour (repeatable): perf per dollar."),
    input_len: str = typer.Option("512", help="Prompt tokens: N or a distribution (uniform:A,B, normal:M,S)."),
    output_len: str = typer.Option("128", help="Generated tokens: N or a distribution."),
    requests: int = typer.Option(CAPACITY_REQUESTS, help="Requests per capacity run (at least; serve's default: "
                                                          "both search capacity alike)."),
    devices: int | None = typer.Option(None, help="Devices per replica (default: search 1, 2, 4, 8 in a node, "
                                                  "each split TP x PP)."),
    devices_budget: int | None = typer.Option(None, "--devices-budget", help="Devices the replicas fill (default "
                                                                             "one node of the platform)."),
    runtime: str = typer.Option("engine", "--runtime", help=RUNTIME_HELP + "; default engine."),
    include_datasheet_only: bool = typer.Option(False, "--include-datasheet-only",
                                                help="Rank devices whose catalog lacks achievable figures with the "
                                                     "others (by default after them)."),
    dtype: str = typer.Option("bf16", help="Precision."),
    engine: str = typer.Option("local", help="Where the cells run, one task each: local (a process pool here) or "
                                             "ray (a Ray cluster, the ray extra)."),
    out: Path | None = typer.Option(None, help="Write fit.json and fit.md here."),
    store: Path | None = typer.Option(None, "--store", help="Run store file (default $OPMAP_STORE)."),
    no_store: bool = typer.Option(False, "--no-store", help="Do not record this run in the run store."),
) -> None:
    """Rows workloads, columns platforms: throughput at the SLO, p99 latency, memory fit, perf per watt, energy
    per token, perf per dollar, bottleneck; platforms that break a constraint kept, struck out, with the
    reason; ranked per workload."""
    from rich.table import Table

    from opmap.cli.common import step_progress
    from opmap.explore.engine import check_engine
    from opmap.explore.fit import fit_matrix
    from opmap.explore.layouts import label
    from opmap.explore.sweep import parse_ints
    from opmap.report.sheet import check_out_dir, si, write_set
    from opmap.serve.arrivals import MAX_REQUESTS
    from opmap.serve.metrics import Slo

    check_runtime(runtime)
    options({"--devices-budget": (devices_budget, {**INT_GE1, "hi": MAX_BUDGET}),
             "--slo-ttft": (slo_ttft, positive_in("ms")), "--slo-tpot": (slo_tpot, positive_in("ms")),
             "--slo-p99": (slo_p99, positive_in("ms")), "--power-budget": (power_budget, positive_in("W")),
             "--requests": (requests, {**INT_GE1, "lo": 10, "hi": MAX_REQUESTS}), "--devices": (devices, INT_GE1)})
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
    if out is not None:
        check_out_dir(out)
    stop = None
    try:
        with step_progress("fitting") as progress:
            r = fit_matrix(ms, hws, slo, input_len, output_len, requests, dtype, devices, power_budget, prices,
                           progress=progress, engine=engine, runtime=runtime, devices_budget=devices_budget,
                           include_datasheet_only=include_datasheet_only)
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM: the finished cells shown, written, recorded, marked
        r, stop = kept(e)
    slo_text = (f"p99 end to end {slo.p99_s * 1e3:g} ms" if slo.p99_s is not None else
                f"p99 TTFT {slo.ttft_s * 1e3:g} ms, p99 TPOT {slo.tpot_s * 1e3:g} ms")
    t = Table(title=f"opmap fit: output tokens/s per device at the SLO ({slo_text}; runtime {runtime})"
                    + safe(_stopped_words(r)), title_justify="left")
    t.add_column("workload")
    for h in r["hardware"]:
        t.add_column(h, justify="right")
    for m in ms:
        row = [safe(m)]
        for h in r["hardware"]:
            c = next((c for c in r["cells"] if c["model"] == m and c["hardware"] == h), None)
            if c is None:
                row.append("[yellow]not run: interrupted[/yellow]")
                continue
            if c["throughput_at_slo"] is None:
                row.append(f"[strike]-[/strike] {safe(c['excluded_reason'][:80])}")
                continue
            text = ((f"#{c['rank']} " if c["rank"] else "") + f"{si(c['throughput_per_device'])}/device, "
                    f"{label(c['layout'])}")
            if c["runner_up"]:
                text += f"\nrunner-up {label(c['runner_up'])}: {si(c['runner_up']['per_device_tokens_per_s'])}/device"
            if c["datasheet_only"]:
                text += "\n[yellow]datasheet only[/yellow]"
            ppw = "power not modelled" if c["perf_per_watt"] is None else f"{c['perf_per_watt']:.3g} tok/J"
            text += f"\np99 {si(c['latency_p99_s'], 's')}, {ppw}, {c['bound']}, risk {c['risk']}"
            row.append(f"[strike]{text}[/strike]\n{safe(c['excluded_reason'])}" if c["excluded_reason"] else text)
        t.add_row(*row)
    console.print(t)
    notes = sorted({c["runtime"]["note"] for c in r["cells"] if (c.get("runtime") or {}).get("note")})
    for n in notes:
        console.print(f"  runtime: {n}", highlight=False, markup=False)
    for a in r["assumptions"]:
        console.print(f"  {a}", highlight=False, markup=False)
    if out is not None:
        md = [f"# opmap fit ({slo_text}){_stopped_words(r)}", "", *[f"- {a}" for a in r["assumptions"]], "",
              "| workload | platform | layout | runner-up | devices | tok/s at SLO | tok/s per device | p99 e2e (s) | "
              "W | tok/J | J/tok | tok/$ | bound | risk | rank | excluded |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in r["cells"]:
            def f(x, fmt=".4g"):
                return "-" if x is None else format(x, fmt)
            lay = label(c["layout"]) if c["layout"] else "-"
            run = (f"{label(c['runner_up'])} ({c['runner_up']['per_device_tokens_per_s']:.4g}/device)"
                   if c["runner_up"] else "-")
            ds = f" (datasheet only: {', '.join(c['datasheet_only'])})" if c["datasheet_only"] else ""
            md.append(f"| {c['model']} | {c['hardware']}{ds} | {lay} | {run} | {f(c['devices'], 'd')} | "
                      f"{f(c['throughput_at_slo'])} | {f(c['throughput_per_device'])} | {f(c['latency_p99_s'])} | "
                      f"{f(c['power_w'], '.0f')} | {f(c['perf_per_watt'])} | "
                      f"{f(c['energy_per_token_j'])} | {f(c['perf_per_dollar'])} | {c['bound'] or '-'} | {c['risk']} | "
                      f"{f(c['rank'], 'd')} | {c['excluded_reason'] or '-'} |")
        from opmap.report.trade_curve import have_matplotlib, trade_curve_png

        files: dict[str, str | bytes] = {"fit.json": json_text(r, indent=1), "fit.md": "\n".join(md) + "\n"}
        png = trade_curve_png(r) if stop is None else None  # a stop writes the data and ends: no plotting
        if png is not None:
            files["trade_curve.png"] = png
        print_wrote(write_set(out, files, remove=["trade_curve.png"]))  # an earlier run's PNG never stays
        if png is None:
            why = ("the fit was interrupted (fit.json holds the cells run)" if stop is not None else
                   "no platform has a throughput at the SLO" if have_matplotlib() else
                   "matplotlib is not installed (pip install 'opmap[report]')")
            console.print(f"  trade_curve.png not drawn: {why}", highlight=False, markup=False)
    from opmap.cli.common import record_run

    record_run("fit", r, {"workload": ",".join(ms), "hardware": ",".join(r["hardware"]), "phase": "serve",
                          "precision": dtype}, store, no_store)
    exit_if_stopped(stop)


def _stopped_words(r: dict) -> str:
    """The words that mark a fit stopped by a signal (its finished cells only), empty for a whole one."""
    i = r.get("interrupted")
    return "" if not i else clean(f": INTERRUPTED by {i['signal']}, {i['cells_done']} of {i['cells_total']} cells "
                                   f"run (not run: {', '.join(i['cells_not_run'])})")
