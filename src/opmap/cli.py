"""The opmap command line. Thin: parses, calls library functions, renders.

Bad input ends with one line on stderr naming the problem and what is accepted, and exit status 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from opmap.errors import OpmapError

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True,
                  help="Map a neural-network workload onto hardware: operators, costs, predicted time.")
models_app = typer.Typer(help="The built-in model zoo.", no_args_is_help=True)
hardware_app = typer.Typer(help="The hardware catalog.", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(hardware_app, name="hardware")
# Piped output (CI, files) gets a wide page instead of rich's 80-column default, so the sheet stays a table.
console = Console(width=None if sys.stdout.isatty() else 180)


@app.command()
def analyze(
    model: str = typer.Argument(..., help="A zoo name (opmap models list) or path/to/file.py:factory."),
    hardware: str = typer.Option("h100-sxm", "--hardware", "-H", help="Catalog name (opmap hardware list)."),
    batch: int = typer.Option(1, help="Batch size."),
    seq: Optional[int] = typer.Option(None, help="Sequence length for text models (default: the model's)."),
    image_size: Optional[int] = typer.Option(None, help="Image side in pixels for vision models."),
    dtype: str = typer.Option("bf16", help="Precision: fp32, tf32, bf16, fp16, fp8, int8, int4 (weight-only)."),
    out: Optional[Path] = typer.Option(None, help="Write sheet.csv, kernels.csv, sheet.md and analysis.json here."),
    device: str = typer.Option("meta", help="Capture device: meta (no weights allocated), cpu or cuda."),
    layer_type: List[str] = typer.Option([], "--layer-type", help="Override: GLOB=TYPE on the module path."),
    rows: int = typer.Option(25, help="Kernels shown in the terminal sheet (0: all)."),
    fusion: str = typer.Option("eager", help="Fusion policy: eager (one kernel per op) or compiler."),
    fusion_plan: Optional[Path] = typer.Option(None, help='A plan file: JSON {"kernels": [[node ids], ...]}.'),
    quality: Optional[Path] = typer.Option(None, help="quality.json from opmap quality: evidence for --dtype."),
    layout: str = typer.Option("nchw", help="Activation layout of conv models: nchw or channels_last."),
) -> None:
    """Capture MODEL, cost every operator, map them to kernels, predict each one's time on HARDWARE."""
    from opmap.analyze import analyze as run_analyze
    from opmap.capture import parse_overrides
    from opmap.hardware import get_hardware
    from opmap.precision import resolve_precision
    from opmap.report.sheet import print_report, write_outputs

    from opmap.mapping.fusion import POLICIES

    hw = get_hardware(hardware)
    resolve_precision(hw, dtype)
    overrides = parse_overrides(layer_type)
    if fusion not in POLICIES and fusion_plan is None:
        raise OpmapError(f"unknown fusion policy {fusion!r}; accepted: {', '.join(POLICIES)}, or --fusion-plan FILE")
    if fusion_plan is not None and not fusion_plan.is_file():
        raise OpmapError(f"fusion plan {fusion_plan} does not exist")
    if device not in ("meta", "cpu", "cuda"):
        raise OpmapError(f"unknown capture device {device!r}; accepted: meta, cpu, cuda")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise OpmapError("--device cuda: no CUDA device is available here; accepted: meta, cpu")
    from opmap.workloads import with_layout

    w = with_layout(_build(model, batch, seq, image_size, dtype, device), layout)
    with console.status(f"capturing {w.name} and predicting on {hw.name}"):
        a = run_analyze(w, hw, dtype, overrides, fusion, fusion_plan, evidence=_evidence(quality, w.name, dtype))
    print_report(a, console, rows)
    if out is not None:
        paths = write_outputs(a, out)
        console.print("wrote " + ", ".join(str(p) for p in paths))


def _build(model: str, batch: int, seq: Optional[int], image_size: Optional[int], dtype: str, device: str):
    """Validate the shape knobs against the model's kind, check memory for a real build, then build."""
    from opmap.workloads import MODELS, load_workload

    spec = MODELS.get(model)
    if spec is not None and spec.kind == "vision" and seq is not None:
        raise OpmapError(f"{model} is a vision model: it takes --image-size, not --seq")
    if spec is not None and spec.kind == "text" and image_size is not None:
        raise OpmapError(f"{model} is a text model: it takes --seq, not --image-size")
    if spec is not None and device != "meta":
        _check_memory(spec.published_params, dtype, device)
    with console.status(f"building {model} on {device}"):
        return load_workload(model, batch, seq if seq is not None else image_size, dtype, device)


