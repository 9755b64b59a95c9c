"""``opmap tune``: rank each operator signature's candidate mappings by the cost model, time the top k on this
device, keep the fastest, cache the choices (read by ``opmap analyze --tuned``), and write tune.json."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from opmap.cli.common import build_workload, console, print_wrote, step_progress
from opmap.cli.common import hardware as get_hardware
from opmap.record import record
from opmap.validate import INT_GE1, json_text, options

if TYPE_CHECKING:
    from opmap.explore.tune.result import SignatureResult

MAX_ROUNDS = 100  # samples per candidate: far above what a noisy host needs (the default 5 takes a minute or two)


def tune(
    model: str = typer.Argument(..., help="A zoo name (opmap models list), path/to/file.py:factory or hf:NAME."),
    hardware: str = typer.Option("local", "--hardware", "-H", help="The calibrated profile of this CPU: local."),
    batch: int = typer.Option(1, help="Batch size."),
    seq: int | None = typer.Option(None, help="Sequence length for text models (default: the model's)."),
    image_size: int | None = typer.Option(None, help="Image side in pixels for vision models."),
    dtype: str = typer.Option("fp32", help="The model's dtype (candidates may compute in others: bf16, fp16)."),
    top_k: int = typer.Option(3, "--top-k", help="Candidates timed per signature, by predicted rank (1-16)."),
    rounds: int = typer.Option(5, help="Interleaved timing rounds: samples per candidate."),
    device: str = typer.Option("cpu", help="cpu, or cuda: Triton GEMM configs vs cuBLAS and flash tiles vs SDPA, "
                                           "ranked by the GPU tilers and timed with CUDA events (--hardware: the "
                                           "GPU's catalog entry)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Tune every signature again (the cache is rewritten)."),
    out: Path | None = typer.Option(None, help="Write tune.json here."),
    store: Path | None = typer.Option(None, "--store", help="Run store file (default $OPMAP_STORE)."),
    no_store: bool = typer.Option(False, "--no-store", help="Do not record this run in the run store."),
) -> None:
    """Tune MODEL's operator mappings on this CPU: thread count, dtype, channels_last, SDPA backend, GEMM
    chunking; predicted vs measured per candidate, Kendall's tau of the ranking, the whole-model gain."""
    from opmap.explore.tune import tune as run_tune
    from opmap.explore.tune.run import MAX_TOP_K, check_setup
    from opmap.report.sheet import check_out_dir, write_set

    options({"--top-k": (top_k, INT_GE1.but(hi=MAX_TOP_K)), "--batch": (batch, INT_GE1),
             "--seq": (seq, INT_GE1), "--image-size": (image_size, INT_GE1),
             "--rounds": (rounds, INT_GE1.but(lo=3, hi=MAX_ROUNDS))})
    if model.lower().endswith(".onnx"):
        from opmap.errors import OpmapError

        raise OpmapError("tune times PyTorch modules: an ONNX model is analysed (opmap analyze), not tuned; accepted: "
                         "a zoo name, path/to/file.py:factory or hf:NAME")
    if device not in ("cpu", "cuda"):
        from opmap.errors import OpmapError

        raise OpmapError(f"tune cannot run on {device!r}; accepted: cpu, cuda")
    hw = get_hardware(hardware)
    if device == "cuda":
        _tune_cuda(model, hw, batch, seq, image_size, dtype, top_k, rounds, out)
        return
    check_setup(hw, top_k)
    if out is not None:
        check_out_dir(out)
    build_workload(model, batch, seq, image_size, dtype, "meta")  # a bad model or shape fails here, in one line
    with step_progress("tuning") as progress:
        result = run_tune(model, lambda: build_workload(model, batch, seq, image_size, dtype, "meta"),
                          lambda: build_workload(model, batch, seq, image_size, dtype, "cpu"), hw, dtype, top_k,
                          rounds, use_cache=not no_cache, progress=progress)
    console.print(_table(f"opmap tune {result.model} on {result.hardware} ({result.dtype} model, "
                         f"{result.threads} threads)", result.signatures))
    changed = precision_changes(result.signatures)
    if changed:
        console.print(changed, highlight=False, soft_wrap=True)
    w, tau = result.whole_model, result.kendall_tau
    console.print(f"Kendall tau (predicted vs measured order, within signatures): "
                  f"{'n/a' if tau is None else f'{tau:.2f}'}; cache: {result.hits} hits, "
                  f"{result.misses} tuned", highlight=False)
    d, tu = w.default, w.tuned
    console.print(f"whole model: default {d.measured_s * 1e3:.3g} ms (IQR {d.iqr_s * 1e3:.2g}), "
                  f"tuned {tu.measured_s * 1e3:.3g} ms (IQR {tu.iqr_s * 1e3:.2g}): "
                  f"gain {w.gain:.2f}x over {result.rounds} interleaved rounds; timed on a shared host",
                  highlight=False)
    if out is not None:
        print_wrote(write_set(out, {"tune.json": json_text(record(result), indent=1)}))
    from opmap.cli.common import record_run
    from opmap.tags import Tags

    tags = Tags("sweep", workload=model, hardware=hw.name, phase="tune", precision=dtype)
    record_run("tune", record(result.stored), tags, store, no_store)


