"""Where independent tasks run: ``local`` (a process pool on this machine, the default) or ``ray`` (a Ray
cluster, or a local Ray instance), behind one call::

    results = get_engine("local").map(fn, items, progress=progress)   # fn(item) for each item, in input order

Use an engine as a context manager (``with get_engine("local") as eng:``) so a local pool is shut down after
the last map. Both return ``[fn(item) for item in items]``: the same values in the same order, whichever
engine ran them. That holds because a task is a pure function of its item: ``fn`` is a module-level function
(pickled by reference, imported by the worker), the item carries everything it needs (seeds included), and no
task reads or writes state another task sets.

- ``local``: ``concurrent.futures.ProcessPoolExecutor`` in a ``spawn`` context: torch in a forked child of a
  threaded parent can deadlock, so workers start from a clean interpreter, and they are this process's own
  children (a forkserver's workers are the server's, and keep it alive). Workers: min(items, the cap), the cap
  the caller's ``workers``, else $OPMAP_WORKERS (``WORKERS_ENV``: a shared or small machine, or a test suite,
  where starting a pool of fresh interpreters costs more than the tasks), else os.cpu_count(); with one item or
  one worker the tasks run inline, in this process. A worker ignores SIGINT (a terminal's
  Ctrl-C reaches the whole process group: the parent decides) and dies with its parent: on Linux the kernel
  kills it when the thread that started it ends (prctl PR_SET_PDEATHSIG, SIGKILL), elsewhere a thread of the
  worker polls its parent once a second. Start a pool from a thread that outlives it (the CLI: the main one).
- ``ray``: ``ray.init(address="auto")`` when ``RAY_ADDRESS`` is set (an existing cluster: opmap must be
  installed on its nodes), otherwise a local instance (no dashboard, worker logs not forwarded), started
  once and kept for the rest of the process; one ``ray.remote`` task per item, gathered in input order. A Ray
  instance already initialised by the caller is used as it is. Ray is imported only here.

``progress(what, done, total)`` is called in this process as each task completes (in completion order).

Stopping: a KeyboardInterrupt (Ctrl-C, or ``opmap.errors.Interrupted`` for SIGTERM: the CLI raises it from its
signal handler) during a map stops it at once: the local pool's workers are killed (a task is a pure function:
nothing of a running one is worth waiting for) and its queued tasks dropped, Ray's tasks cancelled; the map
raises ``Interrupted`` whose ``done`` holds the results finished before the stop, by input index.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from opmap.errors import Interrupted, OpmapError

ENGINES = ("local", "ray")
RAY_MISSING = "--engine ray needs the ray extra: pip install 'opmap[ray]'"

Progress = Callable[[str, int, int], None]
PR_SET_PDEATHSIG = 1  # linux/prctl.h
WATCH_S = 1.0  # where prctl is not available: how often a worker polls its parent
WORKERS_ENV = "OPMAP_WORKERS"  # the local pool's worker cap where the caller names none (unset: the CPU count)


def check_engine(name: str) -> str:
    """``name`` if it is an engine; one line naming the accepted ones otherwise."""
    if name not in ENGINES:
        raise OpmapError(f"unknown engine {name!r}; accepted: {', '.join(ENGINES)}")
    return name


def get_engine(name: str = "local", workers: int | None = None) -> LocalEngine | RayEngine:
    """The engine called ``name`` (``local`` or ``ray``). ``workers`` caps the local pool (default: the CPU
    count); ``workers=1`` runs every task inline. Ray schedules on the cluster's CPUs and ignores it."""
    check_engine(name)
    if workers is not None and workers < 1:
        raise OpmapError(f"an engine needs at least one worker, got {workers}")
    return LocalEngine(workers) if name == "local" else RayEngine()


def _note(progress: Progress | None, label: Callable[[Any], str] | None, item: Any, done: int, total: int) -> None:
    if progress is not None:
        progress(label(item) if label else f"{done}/{total} tasks", done, total)


