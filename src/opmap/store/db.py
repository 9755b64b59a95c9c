"""The DuckDB run store: spool, lock, ingest, query (see the package docstring for the design)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from opmap import __version__
from opmap.errors import OpmapError

SCHEMA_VERSION = 2  # 2: kernels gained node_ids, signature, mfu, stall_fraction; layer_types mfu, stall, bytes
TAGS_VERSION = 1  # the tag names below; a new tag may be added, a renamed one bumps this
LOCK_TIMEOUT_S = 60.0
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


def _open_for_write(path: Path):
    """The store read-write (the caller holds the lock), created or migrated to SCHEMA_VERSION in one transaction."""
    con = _duckdb().connect(str(path))
    try:
        v = _check_version(con, path)
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


@contextlib.contextmanager
def _locked(path: Path, timeout_s: float = LOCK_TIMEOUT_S):
    lock = path.with_name(path.name + ".lock")
    with open(lock, "a") as f:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise OpmapError(f"the run store {path} stayed locked for {timeout_s:.0f} s") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _spool(path: Path) -> Path:
    return path.with_name(path.name + ".spool")


def _ingest_all(path: Path) -> int:
    """Ingest every complete spool file into the store (the caller holds the lock). Returns runs added."""
    con = _open_for_write(path)
    added = 0
    try:
        for f in sorted(_spool(path).glob("*.json")):
            try:
                run = json.loads(f.read_text())
            except (OSError, ValueError):
                continue  # not ours to judge: left for a person to look at
            if con.execute("SELECT 1 FROM runs WHERE id = ?", [run["id"]]).fetchone():
                f.unlink(missing_ok=True)  # committed before, deleted not (a writer killed in between)
                continue
            tags = run["tags"]
            rows = run.get("rows") or {}
            kernels, lts, samples = rows.get("kernels", []), rows.get("layer_types", []), rows.get("samples", [])
            con.execute("BEGIN TRANSACTION")
            try:
                con.execute("INSERT INTO runs VALUES (" + ", ".join(["?"] * 18) + ")",
                            [run["id"], run["kind"], run["time_utc"], *[_col(tags.get(c)) for c in TAG_COLUMNS],
                             json.dumps(tags), json.dumps(run["payload"])])
                for table, rows in (("kernels", kernels), ("layer_types", lts), ("samples", samples)):
                    _insert_columns(con, table, run["id"], rows)
                con.execute("COMMIT")
            except Exception:
                con.execute("ROLLBACK")
                raise
            f.unlink(missing_ok=True)
            added += 1
    finally:
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


def record(kind: str, payload: dict[str, Any], tags: dict[str, Any], path: Path | None = None,
           run_id: str | None = None, ingest: bool = True) -> str:
    """Record one run; returns its id. Raises StoreUnavailable where recording is off or duckdb is missing.
    ``run_id``: a stable id (an import names a file's run by its content, so importing it twice adds it once).
    ``ingest=False``: spool the run only (durable once its file is renamed into place) and leave the ingest to
    the next reader or ingesting writer; the commands do this, so a run costs a JSON write, not a DuckDB open
    (llama-3-70b whole process: 0.18 s less)."""
    import importlib.util

    path = path if path is not None else default_path()
    if path is None:
        raise StoreUnavailable("recording is off (--no-store or OPMAP_STORE=off)")
    if importlib.util.find_spec("duckdb") is None:
        _duckdb()  # raises the install hint
    path.parent.mkdir(parents=True, exist_ok=True)
    spool = _spool(path)
    spool.mkdir(exist_ok=True)
    run_id = run_id or datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]
    body = {"id": run_id, "kind": kind, "time_utc": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "tags": _common_tags(tags), "payload": payload}
    kernels, lts, samples = _rows(payload)
    # the per-node list stays in the run's own files (analysis.json); kernels, layer types and samples are rows
    body["payload"] = {k: v for k, v in payload.items() if k not in ("nodes", "kernels", "samples")}
    body["rows"] = {"kernels": kernels, "layer_types": lts, "samples": samples}
    tmp = spool / f".{run_id}.tmp"
    tmp.write_text(json.dumps(body))
    os.replace(tmp, spool / f"{run_id}.json")
    if ingest:
        with _locked(path):
            _ingest_all(path)
    return run_id


def _read(path: Path | None):
    path = path if path is not None else default_path()
    if path is None:
        raise StoreUnavailable("recording is off (OPMAP_STORE=off): no store to read")
    duckdb = _duckdb()
    if not path.exists() and not any(_spool(path).glob("*.json")):
        raise OpmapError(f"no run store at {path} (opmap records a run there on each analyze)")
    with _locked(path):  # land any waiting runs first
        _ingest_all(path)
    con = duckdb.connect(str(path), read_only=True)
    try:
        _check_version(con, path)
    except BaseException:
        con.close()
        raise
    return con


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


TABLES = ("meta", "runs", "kernels", "layer_types", "samples")


def _sql_path(p: Path) -> str:
    return str(p).replace("'", "''")


def export_parquet(out_dir: Path, path: Path | None = None) -> list[Path]:
    """Every table as ``out_dir/TABLE.parquet`` (DuckDB's COPY): a store any host can import."""
    con = _read(path)
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for t in TABLES:
            f = out_dir / f"{t}.parquet"
            con.execute(f"COPY {t} TO '{_sql_path(f)}' (FORMAT parquet)")
            written.append(f)
    finally:
        con.close()
    return written


def import_path(src: Path, path: Path | None = None) -> tuple[int, int]:
    """Runs from another host: an exported folder (runs.parquet ...), a profile.json / analysis.json, or a folder
    of them. Returns (runs added, runs already in the store)."""
    src = Path(src)
    path = path if path is not None else default_path()
    if path is None:
        raise StoreUnavailable("recording is off (OPMAP_STORE=off): no store to import into")
    if src.is_dir() and (src / "runs.parquet").exists():
        return _import_parquet(src, path)
    files = sorted(src.rglob("*.json")) if src.is_dir() else [src]
    files = [f for f in files if f.name in ("profile.json", "analysis.json") or not src.is_dir()]
    if not files or not all(f.is_file() for f in files):
        raise OpmapError(f"nothing to import at {src}: accepted: profile.json, analysis.json, a folder of them, "
                         "or a folder from opmap runs export --parquet")
    added = known = 0
    existing = {r["id"] for r in list_runs(path=path)} if path.exists() or any(_spool(path).glob("*.json")) else set()
    for f in files:
        try:
            d = json.loads(f.read_text())
            tags = analysis_tags(d)
        except (OSError, ValueError, AttributeError) as e:
            raise OpmapError(f"cannot import {f}: expected a profile.json or analysis.json ({type(e).__name__})") \
                from None
        rid = "import-" + hashlib.sha256(f.read_bytes()).hexdigest()[:16]
        if rid in existing:
            known += 1
            continue
        samples = (d.get("latency") or {}).get("samples_s")
        payload = {**d, "samples": {"latency_s": samples}} if samples else d
        record(d.get("kind", "analyze"), payload, {**tags, "imported_from": str(f)}, path, run_id=rid)
        added += 1
    return added, known


def _import_parquet(src: Path, path: Path) -> tuple[int, int]:
    _duckdb()
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        _ingest_all(path) if _spool(path).exists() else None
        con = _open_for_write(path)
        try:
            runs = f"read_parquet('{_sql_path(src / 'runs.parquet')}')"
            total = con.execute(f"SELECT count(*) FROM {runs}").fetchone()[0]
            con.execute("BEGIN TRANSACTION")
            con.execute(f"CREATE TEMP TABLE new_ids AS SELECT id FROM {runs} WHERE id NOT IN (SELECT id FROM runs)")
            added = con.execute("SELECT count(*) FROM new_ids").fetchone()[0]
            con.execute(f"INSERT INTO runs BY NAME SELECT * FROM {runs} WHERE id IN (SELECT id FROM new_ids)")
            for t in ("kernels", "layer_types", "samples"):
                f = src / f"{t}.parquet"
                if f.exists():
                    # by name: an export of an older schema lacks the newer columns (they stay NULL)
                    con.execute(f"INSERT INTO {t} BY NAME SELECT * FROM read_parquet('{_sql_path(f)}') "
                                "WHERE run_id IN (SELECT id FROM new_ids)")
            con.execute("COMMIT")
        finally:
            con.close()
    return added, total - added
