"""``opmap quality``: the output error of a reduced precision against fp32 on the same inputs."""

from __future__ import annotations

import math
from pathlib import Path

import typer
from rich.table import Table

from opmap.cli.common import build_workload, console, print_wrote
from opmap.formats import registry
from opmap.record import record
from opmap.report.text import plain, safe
from opmap.validate import INT_GE1, SEED, json_text, options

# quality.json's "weights": the zoo builds random weights (no checkpoint); a model file builds its own
RANDOM_WEIGHTS = "random"
USER_WEIGHTS = "as the model file builds them (random unless it loads a checkpoint)"


def quality(
    model: str = typer.Argument(..., help="A zoo name, path/to/file.py:factory, path/to/config.json or hf:NAME."),
    dtype: str = typer.Option(..., help=f"Reduced precision: {', '.join(registry().names(quality=True))}."),
    batch: int | None = typer.Option(None, help="Batch size (default: 8 images, 2 sequences)."),
    seq: int | None = typer.Option(None, help="Sequence length for text models (default 64)."),
    image_size: int | None = typer.Option(None, help="Image side for vision models."),
    seed: int = typer.Option(0, help="Seed of the random inputs."),
    out: Path | None = typer.Option(None, help="Write quality.json here."),
) -> None:
    """Run MODEL in a reduced precision against fp32 on the same inputs; report the output error."""
    from opmap.measure.quality import check_dtype, measure_quality
    from opmap.report.sheet import check_out_dir, write_set
    from opmap.workloads import MODELS

    options({"--batch": (batch, INT_GE1), "--seq": (seq, INT_GE1), "--image-size": (image_size, INT_GE1),
             "--seed": (seed, SEED)})
    check_dtype(dtype)  # before the fp32 build on the CPU, the expensive part
    if out is not None:
        check_out_dir(out)
    spec = MODELS.get(model)
    if spec is not None and spec.kind == "text" and seq is None:
        seq = 64
    if batch is None:
        batch = 2 if spec is None or spec.kind == "text" else 8
    w = build_workload(model, batch, seq, image_size, "fp32", "cpu")
    weights = RANDOM_WEIGHTS if spec is not None else USER_WEIGHTS
    with console.status(f"running {safe(w.name)} in fp32 and in {dtype}"):
        q = measure_quality(w.name, w.module, w.inputs, dtype, spec.kind if spec else "", seed, weights)
    console.print(_quality_table(q, w.name, dtype, seed))
    if q.layers:
        console.print(_layer_table(q))
    if out is not None:
        print_wrote(write_set(out, {"quality.json": json_text(record(q), indent=1) + "\n"}))


def _quality_table(q, workload: str, dtype: str, seed: int) -> Table:
    what = "random weights" if q.weights == RANDOM_WEIGHTS else f"weights {q.weights}"
    t = Table(title=plain(f"{workload}: {dtype} against fp32 on the same inputs (seed {seed}), {what}"),
              title_justify="left")
    for col in ("relative error", "max abs error", "SNR dB", q.agreement_kind, "KL(ref || q) nats", "positions",
                "method"):
        t.add_column(col, overflow="fold")
    t.add_row(f"{q.rel_error:.3g}", f"{q.max_abs_error:.3g}", _db(q.snr_db), f"{q.agreement:.1%}",
              "-" if q.kl is None else f"{q.kl:.3g}", str(q.positions), q.method)
    return t


LAYER_ROWS = 12  # the lowest-SNR layers shown; quality.json holds every one


def _db(v: float | None) -> str:
    return "exact" if v is None else f"{v:.1f}"


def _layer_table(q) -> Table:
    """The Linear layers with the lowest SNR fed the reference's input (their own error), worst first."""
    worst = sorted(q.layers, key=lambda la: math.inf if la.snr_db is None else la.snr_db)[:LAYER_ROWS]
    more = len(q.layers) - len(worst)
    rest = f"; {more} more in quality.json" if more else ""
    t = Table(title=plain(f"per Linear layer, output SNR against fp32 (lowest first{rest})"), title_justify="left")
    for col in ("layer", "SNR dB, fed the reference's input", "SNR dB, in the model's run"):
        t.add_column(col, overflow="fold")
    for la in worst:
        t.add_row(safe(la.layer), _db(la.snr_db), _db(la.snr_db_in_model))
    return t
