"""What the commands share: the console, building a workload from the shape options, the hardware by name,
the "wrote" line, the stop signals."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterable
from pathlib import Path

from rich.console import Console

from opmap.errors import Interrupted
from opmap.report.text import clean, safe
from opmap.tags import Tags
from opmap.validate import visible

# Piped output (CI, files) gets a wide page instead of rich's 80-column default, so the sheet stays a table.
console = Console(width=None if sys.stdout.isatty() else 180)
# Progress bars go to stderr: stdout holds the result alone (a --json document, a report piped to a file), and the bar
# still shows on the terminal while stdout is redirected.
progress_console = Console(stderr=True)


@contextlib.contextmanager
def result_only_on_stdout(on: bool = True):
    """While ``on`` (a command's --json): all the shared console prints (the report, notes, a first-use calibration,
    the "wrote" and store lines) goes to stderr, so that stdout holds the JSON document alone."""
    if not on:
        yield
        return
    console.stderr = True  # the console's file follows sys.stderr while set (rich: Console.file)
    try:
        yield
    finally:
        console.stderr = False


@contextlib.contextmanager
def collector_paused():
    """The cyclic garbage collector off while a command builds one analysis, on again after, with what the block
    left alive moved to the permanent generation (``gc.freeze``; the command ends soon after): what it builds (the
    graph, costs, predictions, kernels and rows) is acyclic, freed by reference counting, and with the collector on
    each collection walks the growing graph again. `opmap analyze` of DeepSeek-R1 (142,806 nodes) spent ~3 s of its
    ~18 s CPU in collections at GC_THRESHOLD, for a peak RSS within 3% of the collector-off run's; unfrozen, the
    first collection after the block would walk every object made in it."""
    import gc

    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:
            gc.enable()


def status(message: str):
    """A spinner on the console showing ``message`` as plain text (never read as markup): opmap.api's Status."""
    from opmap.report.text import plain

    return console.status(plain(message))


def build_workload(model: str, batch: int, seq: int | None, image_size: int | None, dtype: str,
                   device: str, allow_long_context: bool = False, dims: dict[str, int] | None = None,
                   overrides=()):
    """Build MODEL from the shape options (opmap.api.build_workload: --seq for text models, --image-size for vision
    ones, a real-tensor build refused first if the weights cannot fit)."""
    from opmap.api import Shape
    from opmap.api import build_workload as build

    return build(model, Shape(batch, seq, image_size), dtype, device, allow_long_context, dims, overrides, status)


ATTENTION_DROPOUT_HELP = ("How much longer the fused-attention kernel runs when it drops scores (attention dropout in "
                          "training) than without: default the catalog's measured factor for the kernel (cudnn on "
                          "H100 / H200: 1.034), 1 where none is measured; 1.8 prices NeMo's and Megatron-Core's 2024 "
                          "stacks (inferred from their published runs: benchmarks/published.py NEMO_2024_DROPOUT).")


def stack_hardware(name: str, attention_kernel: str | None, attention_dropout: float | None):
    """The device ``name`` as a software stack prices it: ``--attention-kernel`` and ``--attention-dropout``."""
    from opmap.hardware import with_attention_dropout, with_attention_kernel

    hw = with_attention_kernel(hardware(name), attention_kernel)
    return with_attention_dropout(hw, attention_dropout, "--attention-dropout", field="--attention-dropout")


ATTENTION_KERNEL_HELP = ("The fused-attention kernel the software stack runs, priced off its measured rows in the "
                         "catalog: cudnn (TransformerEngine on Hopper), fa2 (FlashAttention-2), fa3 "
                         "(FlashAttention-3); default: the device's own (opmap hardware show).")


def hardware(name: str):
    """The device ``name`` names (opmap.hardware.get_hardware), with a note line when it was an alias."""
    from opmap.hardware import alias_note, get_hardware

    spec = get_hardware(name)
    note = alias_note(name)
    if note:
        console.print(f"note: {clean(note)}", highlight=False, markup=False)
    return spec


def warn_unmatched_overrides(overrides, graph) -> None:
    """One warning line on stderr per --layer-type override whose pattern matched no module of ``graph``."""
    from opmap.capture import unmatched_overrides

    paths = sorted({n.module for n in graph.nodes if n.module}, key=lambda m: (m.count("."), m))
    example = f" (module paths look like {paths[-1]!r})" if paths else " (the model has no submodules)"
    for item in unmatched_overrides(overrides, paths):
        Console(stderr=True).print(clean(f"opmap: warning: --layer-type {item} matched no module{example}"),
                                   highlight=False, markup=False, soft_wrap=True)


def print_wrote(paths: Iterable[Path]) -> None:
    """The "wrote" line: each path as written, its escape sequences and control characters shown as escapes
    (validate.visible), so the name printed is the name on disk and the terminal acts on nothing in it."""
    console.print("wrote " + ", ".join(visible(p) for p in paths), markup=False, highlight=False, soft_wrap=True)


def progress_bar():
    """A transient progress bar on stderr (``progress_console``): the stage, the steps done, the time elapsed and an
    estimate of the time left."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(), console=progress_console,
                    transient=True)


@contextlib.contextmanager
def step_progress(first: str):
    """A transient progress bar (``progress_bar``); yields ``progress(what, done, total)`` for the library's long
    loops."""
    with progress_bar() as bar:
        task = bar.add_task(first, total=1)

        def progress(what: str, done: int, total: int) -> None:
            bar.update(task, description=safe(what), completed=done, total=max(1, total))

        yield progress


def record_run(kind: str, payload: dict, tags: Tags, store: Path | None, no_store: bool) -> None:
    """Record a finished run in the run store (opmap.store); a store that cannot take it costs one line, never
    the user's result."""
    if no_store:
        return
    from opmap.store import StoreUnavailable, record

    try:
        rid = record(kind, payload, tags, store, ingest=False)  # spooled; the next reader ingests it
    except StoreUnavailable as e:
        if "duckdb" in str(e):
            console.print(f"[dim]run not recorded: {safe(e)}[/dim]")
        return
    except Exception as e:  # the store's own failure (a locked, corrupt or foreign file) never costs the result
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        console.print(f"[yellow]warning[/yellow]: run not recorded in the store: {safe(msg)}", highlight=False,
                      soft_wrap=True)  # one line, however long the store's path
        return
    console.print(f"[dim]recorded as run {rid} (opmap runs show {rid})[/dim]")


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """SIGINT and SIGTERM while a command runs: the first raises ``Interrupted`` in the main thread (the work in
    hand stops, an engine's pool is killed, what was finished is kept) and is remembered in ``signum``; a second
    one ends the process at once, by that signal's default action (the pool's workers die with it)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, object] = {}

    def _handle(self, signum: int, _frame) -> None:
        if self.signum is not None:  # a second stop: no more cleaning up
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.signum = signum
        raise Interrupted(signum)

    def __enter__(self) -> StopSignals:
        try:
            for sig in STOP_SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread: Python's own handling stays
            pass
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


def kept(e: KeyboardInterrupt) -> tuple:
    """(what an interrupted library call kept, the stop): its ``partial`` result, marked ``interrupted``; a call
    that kept nothing has ``e`` raised again (the command ends with the stop's one line)."""
    stop = Interrupted.of(e)
    if stop.partial is None:
        raise e
    return stop.partial, stop


def exit_if_stopped(stop: Interrupted | None) -> None:
    """After a command has shown, written and recorded what it kept: end it with the stop's status."""
    if stop is not None:
        import typer

        raise typer.Exit(stop.exit_status)
