"""``opmap calibrate``: measure this device and write the profile that ``--hardware local`` reads.

``run_calibration`` is the whole run (measure with a progress bar, write, show); ``opmap profile`` calls it
too when --hardware local has no profile yet.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from opmap.cli.common import console, progress_console
from opmap.validate import visible


def calibrate(
    device: str = typer.Option("cpu", help="cpu or cuda."),
    quick: bool = typer.Option(False, help="A small grid (seconds): a smoke test, not a profile to trust."),
    no_budget: bool = typer.Option(False, "--no-budget", help="Lift the one-minute time budget: every shape the "
                                                               "skip rule allows (minutes on a loaded host)."),
    out: Path | None = typer.Option(None, help="Profile path (default: the cache that --hardware local reads)."),
    datasheet: str | None = typer.Option(None, help="Catalog entry to compare with (CUDA: matched by device "
                                                       "name)."),
    store: Path | None = typer.Option(None, "--store", help="Run store file (default $OPMAP_STORE)."),
    no_store: bool = typer.Option(False, "--no-store", help="Do not record this run in the run store."),
    allow_busy: bool = typer.Option(False, "--allow-busy", help="Measure on a busy host anyway (its figures read "
                                                                 "low): the profile is marked busy and goes to "
                                                                 "--out PATH, never the host's."),
    from_bench: list[Path] | None = typer.Option(None, "--from-bench", help="A serving stack instead of the device: "
                                                 "fit its profile to these bench runs (folders `opmap bench --out` "
                                                 "wrote; repeat the option), written to --out for --stack."),
    config: str | None = typer.Option(None, "--config", help="--from-bench: the served model's Hugging Face config "
                                                            "(default: the launched server's)."),
    hardware: str | None = typer.Option(None, "--hardware", help="--from-bench: the device the server ran on "
                                                                "(default for a launched server: local)."),
    dtype: str | None = typer.Option(None, "--dtype", help="--from-bench: the served precision (default: the "
                                                          "launched model's, else bf16)."),
    runtime: str = typer.Option("engine", "--runtime", help="--from-bench: the runtime the steps are priced under."),
) -> None:
    """Measure this device's matmul rates, bandwidth, dispatch overhead and vector rate. A busy host (other
    processes holding the CPUs, repeats that disagree) is refused: its profile would read low. With --from-bench:
    fit a serving stack's profile (host time per step, per sequence and per request, decode and prefill scales) to
    measured bench runs instead."""
    if from_bench:
        from opmap.cli.calibrate_stack import calibrate_stack
        from opmap.errors import OpmapError

        if out is None:
            raise OpmapError("--from-bench writes a stack profile: name it with --out PATH")
        calibrate_stack(list(from_bench), out, config, hardware, dtype, runtime)
        return
    path = run_calibration(device, quick, out, datasheet, budgeted=not no_budget, allow_busy=allow_busy)
    if not no_store:
        from opmap.cli.common import record_run
        from opmap.store.db import read_profile

        run = read_profile(path, quick)
        record_run("calibrate", run.payload, run.tags, store, no_store)


def run_calibration(device: str, quick: bool = False, out: Path | None = None,
                    datasheet: str | None = None, budgeted: bool = True, allow_busy: bool = False) -> Path:
    """Calibrate ``device``, write the profile (``out``, default the cache), show the measured rates and,
    where a datasheet is named or matched, measured over datasheet. Returns the profile's path. A busy host is
    refused before measuring where it is busy already, after where it grew busy (nothing written), unless
    ``allow_busy``, which needs an ``out`` apart from the host's profile and marks what it writes."""
    from opmap.calibrate import MAX_CALL_S, write_profile
    from opmap.calibrate import calibrate as measure
    from opmap.calibrate.load import summary
    from opmap.calibrate.profile_file import is_host_profile
    from opmap.errors import OpmapError
    from opmap.hardware import get_hardware
    from opmap.hardware.local import cache_path

    ds = get_hardware(datasheet) if datasheet else None  # a bad name fails before the measuring, not after
    if allow_busy and (out is None or is_host_profile(out, device)):
        raise OpmapError("--allow-busy keeps a busy host's profile apart from the host's "
                         f"({visible(cache_path(device))}): name another file with --out PATH")
    cal = _measure_with_progress(measure, device, quick, budgeted, allow_busy)
    if cal.busy and not allow_busy:
        raise OpmapError(f"the host was busy while calibrating ({summary(cal.conditions)}): the figures read low, so "
                         "nothing was written; calibrate when it is quiet (or --allow-busy --out PATH: a profile "
                         "marked busy, kept apart from the host's)")
    path = write_profile(cal, out)
    console.print(_measured_table(cal))
    if ds is None and cal.device.startswith("cuda"):
        from opmap.hardware.match import match_datasheet

        match = match_datasheet(str(cal.fingerprint["model"]))
        ds = get_hardware(match) if match else None
    if ds is not None:
        console.print(_datasheet_table(cal, ds))
    if cal.skipped:
        console.print(f"{len(cal.skipped)} shapes skipped (one call over {MAX_CALL_S} s, or past the time budget: "
                      "--no-budget lifts it): "
                      + "; ".join(cal.skipped[:3]) + (" ..." if len(cal.skipped) > 3 else ""))
    _print_conditions(cal)
    console.print(f"wrote {visible(path)}; use it with --hardware local", markup=False, highlight=False,
                  soft_wrap=True)
    return path


