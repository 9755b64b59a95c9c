"""The store's locks: one writer or many readers, writers first.

Two ``flock`` files beside the store: ``runs.duckdb.lock`` is held exclusive by whoever opens DuckDB read-write
(an ingest, a migration, a rebuild, an import) and shared by every read-only connection for as long as it is
open, so a read-only open never meets a read-write one (DuckDB refuses that with "Conflicting lock").
``runs.duckdb.lock.gate`` is taken briefly by a reader before its shared lock and held by a writer while it
waits for its exclusive one: a writer waiting for the readers to drain stops new readers from starving it.

Within one process the locks are counted: a read opened while another is open shares the first one's lock (an
``flock`` on a second descriptor would wait on its own process); an exclusive lock is never asked for while the
process holds the shared one (``holds_shared``: the caller leaves the spool for the next writer instead).
Lock files are opened with ``O_NOFOLLOW``: a symlink in their place is refused, never written through.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

from opmap.errors import OpmapError

LOCK_TIMEOUT_S = 60.0
POLL_S = 0.02  # between tries of a busy lock

_shared: dict[str, list] = {}  # store path -> [descriptor, open readers] of this process


def _open(lock: Path) -> int:
    try:
        return os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise OpmapError(f"cannot open the lock file {lock}: {e.strerror} (a symlink there is refused)") from None


def _acquire(fd: int, mode: int, path: Path, deadline: float) -> None:
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise OpmapError(f"the run store {path} stayed locked for {LOCK_TIMEOUT_S:.0f} s (another opmap "
                                 "is writing to it); try again") from None
            time.sleep(POLL_S)


def _lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def _through_gate(path: Path, mode: int, timeout_s: float) -> int:
    """The main lock in ``mode``, taken while holding the gate; returns its descriptor (closing it releases)."""
    deadline = time.monotonic() + timeout_s
    lock = _lock_path(path)
    gate = _open(lock.with_name(lock.name + ".gate"))
    try:
        _acquire(gate, fcntl.LOCK_EX, path, deadline)
        fd = _open(lock)
        try:
            _acquire(fd, mode, path, deadline)
        except BaseException:
            os.close(fd)
            raise
    finally:
        os.close(gate)  # a writer lets go of the gate once it holds the store: new readers queue behind it
    return fd


def holds_shared(path: Path) -> bool:
    """Whether this process has a read of ``path`` open (then it must not ask for the exclusive lock)."""
    return str(path) in _shared


@contextlib.contextmanager
def exclusive(path: Path, timeout_s: float = LOCK_TIMEOUT_S):
    """The store to oneself (for a read-write DuckDB open): waits for open reads to close, new ones wait."""
    if holds_shared(path):
        raise OpmapError(f"the run store {path} is open for reading in this process; close it before writing")
    fd = _through_gate(path, fcntl.LOCK_EX, timeout_s)
    try:
        yield
    finally:
        os.close(fd)


def acquire_shared(path: Path, timeout_s: float = LOCK_TIMEOUT_S) -> None:
    """A shared hold on the store (for a read-only DuckDB open); release with ``release_shared``."""
    key = str(path)
    if key in _shared:
        _shared[key][1] += 1
        return
    _shared[key] = [_through_gate(path, fcntl.LOCK_SH, timeout_s), 1]


def release_shared(path: Path) -> None:
    """Give back one ``acquire_shared``; the last one closes the lock."""
    key = str(path)
    held = _shared.get(key)
    if held is None:
        return
    held[1] -= 1
    if held[1] <= 0:
        del _shared[key]
        os.close(held[0])
