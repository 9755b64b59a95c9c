"""A cache of captured graphs: a zoo model at the same shapes is captured once per opmap, torch and source.

A capture on the meta device is a pure function of the model's code, its shapes, the dtype it is built in,
the activation layout and the layer-type overrides; the analysis after it (costs, mapping, prediction on
any device, at any precision of the same build dtype, under any fusion policy) is cheap. So the graph, with
the workload's name, batch, sequence and notes, is kept under ``$XDG_CACHE_HOME/opmap/graphs`` (default
``~/.cache``), keyed by those inputs plus the opmap and torch versions and a hash of the source files that
build and capture models. ``OPMAP_GRAPH_CACHE=0`` turns it off. A cache that cannot be read or written is
skipped, never an error; entries are written whole (temporary file, then rename).

Entries are data, never code: a JSON header line (cache version, key, the SHA-256 and length of the payload)
then the payload, a JSON of the graph (opmap.capture.codec's columnar layout), the workload's name and
assumptions and, for training, the saved activations. An entry that is not a regular file of at most
opmap.safeio.LIMIT_JSON_BYTES (a link at its name is not followed), does not parse, is of another version or
key, fails its hash or holds a value of the wrong type is a miss (the graph is captured again and the entry
rewritten). The hash guards against a torn or damaged file, not against a writer who recomputes it: what makes
a planted entry harmless is that it is only parsed, each field type-checked, never unpickled or imported (old
``.pkl`` entries are never read).
"""

from __future__ import annotations

import functools
import gc
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from opmap import __version__
from opmap.capture.codec import BadEntry, decode_graph, encode_graph
from opmap.errors import OpmapError
from opmap.geometry import AttentionSpec, ModelGeometry
from opmap.graph import OpGraph
from opmap.record import record
from opmap.safeio import LIMIT_JSON_BYTES, read_bounded

T = TypeVar("T")

# 1 was pickle (never read again); 2: JSON with a SHA-256 of the payload, a row per node; 3: the graph columnar
# (opmap.capture.codec: each distinct string and tensor once), parsed in about half the time
CACHE_VERSION = 3
# what a captured graph depends on, and a training entry's saved activations (measured by mapping/activations.py's
# saved_activation_bytes as phases/train.py's train_activations calls it)
_SOURCES = ("graph.py", "ops.py", "precision.py", "capture", "workloads", "mapping/activations.py", "phases/train.py")


def enabled() -> bool:
    return os.environ.get("OPMAP_GRAPH_CACHE", "1") != "0"


def cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "opmap" / "graphs"


