"""The DuckDB run store: spool, lock, ingest, query (see the package docstring for the design)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from opmap import __version__
from opmap.errors import OpmapError
from opmap.store import locks

SCHEMA_VERSION = 2  # 2: kernels gained node_ids, signature, mfu, stall_fraction; layer_types mfu, stall, bytes
TAGS_VERSION = 1  # the tag names below; a new tag may be added, a renamed one bumps this
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


def _git_commit() -> str | None:
    try:
        p = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() or None if p.returncode == 0 else None


def graph_hash(nodes: list[dict[str, Any]]) -> str:
    """A stable hash of a graph's operators and tensor shapes (analysis.json ``nodes``), order included."""
    h = hashlib.sha256()
    for n in nodes:
        h.update(n.get("op", "").encode())
        for t in n.get("inputs", []) + n.get("outputs", []):
            h.update(repr(tuple(t.get("shape", ()))).encode())
    return h.hexdigest()[:16]


def analysis_tags(d: dict[str, Any]) -> dict[str, Any]:
    """The telemetry tags of an analysis.json (or profile.json) body."""
    a = d.get("assumptions", {})
    par = d.get("parallelism")
    phase = d.get("phase") or {}
    return {
        "tags_version": TAGS_VERSION,
        "workload": a.get("workload"), "hardware": a.get("hardware"), "phase": phase.get("name", "prefill"),
        "precision": a.get("dtype"), "batch": a.get("batch"), "seq": a.get("seq"), "fusion": a.get("fusion_policy"),
        "parallelism": (f"tp{par['tp']} pp{par['pp']} dp{par['dp']} ep{par['ep']}" if par else "single device"),
        "graph_hash": d.get("graph_hash") or graph_hash(d.get("nodes", [])),
        "opmap_version": a.get("opmap_version", __version__),
        "torch_version": a.get("torch_version"),
    }


def read_profile(path: Path) -> dict[str, Any]:
    """A calibration profile (TOML) as the payload of a calibrate run."""
    import tomllib

    return tomllib.loads(Path(path).read_text())


def calibration_tags(d: dict[str, Any], quick: bool = False) -> dict[str, Any]:
    """The telemetry tags of a calibration profile: the hardware is the local fingerprint (device and model)."""
    cal = d.get("calibration") or {}
    fp = cal.get("fingerprint") or {}
    return {"tags_version": TAGS_VERSION, "workload": "calibration" + (" (quick)" if quick else ""),
            "hardware": f"{d.get('name', 'local')}: {fp.get('model', '?')}", "phase": "calibrate",
            "precision": None, "torch_version": fp.get("torch_version"),
            "fingerprint": {k: fp.get(k) for k in ("model", "machine", "threads", "cores", "memory_bytes")}}


def _common_tags(tags: dict[str, Any]) -> dict[str, Any]:
    return {"opmap_version": __version__, "git_commit": _git_commit(),
            "command": shlex.join(["opmap", *sys.argv[1:]]) if sys.argv else None, **tags}


def _signature(node: dict[str, Any]) -> str | None:
    """A node's op signature: its op with its inputs' dtypes and shapes (None where the payload has no tensors)."""
    ins = node.get("inputs")
    if ins is None:
        return None
    return f"{node.get('op', '')}(" + ", ".join(f"{t.get('dtype', '')}{list(t.get('shape', ()))}" for t in ins) + ")"


def _matrix_peak(payload: dict[str, Any]) -> float | None:
    """The dense matrix peak the run's MFU is over, recovered from its totals (MFU = matrix FLOPs / (latency x
    peak)); None where the payload has no predicted MFU."""
    t = payload.get("totals") or {}
    mf, lat, m = t.get("matrix_flops"), t.get("predicted_latency_s"), t.get("predicted_mfu")
    return mf / (lat * m) if mf and lat and m else None