def _measure_with_progress(measure, device: str, quick: bool, budgeted: bool, allow_busy: bool):
    """The library's calibration under a transient progress bar with the time elapsed and an estimate of the time
    left."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from opmap.calibrate import steps

    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), TextColumn("left"),
                  TimeRemainingColumn(), console=progress_console, transient=True) as bar:
        task = bar.add_task("calibrating", total=steps(quick))
        return measure(device, quick, progress=lambda msg: bar.update(task, advance=1, description=msg),
                       budgeted=budgeted, allow_busy=allow_busy)


def _print_conditions(cal) -> None:
    """The host's load while measuring, in one line: busy (the profile is marked), warned, or quiet."""
    from opmap.calibrate.load import summary

    c = cal.conditions
    if c is None:
        return
    share = c.run.others_cpu_share
    quiet = f"other processes took {share:.0%} of the {c.cpus} CPUs' time" if share is not None else \
        f"{c.run.own_cpu_per_wall:.2f} CPU seconds a wall second"
    if cal.busy:
        line = f"[yellow]warning[/yellow]: measured on a busy host ({summary(c)}): the profile is marked busy"
    elif c.verdict.warnings:
        line = f"[yellow]note[/yellow]: {summary(c)}: the figures may read a little low"
    else:
        line = f"host quiet while measuring: {quiet}"
    console.print(line, highlight=False, soft_wrap=True)


def _measured_table(cal) -> Table:
    """Every measured rate with its shape, median and spread."""
    from opmap.report.sheet import si

    t = Table(title=f"measured on {cal.fingerprint['model']} ({cal.fingerprint['threads']} threads)")
    for col in ("what", "shape / size", "median", "spread (min-max)"):
        t.add_column(col)
    for r in cal.matmul:
        lo, hi = 2.0 * r["m"] * r["n"] * r["k"] / r["max_s"], 2.0 * r["m"] * r["n"] * r["k"] / r["min_s"]
        t.add_row(f"matmul {r['dtype']}", f"{r['m']}x{r['n']}x{r['k']}", si(r["flops_per_s"], "FLOP/s"),
                  f"{si(lo, 'FLOP/s')} - {si(hi, 'FLOP/s')}")
    for r in cal.conv:
        t.add_row(f"conv {r['dtype']}", f"b{r['batch']} {r['cin']}->{r['cout']} {r['side']}px k{r['kernel']}",
                  si(r["flops_per_s"], "FLOP/s"), "")
    for r in cal.attention:
        t.add_row(f"attention {r['dtype']}", f"{r['bh']}x{r['sq']}x{r['d']}{' causal' if r['causal'] else ''}",
                  si(r["flops_per_s"], "FLOP/s"), "")
    for r in cal.bandwidth:
        t.add_row(f"{r['kind']} bandwidth", si(r["bytes"], "B"), si(r["bytes_per_s"], "B/s"), "")
    lo = cal.launch_overhead
    t.add_row("dispatch overhead", "1 element", si(lo.median_s, "s"),
              f"{si(lo.spread()['min_s'], 's')} - {si(lo.spread()['max_s'], 's')}")
    t.add_row("view overhead", "view of 64x64", si(cal.view_overhead_s, "s"), "")
    for dt, r in cal.vector.items():
        t.add_row(f"vector {dt}", "addcmul, 128k elements", si(r, "FLOP/s"), "")
    t.add_row("transcendental fp32", "exp, tanh, erf, 128k elements", si(cal.transcendental_per_s, "/s"), "")
    return t


def _datasheet_table(cal, ds) -> Table:
    """Measured over datasheet, per matrix dtype and for the memory bandwidth."""
    from opmap.report.sheet import si

    t = Table(title=f"measured over datasheet ({ds.name}: {ds.display_name})")
    for col in ("what", "measured", "datasheet", "measured / datasheet"):
        t.add_column(col)
    for dt in ("fp32", "tf32", "bf16", "fp16"):
        best, v = cal.peak(dt), ds.matrix_peak_flops_per_s.get(dt)
        if best and v is not None and v.value:
            t.add_row(f"matrix {dt} ({v.kind})", si(best["flops_per_s"], "FLOP/s"), si(v.value, "FLOP/s"),
                      f"{best['flops_per_s'] / v.value:.2f}")
    bw = cal.copy_bandwidth()["bytes_per_s"]
    t.add_row("memory bandwidth (copy, largest size)", si(bw, "B/s"), si(ds.memory_bandwidth_bytes_per_s, "B/s"),
              f"{bw / ds.memory_bandwidth_bytes_per_s:.2f}")
    return t
