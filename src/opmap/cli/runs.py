"""``opmap runs``: the recorded runs (opmap.store)."""

from __future__ import annotations

from pathlib import Path

import typer

from opmap.cli.common import console
from opmap.errors import OpmapError
from opmap.report.text import clean, plain
from opmap.validate import json_text

runs_app = typer.Typer(help="Runs recorded in the run store: list and show.", no_args_is_help=True)


def _where(items: list[str]) -> dict[str, str]:
    out = {}
    for it in items:
        k, sep, v = it.partition("=")
        if not sep or not k.strip():
            raise OpmapError(f"--where takes TAG=VALUE, got {it!r}")
        out[k.strip()] = v.strip()
    return out


@runs_app.command("list")
def list_cmd(where: list[str] = typer.Option([], "--where", help="TAG=VALUE (repeatable): keep matching runs."),
             as_json: bool = typer.Option(False, "--json", help="Print JSON: [{id, kind, time_utc, tags}]."),
             store: Path | None = typer.Option(None, "--store", help="Run store file.")) -> None:
    """The recorded runs, oldest first."""
    from rich.table import Table

    from opmap.store import list_runs

    runs = list_runs(_where(where), store)
    if as_json:
        print(json_text(runs, indent=1))
        return
    t = Table(title=f"{len(runs)} runs", title_justify="left")
    for c in ("id", "kind", "time (UTC)", "workload", "hardware", "phase", "precision", "batch", "seq"):
        t.add_column(c)
    for r in runs:  # tags are the user's strings: plain text, never rich markup
        g = r["tags"]
        cells = (r["id"], r["kind"], r["time_utc"],
                 *(g.get(k, "") for k in ("workload", "hardware", "phase", "precision", "batch", "seq")))
        t.add_row(*map(plain, cells))
    console.print(t)


@runs_app.command("show")
def show_cmd(run_id: str = typer.Argument(..., help="A run id (opmap runs list)."),
             as_json: bool = typer.Option(False, "--json", help="Print the run as JSON."),
             store: Path | None = typer.Option(None, "--store", help="Run store file.")) -> None:
    """One run: its tags, its figures and how many kernel rows and samples it holds."""
    from dataclasses import asdict

    from opmap.store import show_run

    r = show_run(run_id, store)
    if as_json:
        print(json_text(asdict(r), indent=1))
        return
    console.print(clean(f"run {r.id} ({r.kind}, {r.time_utc}): {r.kernels} kernels, {r.samples} samples"),
                  highlight=False, markup=False)
    for k, v in r.tags.items():
        console.print(clean(f"  {k}: {v}"), highlight=False, markup=False)


@runs_app.command("export")
def export_cmd(parquet: Path = typer.Option(..., "--parquet", help="Folder to write each table's .parquet into."),
               store: Path | None = typer.Option(None, "--store", help="Run store file.")) -> None:
    """Every table of the store as Parquet files (meta, runs, kernels, layer_types, samples), in a new folder."""
    from opmap.cli.common import print_wrote
    from opmap.store.transfer import export_parquet

    print_wrote(export_parquet(parquet, store))


@runs_app.command("import")
def import_cmd(src: Path = typer.Argument(..., help="profile.json, analysis.json, a folder of them, or a folder "
                                                    "written by opmap runs export --parquet."),
               store: Path | None = typer.Option(None, "--store", help="Run store file.")) -> None:
    """Runs from other hosts into this store, all or none (each run once, however often it is imported)."""
    from opmap.store.transfer import import_path

    added, known = import_path(src, store)
    console.print(f"imported {added} run(s); {known} already in the store", highlight=False)