def env_workers() -> int | None:
    """$OPMAP_WORKERS as a worker count (None: unset or empty); one line naming what is accepted otherwise."""
    v = os.environ.get(WORKERS_ENV, "").strip()
    if not v:
        return None
    if not v.isdigit() or int(v) < 1:
        raise OpmapError(f"{WORKERS_ENV}={v!r} is not a worker count; accepted: a positive integer (the local "
                         "pool's workers at most; 1 runs every task inline), or unset (the CPU count)")
    return int(v)


class LocalEngine:
    """A process pool on this machine; inline for one item or one worker. The pool is started by the first
    map that needs it and kept for the next ones (a capacity search maps several rounds) until ``close``."""

    name = "local"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers if workers is not None else env_workers()
        self._pool = None
        self._pool_workers = 0

    def workers_for(self, n: int) -> int:
        return max(1, min(n, self.workers or os.cpu_count() or 1))

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool, self._pool_workers = None, 0

    def kill(self) -> None:
        """Stop the pool now: its workers killed, its queued tasks dropped (a stop signal: nothing waited for)."""
        pool, self._pool, self._pool_workers = self._pool, None, 0
        if pool is None:
            return
        procs = list((getattr(pool, "_processes", None) or {}).values())  # the executor's own table of its workers
        for p in procs:
            try:
                p.kill()
            except (OSError, ValueError):  # gone already, or closed
                pass
        pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            p.join(timeout=2.0)

    def _executor(self, workers: int):
        if self._pool is not None and self._pool_workers >= workers:
            return self._pool
        self.close()
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        # spawn: each worker a clean interpreter, never a fork of this (threaded, torch) process
        self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                         initializer=worker_init, initargs=(os.getpid(),))
        self._pool_workers = workers
        return self._pool

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any], progress: Progress | None = None,
            label: Callable[[Any], str] | None = None, cost: Callable[[Any], float] | None = None) -> list[Any]:
        """``cost(item)``: a guess of each task's run time; the pool is handed the costliest tasks first (longest
        processing time first), so that one long task picked up last does not set the wall time alone. The
        results come back in input order whatever the order run."""
        items = list(items)
        n = len(items)
        workers = self.workers_for(n)
        if workers == 1:
            out = []
            try:
                for i, it in enumerate(items):
                    out.append(fn(it))
                    _note(progress, label, it, i + 1, n)
            except KeyboardInterrupt as e:
                raise _stopped(e, dict(enumerate(out))) from None
            return out
        from concurrent.futures import as_completed
        from concurrent.futures.process import BrokenProcessPool

        out: dict[int, Any] = {}
        order = sorted(range(n), key=lambda i: -cost(items[i])) if cost is not None else range(n)
        futures: dict[Any, int] = {}
        try:
            pool = self._executor(workers)
            for i in order:  # a submit starts a worker where one is missing: a stop may land in it
                futures[pool.submit(fn, items[i])] = i
            for done, f in enumerate(as_completed(futures), 1):
                i = futures[f]
                out[i] = f.result()
                _note(progress, label, items[i], done, n)
        except BrokenProcessPool:
            self.close()
            raise OpmapError(f"a worker of the local pool ({workers} processes) died (out of memory?): nothing was "
                             "written; rerun with fewer tasks at once or on a larger machine") from None
        except KeyboardInterrupt as e:
            self.kill()
            out.update({i: f.result() for f, i in futures.items() if _finished(f)})
            raise _stopped(e, out) from None
        except BaseException:
            for f in futures:
                f.cancel()
            raise
        return [out[i] for i in range(n)]


def _finished(f) -> bool:
    """A future that holds a result (not cancelled, not failed); never waits."""
    return f.done() and not f.cancelled() and f.exception() is None


def _stopped(e: KeyboardInterrupt, done: dict[int, Any]) -> Interrupted:
    """The stop ``e`` (SIGINT's for a plain KeyboardInterrupt) carrying the results finished before it."""
    return Interrupted(Interrupted.of(e).signum, done)