@functools.lru_cache(maxsize=1)
def source_hash() -> str:
    """A hash of the opmap source files a captured graph depends on (model code, tracer, op taxonomy)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for name in _SOURCES:
        p = root / name
        for f in sorted(p.rglob("*.py")) if p.is_dir() else [p]:
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def key(parts: dict[str, Any]) -> str:
    import torch

    full = {**parts, "cache": CACHE_VERSION, "opmap": __version__, "torch": torch.__version__,
            "source": source_hash()}
    return hashlib.sha256(json.dumps(full, sort_keys=True, default=str).encode()).hexdigest()[:32]


class _Bad(Exception):
    """A cache entry that is not what this version writes: treated as a miss."""


def _check(cond: bool) -> None:
    if not cond:
        raise _Bad()


def _int(v) -> int:
    _check(type(v) is int)
    return v


def _num(v) -> float:
    _check(type(v) in (int, float))
    return v


def _str(v) -> str:
    _check(type(v) is str)
    return v


def _opt(v, f):
    return None if v is None else f(v)


@dataclass(frozen=True)
class CachedWorkload:
    """What a cached graph keeps of its workload: its name, batch, sequence and notes, and its geometry (as the
    captured model's layers are); not its module or inputs (a cached graph needs neither). Its record is the
    entry's ``workload`` JSON (``_workload`` reads it back)."""

    name: str
    batch: int
    seq: int | None
    assumptions: tuple[str, ...]
    geometry: ModelGeometry | None = None


def _workload(d) -> CachedWorkload:
    """The workload a cached graph keeps, each field type-checked."""
    _check(type(d) is dict)
    return CachedWorkload(_str(d["name"]), _int(d["batch"]), _opt(d["seq"], _int),
                          tuple(_str(x) for x in d["assumptions"]), _opt(d.get("geometry"), _geometry))


def _geometry(d) -> ModelGeometry:
    """A workload's geometry (opmap.geometry.ModelGeometry), each field type-checked against the dataclass."""
    _check(type(d) is dict and type(d["attention"]) is list)
    attention = tuple(_fields(AttentionSpec, a) for a in d["attention"])
    return ModelGeometry(**{**_fields(ModelGeometry, {k: v for k, v in d.items() if k != "attention"}, False),
                            "attention": attention})


_KINDS = {"int": _int, "str": _str, "bool": lambda v: (_check(type(v) is bool), v)[1],
          "int | None": lambda v: _opt(v, _int),
          "tuple[str, ...]": lambda v: (_check(type(v) is list), tuple(_str(x) for x in v))[1]}


def _fields(cls, d, whole: bool = True):
    """``cls``'s scalar fields from ``d`` (every one present, each of its declared type); ``whole``: the instance."""
    from dataclasses import fields

    _check(type(d) is dict)
    names = [f for f in fields(cls) if f.type in _KINDS]
    _check(set(d) == {f.name for f in names})
    kw = {f.name: _KINDS[f.type](d[f.name]) for f in names}
    return cls(**kw) if whole else kw


def _saved(d, make: Callable[..., T] | None) -> T | None:
    """A training step's saved activations as ``make`` builds them from their fields, each type-checked first."""
    if d is None:
        return None
    _check(make is not None and type(d) is dict and type(d["by_block"]) is dict)
    return make(total_bytes=_num(d["total_bytes"]),
                by_block={_str(k): _num(v) for k, v in d["by_block"].items()},
                recompute=_str(d["recompute"]), attention=_str(d["attention"]), tensors=_int(d["tensors"]),
                notes=tuple(_str(x) for x in d["notes"]))


def _path(k: str) -> Path:
    return cache_dir() / f"{k}.json"


def _read(k: str) -> bytes:
    """The payload of the entry for ``k`` once its header matches (this version, this key, its length and SHA-256);
    raises (OpmapError, ValueError, _Bad) otherwise: the callers treat every failure as a miss. The entry is read
    as a regular file of at most LIMIT_JSON_BYTES, never through a link (opmap.safeio): a name linked to
    /dev/zero, a FIFO, a folder or an oversized file is a miss, not a MemoryError or a hang."""
    data = read_bounded(_path(k), LIMIT_JSON_BYTES, "graph cache entry")
    line, newline, payload = data.partition(b"\n")
    _check(newline == b"\n")
    header = json.loads(line)
    _check(type(header) is dict and header.get("cache_version") == CACHE_VERSION and header.get("key") == k)
    _check(header.get("bytes") == len(payload) and header.get("sha256") == hashlib.sha256(payload).hexdigest())
    return payload


def load(k: str, saved: Callable[..., Any] | None = None) -> tuple | None:
    """The cached (graph, CachedWorkload) or (graph, CachedWorkload, saved activations or None) for ``k``, the
    saved activations as ``saved`` builds them from the entry's checked fields (SavedActivations: capture does not
    import mapping; without ``saved`` an entry holding them is a miss), or None: absent, unreadable, of another
    version or key, failing its hash, or holding a value of the wrong type."""
    if not enabled():
        return None
    try:
        payload = _read(k)
        was = gc.isenabled()
        gc.disable()  # parsing makes ~10^5 containers: each collection would walk torch's heap again
        try:
            body = json.loads(payload)
            _check(type(body) is dict)
            entry = (decode_graph(body["graph"]), _workload(body["workload"]))
            return (*entry, _saved(body["saved"], saved)) if "saved" in body else entry
        finally:
            if was:
                gc.enable()
    except (OpmapError, OSError, ValueError, KeyError, TypeError, IndexError, RecursionError, _Bad, BadEntry):
        return None  # a miss in every form: missing, not a bounded regular file, truncated, damaged, wrong types


def store(k: str, graph: OpGraph, workload: CachedWorkload, *saved: Any) -> None:
    """Write the entry for ``k`` (the graph; the workload's name, batch, seq and assumptions; for a training step
    its saved activations, a SavedActivations or None, as their fields) whole, or not at all. A link at the entry's
    name is replaced, not followed."""
    if not enabled():
        return
    body: dict[str, Any] = {"graph": encode_graph(graph), "workload": record(workload)}
    if saved:
        s = saved[0]
        body["saved"] = None if s is None else {**asdict(s), "notes": list(s.notes)}
    _write(k, json.dumps(body, separators=(",", ":")).encode())


def _write(k: str, payload: bytes) -> None:
    """The entry for ``k``: a JSON header line (version, key, length and SHA-256 of the payload), then the payload,
    written to a temporary file and renamed into place (whole or not at all; a link at the name is replaced)."""
    header = {"cache_version": CACHE_VERSION, "key": k, "bytes": len(payload),
              "sha256": hashlib.sha256(payload).hexdigest()}
    d = cache_dir()
    tmp = None
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{k}.", dir=d)
        with os.fdopen(fd, "wb") as f:
            f.write(json.dumps(header, allow_nan=False).encode() + b"\n" + payload)
        os.replace(tmp, _path(k))
    except OSError:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def _scalar(v):
    _check(v is None or type(v) in (bool, int, float, str))
    return v


def load_fields(k: str, make: Callable[..., T], names: Iterable[str]) -> T | None:
    """A cached flat record (what a model's build told about it: its layer count, limits, bytes) as ``make``
    builds it from exactly the fields ``names`` (each value a JSON scalar), or None (absent, damaged, another
    version or key, a value of another type, another set of names, or refused by ``make``)."""
    if not enabled():
        return None
    try:
        payload = _read(k)
        body = json.loads(payload)
        _check(type(body) is dict and type(body.get("fields")) is dict)
        fields = {_str(n): _scalar(v) for n, v in body["fields"].items()}
        _check(set(fields) == set(names))
        return make(**fields)
    except (OpmapError, OSError, ValueError, KeyError, TypeError, RecursionError, _Bad):
        return None


def store_fields(k: str, fields: dict[str, Any]) -> None:
    """Write a flat record of JSON scalars for ``k`` whole, or not at all (as ``store``)."""
    if not enabled():
        return
    try:  # a record is plain JSON: a NaN or infinity in it is not cached (the pricing recomputes it)
        payload = json.dumps({"fields": fields}, separators=(",", ":"), allow_nan=False).encode()
    except ValueError:
        return
    _write(k, payload)
