"""``opmap compare A B``: two runs (run ids or output folders), kernel by kernel, judged against this host's noise
between runs; exit 0 no regression (or inconclusive: the noise between runs not measured), 1 regression, 2 bad
input."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from opmap.cli.common import console
from opmap.record import record as json_record
from opmap.report.text import clean, plain
from opmap.validate import INT_GE0, POSITIVE, Rule, json_text, options

if TYPE_CHECKING:
    from opmap.store.bench_compare import BenchComparison, MetricChange
    from opmap.store.comparison import Comparison, KernelChange, LayerTypeChange
    from opmap.store.shapes import ShapeCheck

# Each re-run is a whole profile in a fresh process (seconds to minutes): 100 a side resolves a shift far below any
# host's run-to-run noise; more is hours of re-profiling, not a finer verdict
MAX_RERUNS = 100


def compare(
    a: str = typer.Argument(..., help="The baseline: a run id (opmap runs list) or a run's output folder."),
    b: str | None = typer.Argument(None, help="The run to judge against it, a run id or a folder (omit with "
                                             "--production to check A's shapes alone)."),
    force: bool = typer.Option(False, help="Compare runs whose hardware, precision, phase or workload differ."),
    min_effect: float = typer.Option(0.05, "--min-effect", help="Smallest relative change that counts; the "
                                     "verdict uses the larger of this and the host's noise floor between runs."),
    rerun: int = typer.Option(0, "--rerun", help="Re-run A's and B's recorded profile commands N more times each, "
                                                 "interleaved A B A B in fresh processes: the noise floor measured "
                                                 "now (5 runs a side, --rerun 4, tell +20% from same-code noise)."),
    alpha: float = typer.Option(0.05, help="Significance level of the rank test."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    rows: int = typer.Option(10, help="Kernels shown (largest changes first)."),
    production: str | None = typer.Option(None, "--production", help="A production run of the workload that A "
                                          "(a synthetic slice) stands for: which of its kernels A represents, and "
                                          "what A -> B's change would buy there."),
    store: Path | None = typer.Option(None, "--store", help="Run store file."),
    no_store: bool = typer.Option(False, "--no-store", help="Do not record the shape check in the run store."),
) -> None:
    """Per layer type and per kernel deltas; a regression only where a rank test on the raw samples and the
    minimum effect agree, the minimum effect raised to this host's noise between runs (repeats of A and B in the
    store with the same tags, code and host, or --rerun); with fewer than 4 runs in all that noise is not
    measured and the verdict is inconclusive (exit 0), naming the --rerun that measures it; warm-up outliers
    dropped by a stated rule. With --production, whether the synthetic run A's kernels stand for the production
    run's kernels of the same class (production-shape validation)."""
    from opmap.errors import OpmapError
    from opmap.store.compare import compare as run_compare
    from opmap.store.shapes import class_changes, production_check

    options({"--min-effect": (min_effect, Rule(lo=0)), "--alpha": (alpha, POSITIVE.but(hi=1, hi_open=True)),
             "--rows": (rows, INT_GE0), "--rerun": (rerun, INT_GE0.but(hi=MAX_RERUNS))})
    if b is None and production is None:
        raise OpmapError("compare takes two runs (A B), or one run with --production RUN")
    r = None
    if b is not None and production is None and not rerun:
        from opmap.cli.bench_predict import bench_vs_serve

        if bench_vs_serve(a, b, store, as_json):  # a measured load run against its prediction: the join table
            return
    if b is not None:
        with console.status("comparing") as st:
            r = run_compare(a, b, store, force, min_effect, alpha, rerun, progress=lambda s: st.update(s))
    shapes = (production_check(a, production, store, force, class_changes(r) if r is not None else None)
              if production is not None else None)
    if shapes is not None:
        from opmap.cli.common import record_run
        from opmap.tags import Tags

        tags = Tags("shape-check", workload=f"shape-check {a} -> {production}", command="opmap compare " + " ".join(
            x for x in (a, b or "", f"--production {production}") if x))
        record_run("shape-check", json_record(shapes), tags, store, no_store)
    _render(r, shapes, a, b, as_json, rows)
    if r is not None and r.regressed:
        raise typer.Exit(1)


def _render(r: Comparison | BenchComparison | None, shapes: ShapeCheck | None, a: str, b: str | None,
            as_json: bool, rows: int) -> None:
    """The comparison (``r``: None with --production alone) and the shape check, as JSON or tables."""
    from opmap.store.bench_compare import BenchComparison

    if as_json:
        d = json_record(r) if r is not None else {}
        print(json_text(d if shapes is None else {**d, "production_check": json_record(shapes)}, indent=1))
    elif r is None:
        _print_shapes(shapes)
    elif isinstance(r, BenchComparison):
        _print_bench(r, a, b)
    else:
        _print_kernels(r, a, b, rows)
        _print_totals(r)
        _print_verdict(r)
        if shapes is not None:
            _print_shapes(shapes)


def _print_kernels(r: Comparison, a: str, b: str | None, rows: int) -> None:
    """Per layer type, then the ``rows`` kernels with the largest changes."""
    from rich.table import Table

    from opmap.report.sheet import si

    how = ", ".join(f"{n} by {k}" for k, n in r.matched_by) or "none"
    t = Table(title=plain(f"{b} against {a}: {r.times} times; kernels matched: {how}"), title_justify="left")
    for c in ("layer type", "A", "B", "change", "MFU", "stall", "bytes", "verdict"):
        t.add_column(c, justify="left" if c in ("layer type", "verdict") else "right")
    for v in r.layer_types:
        t.add_row(plain(v.layer_type), si(v.a_s, "s"), si(v.b_s, "s"), _pct(v.rel), _pts(v.mfu_delta),
                  _pts(v.stall_delta), _bytes(v.bytes_delta), plain(_verdict(v)))
    console.print(t)
    k = Table(title="kernels, largest changes first", title_justify="left")
    for c in ("kernel", "A", "B", "change", "MFU", "stall", "bytes", "verdict"):
        k.add_column(c, justify="left" if c in ("kernel", "verdict") else "right")
    for x in r.kernels[:rows]:
        k.add_row(plain(x.name), si(x.a_s, "s"), si(x.b_s, "s"), _pct(x.rel), _pts(x.mfu_delta),
                  _pts(x.stall_delta), _bytes(x.bytes_delta), plain(_verdict(x)))
    console.print(k)


