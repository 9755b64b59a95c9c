"""The DuckDB run store: spool, lock, ingest, rebuild (see the package docstring for the design; reads: reading.py)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from opmap.errors import OpmapError
from opmap.store import locks
from opmap.store.rows import (  # noqa: F401  (re-exported: callers import them from opmap.store.db)
    KERNEL_COLUMNS,
    LAYER_COLUMNS,
    _rows,
    analysis_tags,
    calibration_tags,
    graph_hash,
    payload_rows,
    read_profile,
    recorded_tags,
)
from opmap.tags import TAGS_VERSION, Tags  # noqa: F401  (TAGS_VERSION re-exported)
from opmap.validate import visible

SCHEMA_VERSION = 2  # 2: kernels gained node_ids, signature, mfu, stall_fraction; layer_types mfu, stall, bytes
TAG_COLUMNS = ("workload", "hardware", "phase", "precision", "batch", "seq", "fusion", "parallelism",
               "graph_hash", "opmap_version", "torch_version", "git_commit", "command")


class StoreUnavailable(OpmapError):
    """The store cannot be used here (no duckdb, or recording turned off)."""


def default_path() -> Path | None:
    """The store file: ``$OPMAP_STORE`` (``off``: none), else under the user's data directory."""
    env = os.environ.get("OPMAP_STORE")
    if env is not None:
        return None if env.strip().lower() in ("", "0", "off", "none") else Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "opmap" / "runs.duckdb"


def _duckdb():
    try:
        import duckdb
    except ImportError:
        raise StoreUnavailable("the run store needs duckdb: pip install 'opmap[store]' (or pip install duckdb)") \
            from None
    return duckdb


SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE IF NOT EXISTS runs (id VARCHAR PRIMARY KEY, kind VARCHAR, time_utc VARCHAR, workload VARCHAR,
  hardware VARCHAR, phase VARCHAR, precision VARCHAR, batch BIGINT, seq BIGINT, fusion VARCHAR,
  parallelism VARCHAR, graph_hash VARCHAR, opmap_version VARCHAR, torch_version VARCHAR, git_commit VARCHAR,
  command VARCHAR, tags JSON, payload JSON);
CREATE TABLE IF NOT EXISTS kernels (run_id VARCHAR, idx INTEGER, name VARCHAR, layer_type VARCHAR,
  predicted_s DOUBLE, measured_s DOUBLE, flops DOUBLE, bytes DOUBLE, bound VARCHAR, node_ids VARCHAR,
  signature VARCHAR, mfu DOUBLE, stall_fraction DOUBLE);
CREATE TABLE IF NOT EXISTS layer_types (run_id VARCHAR, layer_type VARCHAR, predicted_s DOUBLE,
  measured_s DOUBLE, share DOUBLE, mfu DOUBLE, stall_fraction DOUBLE, bytes DOUBLE);