def worker_init(parent: int) -> None:
    """A pool worker's first act: ignore SIGINT (the parent stops the pool itself) and die with ``parent``: the
    kernel's SIGKILL when it ends (Linux), else a thread polling it; a parent already gone ends the worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not _die_with_parent():
        threading.Thread(target=_watch_parent, args=(parent,), name="opmap-watch-parent", daemon=True).start()
    if os.getppid() != parent:  # it ended before the watch began
        os._exit(1)


def _die_with_parent() -> bool:
    """prctl(PR_SET_PDEATHSIG, SIGKILL) for this process; False where there is no prctl (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int) -> None:
    """Poll until this process's parent is no longer ``parent`` (it ended: the orphan was re-parented), then
    end this process (a daemon thread of a pool worker)."""
    while os.getppid() == parent:
        time.sleep(WATCH_S)
    os._exit(1)


def _apply(fn: Callable[[Any], Any], item: Any) -> Any:
    """The body of every Ray task: ``fn(item)`` (one remote function for all maps)."""
    return fn(item)


def _ray_module():
    try:
        import ray
    except ImportError:
        raise OpmapError(RAY_MISSING) from None
    return ray


def ray_init(num_cpus: int | None = None) -> None:
    """Connect to the cluster in RAY_ADDRESS, or start a local instance (of ``num_cpus`` CPUs, default all);
    a Ray already initialised in this process is kept as it is."""
    import logging

    ray = _ray_module()
    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if address:
        try:
            ray.init(address="auto", include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        except ConnectionError as e:
            raise OpmapError(f"--engine ray could not reach the Ray cluster at RAY_ADDRESS={address}: "
                             f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        return
    # a local instance's workers import the tasks' functions by module: opmap from where this process has it
    import opmap

    here = os.path.dirname(os.path.dirname(os.path.abspath(opmap.__file__)))
    path = [here] + [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {"PYTHONPATH": os.pathsep.join(dict.fromkeys(path))}
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
             runtime_env={"env_vars": env})


class RayEngine:
    """One ``ray.remote`` task per item on a Ray cluster or a local instance (kept for the process)."""

    name = "ray"

    def __enter__(self) -> RayEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to release per map: the Ray connection lasts for the process (Ray shuts it down at exit)."""

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any], progress: Progress | None = None,
            label: Callable[[Any], str] | None = None, cost: Callable[[Any], float] | None = None) -> list[Any]:
        """``cost``: accepted for the local engine's signature; Ray's scheduler places the tasks itself."""
        ray = _ray_module()
        items = list(items)
        if not items:
            return []
        ray_init()
        remote = ray.remote(_apply)
        fn_ref = ray.put(fn)
        refs = [remote.remote(fn_ref, it) for it in items]
        index = {r: i for i, r in enumerate(refs)}
        out: dict[int, Any] = {}
        pending = list(refs)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                for r in ready:
                    i = index[r]
                    out[i] = _ray_get(ray, r)
                    _note(progress, label, items[i], len(out), len(items))
        except KeyboardInterrupt as e:
            for r in refs:
                if index[r] not in out:
                    ray.cancel(r, force=True)  # its worker killed: a stop waits for nothing
            raise _stopped(e, out) from None
        except BaseException:
            for r in pending:
                ray.cancel(r)
            raise
        return [out[i] for i in range(len(items))]


def _ray_get(ray, ref) -> Any:
    """ray.get, with a task's own OpmapError raised as itself (Ray wraps it with the worker's traceback)."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, OpmapError):
            raise OpmapError(str(cause)) from None
        if isinstance(cause, ModuleNotFoundError):
            raise OpmapError(f"a Ray worker could not import {cause.name or 'a module'}: install opmap (and its "
                             "extras) on every node of the Ray cluster") from None
        raise
