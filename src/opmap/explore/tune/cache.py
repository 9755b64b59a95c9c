"""The tuning cache: one JSON file per (device, library versions, signature), beside the calibrated profile.

The file name is a hash of the device fingerprint (calibrate/fingerprint.py: CPU or GPU model, threads,
memory, caches, torch / opmap / python versions), the library versions and the signature's key, so another
machine, another thread count or another torch never reads this one's choices: a changed fingerprint is a
miss and the signature is tuned again. Inside, the candidate-list hash (the candidates enumerated and the
top-k timed) must match too, else the entry is stale (a new candidate axis re-tunes). A model's whole-model
measurement is cached the same way, keyed by the model, its signatures and the choices applied, so a second
run that changes nothing reads it too instead of running the model again.

Entries are parsed, never executed (JSON, no pickle); written atomically (a temporary file created beside
it with O_EXCL | O_NOFOLLOW, then renamed over); read through opmap.safeio (a regular file of at most
ENTRY_LIMIT_BYTES, no link followed, a FIFO never blocking); a cache folder that is a symlink, or an entry that
does not parse or lacks its fields, counts as absent (the signature is tuned again and the entry
rewritten).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Any

from opmap.errors import OpmapError
from opmap.explore.tune.result import SignatureResult, WholeModel
from opmap.record import record
from opmap.safeio import read_bounded
from opmap.validate import json_text

CACHE_SCHEMA_VERSION = 1
ENTRY_LIMIT_BYTES = 1 << 22  # 4 MiB: far above any entry; a larger file is not one of ours
_FIELDS = ("schema_version", "key", "candidate_hash", "signature", "candidates", "chosen", "default")


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/opmap/tune`` (default ``~/.cache``): beside the profile ``--hardware local`` reads."""
    from opmap.hardware.local import cache_path

    return cache_path("cpu").parent / "tune"


def versions() -> dict[str, str]:
    """The library versions a measured choice depends on."""
    import torch

    from opmap import __version__

    return {"torch": torch.__version__, "opmap": __version__, "python": platform.python_version(),
            "mkldnn": str(torch.backends.mkldnn.is_available()),
            "cpu_capability": str(torch.backends.cpu.get_cpu_capability())}


def _digest(obj: Any) -> str:
    return hashlib.sha256(json_text(obj, sort_keys=True).encode()).hexdigest()


def entry_key(fingerprint: dict[str, Any], signature_key: str) -> str:
    """The file name's hash: device fingerprint, library versions, signature."""
    return _digest({"fingerprint": fingerprint, "versions": versions(), "signature": signature_key})[:32]


def candidate_hash(labels: list[str], top_k: int) -> str:
    """The hash of the candidate list enumerated and how many of it are timed."""
    return _digest({"candidates": labels, "top_k": top_k})[:16]


def _safe_dir(d: Path) -> bool:
    return not any(p.is_symlink() for p in (d, *d.parents) if p != p.parent)


WHOLE_FIELDS = ("schema_version", "key", "whole_model")  # a model's measured default-vs-tuned entry


def _load(d: Path, key: str, fields: tuple[str, ...]) -> Any:
    """The parsed entry ``key`` in folder ``d``, or None: absent, a symlink, unparsable, of another schema version
    or key, or missing one of ``fields``."""
    if not _safe_dir(d):
        return None
    try:  # a regular file of at most 4 MiB (far above any entry), no link followed, a FIFO never blocking
        entry = json.loads(read_bounded(d / f"{key}.json", ENTRY_LIMIT_BYTES, "tuning cache entry"))
    except (OpmapError, ValueError, RecursionError):
        return None
    if not isinstance(entry, dict) or any(k not in entry for k in fields):
        return None
    if entry["schema_version"] != CACHE_SCHEMA_VERSION or entry["key"] != key:
        return None
    return entry


def read_entry(d: Path, key: str, candidate_hash: str | None = None) -> SignatureResult | None:
    """The signature entry ``key`` in folder ``d``, or None: absent or unreadable (see ``_load``), a field missing
    or mistyped, or (where ``candidate_hash`` is given) tuned over another candidate list."""
    entry = _load(d, key, _FIELDS)
    if entry is None or (candidate_hash is not None and entry["candidate_hash"] != candidate_hash):
        return None
    try:
        return SignatureResult.from_dict(entry)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
        return None


def read_whole(d: Path, key: str) -> WholeModel | None:
    """The whole-model entry ``key`` in folder ``d``, or None (as ``read_entry``)."""
    entry = _load(d, key, WHOLE_FIELDS)
    try:
        return WholeModel.from_dict(entry["whole_model"]) if entry is not None else None
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
        return None


def write_entry(d: Path, key: str, e: SignatureResult, candidate_hash: str, fingerprint: Any) -> Path | None:
    """Cache signature entry ``e`` as ``key`` with the candidate list's hash and the device it was tuned on."""
    body = {k: v for k, v in record(e).items() if k != "cached"}  # ``cached``: a run's flag, not the entry's
    return write(d, key, {**body, "candidate_hash": candidate_hash, "fingerprint": fingerprint,
                          "versions": versions()})


def write_whole(d: Path, key: str, w: WholeModel) -> Path | None:
    """Cache the whole-model measurement ``w`` as ``key``."""
    return write(d, key, {"whole_model": {k: v for k, v in record(w).items() if k != "cached"}})


def write(d: Path, key: str, entry: dict[str, Any]) -> Path | None:
    """Write ``entry`` as ``key``.json atomically; None (nothing written) where the folder is a symlink."""
    if not _safe_dir(d):
        return None
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{key}.json"
    tmp = d / f".{key}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json_text({**entry, "schema_version": CACHE_SCHEMA_VERSION, "key": key}, indent=1))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