def _print_totals(r: Comparison) -> None:
    """Each run's total over every kernel, and the kernels without a partner with their time."""
    from opmap.report.sheet import si

    t = r.totals
    only = [f"{n} kernels only in {s}, {si(ts, 's')}"
            for s, n, ts in (("A", t.only_a.kernels, t.only_a.time_s), ("B", t.only_b.kernels, t.only_b.time_s)) if n]
    console.print(f"totals, every kernel: A {si(t.a_s, 's')}, B {si(t.b_s, 's')} ({_pct(t.rel)})"
                  + (f"; {'; '.join(only)} (the JSON's unmatched)" if only else "; every kernel matched"),
                  highlight=False)


def _print_verdict(r: Comparison) -> None:
    """The verdict line, then how it was reached: the minimum effect and the noise floor, the runs on each side,
    the warm-up rule."""
    def say(text: str) -> None:  # names, hosts and run ids come from the runs: text, never terminal commands
        console.print(clean(text), highlight=False, markup=False)

    v = r.verdict
    say(v.line)
    if v.evidence is None:
        say(f"  {v.note}")
        return
    e = v.evidence
    n, w = e.noise, e.warmup
    say(f"  minimum effect {n.minimum_effect}; noise floor between runs: {n.rule}" if n.measured else
        f"  noise floor between runs {n.rule}")
    say(f"  host: {e.host or 'not recorded'}; side A: {', '.join(n.runs_a)}; side B: {', '.join(n.runs_b)}")
    say(f"  {w.rule}: dropped {sum(w.dropped_a)} leading samples on side A, {sum(w.dropped_b)} on B")
    say(f"  kernels: minimum effect max(--min-effect, {r.kernel_floor.rule})")


def _print_bench(r: BenchComparison, a: str, b: str) -> None:
    """Two bench runs: each latency metric's p50 and p99 on both sides with its rank test, throughput, the
    verdict."""
    from rich.table import Table

    from opmap.report.sheet import si

    t = Table(title=plain(f"{b} against {a}: measured load, per-request samples"), title_justify="left")
    for c in ("metric", "A p50", "B p50", "change", "A p99", "B p99", "n A/B", "verdict"):
        t.add_column(c, justify="left" if c in ("metric", "verdict") else "right")
    def s_(x):
        return "-" if x is None else si(x, "s")

    for m in r.metrics:
        t.add_row(m.metric, s_(m.a_p50_s), s_(m.b_p50_s), _pct(m.rel), s_(m.a_p99_s), s_(m.b_p99_s),
                  f"{m.n_a}/{m.n_b}", _verdict(m))
    for v in r.throughput:
        if v.a is not None and v.b is not None:
            t.add_row(v.name.replace("_per_s", "/s"), f"{v.a:.4g}", f"{v.b:.4g}", _pct(v.rel), "", "", "",
                      "one value a run: not tested")
    console.print(t)
    console.print(plain(r.verdict_line), highlight=False)
    console.print(plain(f"  {r.test.name}; validity A {r.validity.a}, B {r.validity.b}"), highlight=False)


def _print_shapes(v: ShapeCheck) -> None:
    from rich.table import Table

    t = Table(title=plain(f"production-shape check: does {v.synthetic} stand for {v.production}? ({v.rule})"),
              title_justify="left")
    for c in ("class", "synthetic FLOP/B", "production FLOP/B p10/p50/p90", "prod. share", "represented",
              "bound mix", "change carried", "verdict"):
        t.add_column(c, justify="left" if c in ("class", "bound mix", "verdict") else "right")
    for c in v.classes:
        si_ = c.synthetic_intensity
        mix = ", ".join(f"{k} {w:.0%}" for k, w in c.production_bound_mix)
        carried = c.expected_production_change
        t.add_row(plain(c.name),
                  "-" if not si_ else f"{si_[0]:.3g}" + ("" if si_[0] == si_[1] else f"-{si_[1]:.3g}"),
                  "/".join("-" if x is None else f"{x:.3g}" for x in c.production_intensity_p10_p50_p90),
                  f"{c.production_share:.1%}", f"{c.represented_share_of_class:.0%} of class", plain(mix or "-"),
                  "-" if carried is None else f"{c.synthetic_change:+.1%} -> {carried:+.1%}", plain(c.verdict))
    console.print(t)
    if v.expected_production_change is not None:
        console.print(f"the synthetic change, carried over the represented kernels only: "
                      f"{v.expected_production_change:+.1%} of the production total", highlight=False)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _pts(x: float | None) -> str:
    """A change of a fraction (MFU, stall) in percentage points."""
    return "-" if x is None else f"{100 * x:+.1f} pt"


def _bytes(x: float | None) -> str:
    from opmap.report.sheet import si

    return "-" if x is None else ("+" if x > 0 else "") + si(x, "B") if x else "0"


def _verdict(v: KernelChange | LayerTypeChange | MetricChange) -> str:
    """A row's verdict with its p-value where it was tested."""
    return v.verdict + (f" (p {v.p:.2g})" if v.p is not None else "")
