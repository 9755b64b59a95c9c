"""fit's progress within its cells: each cell's layout search reports the layout it prices or searches (two notes a
layout, opmap.explore.layouts.search) over a queue from the pool's worker processes; the parent shows the note,
the steps done of all and the time left at their pace so far, beside the cells done."""

from __future__ import annotations

import dataclasses
import time

from opmap.hardware import get_hardware


class Notes:
    """Progress within the cells: each cell's search notes (its layout being priced or searched) come back over a
    queue, a thread here passes them on as ``progress(what, cells done, cells)``, ``what`` naming the note, the
    steps done of all (a step a note, two a layout) and the time left at their pace so far: an estimate that moves
    within a cell too. Local engine only (a Ray cluster's workers report cells as they finish)."""

    def __init__(self, jobs: list, progress, engine: str) -> None:
        import threading

        self.progress, self.jobs = progress, jobs
        self.steps = {cell_label(j): cell_steps(j) for j in jobs}
        self.seen = dict.fromkeys(self.steps, 0)
        self.cells_done, self._lock, self._thread, self._manager = 0, threading.Lock(), None, None
        self.t0 = time.monotonic()
        if progress is not None and engine == "local":
            import multiprocessing as mp
            import os
            from multiprocessing.managers import SyncManager

            from opmap.explore.engine import worker_init

            # the queue's server process dies with this one, as the pool's workers do (a SIGKILL runs no __exit__)
            self._manager = SyncManager(ctx=mp.get_context("spawn"))
            self._manager.start(worker_init, (os.getpid(),))
            self._queue = self._manager.Queue()
            self.jobs = [dataclasses.replace(j, notes=self._queue) for j in jobs]
            self._thread = threading.Thread(target=self._drain, name="opmap-fit-notes", daemon=True)

    def __enter__(self) -> Notes:
        if self._thread is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            try:
                self._queue.put(None)
            except (OSError, EOFError):  # the manager gone with a stop signal
                pass
            self._thread.join(timeout=5.0)
            self._manager.shutdown()

    def _drain(self) -> None:
        try:
            while (item := self._queue.get()) is not None:
                cell, note = item
                with self._lock:
                    self.seen[cell] = min(self.steps[cell], self.seen[cell] + 1)
                    self._show(note)
        except (OSError, EOFError):  # the manager gone with a stop signal: the cells still report as they end
            return

    def _show(self, what: str) -> None:
        """The bar counts cells; the words say the note and the time left at the steps' pace so far."""
        done, total = sum(self.seen.values()), sum(self.steps.values())
        spent = time.monotonic() - self.t0
        left = f"; about {spent / done * (total - done):.0f} s left" if done and total > done else ""
        self.progress(f"{what} (step {done} of {total}{left})", self.cells_done, len(self.jobs))

    def cell_done(self, what: str, done: int, total: int) -> None:
        if self.progress is None:
            return
        with self._lock:
            self.cells_done = done
            self.seen[what] = self.steps.get(what, 0)
            self._show(f"{what}: done")


def cell_label(job) -> str:
    return f"{job.model} on {job.hardware}"


def cell_steps(job) -> int:
    """Progress notes a cell's search sends: two a candidate layout (opmap.explore.layouts.search)."""
    from opmap.explore.layouts import default_budget, layout_candidates

    hw = get_hardware(job.hardware)
    return 2 * len(layout_candidates(job.model, hw, job.devices_budget or default_budget(hw), job.dtype, job.devices))