def _rows(payload: dict[str, Any]) -> tuple[list[tuple], list[tuple], list[tuple]]:
    """(kernels, layer_types, samples) rows of an analysis.json / profile.json body.

    A kernel's MFU is its FLOPs over its time (measured where there is one, else predicted) times the run's dense
    matrix peak; its stall fraction is the roofline-estimated memory stall of a measured kernel over its measured
    time (profile runs only); a layer type's MFU is its matrix FLOPs over the same."""
    kernels = []
    nodes = {n["id"]: n for n in payload.get("nodes", []) if "id" in n}
    peak = _matrix_peak(payload)
    samples = []
    for i, k in enumerate(payload.get("kernels", [])):
        anchor = nodes.get(k.get("anchor"), {})
        # a kernel's name: its anchor op at its module path (the last matching step of compare)
        name = (f"{anchor.get('op', '')}@{anchor.get('module', '')}" if anchor else
                str(k.get("op") or k.get("collective") or ""))
        flops = sum(nodes.get(n, {}).get("flops") or 0.0 for n in k.get("nodes", ())) if nodes else k.get("flops")
        sigs = [_signature(nodes[n]) for n in k.get("nodes", ()) if n in nodes]
        sig = " | ".join(sigs) if sigs and None not in sigs else None
        t = k.get("measured_s") or k.get("predicted_s")
        mfu = flops / (t * peak) if flops and t and peak else None
        stall = (k["memory_stall_s"] / k["measured_s"] if k.get("memory_stall_s") is not None and k.get("measured_s")
                 else None)
        node_ids = ",".join(str(n) for n in k.get("nodes", ())) or None
        kernels.append((i, name, anchor.get("layer_type") or k.get("layer_type"), k.get("predicted_s"),
                        k.get("measured_s"), flops,
                        k.get("bytes") if k.get("bytes") is not None else k.get("traffic_bytes"), k.get("bound"),
                        node_ids, sig, mfu, stall))
        if k.get("measured_samples_s"):
            samples += [(f"kernel:{i}", j, float(x)) for j, x in enumerate(k["measured_samples_s"])]
    lts = []
    for lt, v in (payload.get("layer_types") or {}).items():
        m = (v.get("measured") or {})
        t = m.get("measured_s") or v.get("predicted_s")
        mfu = v["matrix_flops"] / (t * peak) if v.get("matrix_flops") and t and peak else None
        lts.append((lt, v.get("predicted_s"), m.get("measured_s"), v.get("share_of_time"), mfu,
                    m.get("memory_stall"), v.get("bytes")))
    for metric, values in (payload.get("samples") or {}).items():
        samples += [(metric, i, float(x)) for i, x in enumerate(values or ())]
    return kernels, lts, samples


KERNEL_COLUMNS = ("idx", "name", "layer_type", "predicted_s", "measured_s", "flops", "bytes", "bound", "node_ids",
                  "signature", "mfu", "stall_fraction")
LAYER_COLUMNS = ("layer_type", "predicted_s", "measured_s", "share", "mfu", "stall_fraction", "bytes")


