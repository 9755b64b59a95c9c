"""``opmap memo RUN``: the closure memo of a recorded run (owners, evidence, fixes, risks, pitfall checks)."""

from __future__ import annotations

from pathlib import Path

import typer

from opmap.cli.common import console, print_wrote


def memo(
    source: str = typer.Argument(..., help="A run id (opmap runs list) or a run's output folder (opmap analyze, "
                                           "profile, plan, sweep, serve or fit --out)."),
    out: Path | None = typer.Option(None, help="Write memo.md (and memo.json) into this folder."),
    store: Path | None = typer.Option(None, "--store", help="Run store file."),
) -> None:
    """Each finding assigned to an owner layer (ML compiler, runtime, performance modelling) with its evidence,
    the command that reproduces it, a bounded fix with its expected gain from the model, a rollback boundary and
    a risk; the field's pitfalls as checks. Every run kind: analyze and profile (per layer type), fit (the
    ranking, struck cells, the SLO), plan (the best layout and why), sweep (the knee), serve (the SLO verdict and
    the tail), shape-check and calibrate."""
    from opmap.report.memo import KERNEL_KINDS, memo_json, memo_markdown, memo_parts
    from opmap.report.sheet import check_out_dir, write_set
    from opmap.store.source import load

    run = load(source, store)
    if out is not None:
        check_out_dir(out)
    extra = {}
    if run.kind in KERNEL_KINDS:
        checked = _shape_check(run.id, store) if run.stored else None
        extra = {"production_compared": checked or bool(_others(run, store)), "fusion_gain_s": _fusion_gain(run),
                 "format_step": _format_step(run)}
    fs, pits = memo_parts(run, **extra)
    text = memo_markdown(run, fs, pits, f"opmap memo {source}", folder=not run.stored)
    console.print(text, markup=False, highlight=False, soft_wrap=True)  # Markdown: table rows never cut
    if out is not None:
        print_wrote(write_set(out, {"memo.md": text, "memo.json": memo_json(run, fs, pits)}))


def _others(run, store) -> list[dict]:
    """Other stored runs of the run's workload (another shape of it); a folder's run without a store has none."""
    from opmap.errors import OpmapError
    from opmap.store import list_runs

    try:
        return [r for r in list_runs({"workload": str(run.tags.get("workload"))}, store) if r["id"] != run.id]
    except OpmapError:
        if run.stored:
            raise
        return []


def _shape_check(run_id: str, store) -> dict | None:
    """The newest production-shape check of this run in the store (its payload, with its ``run`` id)."""
    from opmap.store import list_runs, show_run

    for r in reversed(list_runs({"kind": "shape-check"}, store)):
        body = show_run(r["id"], store).payload
        if body.get("synthetic") == run_id:
            return {**body, "run": r["id"]}
    return None


def _format_step(run) -> tuple[str, float] | None:
    """(the next narrower matrix format, its dense peak over the run's format's) on the run's catalog device."""
    from opmap.errors import OpmapError
    from opmap.formats import registry
    from opmap.hardware import get_hardware

    t = run.tags
    now = str(t.get("precision") or "")
    nxt = f.narrower if (f := registry().get(now)) is not None else None  # the registry's next narrower format
    if nxt is None:
        return None
    try:
        peaks = get_hardware(str(t.get("hardware"))).matrix_peak_flops_per_s
    except (OpmapError, KeyError, ValueError):
        return None
    a, b = peaks.get(now), peaks.get(nxt)
    if a is None or b is None or not a.value or not b.value:
        return None
    return nxt, float(b.value) / float(a.value)


def _fusion_gain(run) -> float | None:
    """The model's own estimate of the compiler fix: the same zoo workload analysed eager and under --fusion
    compiler on the run's hardware, predicted latency saved (None where the run cannot be rebuilt here)."""
    from opmap.analyze import analyze
    from opmap.errors import OpmapError
    from opmap.hardware import get_hardware
    from opmap.workloads import MODELS, build_zoo

    t = run.tags
    if t.get("workload") not in MODELS or t.get("phase") not in (None, "prefill"):
        return None
    try:
        hw = get_hardware(str(t["hardware"]))
        w = build_zoo(t["workload"], int(t.get("batch") or 1), t.get("seq"), str(t.get("precision") or "fp32"))
        eager = analyze(w, hw, str(t.get("precision") or "fp32")).predicted_latency_s
        fused = analyze(w, hw, str(t.get("precision") or "fp32"), fusion="compiler").predicted_latency_s
    except (OpmapError, KeyError, ValueError):
        return None
    return max(0.0, eager - fused)
