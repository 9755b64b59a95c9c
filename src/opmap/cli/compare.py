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
        t = Table(title=f"{b} against {a}: {r['times']} times, kernels matched by {r['matched_by']}",
                  title_justify="left")
        for c in ("layer type", "A", "B", "change"):
            t.add_column(c, justify="right" if c != "layer type" else "left")
        for lt, v in r["layer_types"].items():
            t.add_row(lt, si(v["a_s"], "s"), si(v["b_s"], "s"), "-" if v["rel"] is None else f"{v['rel']:+.1%}")
        console.print(t)
        k = Table(title="kernels, largest changes first", title_justify="left")
        for c in ("kernel", "A", "B", "change"):
            k.add_column(c, justify="right" if c != "kernel" else "left")
        for x in r["kernels"][:rows]:
            k.add_row(x["name"], si(x["a_s"], "s"), si(x["b_s"], "s"), "-" if x["rel"] is None else f"{x['rel']:+.1%}")
        console.print(k)
        test = r["test"]
        line = (f"{r['verdict']}: median {r['effect']:+.1%}, {test['name']} p = {test['p']:.3g} "
                f"(alpha {alpha}, minimum effect {min_effect:.0%})" if test else
                f"{r['verdict']}: predicted total {r['effect']:+.1%} ({r['note']})")
        console.print(line, highlight=False, markup=False)
    if r["verdict"] == "regression":
        raise typer.Exit(1)
