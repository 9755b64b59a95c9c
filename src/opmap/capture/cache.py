"""A cache of captured graphs: a zoo model at the same shapes is captured once per opmap, torch and source.

A capture on the meta device is a pure function of the model's code, its shapes, the dtype it is built in,
the activation layout and the layer-type overrides; the analysis after it (costs, mapping, prediction on
any device, at any precision of the same build dtype, under any fusion policy) is cheap. So the graph, with
the workload's name, batch, sequence and notes, is kept under ``$XDG_CACHE_HOME/opmap/graphs`` (default
``~/.cache``), keyed by those inputs plus the opmap and torch versions and a hash of the source files that
build and capture models. ``OPMAP_GRAPH_CACHE=0`` turns it off. A cache that cannot be read or written is
skipped, never an error; entries are written whole (temporary file, then rename).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

from opmap import __version__

CACHE_VERSION = 1
_SOURCES = ("graph.py", "ops.py", "precision.py", "capture", "workloads")  # what a captured graph depends on


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


def load(k: str) -> Any | None:
    """The cached entry for ``k``, or None (absent, unreadable, or from another format)."""
    if not enabled():
        return None
    try:
        with open(cache_dir() / f"{k}.pkl", "rb") as f:
            return pickle.load(f)
    except Exception:  # a cache miss in every form: missing, truncated, stale classes
        return None


def store(k: str, entry: Any) -> None:
    """Write ``entry`` for ``k`` whole, or not at all."""
    if not enabled():
        return
    d = cache_dir()
    tmp = None
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{k}.", dir=d)
        with os.fdopen(fd, "wb") as f:
            pickle.dump(entry, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, d / f"{k}.pkl")
    except OSError:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