def _check_memory(params: int, dtype: str, device: str) -> None:
    """Refuse a real-tensor build that cannot fit, before allocating anything."""
    import os

    need = params * (4 if dtype in ("fp32", "tf32") else 2)
    if device == "cpu":
        have = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    else:
        import torch

        have = torch.cuda.mem_get_info()[0]
    if need > 0.8 * have:
        raise OpmapError(f"the weights need {need / 1e9:.1f} GB on {device}, {have / 1e9:.1f} GB is free; "
                         "use --device meta (no weights allocated)")


@app.command("quality")
def quality_cmd(
    model: str = typer.Argument(..., help="A zoo name or path/to/file.py:factory."),
    dtype: str = typer.Option(..., help="Reduced precision: bf16, fp16, fp8, int8, int4."),
    batch: Optional[int] = typer.Option(None, help="Batch size (default: 8 images, 2 sequences)."),
    seq: Optional[int] = typer.Option(None, help="Sequence length for text models (default 64)."),
    image_size: Optional[int] = typer.Option(None, help="Image side for vision models."),
    seed: int = typer.Option(0, help="Seed of the random inputs."),
    out: Optional[Path] = typer.Option(None, help="Write quality.json here."),
) -> None:
    """Run MODEL in a reduced precision against fp32 on the same inputs; report the output error."""
    import json

    from opmap.measure.quality import QUALITY_DTYPES, measure_quality
    from opmap.report.sheet import write_set
    from opmap.workloads import MODELS

    if dtype not in QUALITY_DTYPES:
        raise OpmapError(f"quality takes a reduced precision; accepted: {', '.join(QUALITY_DTYPES)} (got {dtype!r})")
    spec = MODELS.get(model)
    if spec is not None and spec.kind == "text" and seq is None:
        seq = 64
    if batch is None:
        batch = 2 if spec is None or spec.kind == "text" else 8
    w = _build(model, batch, seq, image_size, "fp32", "cpu")
    with console.status(f"running {w.name} in fp32 and in {dtype}"):
        q = measure_quality(w.name, w.module, w.inputs, dtype, spec.kind if spec else "", seed)
    t = Table(title=f"{w.name}: {dtype} against fp32 on the same inputs (seed {seed})", title_justify="left")
    for col in ("relative error", "max abs error", q.agreement_kind, "positions", "method"):
        t.add_column(col, overflow="fold")
    t.add_row(f"{q.rel_error:.3g}", f"{q.max_abs_error:.3g}", f"{q.agreement:.1%}", str(q.positions), q.method)
    console.print(t)
    if out is not None:
        paths = write_set(out, {"quality.json": json.dumps(q.to_dict(), indent=1) + "\n"})
        console.print("wrote " + ", ".join(str(p) for p in paths))


