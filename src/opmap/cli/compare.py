"""``opmap compare A B``: two recorded runs, kernel by kernel; exit 0 no regression, 1 regression, 2 bad input."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from opmap.cli.common import console


def compare(
    a: str = typer.Argument(..., help="The baseline run id (opmap runs list)."),
    b: str = typer.Argument(..., help="The run to judge against it."),
    force: bool = typer.Option(False, help="Compare runs whose hardware, precision, phase or workload differ."),
    min_effect: float = typer.Option(0.05, "--min-effect", help="Smallest relative change that counts."),
    alpha: float = typer.Option(0.05, help="Significance level of the rank test."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    rows: int = typer.Option(10, help="Kernels shown (largest changes first)."),
    store: Path | None = typer.Option(None, "--store", help="Run store file."),
) -> None:
    """Per layer type and per kernel deltas; a regression only where a rank test on the raw samples and the
    minimum effect agree."""
    from rich.table import Table

    from opmap.report.sheet import si
    from opmap.store.compare import compare as run_compare

    r = run_compare(a, b, store, force, min_effect, alpha)
    if as_json:
        print(json.dumps(r, indent=1))
    else:
        how = ", ".join(f"{n} by {k}" for k, n in r["matched_by"].items()) or "none"
        t = Table(title=f"{b} against {a}: {r['times']} times; kernels matched: {how}", title_justify="left")
        for c in ("layer type", "A", "B", "change", "MFU", "stall", "bytes", "verdict"):
            t.add_column(c, justify="left" if c in ("layer type", "verdict") else "right")
        for lt, v in r["layer_types"].items():
            t.add_row(lt, si(v["a_s"], "s"), si(v["b_s"], "s"), _pct(v["rel"]), _pts(v["mfu_delta"]),
                      _pts(v["stall_delta"]), _bytes(v["bytes_delta"]), _verdict(v))
        console.print(t)
        k = Table(title="kernels, largest changes first", title_justify="left")
        for c in ("kernel", "A", "B", "change", "MFU", "stall", "bytes", "verdict"):
            k.add_column(c, justify="left" if c in ("kernel", "verdict") else "right")
        for x in r["kernels"][:rows]:
            k.add_row(x["name"], si(x["a_s"], "s"), si(x["b_s"], "s"), _pct(x["rel"]), _pts(x["mfu_delta"]),
                      _pts(x["stall_delta"]), _bytes(x["bytes_delta"]), _verdict(x))
        console.print(k)
        if r["unmatched"]:
            console.print(f"{len(r['unmatched'])} kernels without a match (in the JSON's unmatched)",
                          highlight=False)
        test = r["test"]
        line = (f"{r['verdict']}: median {r['effect']:+.1%}, {test['name']} p = {test['p']:.3g} "
                f"(alpha {alpha}, minimum effect {min_effect:.0%})" if test else
                f"{r['verdict']}: predicted total {r['effect']:+.1%} ({r['note']})")
        console.print(line, highlight=False, markup=False)
    if r["verdict"] == "regression":
        raise typer.Exit(1)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _pts(x: float | None) -> str:
    """A change of a fraction (MFU, stall) in percentage points."""
    return "-" if x is None else f"{100 * x:+.1f} pt"


def _bytes(x: float | None) -> str:
    from opmap.report.sheet import si

    return "-" if x is None else ("+" if x > 0 else "") + si(x, "B") if x else "0"


def _verdict(v: dict) -> str:
    return v["verdict"] + (f" (p {v['p']:.2g})" if v.get("p") is not None else "")