def _table(title: str, entries: Sequence[SignatureResult]):
    from rich.table import Table

    from opmap.report.text import safe

    t = Table(title=safe(title), title_justify="left")
    for col in ("signature", "nodes", "default", "chosen", "chosen mapping", "precision", "gain",
                "predicted / measured"):
        t.add_column(col, justify="left" if col in ("signature", "chosen mapping", "precision") else "right")
    for e in entries:
        ch = [r for r in e.candidates if r.label == e.chosen.label and r.timing is not None]
        ratio = f"{ch[0].predicted_s / ch[0].timing.measured_s:.2f}" if ch and ch[0].timing.measured_s else ""
        was, now = _precision(e)
        t.add_row(safe(e.signature.key), str(e.signature.count), f"{e.default_s * 1e6:.4g} us",
                  f"{e.chosen_s * 1e6:.4g} us", safe(e.chosen.label),
                  safe(was) if now == was else f"[bold yellow]{safe(was)} -> {safe(now)}[/]", f"{e.gain:.2f}x",
                  ratio)
    return t


def _precision(entry: SignatureResult) -> tuple[str, str]:
    """(the signature's own format, the format its chosen mapping computes in)."""
    was = entry.signature.dtype or ""
    return was, entry.chosen.dtype or was


def precision_changes(entries: Sequence[SignatureResult]) -> str:
    """The line that says which chosen mappings compute in another format than the model's own (fp32 -> bf16),
    and that their numerics are not checked by the timing; "" when none does."""
    moved: dict[tuple[str, str], int] = {}
    for e in entries:
        was, now = _precision(e)
        if now != was:
            moved[(was, now)] = moved.get((was, now), 0) + 1
    if not moved:
        return ""
    n = len(entries)
    what = ", ".join(f"{k} of {n} signatures {a} -> {b}" for (a, b), k in moved.items())
    fmt = sorted({b for _, b in moved})
    return (f"precision changed: {what}: the tuned model computes those operators in {', '.join(fmt)}; tune times "
            f"them, it does not check their accuracy (opmap quality MODEL --dtype {fmt[0]})")


def _tune_cuda(model, hw, batch, seq, image_size, dtype, top_k, rounds, out) -> None:
    """``--device cuda``: the GPU candidates of each GEMM / attention signature, timed on the CUDA device."""
    import torch

    from opmap.capture import capture
    from opmap.errors import OpmapError
    from opmap.explore.tune.gpu import tune_gpu
    from opmap.explore.tune.rank import kendall_tau
    from opmap.explore.tune.run import SCHEMA_VERSION
    from opmap.explore.tune.signatures import signatures
    from opmap.report.sheet import check_out_dir, write_set

    if not torch.cuda.is_available():
        raise OpmapError("tune --device cuda: no CUDA device here; accepted: cpu")
    if hw.device_type != "gpu":
        raise OpmapError(f"tune --device cuda ranks with a GPU's catalog entry, not {hw.name}: pass --hardware")
    if out is not None:
        check_out_dir(out)
    w = build_workload(model, batch, seq, image_size, dtype, "meta")
    entries = tune_gpu(signatures(capture(w.module, w.inputs)), hw, top_k, rounds)
    result = {"schema_version": SCHEMA_VERSION, "model": model, "hardware": hw.name, "dtype": dtype, "device": "cuda",
              "top_k": top_k, "rounds": rounds, "signatures": entries,
              "kendall_tau": kendall_tau([([c["predicted_s"] for c in e["candidates"] if c["timed"]],
                                           [c["measured_s"] for c in e["candidates"] if c["timed"]])
                                          for e in entries]),
              "whole_model": None, "note": "GPU: per-signature choices; the whole model is not re-run with them"}
    console.print(f"{len(entries)} signatures tuned on {torch.cuda.get_device_name()}; Kendall tau "
                  f"{result['kendall_tau']}", highlight=False)
    if out is not None:
        print_wrote(write_set(out, {"tune.json": json_text(result, indent=1)}))
