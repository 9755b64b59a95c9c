"""A run as compare and memo read it: a run id in the store, or an output folder (``opmap analyze``, ``profile``,
``plan``, ``sweep``, ``serve`` or ``fit`` with ``--out``), read the same way (as ``opmap report`` takes either).

A folder's run is parsed, never executed: its JSON is read and checked for the field each file cannot be
without. A folder carries no git commit or command, so it has no repeats in the store and cannot be re-run.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from opmap.errors import OpmapError
from opmap.safeio import LIMIT_JSON_BYTES, read_json_object
from opmap.tags import Tags

# a folder's files, in the order one is chosen where it holds several; each with its run kind
FOLDER_FILES = (("profile.json", "profile"), ("analysis.json", "analyze"), ("plan.json", "plan"),
                ("sweep.json", "sweep"), ("serve.json", "serve"), ("fit.json", "fit"), ("bench.json", "bench"))
# the field each file cannot be without (a file lacking it is not opmap's)
REQUIRED = {"profile": "assumptions", "analyze": "assumptions", "plan": "ranked", "sweep": "points",
            "serve": "latency", "fit": "cells", "bench": "latency"}
ACCEPTED = ("a run id (opmap runs list) or an output folder holding profile.json, analysis.json, plan.json, "
            "sweep.json, serve.json, fit.json or bench.json")


@dataclass(frozen=True)
class Run:
    """One run: ``id`` (the run id, or the folder), ``kind``, its tags (as the store or the folder's file holds
    them: opmap.tags.Tags.to_dict) and payload; ``stored``: in the store."""

    id: str
    kind: str
    time_utc: str | None  # an imported run's may be unknown
    tags: dict[str, Any]
    payload: dict[str, Any]
    stored: bool


def is_run_id(source: str) -> bool:
    """Whether ``source`` names a stored run rather than a folder (it is checked when it is loaded)."""
    return not Path(source).exists() and "/" not in source and not source.startswith(".")


@contextlib.contextmanager
def reading(path: Path | None, needed: bool = True):
    """One read-only connection to the store for several reads (None where ``needed`` is false)."""
    if not needed:
        yield None
        return
    from opmap.store.reading import open_read

    con = open_read(path)
    try:
        yield con
    finally:
        con.close()


def load(source: str, path: Path | None = None, con=None) -> Run:
    """A run id or an output folder (an existing folder wins over a run id of the same name); ``con``: an open
    store connection to read a run id through (else one is opened)."""
    p = Path(source)
    if p.is_dir():
        return from_folder(p)
    if p.is_file():
        raise OpmapError(f"{source} is a file; accepted: {ACCEPTED}")
    if "/" in source or source.startswith("."):
        raise OpmapError(f"no folder {source}; accepted: {ACCEPTED}")
    if con is None:
        from opmap.store.reading import show_run

        r = show_run(source, path)
        return Run(r.id, r.kind, r.time_utc, r.tags, r.payload, True)
    r = con.execute("SELECT id, kind, time_utc, tags, payload FROM runs WHERE id = ?", [source]).fetchone()
    if r is None:
        raise OpmapError(f"no run {source!r} in the store (opmap runs list shows the ids)")
    return Run(r[0], r[1], r[2], json.loads(r[3]), json.loads(r[4]), True)


def _not_opmaps(f: Path, kind: str) -> str:
    """Why a folder's file ``f`` is refused: it lacks the field its kind cannot be without."""
    return f"{f} is not opmap's {f.name} (no {REQUIRED[kind]!r}); accepted: the file opmap {kind} --out writes"


def folder_tags(kind: str, d: dict[str, Any]) -> Tags:
    """The tags the command of ``kind`` records its run under (cli/*.py), from its output file."""
    from opmap.store.rows import analysis_tags

    if kind in ("analyze", "profile"):
        return analysis_tags(d)
    if kind == "plan":
        return Tags("plan", workload=d.get("model"), hardware=d.get("hardware"), phase=d.get("phase"),
                    precision=d.get("dtype"), parallelism=f"{d.get('devices')} devices")
    if kind == "sweep":
        return Tags("sweep", workload=d.get("model"), hardware=d.get("hardware"), phase=d.get("phase"),
                    precision=d.get("dtype"))
    if kind == "bench":
        from opmap.bench.outputs import bench_tags

        return bench_tags(d)
    if kind == "serve":
        a = d.get("assumptions") if isinstance(d.get("assumptions"), dict) else {}
        return Tags("serve", workload=a.get("model"), hardware=a.get("hardware"), phase="serve",
                    precision=a.get("dtype"), parallelism=f"tp{a.get('tp')} x {a.get('replicas')} replicas")
    return Tags("sweep", workload=",".join(map(str, d.get("models") or ())),
                hardware=",".join(map(str, d.get("hardware") or ())), phase="serve", precision=d.get("dtype"))