CREATE TABLE IF NOT EXISTS samples (run_id VARCHAR, metric VARCHAR, i INTEGER, value_s DOUBLE);
"""
# what each older schema lacks, added in place (new columns go last, so positional inserts stay valid)
MIGRATIONS = {1: ["ALTER TABLE kernels ADD COLUMN node_ids VARCHAR", "ALTER TABLE kernels ADD COLUMN signature VARCHAR",
                  "ALTER TABLE kernels ADD COLUMN mfu DOUBLE", "ALTER TABLE kernels ADD COLUMN stall_fraction DOUBLE",
                  "ALTER TABLE layer_types ADD COLUMN mfu DOUBLE",
                  "ALTER TABLE layer_types ADD COLUMN stall_fraction DOUBLE",
                  "ALTER TABLE layer_types ADD COLUMN bytes DOUBLE"]}


def _stored_version(con) -> int | None:
    duckdb = _duckdb()
    try:
        r = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except duckdb.CatalogException:  # no meta table: a new file
        return None
    except duckdb.Error as e:  # the first query of an open: where a damaged file shows
        if _damaged(e):
            raise _Unreadable(_first_line(e)) from None
        raise
    return int(r[0]) if r else None


def _check_version(con, path: Path) -> int | None:
    v = _stored_version(con)
    if v is not None and v > SCHEMA_VERSION:
        raise OpmapError(f"the run store {path} has schema version {v}, newer than this opmap's {SCHEMA_VERSION}: "
                         "upgrade opmap (or use another --store)")
    return v


# --- the spool: pending runs, the journal of ingested ones (done/), the runs that failed their check -----------

def _spool(path: Path) -> Path:
    return path.with_name(path.name + ".spool")


def _journal(path: Path) -> Path:
    return _spool(path) / "done"


def _complete_mark(path: Path) -> Path:
    """Present when the journal holds every run of the store (the store was created by a journalling opmap)."""
    return _journal(path) / ".complete"


def _dir(d: Path) -> Path:
    """``d``, created; a symlink there is refused (the store writes into it)."""
    if d.is_symlink():
        raise OpmapError(f"{d} is a symlink; the run store writes only into real folders: remove it")
    d.mkdir(parents=True, exist_ok=True)
    return d


def _make_parent(path: Path) -> None:
    """The store's folder, created if missing; one line where it cannot be (a file in the way, no permission)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OpmapError(f"cannot create the folder of the run store {path}: {e.strerror or type(e).__name__}"
                         f" ({e.filename})") from None


def _pending(path: Path) -> list[Path]:
    spool = _spool(path)
    return sorted(spool.glob("*.json")) if spool.is_dir() else []


def _write_new(f: Path, text: str) -> None:
    """``text`` into a new file ``f`` (never through a symlink or over a file), flushed to disk."""
    fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())


@dataclass(frozen=True)
class SpoolEntry:
    """A run ready for the spool, checked (store.validate.check_entry): its id and the JSON text of its entry
    (id, kind, time_utc, tags, payload, rows), written as is."""

    id: str
    text: str


def _spool_entry(path: Path, e: SpoolEntry) -> Path:
    """A run's entry in the spool: written whole under a temporary name, then renamed into place. A write that
    fails (a full disk) removes its temporary file and raises one line naming the spool and the cause."""
    spool = _dir(_spool(path))
    tmp = spool / f".{e.id}.{uuid.uuid4().hex[:8]}.tmp"
    dest = spool / f"{e.id}.json"
    try:
        _write_new(tmp, e.text)
        os.replace(tmp, dest)  # replaces a symlink there, never writes through it
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OpmapError(f"cannot write the run into the store's spool {visible(spool)}: "
                         f"{e.strerror or type(e).__name__}") from None
    return dest


def _quarantine(path: Path, f: Path, why: str) -> None:
    """Move a spool entry that is not a valid run out of the way, and say so in one line."""
    q = _dir(_spool(path) / "quarantine")
    dest = q / f.name
    os.replace(f, dest)
    print(f"opmap: warning: {visible(f.name)} in the run store's spool is not a valid run ({visible(why)}); moved to "
          f"{visible(dest)}", file=sys.stderr)


# --- opening: created whole, migrated, or rebuilt from the journal when unreadable -----------------------------

# DuckDB errors that are the host's, not the file's: a lock another program holds, permissions, a full or read-only
# disk, memory. Every other error of an open or a query says the bytes are not a database (0 bytes, foreign,
# truncated: "Could not read enough bytes", bit-flipped: "Corrupt database file ... checksum").
_HOST_ERRORS = ("could not set lock", "conflicting lock", "permission denied", "no space left", "read-only file system",
                "too many open files")


def _damaged(e: BaseException) -> bool:
    """Whether a DuckDB error from opening or reading the store says its file is damaged (module comment above):
    an error of the SQL (ProgrammingError) or of a row's values is opmap's or the run's, never the file's."""
    duckdb = _duckdb()
    if not isinstance(e, duckdb.Error) or isinstance(e, (
            duckdb.ProgrammingError, duckdb.IntegrityError, duckdb.DataError, duckdb.OutOfMemoryException,
            duckdb.InterruptException, duckdb.PermissionException)):
        return False
    return not any(s in str(e).lower() for s in _HOST_ERRORS)


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0]