def payload_rows(payload: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(kernels, layer types) of an analysis.json / profile.json body as dicts, exactly as the store would hold
    them (see _rows: one MFU and stall formula for the store, compare and the dashboard)."""
    kernels, lts, _ = _rows(payload)
    return [dict(zip(KERNEL_COLUMNS, r)) for r in kernels], [dict(zip(LAYER_COLUMNS, r)) for r in lts]


def run_rows(run_id: str, path: Path | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(kernels, layer types) of a recorded run, from the store's tables, as payload_rows gives them."""
    con = _read(path)
    try:
        k = con.execute(f"SELECT {', '.join(KERNEL_COLUMNS)} FROM kernels WHERE run_id = ? ORDER BY idx",
                        [run_id]).fetchall()
        lt = con.execute(f"SELECT {', '.join(LAYER_COLUMNS)} FROM layer_types WHERE run_id = ?", [run_id]).fetchall()
    finally:
        con.close()
    return [dict(zip(KERNEL_COLUMNS, r)) for r in k], [dict(zip(LAYER_COLUMNS, r)) for r in lt]


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
    try:
        r = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except Exception:  # no meta table: a new file
        return None
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


def _spool_entry(path: Path, body: dict[str, Any]) -> Path:
    """A run's entry in the spool: written whole under a temporary name, then renamed into place."""
    spool = _dir(_spool(path))
    tmp = spool / f".{body['id']}.{uuid.uuid4().hex[:8]}.tmp"
    _write_new(tmp, json.dumps(body, allow_nan=False))
    dest = spool / f"{body['id']}.json"
    os.replace(tmp, dest)  # replaces a symlink there, never writes through it
    return dest


def _quarantine(path: Path, f: Path, why: str) -> None:
    """Move a spool entry that is not a valid run out of the way, and say so in one line."""
    q = _dir(_spool(path) / "quarantine")
    dest = q / f.name
    os.replace(f, dest)
    print(f"opmap: warning: {f.name} in the run store's spool is not a valid run ({why}); moved to {dest}",
          file=sys.stderr)


# --- opening: created whole, migrated, or rebuilt from the journal when unreadable -----------------------------

def _unreadable(e: Exception) -> bool:
    """Whether a DuckDB error says the file is not a database (0 bytes, foreign or corrupt), not that it is busy."""
    duckdb = _duckdb()
    msg = str(e).lower()
    return (isinstance(e, (duckdb.SerializationException, duckdb.InternalException))
            or (isinstance(e, duckdb.Error) and ("not a valid duckdb" in msg or "corrupt" in msg
                                                 or "checksum" in msg)))


def _connect(path: Path, read_only: bool):
    """A DuckDB connection; an unreadable file raises _Unreadable, any other DuckDB failure a one-line error."""
    duckdb = _duckdb()
    try:
        con = duckdb.connect(str(path), read_only=read_only)
    except duckdb.Error as e:
        if _unreadable(e):
            raise _Unreadable(str(e).splitlines()[0]) from None
        raise OpmapError(f"cannot open the run store {path}: {str(e).splitlines()[0]}") from None
    return _quiet(con)


def _quiet(con):
    """``con`` without DuckDB's progress bar (drawn on stdout for a query over 2 s: into --json output)."""
    con.execute("SET enable_progress_bar = false")
    return con


class _Unreadable(Exception):
    """The store file is not a readable DuckDB database."""


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
    """An unreadable store (the caller holds the lock): rebuilt from the journal where it holds every run (a
    0-byte file held none), else refused with what to do."""
    size = path.stat().st_size
    why = "0 bytes" if not size else "not a DuckDB database" if "not a valid duckdb" in why.lower() else why
    if size and not _complete_mark(path).exists():
        raise OpmapError(f"the run store {path} is not a readable DuckDB database ({why}) and its spool does not "
                         f"hold all its runs: move it aside (mv {path} {path}.bad) to start a new store, or restore "
                         "it from a backup or an export (opmap runs import)")
    aside = path.with_name(f"{path.name}.corrupt-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}")
    for f in (path, path.with_name(path.name + ".wal")):
        if f.exists() and f.stat().st_size:  # kept for a person to look at; an empty file held nothing
            os.replace(f, aside.with_name(aside.name + f.name[len(path.name):]))
        f.unlink(missing_ok=True)
    _create(path)
    kept = f" (the unreadable file kept as {aside})" if size else ""
    print(f"opmap: warning: the run store {path} was not a readable DuckDB database ({why}); rebuilt from its "
          f"spool{kept}", file=sys.stderr)


def _open_for_write(path: Path):
    """The store read-write (the caller holds the lock), created or migrated to SCHEMA_VERSION in one transaction,
    rebuilt first where the file is unreadable."""
    if not path.exists():
        _create(path)
    try:
        con = _connect(path, read_only=False)
    except _Unreadable as e:
        _recover(path, str(e))
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
    """Ingest every complete spool file into the store (the caller holds the lock). Returns runs added."""
    con = _open_for_write(path)
    try:
        return sum(_ingest_file(con, path, f) for f in _pending(path))
    finally:
        con.close()


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
            return _ingest_all(path)
        except (OSError, _duckdb().Error) as e:  # a full disk, a read-only folder: the runs stay spooled
            raise OpmapError(f"cannot write the run store {path}: {(str(e).splitlines() or [type(e).__name__])[0]}"
                             " (its runs wait in its spool)") from None


def entry(kind: str, payload: dict[str, Any], tags: dict[str, Any], run_id: str | None = None,
          time_utc: str | None = None) -> dict[str, Any]:
    """A run's spool entry (id, kind, time_utc, tags, payload, rows), checked: a bad one raises, nothing written."""
    from opmap.store.validate import check_entry

    run_id = run_id or datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]
    try:
        kernels, lts, samples = _rows(payload)
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError) as e:
        raise OpmapError(f"run {run_id}: its kernels or layer types are malformed ({type(e).__name__}: {e})") \
            from None
    # the per-node list stays in the run's own files (analysis.json); kernels, layer types and samples are rows
    body = {"id": run_id, "kind": kind, "time_utc": time_utc or datetime.now(UTC).isoformat(timespec="milliseconds"),
            "tags": tags, "payload": {k: v for k, v in payload.items() if k not in ("nodes", "kernels", "samples")},
            "rows": {"kernels": kernels, "layer_types": lts, "samples": samples}}
    body = json.loads(json.dumps(body))  # as the ingest will read it back (tuples as lists)
    check_entry(body)
    return body


