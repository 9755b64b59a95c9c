"""The opmap command line: one module per command group, each parsing its options, calling the library and
rendering the result (``analyze``, ``quality``, ``profile``, ``calibrate``; ``catalog``: models and hardware
listings; ``report``: the HTML dashboard). Shared helpers live in ``common``.

Bad input ends with one line on stderr naming the problem and what is accepted, and exit status 2. The
library checks its own input, before its expensive work; the commands do not repeat those checks.
"""

from __future__ import annotations

import gc
import sys

import typer
from rich.console import Console

from opmap.cli import analyze as _analyze
from opmap.cli import bench as _bench
from opmap.cli import calibrate as _calibrate
from opmap.cli import catalog as _catalog
from opmap.cli import compare as _compare
from opmap.cli import fit as _fit
from opmap.cli import memo as _memo
from opmap.cli import plan as _plan
from opmap.cli import profile as _profile
from opmap.cli import quality as _quality
from opmap.cli import report as _report
from opmap.cli import runs as _runs
from opmap.cli import serve as _serve
from opmap.cli import sweep as _sweep
from opmap.cli import tune as _tune
from opmap.cli.common import StopSignals, console
from opmap.errors import Interrupted, OpmapError
from opmap.report.text import clean

__all__ = ["app", "console", "main"]

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True,
                  help="Map a neural-network workload onto hardware: operators, costs, predicted time.")


def version_line() -> str:
    """opmap's, torch's and python's versions, in one line (torch's read from its metadata: no import)."""
    import platform
    from importlib import metadata

    from opmap import __version__

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "not installed"
    return f"opmap {__version__}, torch {torch_version}, python {platform.python_version()}"


def _show_version(value: bool) -> None:
    if value:
        console.print(version_line(), highlight=False, markup=False)
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", is_eager=True, callback=_show_version,
                                          help="Show the opmap, torch and python versions and exit.")) -> None:
    """Map a neural-network workload onto hardware: operators, costs, predicted time."""


app.add_typer(_catalog.models_app, name="models")
app.add_typer(_catalog.hardware_app, name="hardware")
app.add_typer(_runs.runs_app, name="runs")
app.command("analyze")(_analyze.analyze)
app.command("quality")(_quality.quality)
app.command("profile")(_profile.profile)
app.command("calibrate")(_calibrate.calibrate)
app.command("plan")(_plan.plan)
app.command("sweep")(_sweep.sweep)
app.command("fit")(_fit.fit)
app.command("compare")(_compare.compare)
app.command("memo")(_memo.memo)
app.command("report")(_report.report)
app.command("serve")(_serve.serve)
app.command("bench")(_bench.bench)
app.command("tune")(_tune.tune)


def _usage_error(e: Exception) -> bool:
    """A click/typer usage error (typer vendors click from 0.20 on, so match by shape, not by class)."""
    return callable(getattr(e, "format_message", None)) and getattr(e, "exit_code", None) == 2


# the cyclic collector's first-generation threshold for a command's process (Python's default 700): a command holds
# a captured graph of thousands of nodes and allocates its kernels, rows and report in bursts, so at 700 the
# collector ran often over a large live heap; `opmap analyze llama-3-70b --seq 2048` took 2.36-2.59 s with the
# default, 2.12-2.33 s at 50,000 and 2.01-2.22 s with the collector off (3 interleaved runs each, 2-core host)
GC_THRESHOLD = (50_000, 20, 20)


def main(argv: list[str] | None = None) -> int:
    """Run one command: its exit status. SIGINT (Ctrl-C) and SIGTERM stop it (opmap.cli.common.StopSignals):
    what it had finished is kept where it keeps partial results, one line on stderr names the signal, and the
    status is 128 + the signal's number (130, 143)."""
    gc.set_threshold(*GC_THRESHOLD)
    err = Console(stderr=True)
    with StopSignals() as stop:
        try:
            rc = _run(list(sys.argv[1:] if argv is None else argv), err)
        except KeyboardInterrupt as e:  # outside the command (typer turns one inside it into status 130)
            stop.signum = stop.signum or Interrupted.of(e).signum
    if stop.signum is not None:
        err.print(f"opmap: stopped by {Interrupted(stop.signum).name}", highlight=False)
        return 128 + stop.signum
    return rc


def _run(args: list[str], err: Console) -> int:
    try:
        rc = app(args=args, prog_name="opmap", standalone_mode=False)
        if isinstance(rc, int) and rc:  # click returns a typer.Exit's code when not standalone
            return rc
    except OpmapError as e:
        err.print(f"opmap: error: {clean(str(e))}", highlight=False, soft_wrap=True, markup=False)
        return 2
    except Exception as e:
        kind = type(e).__name__
        if kind == "NoArgsIsHelpError":  # a group called bare: show its help, as click does
            return main([*args, "--help"])
        if kind == "Exit":
            return int(getattr(e, "exit_code", 0))
        if kind == "Abort":
            err.print("opmap: aborted")
            return 130
        if _usage_error(e):
            ctx = getattr(e, "ctx", None)
            where = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
            err.print(clean(f"opmap: error: {e.format_message()}{where}"), highlight=False, soft_wrap=True,
                      markup=False)
            return 2
        raise
    return 0
