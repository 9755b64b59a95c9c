"""``opmap sweep``: latency against throughput over batch and sequence, predicted or measured here."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from opmap.cli.common import console, exit_if_stopped, kept, print_wrote, result_only_on_stdout, step_progress
from opmap.cli.common import hardware as get_hardware
from opmap.errors import OpmapError
from opmap.phases.runtime import RUNTIME_HELP
from opmap.record import record
from opmap.validate import INT_GE1, json_text, options, visible

if TYPE_CHECKING:
    from opmap.explore.sweep import Sweep, SweepPoint


def sweep(
    model: str = typer.Argument(..., help="A zoo name (opmap models list), path/to/config.json or hf:NAME."),
    hardware: str | None = typer.Option(None, "--hardware", "-H",
                                        help="Catalog name (opmap hardware list) or a .toml profile; default "
                                             "h100-sxm, and with --measure local (this CPU, calibrated; made on "
                                             "first use): the prediction set beside a measurement is the CPU's."),
    batch: str = typer.Option("1,2,4,8,16,32", help="Batch sizes, comma-separated."),
    seq: str = typer.Option("512", help="Sequence lengths (prefill) or KV-cache lengths (decode), comma-separated."),
    phase: str = typer.Option("prefill", help="prefill (latency: time to first token) or decode (time per "
                                              "output token)."),
    dtype: str | None = typer.Option(None, help="Precision; default bf16, and fp32 with --measure (which runs "
                                                "fp32, bf16 or fp16 here)."),
    measure: bool = typer.Option(False, help="Time every point on this CPU in --dtype instead, beside its "
                                             "prediction for this CPU: p50 / p95 / p99, and its energy from the "
                                             "RAPL package counter where readable."),
    repeats: int = typer.Option(10, help="With --measure: timed runs per point."),
    runtime: str | None = typer.Option(None, "--runtime", help=RUNTIME_HELP + "; default engine for a predicted "
                                                                "sweep (as serve and fit), eager with --measure."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel devices each point is laid out on (predicted)."),
    pp: int = typer.Option(1, "--pp", help="Pipeline stages each point is laid out on (predicted)."),
    engine: str = typer.Option("local", help="Where the predicted points run, one task per sequence length: local "
                                             "(a process pool here) or ray (a Ray cluster, the ray extra). "
                                             "--measure always runs here, one point at a time."),
    out: Path | None = typer.Option(None, help="Write sweep.json and sweep.md here."),
    store: Path | None = typer.Option(None, "--store", help="Run store file (default $OPMAP_STORE)."),
    no_store: bool = typer.Option(False, "--no-store", help="Do not record this run in the run store."),
    engine_preset: str | None = typer.Option(None, "--engine-preset",
                                             help="vllm, sglang, trtllm or trtllm-bench (NAME@VERSION): decode "
                                                  "points under that engine's CUDA graphs (the capture size each "
                                                  "batch pads to, stated per point; runtime engine) in sweep.json."),
    as_json: bool = typer.Option(False, "--json", help="Print sweep.json on stdout instead of the table (the "
                                                       "progress and every other line on stderr)."),
) -> None:
    """Price every (batch, seq) point: latency, requests and tokens per second, bound mix, MFU, memory fit; the
    knee and the Pareto front marked."""
    from opmap.explore.sweep import check_sweep, parse_ints
    from opmap.explore.sweep import sweep as run_sweep
    from opmap.report.sheet import check_out_dir, write_set

    options({"--repeats": (repeats, INT_GE1), "--tp": (tp, INT_GE1), "--pp": (pp, INT_GE1)})
    dtype = dtype or ("fp32" if measure else "bf16")
    batches, seqs = parse_ints(batch, "batch"), parse_ints(seq, "seq")
    check_sweep(model, batches, seqs, phase, dtype, measure, engine, runtime, tp, pp)  # before a calibration
    preset = _preset(engine_preset, measure)
    if out is not None:
        check_out_dir(out)
    stop = None
    with result_only_on_stdout(as_json):
        hw = _hardware(hardware or ("local" if measure else "h100-sxm"))
        try:
            with step_progress("sweeping") as progress:
                r = run_sweep(model, hw, batches, seqs, phase, dtype, measure, repeats, progress, engine=engine,
                              runtime=runtime, tp=tp, pp=pp)
        except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM: the finished lengths shown, written, recorded, marked
            r, stop = kept(e)
        body = record(r)
        if preset is not None:
            body["engine_preset"] = _graphs(preset, hw, tp, phase, batches)
        if not as_json:
            _print_table(r, model, phase, dtype, measure)
            if preset is not None:
                _print_graphs(body["engine_preset"])
        if out is not None:
            print_wrote(write_set(out, {"sweep.json": json_text(body, indent=1),
                                        "sweep.md": _markdown(r, model, phase)}))
        from opmap.cli.common import record_run
        from opmap.tags import Tags

        record_run("sweep", body, Tags("sweep", workload=model, hardware=r.hardware, phase=phase,
                                              precision=dtype), store, no_store)
    if as_json:
        print(json_text(body, indent=1))
    exit_if_stopped(stop)


def _preset(spec: str | None, measure: bool):
    """--engine-preset parsed (None without one); a measured sweep runs eager PyTorch, no engine."""
    if spec is None:
        return None
    if measure:
        raise OpmapError("--engine-preset describes a serving engine's predicted steps; --measure times eager "
                         "PyTorch here: drop one")
    from opmap.engines import parse_preset

    return parse_preset(spec)


def _graphs(preset, hw, tp: int, phase: str, batches: list[int]) -> dict:
    """sweep.json's engine_preset: the engine, its CUDA graph capture sizes on this device and TP degree, and the
    graph each decode batch replays (padded up to it; None: past the largest, no full graph)."""
    from opmap.engines.rules import device_graph_sizes, graph_batch

    sizes, source = device_graph_sizes(preset, hw.name, hw.memory_bytes, tp)
    pads = {str(b): graph_batch(b, sizes) for b in batches} if phase == "decode" and sizes else {}
    return {**record(preset), "cuda_graph_sizes": list(sizes), "cuda_graph_source": source,
            "decode_graph_batch": pads,
            "note": "points priced as --runtime engine prices them; the padding to each graph's batch is stated, "
                    "not priced"}


def _print_graphs(ep: dict) -> None:
    pads = ", ".join(f"{b} -> {g if g is not None else 'no graph'}" for b, g in ep["decode_graph_batch"].items())
    console.print(f"engine preset {ep['engine']}@{ep['version']} ({ep['name']}): {len(ep['cuda_graph_sizes'])} CUDA "
                  f"graph sizes" + (f", up to {ep['cuda_graph_sizes'][-1]}" if ep["cuda_graph_sizes"] else "")
                  + (f"; decode batch -> graph batch: {pads}" if pads else "") + f" ({ep['note']})",
                  highlight=False, markup=False)


def _marks(r: Sweep, p: SweepPoint) -> list[str]:
    from opmap.explore.sweep import BatchSeq

    at = BatchSeq(p.batch, p.seq)
    return [m for m, on in (("knee", at in r.knee), ("pareto", at in r.pareto)) if on]


def _print_table(r: Sweep, model: str, phase: str, dtype: str, measure: bool) -> None:
    """The terminal table: a row a point, a measured point with its prediction beside it; the assumptions."""
    from rich.table import Table

    from opmap.report.sheet import si

    where = r.hardware + (f" tp{r.tp} x pp{r.pp}" if r.tp * r.pp > 1 else "")
    if measure:
        where = f"{r.measured_on}, measured beside its prediction on {r.hardware}"
    t = Table(title=f"opmap sweep {model} on {where} ({phase}, {dtype}, runtime {r.runtime['name']}): "
                    f"{len(r.points)} points, "
                    f"{r.captures} captures, {r.points_per_s:.3g} points/s ({r.engine})" + _stopped_words(r),
              title_justify="left")
    cols = ["batch", "seq", "latency", "p99", "req/s", "tokens/s", "MFU", "bound", "fits", "mark"]
    if measure:
        cols[7:7] = ["W", "J/token"]
        cols[3:3] = ["predicted"]
    for c in cols:
        t.add_column(c, justify="right")
    for p in r.points:
        top = next(iter(p.bound_mix), "-")
        cells = [str(p.batch), str(p.seq), si(p.latency_s, "s"),
                 si(p.latency_p99_s, "s") if p.latency_p99_s is not None else "-",
                 si(p.throughput_per_s), si(p.tokens_per_s), "-" if p.mfu is None else f"{p.mfu:.1%}",
                 f"{top} {p.bound_mix.get(top, 0):.0%}" if p.bound_mix else "-", "yes" if p.fits else "no",
                 " ".join(_marks(r, p))]
        if measure:
            cells[7:7] = [si(p.power_w, "W") if p.power_w is not None else "-",
                          si(p.energy_per_token_j, "J") if p.energy_per_token_j is not None else "-"]
            cells[3:3] = [si(p.predicted.latency_s, "s") if p.predicted is not None else "-"]
        t.add_row(*cells)
    console.print(t)
    if measure and r.points:
        methods = sorted({p.power_method for p in r.points})
        console.print(f"  energy: {'; '.join(methods)}", highlight=False, markup=False)
    for a in r.assumptions:
        console.print(f"  {a}", highlight=False, markup=False)


def _markdown(r: Sweep, model: str, phase: str) -> str:
    """sweep.md: the assumptions and a row a point, each naming its hardware and dtype and its prediction's."""
    md = [f"# opmap sweep: {model} on {r.hardware} ({phase}){_stopped_words(r)}", "",
          *[f"- {a}" for a in r.assumptions], "",
          "| batch | seq | hardware | dtype | latency (s) | predicted (s) | predicted on | p99 (s) | req/s | "
          "tokens/s | MFU | fits | W | J/token | method | power method | mark |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in r.points:
        p99 = f"{p.latency_p99_s:.4g}" if p.latency_p99_s is not None else "-"
        w = "-" if p.power_w is None else f"{p.power_w:.4g}"
        jt = "-" if p.energy_per_token_j is None else f"{p.energy_per_token_j:.4g}"
        pred_s, pred_on = (p.predicted.latency_s, p.predicted.hardware) if p.predicted else (p.latency_s, p.hardware)
        md.append(f"| {p.batch} | {p.seq} | {p.hardware} | {p.dtype} | {p.latency_s:.4g} | "
                  f"{pred_s:.4g} | {pred_on} | {p99} | {p.throughput_per_s:.4g} | "
                  f"{p.tokens_per_s:.4g} | {'-' if p.mfu is None else format(p.mfu, '.1%')} | "
                  f"{'yes' if p.fits else 'no'} | {w} | {jt} | "
                  f"{p.method} | {p.power_method} | {', '.join(_marks(r, p))} |")
    return "\n".join(md) + "\n"


def _hardware(name: str):
    """The hardware profile by name; ``local`` (this CPU, calibrated) is calibrated on its first use, as profile's."""
    from opmap.hardware.local import cache_path

    if name.strip().lower() == "local" and not cache_path("cpu").exists():
        from opmap.cli.calibrate import run_calibration

        console.print(f"no calibration for cpu yet ({visible(cache_path('cpu'))}): running opmap calibrate first",
                      markup=False, highlight=False, soft_wrap=True)
        run_calibration("cpu")
    return get_hardware(name)


def _stopped_words(r: Sweep) -> str:
    """The words that mark a sweep stopped by a signal (its finished sequence lengths only); empty otherwise."""
    i = r.interrupted
    return "" if not i else (f": INTERRUPTED by {i.signal}, seq {', '.join(map(str, i.seqs_done))} run, "
                             f"{', '.join(map(str, i.seqs_not_run))} not run")