def from_folder(folder: Path) -> Run:
    """The run in an output folder: the first of FOLDER_FILES it holds."""
    for name, kind in FOLDER_FILES:
        f = folder / name
        if f.exists() or f.is_symlink():  # a link, a FIFO, a device at the name: refused by read_json_object, named
            # a regular file of at most LIMIT_JSON_BYTES, never read through a link (opmap.safeio)
            d = read_json_object(f, LIMIT_JSON_BYTES, "run file", _not_opmaps(f, kind))
            if not d.get(REQUIRED[kind]):
                raise OpmapError(_not_opmaps(f, kind))
            tags = d.get("tags") if isinstance(d.get("tags"), dict) else {}
            when = tags.get("time_utc") or datetime.fromtimestamp(f.stat().st_mtime, UTC).isoformat(
                timespec="seconds")
            return Run(str(folder), kind, str(when), folder_tags(kind, d).to_dict(), d, False)
    raise OpmapError(f"nothing to read in {folder}; accepted: {ACCEPTED}")


def _numbers(xs: Any, what: str) -> list[float]:
    """``xs`` as finite non-negative times, s (a folder's file is checked, not trusted)."""
    if xs is None:
        return []
    if not isinstance(xs, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs):
        raise OpmapError(f"{what} must be a list of times in seconds")
    bad = [x for x in xs if not math.isfinite(x) or x < 0]
    if bad:
        raise OpmapError(f"{what} holds {bad[0]!r}; accepted: finite times >= 0 s")
    return [float(x) for x in xs]


@dataclass(frozen=True)
class KernelRow:
    """A kernel as the store holds it (store/rows.py): its index, name (anchor op at module path), layer type,
    times, bytes, node ids, op signature, MFU and stall fraction (None where the run has no figure)."""

    idx: int
    name: str
    layer_type: str | None
    predicted_s: float | None
    measured_s: float | None
    bytes: float | None
    node_ids: str | None
    signature: str | None
    mfu: float | None
    stall_fraction: float | None


@dataclass(frozen=True)
class LayerRow:
    """A layer type's MFU, stall fraction and bytes as the store holds them."""

    mfu: float | None
    stall_fraction: float | None
    bytes: float | None


def kernel_rows(run: Run, con=None) -> tuple[list[KernelRow], dict[str, LayerRow]]:
    """(kernels, layer types by name) as the store holds them (``con``: the store's connection, for a stored
    run)."""
    from opmap.store.db import KERNEL_COLUMNS, LAYER_COLUMNS, payload_rows

    if run.stored:
        ks = [dict(zip(KERNEL_COLUMNS, r)) for r in con.execute(
            f"SELECT {', '.join(KERNEL_COLUMNS)} FROM kernels WHERE run_id = ? ORDER BY idx", [run.id]).fetchall()]
        lts = [dict(zip(LAYER_COLUMNS, r)) for r in con.execute(
            f"SELECT {', '.join(LAYER_COLUMNS)} FROM layer_types WHERE run_id = ?", [run.id]).fetchall()]
    else:
        ks, lts = payload_rows(run.payload)
    return ([KernelRow(k["idx"], k["name"], k["layer_type"], k["predicted_s"], k["measured_s"], k["bytes"],
                       k["node_ids"], k["signature"], k["mfu"], k["stall_fraction"]) for k in ks],
            {r["layer_type"]: LayerRow(r.get("mfu"), r.get("stall_fraction"), r.get("bytes")) for r in lts})


Series = tuple[list[float], dict[int, list[float]]]


def series(runs: list[Run], con=None) -> dict[str, Series]:
    """Each run's (latency samples, each kernel's per-iteration samples by kernel index), s, in order."""
    out: dict[str, Series] = {}
    stored = [r.id for r in runs if r.stored]
    if stored:
        out.update(stored_series(stored, con))
    for r in runs:
        if not r.stored:
            lat = (r.payload.get("latency") or {}).get("samples_s")
            per = {i: _numbers(k.get("measured_samples_s"), f"{r.id}: kernel {i}'s measured_samples_s")
                   for i, k in enumerate(r.payload.get("kernels") or []) if isinstance(k, dict)}
            out[r.id] = (_numbers(lat, f"{r.id}: latency.samples_s"), {i: v for i, v in per.items() if v})
    return out


def stored_series(ids: list[str], con) -> dict[str, Series]:
    """Samples of stored runs, one query for all of them."""
    rows = con.execute("SELECT run_id, metric, value_s FROM samples WHERE run_id IN (SELECT unnest(?)) "
                       "ORDER BY run_id, metric, i", [ids]).fetchall()
    lat: dict[str, list[float]] = defaultdict(list)
    per: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for rid, metric, v in rows:
        if metric == "latency_s":
            lat[rid].append(v)
        elif metric.startswith("kernel:"):
            per[rid][int(metric[7:])].append(v)
    return {i: (lat.get(i, []), dict(per.get(i, {}))) for i in ids}


def stored_like(run: Run, con) -> list[Run]:
    """Stored runs of the same kind and workload as ``run`` (oldest first), itself excluded: the candidates for
    its repeats."""
    rows = con.execute("SELECT id, kind, time_utc, tags, payload FROM runs WHERE kind = ? AND "
                       "CAST(workload AS VARCHAR) IS NOT DISTINCT FROM ? ORDER BY time_utc, id",
                       [run.kind, None if run.tags.get("workload") is None else str(run.tags["workload"])]
                       ).fetchall()
    return [Run(r[0], r[1], r[2], json.loads(r[3]), json.loads(r[4]), True) for r in rows if r[0] != run.id]