def _resolve(path: Path | None, what: str) -> Path:
    path = path if path is not None else default_path()
    if path is None:
        raise StoreUnavailable(f"recording is off (--no-store or OPMAP_STORE=off): no store to {what}")
    return path


def record(kind: str, payload: dict[str, Any], tags: dict[str, Any], path: Path | None = None,
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
    body = entry(kind, payload, _common_tags(tags), run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    _spool_entry(path, body)
    if ingest:
        ingest_spool(path)
    return body["id"]


class _Reader:
    """A read-only connection holding the store's shared lock until it is closed (writers wait for it)."""

    def __init__(self, con, path: Path):
        self._con, self._path = con, path

    def execute(self, *args, **kwargs):
        return self._con.execute(*args, **kwargs)

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


def _read(path: Path | None) -> _Reader:
    """The store for reading, with every waiting run landed first (where a spool entry waits, or the file needs
    creating, migrating or rebuilding, under the exclusive lock; else straight to a shared, read-only open)."""
    path = _resolve(path, "read")
    _duckdb()
    if not path.exists() and not _pending(path) and not any(_journal(path).glob("*.json")):
        raise OpmapError(f"no run store at {path} (opmap records a run there on each analyze)")
    for attempt in range(3):
        if (attempt or _pending(path) or not path.exists()) and not locks.holds_shared(path):
            ingest_spool(path)
        locks.acquire_shared(path)
        try:
            con = _connect(path, read_only=True)
        except _Unreadable:
            locks.release_shared(path)
            if attempt or locks.holds_shared(path):
                raise OpmapError(f"the run store {path} is not a readable DuckDB database") from None
            continue
        except BaseException:
            locks.release_shared(path)
            raise
        try:
            v = _check_version(con, path)
        except BaseException:
            con.close()
            locks.release_shared(path)
            raise
        if v == SCHEMA_VERSION or attempt == 2:
            return _Reader(con, path)
        con.close()  # an older schema: migrated under the exclusive lock, then read again
        locks.release_shared(path)
    raise AssertionError("unreachable")


def list_runs(where: dict[str, str] | None = None, path: Path | None = None) -> list[dict[str, Any]]:
    """Runs as [{id, kind, time_utc, tags}], oldest first, filtered by tag equality."""
    where = where or {}
    bad = sorted(set(where) - set(TAG_COLUMNS) - {"kind", "id"})
    if bad:
        raise OpmapError(f"unknown tag {', '.join(bad)}; accepted: kind, id, {', '.join(TAG_COLUMNS)}")
    con = _read(path)
    try:
        sql = "SELECT id, kind, time_utc, tags FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(f"CAST({k} AS VARCHAR) = ?" for k in where)
        rows = con.execute(sql + " ORDER BY time_utc, id", list(where.values())).fetchall()
    finally:
        con.close()
    return [{"id": r[0], "kind": r[1], "time_utc": r[2], "tags": json.loads(r[3])} for r in rows]


def show_run(run_id: str, path: Path | None = None) -> dict[str, Any]:
    con = _read(path)
    try:
        r = con.execute("SELECT id, kind, time_utc, tags, payload FROM runs WHERE id = ?", [run_id]).fetchone()
        if r is None:
            raise OpmapError(f"no run {run_id!r} in the store (opmap runs list shows the ids)")
        kernels = con.execute("SELECT count(*) FROM kernels WHERE run_id = ?", [run_id]).fetchone()[0]
        samples = con.execute("SELECT count(*) FROM samples WHERE run_id = ?", [run_id]).fetchone()[0]
    finally:
        con.close()
    return {"id": r[0], "kind": r[1], "time_utc": r[2], "tags": json.loads(r[3]), "kernels": kernels,
            "samples": samples, "payload": json.loads(r[4])}


def export_parquet(out_dir: Path, path: Path | None = None) -> list[Path]:
    """Every table as ``out_dir/TABLE.parquet`` (opmap.store.transfer)."""
    from opmap.store.transfer import export_parquet as export

    return export(out_dir, path)


def import_path(src: Path, path: Path | None = None) -> tuple[int, int]:
    """Runs from another host, all or none (opmap.store.transfer). Returns (runs added, runs already there)."""
    from opmap.store.transfer import import_path as import_

    return import_(src, path)
