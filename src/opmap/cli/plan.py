"""``opmap plan``: rank every legal parallel layout of a model on N devices."""

from __future__ import annotations

from pathlib import Path

import typer

from opmap.cli.common import (
    ATTENTION_DROPOUT_HELP,
    ATTENTION_KERNEL_HELP,
    console,
    print_wrote,
    stack_hardware,
    step_progress,
)
from opmap.record import record
from opmap.validate import INT_GE0, INT_GE1, json_text, options

# 2**17: above the largest clusters published (~100k GPUs); 131072 devices plan in about a minute, 2**30 ran on
# for minutes
MAX_DEVICES = 2**17


def plan(
    model: str = typer.Argument(..., help="A zoo name (opmap models list), path/to/file.py:factory or hf:NAME."),
    hardware: str = typer.Option("h100-sxm", "--hardware", "-H", help="Catalog name (opmap hardware list)."),
    devices: int = typer.Option(8, "--devices", help="Devices to lay the model over."),
    phase: str = typer.Option("train", help="train (a training step) or prefill (a forward pass)."),
    objective: str = typer.Option("throughput", help="Rank by throughput (tokens/s) or latency."),
    seq: int | None = typer.Option(None, help="Sequence length (default: the model's)."),
    global_batch: int | None = typer.Option(None, "--global-batch", "--batch",
                                            help="Sequences per step over all replicas (default 2 x devices)."),
    dtype: str = typer.Option("bf16", help="Precision."),
    cp: int | None = typer.Option(None, "--cp", help="Context-parallel size to plan with (default: every size the "
                                                      "sequence splits over is searched)."),
    rows: int = typer.Option(15, help="Layouts shown (0: all)."),
    out: Path | None = typer.Option(None, help="Write plan.json and plan.md here."),
    store: Path | None = typer.Option(None, "--store", help="Run store file (default $OPMAP_STORE)."),
    no_store: bool = typer.Option(False, "--no-store", help="Do not record this run in the run store."),
    attention_kernel: str | None = typer.Option(None, "--attention-kernel", help=ATTENTION_KERNEL_HELP),
    attention_dropout: float | None = typer.Option(None, "--attention-dropout", help=ATTENTION_DROPOUT_HELP),
) -> None:
    """Rank every legal (tp, cp, pp, dp, ep, sp, vp, microbatch, recompute, zero) layout by predicted throughput or
    latency; layouts that do not fit memory are rejected with the numbers."""
    from rich.table import Table

    from opmap.explore.plan import plan as run_plan
    from opmap.report.sheet import check_out_dir, si, write_set
    from opmap.workloads import load_workload

    options({"--devices": (devices, INT_GE1.but(hi=MAX_DEVICES)), "--seq": (seq, INT_GE1),
             "--global-batch": (global_batch, INT_GE1), "--rows": (rows, INT_GE0), "--cp": (cp, INT_GE1)})
    hw = stack_hardware(hardware, attention_kernel, attention_dropout)
    if phase == "train":  # fp8 training needs an fp8 matrix engine: refused before any capture
        from opmap.precision import resolve_training_precision

        resolve_training_precision(hw, dtype)
    if out is not None:
        check_out_dir(out)
    with step_progress("planning") as progress:
        result = run_plan(lambda mb: load_workload(model, mb, seq, dtype, "meta"), hw, devices, phase, dtype,
                          global_batch, objective, progress=progress, cp=cp)
    ranked = result.ranked
    t = Table(title=f"opmap plan {model} on {devices} x {hw.name} ({phase}, by {objective}; seq {result.seq}, "
                    f"global batch {result.global_batch}): {len(ranked)} of {result.layouts} "
                    "layouts legal and fitting",
              title_justify="left")
    for col in ("rank", "layout", "tokens/s", "step", "latency", "bubble", "MFU", "memory"):
        t.add_column(col, justify="left" if col == "layout" else "right")
    for i, c in enumerate(ranked if rows <= 0 else ranked[:rows]):
        t.add_row(str(i + 1), c.layout, si(c.tokens_per_s), si(c.step_s, "s"), si(c.latency_s, "s"),
                  f"{c.bubble_fraction:.1%}", f"{c.mfu:.1%}", f"{c.memory_bytes / 2**30:.4g} GiB")
    console.print(t)
    console.print(result.confidence.line, highlight=False, markup=False)  # how far to trust the figures
    rej = result.rejected
    if rej:
        console.print(f"{len(rej)} rejected, e.g.:")
        for c in rej[:5]:
            console.print(f"  {c.layout}: {c.reason}", highlight=False, markup=False)
    if not ranked:
        console.print("no layout is legal and fits: more devices, a shorter sequence or a smaller batch")
    if out is not None:
        md = [f"# opmap plan: {model} on {devices} x {hw.name}", "",
              f"Sequence {result.seq} tokens, global batch {result.global_batch} sequences.", "",
              result.confidence.line, "",
              *[f"- {a}" for a in result.assumptions], "",
              "| rank | layout | tokens/s | step (s) | latency (s) | bubble | MFU | memory (GiB) |",
              "|---|---|---|---|---|---|---|---|"]
        md += [f"| {i + 1} | {c.layout} | {c.tokens_per_s:.4g} | {c.step_s:.4g} | {c.latency_s:.4g} | "
               f"{c.bubble_fraction:.1%} | {c.mfu:.1%} | {c.memory_bytes / 2**30:.4g} |"
               for i, c in enumerate(ranked)]
        md += ["", "## Rejected", ""] + [f"- {c.layout}: {c.reason}" for c in rej]
        print_wrote(write_set(out, {"plan.json": json_text(record(result), indent=1),
                                    "plan.md": "\n".join(md) + "\n"}))
    from opmap.cli.common import record_run
    from opmap.tags import Tags

    record_run("plan", record(result), Tags("plan", workload=model, hardware=hw.name, phase=phase, precision=dtype,
                                              parallelism=f"{devices} devices"), store, no_store)
