"""Runs between hosts: ``opmap runs export --parquet DIR`` and ``opmap runs import SRC``.

An import is all or nothing: every run it names (a profile.json / analysis.json, a folder of them, or a folder
an export wrote) is read and checked first (opmap.store.validate), and only then are they spooled and ingested
like any other run (so the journal holds them too). One bad run refuses the whole import, naming the file.
An export writes its folder under a temporary name beside it and renames it into place: an existing folder
(other than an empty one) or a symlink is refused, and a failure leaves nothing half-written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import uuid
from dataclasses import replace
from pathlib import Path

from opmap.errors import OpmapError
from opmap.store import db, reading
from opmap.validate import visible

TABLES = ("meta", "runs", "kernels", "layer_types", "samples")
ACCEPTED = ("accepted: profile.json, analysis.json, a folder of them, or a folder from opmap runs export "
            "--parquet")


def _sql_path(p: Path) -> str:
    return str(p).replace("'", "''")


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0]


def export_parquet(out_dir: Path, path: Path | None = None) -> list[Path]:
    """Every table as ``out_dir/TABLE.parquet`` (DuckDB's COPY): a store any host can import."""
    out = Path(out_dir)
    if out.is_symlink():
        raise OpmapError(f"{visible(out)} is a symlink; opmap runs export writes a new folder (never through a link)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OpmapError(f"{visible(out)} exists; opmap runs export writes a new folder (or an empty one): choose "
                         "another")
    con = reading.open_read(path)
    tmp = out.parent / f".{out.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        for t in TABLES:
            con.execute(f"COPY {t} TO '{_sql_path(tmp / f'{t}.parquet')}' (FORMAT parquet)")
        os.rename(tmp, out)  # onto an empty folder, or a new name; never through a symlink
    except (OSError, db._duckdb().Error) as e:
        raise OpmapError(f"cannot write the export to {visible(out)}: {_first_line(e)}") from None
    finally:
        con.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return [out / f"{t}.parquet" for t in TABLES]


def _from_file(f: Path, named: bool) -> db.SpoolEntry:
    """The spool entry of one profile.json / analysis.json (or another kind's JSON), checked. ``named``: the user
    named the file itself (a link there is followed; one found in a folder is not), read to LIMIT_JSON_BYTES."""
    from opmap.safeio import LIMIT_JSON_BYTES, read_bounded
    from opmap.store.source import folder_tags
    from opmap.store.validate import validate_run

    try:
        raw = read_bounded(f, LIMIT_JSON_BYTES, "run file", follow_links=named)
        try:
            d = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise OpmapError(f"not JSON ({_first_line(e)}); expected the profile.json / analysis.json opmap wrote") \
                from None
        validate_run(d)
        kind = d.get("kind", "analyze")
        tags = folder_tags(kind, d)
        samples = (d.get("latency") or {}).get("samples_s")
        payload = {**d, "samples": {"latency_s": samples}} if samples else d
        rid = "import-" + hashlib.sha256(raw).hexdigest()[:16]
        return db.entry(kind, payload, replace(db.recorded_tags(tags), imported_from=str(f)), rid)
    except (OSError, ValueError, RecursionError, OpmapError) as e:
        raise OpmapError(f"cannot import {f}: {_first_line(e)} (nothing imported)") from None


def _table(con, f: Path, columns: tuple[str, ...]) -> dict[str, list[list]]:
    """A row table of an export, by run id, in ``columns`` order (a column an older export lacks: null)."""
    if not f.exists():
        return {}
    cur = con.execute(f"SELECT * FROM read_parquet('{_sql_path(f)}')")
    names = [c[0] for c in cur.description]
    if "run_id" not in names:
        raise OpmapError(f"{f.name} has no run_id column")
    out: dict[str, list[list]] = {}
    for r in cur.fetchall():
        row = dict(zip(names, r))
        out.setdefault(row["run_id"], []).append([row.get(c) for c in columns])
    for rows in out.values():
        rows.sort(key=lambda x: tuple((v is None, v) for v in x[:2]))
    return out


# An export's table files, each at most (DuckDB reads them itself, so read_bounded's check is made on their status):
# a run's tables take a few hundred kB of Parquet, so this is thousands of 70B-model runs.
LIMIT_PARQUET_BYTES = 1 << 30


def _check_parquet(src: Path) -> None:
    """Each table file of an export a regular file (no link) of at most LIMIT_PARQUET_BYTES, before DuckDB reads it."""
    for t in TABLES:
        f = src / f"{t}.parquet"
        try:
            st = os.lstat(f)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode):
            raise OpmapError(f"{f.name} is not a regular file (a link, a folder or a device); an export holds files")
        if st.st_size > LIMIT_PARQUET_BYTES:
            raise OpmapError(f"{f.name} is {st.st_size / (1 << 20):.1f} MiB, over the "
                             f"{LIMIT_PARQUET_BYTES >> 20} MiB opmap reads for an export's table")


