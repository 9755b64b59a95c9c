"""``opmap report RUN|DIR``: the self-contained HTML dashboard of a recorded run or an output folder."""

from __future__ import annotations

from pathlib import Path

import typer

from opmap.cli.common import console, print_wrote
from opmap.validate import options, positive_in


def report(
    source: str = typer.Argument(..., help="A run id (opmap runs list) or a folder written by opmap analyze, "
                                           "profile, sweep, serve or fit --out."),
    out: Path | None = typer.Option(None, "--out", help="The HTML file (default: DIR/report.html for a folder, "
                                                        "report.html here for a run id); its trace and figures "
                                                        "go beside it, named by it (PAGE_trace.json, "
                                                        "PAGE_NAME.png)."),
    store: Path | None = typer.Option(None, "--store", help="Run store file (default $OPMAP_STORE)."),
    max_mb: float = typer.Option(8.0, "--max-mb", help="Size budget of the page in MB (plotly.js is ~4.8 MB)."),
    png: bool = typer.Option(True, "--png/--no-png", help="Also write the figures as PAGE_NAME.png "
                                                                    "(matplotlib)."),
    force: bool = typer.Option(False, "--force", help="Replace files at the report's names (the page, "
                                                      "PAGE_trace.json, PAGE_*.png) that opmap report did not write."),
) -> None:
    """One HTML file that needs no network: assumptions, roofline, time / MFU / stall by layer type, the
    mapping sheet (sortable, filterable), sweep curves, serving CDFs, fit matrix, perf per watt, the tags."""
    from opmap.errors import OpmapError
    from opmap.report.dashboard import from_dir, from_run
    from opmap.report.html import require_plotly, write_report

    options({"--max-mb": (max_mb, positive_in("MB"))})
    require_plotly()
    folder = Path(source)
    if folder.is_dir():
        src = from_dir(folder)
        out = out if out is not None else folder / "report.html"
    elif folder.is_file():
        raise OpmapError(f"{source} is a file; accepted: a run id (opmap runs list) or the folder that holds it")
    elif "/" in source or source.startswith("."):
        raise OpmapError(f"no folder {source}; accepted: a run id (opmap runs list) or an output folder")
    else:
        src = from_run(source, store)
        out = out if out is not None else Path("report.html")
    paths = write_report(src, out, int(max_mb * 1e6), png, force)
    size = paths[0].stat().st_size
    console.print(f"report: {size / 1e6:.2f} MB of {max_mb:g} MB budget, {len(src.kernels)} kernels", highlight=False)
    print_wrote(paths)