def _connect(path: Path, read_only: bool):
    """A DuckDB connection; an unreadable file raises _Unreadable, any other DuckDB failure a one-line error."""
    duckdb = _duckdb()
    try:
        con = duckdb.connect(str(path), read_only=read_only)
    except duckdb.Error as e:
        if _damaged(e):
            raise _Unreadable(_first_line(e)) from None
        raise OpmapError(f"cannot open the run store {visible(path)}: {_first_line(e)}") from None
    return _quiet(con)


def _quiet(con):
    """``con`` without DuckDB's progress bar (drawn on stdout for a query over 2 s: into --json output)."""
    con.execute("SET enable_progress_bar = false")
    return con


class _Unreadable(Exception):
    """The store file is not a readable DuckDB database: an open or a query found it damaged."""


def _create(path: Path) -> None:
    """A new store at ``path`` holding every journalled run: built under a temporary name and renamed into place,
    so a failure (a full disk) leaves no store, never a 0-byte or half-built one. The caller holds the lock."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.new")
    try:
        con = _quiet(_duckdb().connect(str(tmp)))
        try:
            con.execute(SCHEMA)
            con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
            journal = _journal(path)
            for f in sorted(journal.glob("*.json")) if journal.is_dir() else ():
                _ingest_file(con, path, f, journalled=True)
            con.execute("CHECKPOINT")
        finally:
            con.close()
        os.replace(tmp, path)
        _dir(_journal(path))
        _complete_mark(path).touch()
    finally:
        for f in (tmp, tmp.with_name(tmp.name + ".wal")):
            f.unlink(missing_ok=True)


def _recover(path: Path, why: str) -> None:
    """An unreadable store (the caller holds the lock): moved aside (never deleted) and rebuilt from the journal
    where it holds every run (a 0-byte file held none), else refused with what to do."""
    size = path.stat().st_size if path.exists() else 0
    why = "0 bytes" if not size else "not a DuckDB database" if "not a valid duckdb" in why.lower() else visible(why)
    shown = visible(path)
    if size and not _complete_mark(path).exists():
        raise OpmapError(f"the run store {shown} is not a readable DuckDB database ({why}) and its spool does not "
                         f"hold all its runs: move it aside (mv {shown} {visible(f'{path}.bad')}) to start a new "
                         "store, or restore it from a backup or an export (opmap runs import)")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    if aside.exists() or aside.is_symlink():  # a second rebuild within the second: never over the first one kept
        aside = path.with_name(f"{path.name}.corrupt-{stamp}-{uuid.uuid4().hex[:8]}")
    for f in (path, path.with_name(path.name + ".wal")):
        if f.exists() and f.stat().st_size:  # kept for a person to look at; an empty file held nothing
            os.replace(f, aside.with_name(aside.name + f.name[len(path.name):]))
        f.unlink(missing_ok=True)
    _create(path)
    kept = f" (the unreadable file kept as {visible(aside)})" if size else ""
    print(f"opmap: warning: the run store {shown} was not a readable DuckDB database ({why}); rebuilt from its "
          f"spool{kept}", file=sys.stderr)


def repair(path: Path, why: str, seen: tuple[int, int] | None) -> None:
    """A store a reader found damaged (``seen``: its file's (inode, mtime) then) rebuilt from its journal under the
    exclusive lock, unless another process rebuilt it while this one waited for the lock."""
    with locks.exclusive(path):
        if seen is None or file_id(path) == seen:
            _recover(path, why)


def file_id(path: Path) -> tuple[int, int] | None:
    """(inode, mtime in ns) of the store file: a rebuild renames a new file into place, so the pair changes."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def _open_for_write(path: Path):
    """The store read-write (the caller holds the lock), created or migrated to SCHEMA_VERSION in one transaction;
    _Unreadable where the open or the first query finds the file damaged."""
    if not path.exists():
        _create(path)
    con = _connect(path, read_only=False)
    try:
        v = _check_version(con, path)
        if v != SCHEMA_VERSION:
            con.execute("BEGIN TRANSACTION")
            if v is not None:
                for old in range(v, SCHEMA_VERSION):
                    for stmt in MIGRATIONS.get(old, ()):
                        con.execute(stmt)
            con.execute(SCHEMA)
            con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
            con.execute("COMMIT")
    except BaseException:
        con.close()
        raise
    return con


# --- the ingest ----------------------------------------------------------------------------------------------

def _bad_row_errors():
    duckdb = _duckdb()
    return (duckdb.ConversionException, duckdb.ConstraintException, duckdb.InvalidInputException,
            duckdb.OutOfRangeException, duckdb.TypeMismatchException)


def _ingest_file(con, path: Path, f: Path, journalled: bool = False) -> bool:
    """One spool entry into the store in one transaction, then moved to the journal; an entry that is not a valid
    run is quarantined (reads go on). ``journalled``: ``f`` is in the journal already (a rebuild). Returns
    whether a run was added."""
    from opmap.store.validate import check_entry

    try:
        if f.is_symlink() or not f.is_file():
            raise OpmapError("not a regular file")
        run = json.loads(f.read_text())
        check_entry(run)
        if run["id"] != f.stem:
            raise OpmapError(f"its id {run['id']!r} is not its file name")
    except (OSError, ValueError, RecursionError, OpmapError) as e:
        _quarantine(path, f, str(e).splitlines()[0] if str(e) else type(e).__name__)
        return False
    done = _journal(path) / f.name
    if con.execute("SELECT 1 FROM runs WHERE id = ?", [run["id"]]).fetchone():
        if not journalled:  # committed before, moved not (a writer killed in between)
            os.replace(f, done) if not done.exists() else f.unlink(missing_ok=True)
        return False
    tags = run["tags"]
    rows = run.get("rows") or {}
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("INSERT INTO runs VALUES (" + ", ".join(["?"] * 18) + ")",
                    [run["id"], run["kind"], run["time_utc"], *[_col(tags.get(c)) for c in TAG_COLUMNS],
                     json.dumps(tags), json.dumps(run["payload"])])
        for table in ("kernels", "layer_types", "samples"):
            _insert_columns(con, table, run["id"], rows.get(table) or [])
        con.execute("COMMIT")
    except _bad_row_errors() as e:
        con.execute("ROLLBACK")
        _quarantine(path, f, str(e).splitlines()[0])
        return False
    except BaseException:
        con.execute("ROLLBACK")
        raise
    if not journalled:
        _dir(_journal(path))
        os.replace(f, done)
    return True


def _ingest_all(path: Path) -> int:
    """Ingest every complete spool file into the store (the caller holds the lock). Returns runs added; raises
    _Unreadable where a query finds the file damaged."""
    duckdb = _duckdb()
    con = _open_for_write(path)
    try:
        added = sum(_ingest_file(con, path, f) for f in _pending(path))
    except BaseException as e:
        with contextlib.suppress(duckdb.Error):  # closing a damaged database can fail too
            con.close()
        if _damaged(e):
            raise _Unreadable(_first_line(e)) from None
        raise
    con.close()
    return added


def _insert_columns(con, table: str, run_id: str, rows: list) -> None:
    """All of a run's rows of one table in one statement, column by column (DuckDB unnests the lists in step):
    a row-by-row executemany of a 70B model's 3,000 kernels took 1.7 s."""
    if not rows:
        return
    cols = [list(c) for c in zip(*rows)]
    sel = ", ".join(f"unnest(?::{t}[])" for t in _TYPES[table])
    con.execute(f"INSERT INTO {table} SELECT ?, {sel}", [run_id, *cols])


_TYPES = {"kernels": ("INTEGER", "VARCHAR", "VARCHAR", "DOUBLE", "DOUBLE", "DOUBLE", "DOUBLE", "VARCHAR", "VARCHAR",
                      "VARCHAR", "DOUBLE", "DOUBLE"),
          "layer_types": ("VARCHAR", "DOUBLE", "DOUBLE", "DOUBLE", "DOUBLE", "DOUBLE", "DOUBLE"),
          "samples": ("VARCHAR", "INTEGER", "DOUBLE")}


def _col(v: Any) -> Any:
    return v if v is None or isinstance(v, (int, float, str)) else str(v)


def ingest_spool(path: Path) -> int:
    """Land every waiting spool entry (takes the lock; skipped where this process has a read open: the entries
    wait for the next writer or reader). Returns runs added."""
    if locks.holds_shared(path):
        return 0
    with locks.exclusive(path):
        try:
            try:
                return _ingest_all(path)
            except _Unreadable as e:  # damaged: moved aside, rebuilt from the journal, and the spool landed again
                _recover(path, str(e))
                return _ingest_all(path)
        except _Unreadable as e:
            raise OpmapError(f"the run store {visible(path)} is still not readable after its rebuild from the "
                             f"journal ({e})") from None
        except (OSError, _duckdb().Error) as e:  # a full disk, a read-only folder: the runs stay spooled
            wait = f" (its {len(_pending(path))} new run(s) wait in its spool)" if _pending(path) else ""
            raise OpmapError(f"cannot write the run store {visible(path)}: {_first_line(e)}{wait}") from None


def entry(kind: str, payload: dict[str, Any], tags: Tags, run_id: str | None = None,
          time_utc: str | None = None) -> SpoolEntry:
    """A run's spool entry (id, kind, time_utc, tags, payload, rows), checked: a bad one raises, nothing written."""
    from opmap.store.validate import check_entry

    run_id = run_id or datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]
    try:
        kernels, lts, samples = _rows(payload)
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError, OverflowError) as e:
        raise OpmapError(f"run {run_id}: its kernels or layer types are malformed ({type(e).__name__}: {e})") \
            from None
    # the per-node list stays in the run's own files (analysis.json); kernels, layer types and samples are rows
    body = {"id": run_id, "kind": kind, "time_utc": time_utc or datetime.now(UTC).isoformat(timespec="milliseconds"),
            "tags": tags.to_dict(),
            "payload": {k: v for k, v in payload.items() if k not in ("nodes", "kernels", "samples")},
            "rows": {"kernels": kernels, "layer_types": lts, "samples": samples}}
    text = json.dumps(body)
    check_entry(json.loads(text))  # as the ingest will read it back (tuples as lists)
    return SpoolEntry(run_id, text)


def _resolve(path: Path | None, what: str) -> Path:
    path = path if path is not None else default_path()
    if path is None:
        raise StoreUnavailable(f"recording is off (--no-store or OPMAP_STORE=off): no store to {what}")
    return path


def record(kind: str, payload: dict[str, Any], tags: Tags, path: Path | None = None,
           run_id: str | None = None, ingest: bool = True) -> str:
    """Record one run; returns its id. Raises StoreUnavailable where recording is off or duckdb is missing, and
    OpmapError (nothing written) where the run is malformed.
    ``run_id``: a stable id (an import names a file's run by its content, so importing it twice adds it once).
    ``ingest=False``: spool the run only (durable once its file is renamed into place) and leave the ingest to
    the next reader or ingesting writer; the commands do this, so a run costs a JSON write, not a DuckDB open
    (llama-3-70b whole process: 0.18 s less)."""
    import importlib.util

    path = _resolve(path, "record into")
    if importlib.util.find_spec("duckdb") is None:
        _duckdb()  # raises the install hint
    e = entry(kind, payload, recorded_tags(tags), run_id)
    _make_parent(path)
    _spool_entry(path, e)
    if ingest:
        ingest_spool(path)
    return e.id