def _evidence(path: Optional[Path], workload: str, dtype: str) -> str:
    """The precision evidence line of the assumptions: verified by a matching quality.json, or unverified."""
    import json

    if dtype in ("fp32", "tf32"):
        return "reference precision (fp32 storage)"
    if path is None:
        return (f"unverified: no quality evidence for {dtype} (run `opmap quality {workload} --dtype {dtype} "
                "--out DIR`, then pass --quality DIR/quality.json)")
    try:
        q = json.loads(Path(path).read_text())
        got = (q["workload"], q["dtype"], q["rel_error"], q["agreement"], q["agreement_kind"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise OpmapError(f"cannot read quality file {path}: expected quality.json from opmap quality "
                         f"({type(e).__name__})") from None
    if got[0] != workload or got[1] != dtype:
        raise OpmapError(f"quality file {path} is for {got[0]} at {got[1]}, not {workload} at {dtype}")
    return f"verified by {path}: relative error {got[2]:.3g}, {got[4]} {got[3]:.1%} against fp32"


@app.command()
def profile(
    model: str = typer.Argument(..., help="A zoo name (opmap models list) or path/to/file.py:factory."),
    device: str = typer.Option("cpu", help="Where it runs: cpu or cuda."),
    hardware: str = typer.Option("local", "--hardware", "-H",
                                 help="Profile the prediction uses: local (calibrated; made on first use), "
                                      "local-cuda, a catalog name or a .toml file."),
    datasheet: Optional[str] = typer.Option(None, help="Catalog entry for the datasheet MFU (CUDA: matched "
                                                       "by device name)."),
    batch: int = typer.Option(1, help="Batch size."),
    seq: Optional[int] = typer.Option(None, help="Sequence length for text models (default: the model's)."),
    image_size: Optional[int] = typer.Option(None, help="Image side in pixels for vision models."),
    dtype: str = typer.Option("fp32", help="Precision: fp32, tf32, bf16, fp16."),
    warmup: int = typer.Option(3, help="Untimed iterations first."),
    iters: int = typer.Option(20, help="Timed iterations (the latency distribution)."),
    profile_iters: int = typer.Option(5, help="Iterations under torch.profiler (the attribution)."),
    out: Optional[Path] = typer.Option(None, help="Write profile.json, sheet.csv, sheet.md, trace.json, "
                                                  "torch_trace.json here."),
    layer_type: List[str] = typer.Option([], "--layer-type", help="Override: GLOB=TYPE on the module path."),
    rows: int = typer.Option(20, help="Nodes shown in the terminal (0: all)."),
    train: bool = typer.Option(False, help="Profile a training step (forward, loss, backward, SGD update)."),
) -> None:
    """Run MODEL for real, attribute measured time to every node, join it to the prediction."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from opmap.capture import parse_overrides
    from opmap.hardware import get_hardware
    from opmap.hardware.local import cache_path
    from opmap.measure import run_profile
    from opmap.precision import resolve_precision
    from opmap.report.profile_sheet import print_profile_report, write_profile_outputs

    if device not in ("cpu", "cuda"):
        raise OpmapError(f"profile runs on a real device; accepted: cpu, cuda (got {device!r})")
    if dtype not in ("fp32", "tf32", "bf16", "fp16"):
        raise OpmapError(f"profile runs torch dtypes; accepted: fp32, tf32, bf16, fp16 (got {dtype!r}; "
                         "quantized formats: opmap analyze for the prediction, opmap quality for the error)")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise OpmapError("--device cuda: no CUDA device is available here; accepted: cpu")
    if hardware == "local" and device == "cuda":
        hardware = "local-cuda"
    if hardware in ("local", "local-cuda") and not cache_path(device).exists():
        console.print(f"no calibration for {device} yet ({cache_path(device)}): running opmap calibrate first")
        calibrate(device=device, quick=False, out=None)
    hw = get_hardware(hardware)
    resolve_precision(hw, dtype)
    ds = get_hardware(datasheet) if datasheet else None
    overrides = parse_overrides(layer_type)
    w = _build(model, batch, seq, image_size, dtype, device)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("starting", total=warmup + iters + profile_iters)
        p = run_profile(w, hw, dtype, device, warmup=warmup, iters=iters, profile_iters=profile_iters,
                        overrides=overrides, datasheet=ds, train=train,
                        progress=lambda stage, n: bar.update(task, advance=n, description=stage))
    d = p.to_dict()
    print_profile_report(p, console, rows, d)
    if out is not None:
        paths = write_profile_outputs(p, out, d)
        console.print("wrote " + ", ".join(str(x) for x in paths))


@app.command()
def calibrate(
    device: str = typer.Option("cpu", help="cpu or cuda."),
    quick: bool = typer.Option(False, help="A small grid (seconds): a smoke test, not a profile to trust."),
    out: Optional[Path] = typer.Option(None, help="Profile path (default: the cache that --hardware local reads)."),
    datasheet: Optional[str] = typer.Option(None, help="Catalog entry to compare with (CUDA: matched by device "
                                                       "name)."),
) -> None:
    """Measure this device's matmul rates, bandwidth, dispatch overhead and vector rate."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from opmap.calibrate import MAX_CALL_S, write_profile
    from opmap.calibrate import calibrate as run
    from opmap.calibrate import steps as count_steps
    from opmap.report.sheet import si

    steps = count_steps(quick)
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task("calibrating", total=steps)
        cal = run(device, quick, progress=lambda msg: bar.update(task, advance=1, description=msg))
    path = write_profile(cal, out)
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
    console.print(t)
    _datasheet_table(cal, datasheet)
    if cal.skipped:
        console.print(f"{len(cal.skipped)} shapes skipped (one call over {MAX_CALL_S} s): "
                      + "; ".join(cal.skipped[:3]) + (" ..." if len(cal.skipped) > 3 else ""))
    console.print(f"wrote {path}; use it with --hardware local")


def _datasheet_table(cal, datasheet: Optional[str]) -> None:
    """Measured over datasheet, per matrix dtype and for the memory bandwidth."""
    from opmap.hardware import get_hardware
    from opmap.hardware.match import match_datasheet
    from opmap.report.sheet import si

    name = datasheet or (match_datasheet(str(cal.fingerprint["model"])) if cal.device.startswith("cuda") else None)
    if name is None:
        return
    ds = get_hardware(name)
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
    console.print(t)


@models_app.command("list")
def models_list() -> None:
    """The zoo: names, published parameter counts and shape knobs."""
    from opmap.workloads import MODELS

    t = Table(title="opmap model zoo (random weights; parameter counts match the published figures)")
    for col in ("name", "description", "params", "knob", "default", "max", "source"):
        t.add_column(col, overflow="fold")
    for m in MODELS.values():
        t.add_row(m.name, m.description, f"{m.published_params:,}", "seq" if m.kind == "text" else "image-size",
                  str(m.default_seq), str(m.max_seq), m.params_source)
    console.print(t)


@hardware_app.command("list")
def hardware_list() -> None:
    """Every catalog device with its headline dense peaks and bandwidth."""
    from opmap.hardware import catalog
    from opmap.report.sheet import si

    t = Table(title="opmap hardware catalog (dense peaks)")
    for col in ("name", "device", "bf16", "fp8", "fp32", "memory", "bandwidth", "TDP"):
        t.add_column(col, justify="left" if col in ("name", "device") else "right")
    for h in catalog().values():
        def peak(d):
            v = h.matrix_peak_flops_per_s.get(d)
            return si(v.value, "FLOP/s") if v and v.value else "-"
        tdp = h.tdp_w
        t.add_row(h.name, h.display_name, peak("bf16"), peak("fp8"), peak("fp32"),
                  si(h.memory_bytes, "B"), si(h.memory_bandwidth_bytes_per_s, "B/s"),
                  f"{tdp:.0f} W" if tdp else "-")
    console.print(t)


@hardware_app.command("show")
def hardware_show(name: str = typer.Argument(..., help="Catalog name or a .toml file.")) -> None:
    """Every value of one device with its kind and source."""
    from opmap.hardware import get_hardware
    from opmap.hardware.spec import SCALAR_FIELDS
    from opmap.report.sheet import si

    h = get_hardware(name)
    t = Table(title=f"{h.name}: {h.display_name} ({h.vendor}, {h.device_type})")
    for col in ("field", "value", "kind", "source"):
        t.add_column(col, overflow="fold")
    for label, peaks in (("matrix", h.matrix_peak_flops_per_s), ("sparse matrix", h.sparse_matrix_peak_flops_per_s),
                         ("vector", h.vector_peak_flops_per_s)):
        for d, v in peaks.items():
            t.add_row(f"{label} peak {d}", si(v.value, "FLOP/s") if v.value else "-", v.kind, v.source)
    for key, unit in SCALAR_FIELDS.items():
        v = h.fields.get(key)
        if v is not None:
            val = "-" if v.value is None else (f"{v.value:g}" if unit in ("", "x") else si(v.value, unit))
            t.add_row(key, val, v.kind, v.source + (f" ({v.note})" if v.note else ""))
    console.print(t)
    if h.notes:
        console.print(h.notes)


def _usage_error(e: Exception) -> bool:
    """A click/typer usage error (typer vendors click from 0.20 on, so match by shape, not by class)."""
    return callable(getattr(e, "format_message", None)) and getattr(e, "exit_code", None) == 2


def main(argv: list[str] | None = None) -> int:
    err = Console(stderr=True)
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        app(args=args, prog_name="opmap", standalone_mode=False)
    except OpmapError as e:
        err.print(f"opmap: error: {e}", highlight=False, soft_wrap=True, markup=False)
        return 2
    except Exception as e:
        kind = type(e).__name__
        if kind == "NoArgsIsHelpError":  # a group called bare: show its help, as click does
            return main([*args, "--help"])
        if kind == "Exit":
            return int(getattr(e, "exit_code", 0))
        if kind == "Abort":
            err.print("opmap: aborted")
            return 130
        if _usage_error(e):
            ctx = getattr(e, "ctx", None)
            where = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
            err.print(f"opmap: error: {e.format_message()}{where}", highlight=False, soft_wrap=True, markup=False)
            return 2
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