def _from_parquet(src: Path) -> list[db.SpoolEntry]:
    """The spool entries of a folder ``opmap runs export --parquet`` wrote, checked."""
    from opmap.store.validate import check_entry, finite

    try:
        _check_parquet(src)
    except OpmapError as e:
        raise OpmapError(f"cannot import {src}: {e}; nothing imported") from None
    con = db._quiet(db._duckdb().connect())
    try:
        cur = con.execute(f"SELECT * FROM read_parquet('{_sql_path(src / 'runs.parquet')}')")
        names = [c[0] for c in cur.description]
        missing = {"id", "kind", "time_utc", "tags", "payload"} - set(names)
        if missing:
            raise OpmapError(f"runs.parquet lacks {', '.join(sorted(missing))}")
        runs = [dict(zip(names, r)) for r in cur.fetchall()]
        rows = {t: _table(con, src / f"{t}.parquet", cols) for t, cols in
                (("kernels", db.KERNEL_COLUMNS), ("layer_types", db.LAYER_COLUMNS),
                 ("samples", ("metric", "i", "value_s")))}
        entries = []
        for r in runs:
            e = {"id": r["id"], "kind": r["kind"], "time_utc": r["time_utc"],
                 "tags": json.loads(r["tags"]) if isinstance(r["tags"], str) else r["tags"],
                 "payload": json.loads(r["payload"]) if isinstance(r["payload"], str) else r["payload"],
                 "rows": {t: rows[t].get(r["id"], []) for t in rows}}
            try:
                check_entry(e)
                finite(e, "run")  # an import is user data: no NaN or infinity
            except OpmapError as err:
                raise OpmapError(f"run {str(r['id'])[:40]!r}: {err}") from None
            entries.append(db.SpoolEntry(e["id"], json.dumps(e)))
        return entries
    except (OpmapError, ValueError, RecursionError, db._duckdb().Error) as e:
        raise OpmapError(f"cannot import {src}: not a readable opmap export ({_first_line(e)}); nothing imported") \
            from None
    finally:
        con.close()


def _sources(src: Path) -> list[db.SpoolEntry]:
    """Every run ``src`` names, checked (the first bad one refuses them all)."""
    if src.is_dir() and (src / "runs.parquet").exists():
        return _from_parquet(src)
    files = sorted(src.rglob("*.json")) if src.is_dir() else [src]
    files = [f for f in files if f.name in ("profile.json", "analysis.json") or not src.is_dir()]
    if not files or not all(f.is_file() for f in files):
        raise OpmapError(f"nothing to import at {src}: {ACCEPTED}")
    return [_from_file(f, named=not src.is_dir()) for f in files]


def import_path(src: Path, path: Path | None = None) -> tuple[int, int]:
    """Runs from another host, all or none. Returns (runs added, runs already in the store)."""
    path = db._resolve(path, "import into")
    db._duckdb()
    entries = list({e.id: e for e in _sources(Path(src))}.values())
    known = set()
    if path.exists() or db._pending(path):
        ids = {e.id for e in entries}
        known = {r["id"] for r in reading.list_runs(path=path) if r["id"] in ids}
    new = [e for e in entries if e.id not in known]
    db._make_parent(path)
    written = []
    try:
        for e in new:
            written.append(db._spool_entry(path, e))
    except (OSError, OpmapError) as e:
        for f in written:
            f.unlink(missing_ok=True)
        raise OpmapError(f"cannot spool the imported runs into {db._spool(path)}: {_first_line(e)} "
                         "(nothing imported)") from None
    db.ingest_spool(path)
    return len(new), len(known)
