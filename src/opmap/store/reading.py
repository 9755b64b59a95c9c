"""Reading the run store: a read-only connection under the shared lock, and the queries the commands run.

A damaged store file (truncated, bit-flipped) may open and still fail a later query: DuckDB checks each block's
checksum as it reads it, so a flipped byte in the kernels table shows only when a query reads that block. Every
query of a reader goes through ``_Reader.execute``: where a query fails because the file is damaged
(``db._damaged``), the reader lets go of the store, it is moved aside and rebuilt from its journal under the
exclusive lock (``db.repair``: one line on stderr saying so), and the query runs again on the rebuilt file, once.
A store whose journal cannot rebuild it is refused in one line.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opmap.errors import OpmapError
from opmap.store import db, locks
from opmap.validate import visible


class _Reader:
    """A read-only connection holding the store's shared lock until it is closed (writers wait for it)."""

    def __init__(self, con, path: Path):
        self._con, self._path = con, path
        self._seen = db.file_id(path)  # the file this connection opened (a rebuild replaces it)
        self._repaired = False

    def execute(self, *args, **kwargs):
        """``con.execute``; a query that finds the file damaged rebuilds the store and runs again (once)."""
        duckdb = db._duckdb()
        while True:
            try:
                return self._con.execute(*args, **kwargs)
            except duckdb.Error as e:
                if not db._damaged(e):
                    raise
                if self._repaired:
                    raise OpmapError(f"the run store {visible(self._path)} is still not readable after its "
                                     f"rebuild ({db._first_line(e)})") from None
                why = db._first_line(e)
            self._reopen(why)

    def _reopen(self, why: str) -> None:
        """Close, rebuild the damaged store from its journal, and open the rebuilt one."""
        with contextlib.suppress(db._duckdb().Error):  # closing a damaged database can fail too
            self._con.close()
        self._con = None
        locks.release_shared(self._path)
        if locks.holds_shared(self._path):  # another read of this process still has it open: no rebuild under it
            raise OpmapError(f"the run store {visible(self._path)} is damaged ({why}): run the command again to "
                             "rebuild it from its journal")
        db.repair(self._path, why, self._seen)
        locks.acquire_shared(self._path)
        try:
            self._con = db._connect(self._path, read_only=True)
        except BaseException:
            locks.release_shared(self._path)
            raise
        self._seen, self._repaired = db.file_id(self._path), True

    def __getattr__(self, name: str):
        return getattr(self._con, name)

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None
            locks.release_shared(self._path)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_read(path: Path | None) -> _Reader:
    """The store for reading, with every waiting run landed first (where a spool entry waits, or the file needs
    creating, migrating or rebuilding, under the exclusive lock; else straight to a shared, read-only open)."""
    path = db._resolve(path, "read")
    db._duckdb()
    if not path.exists() and not db._pending(path) and not any(db._journal(path).glob("*.json")):
        raise OpmapError(f"no run store at {visible(path)} (opmap records a run there on each analyze)")
    for attempt in range(3):
        if (attempt or db._pending(path) or not path.exists()) and not locks.holds_shared(path):
            db.ingest_spool(path)
        locks.acquire_shared(path)
        try:
            con = db._connect(path, read_only=True)
            try:
                v = db._check_version(con, path)
            except BaseException:
                with contextlib.suppress(db._duckdb().Error):
                    con.close()
                raise
        except db._Unreadable as e:
            locks.release_shared(path)
            if attempt or locks.holds_shared(path):
                raise OpmapError(f"the run store {visible(path)} is not a readable DuckDB database ({e})") \
                    from None
            db.repair(path, str(e), None)  # damaged: rebuilt from the journal (or refused in one line)
            continue
        except BaseException:
            locks.release_shared(path)
            raise
        if v == db.SCHEMA_VERSION or attempt == 2:
            return _Reader(con, path)
        con.close()  # an older schema: migrated under the exclusive lock, then read again
        locks.release_shared(path)
    raise AssertionError("unreachable")


def list_runs(where: dict[str, str] | None = None, path: Path | None = None) -> list[dict[str, Any]]:
    """Runs as [{id, kind, time_utc, tags}], oldest first, filtered by tag equality."""
    where = where or {}
    bad = sorted(set(where) - set(db.TAG_COLUMNS) - {"kind", "id"})
    if bad:
        raise OpmapError(f"unknown tag {', '.join(bad)}; accepted: kind, id, {', '.join(db.TAG_COLUMNS)}")
    with open_read(path) as con:
        sql = "SELECT id, kind, time_utc, tags FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(f"CAST({k} AS VARCHAR) = ?" for k in where)
        rows = con.execute(sql + " ORDER BY time_utc, id", list(where.values())).fetchall()
    return [{"id": r[0], "kind": r[1], "time_utc": r[2], "tags": json.loads(r[3])} for r in rows]


@dataclass(frozen=True)
class StoredRun:
    """One stored run as ``opmap runs show`` gives it: ``tags`` and ``payload`` as the store holds them (JSON
    columns: a run of any opmap version), and how many kernel rows and samples the store holds for it."""

    id: str
    kind: str
    time_utc: str
    tags: dict[str, Any]
    kernels: int
    samples: int
    payload: dict[str, Any]


def show_run(run_id: str, path: Path | None = None) -> StoredRun:
    """A stored run by id, else one line naming it."""
    with open_read(path) as con:
        r = con.execute("SELECT id, kind, time_utc, tags, payload FROM runs WHERE id = ?", [run_id]).fetchone()
        if r is None:
            raise OpmapError(f"no run {run_id!r} in the store (opmap runs list shows the ids)")
        kernels = con.execute("SELECT count(*) FROM kernels WHERE run_id = ?", [run_id]).fetchone()[0]
        samples = con.execute("SELECT count(*) FROM samples WHERE run_id = ?", [run_id]).fetchone()[0]
    return StoredRun(r[0], r[1], r[2], json.loads(r[3]), kernels, samples, json.loads(r[4]))


def run_rows(run_id: str, path: Path | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(kernels, layer types) of a recorded run, from the store's tables, as payload_rows gives them."""
    kc, lc = db.KERNEL_COLUMNS, db.LAYER_COLUMNS
    with open_read(path) as con:
        k = con.execute(f"SELECT {', '.join(kc)} FROM kernels WHERE run_id = ? ORDER BY idx", [run_id]).fetchall()
        lt = con.execute(f"SELECT {', '.join(lc)} FROM layer_types WHERE run_id = ?", [run_id]).fetchall()
    return [dict(zip(kc, r)) for r in k], [dict(zip(lc, r)) for r in lt]
