"""Checks on a run before the store takes it: an imported file (``validate_run``) and a spool entry
(``check_entry``), each raising a one-line OpmapError that names the field and what is accepted.

The store's columns are typed (batch BIGINT, predicted_s DOUBLE ...): a value of the wrong type found only at
the ingest would fail the ingest of every later run, so every run is checked whole before a byte is written.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

from opmap.errors import OpmapError

KINDS = ("analyze", "profile", "plan", "sweep", "serve", "fit", "calibrate", "shape-check", "bench", "tune")
# the field each kind's file cannot be without (as compare reads output folders, store/source.py)
REQUIRED = {"profile": "assumptions", "analyze": "assumptions", "plan": "ranked", "sweep": "points",
            "serve": "latency", "fit": "cells", "bench": "latency", "tune": "signatures"}
ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
INT_TAGS = ("batch", "seq")
# column types of the row tables, in the order of db.KERNEL_COLUMNS / LAYER_COLUMNS / samples
ROW_TYPES = {"kernels": ("int", "str", "str", "num", "num", "num", "num", "str", "str", "str", "num", "num"),
             "layer_types": ("str", "num", "num", "num", "num", "num", "num"),
             "samples": ("str", "int", "num")}
BIND_INT = 2 ** 127  # the largest Python integer DuckDB binds as a parameter (a DOUBLE or VARCHAR cell)
MAX_DEPTH = 64  # a run's JSON nests a few levels; deeper is not opmap's
# The longest string an imported run may hold, in characters: far above any name, tag, command or note opmap writes
# (a templated CUDA kernel name is a few kB); a 50 MB string took 37 s and 1.1 GB of memory to import.
MAX_STRING = 65536


def _fail(where: str, problem: str) -> OpmapError:
    return OpmapError(f"{where}: {problem}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _utf8(s: str) -> bool:
    """Whether ``s`` can be stored: a lone surrogate (JSON's "\\ud800", or a file name's undecodable byte) cannot
    be encoded as UTF-8, and DuckDB refuses it at the insert."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


NOT_UTF8 = "holds a lone surrogate (such as \\ud800), which is not text: only valid UTF-8 is accepted"


def _text(s: str, where: str) -> None:
    if len(s) > MAX_STRING:
        raise _fail(where, f"a string of {len(s):,} characters; at most {MAX_STRING:,} are accepted")
    if not _utf8(s):
        raise _fail(where, NOT_UTF8)


def finite(v: Any, where: str, depth: int = 0) -> None:
    """Every number in ``v`` (any JSON) finite, every string and key valid UTF-8 and at most MAX_STRING characters,
    and ``v`` no deeper than MAX_DEPTH."""
    if depth > MAX_DEPTH:
        raise _fail(where, f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(v, float) and not math.isfinite(v):
        raise _fail(where, f"{v} is not a finite number")
    if _is_int(v) and abs(v) > sys.float_info.max:  # a JSON integer of 400 digits: no float holds it
        raise _fail(where, f"an integer of {v.bit_length()} bits is too large for a number (at most "
                          f"{sys.float_info.max:.3e})")
    if isinstance(v, str):
        _text(v, where)
    if isinstance(v, dict):
        for k, x in v.items():
            if isinstance(k, str):
                _text(k, f"{where} key {k!r:.40}")
            finite(x, f"{where}.{k}", depth + 1)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            finite(x, f"{where}[{i}]", depth + 1)


def _opt(d: dict, key: str, kind: str, where: str, minimum: float | None = None) -> None:
    """``d[key]`` absent, null or of ``kind`` (str / int / num / dict / list), at least ``minimum``."""
    v = d.get(key)
    if v is None:
        return
    ok = {"str": isinstance(v, str), "int": _is_int(v), "num": _is_num(v), "dict": isinstance(v, dict),
          "list": isinstance(v, list)}[kind]
    what = {"str": "a string", "int": "an integer", "num": "a number", "dict": "an object", "list": "a list"}[kind]
    if not ok:
        raise _fail(f"{where}.{key}", f"{v!r:.40} is not {what}")
    if minimum is not None and v < minimum:
        raise _fail(f"{where}.{key}", f"{v} is below {minimum}")


def _each(d: dict, key: str, where: str) -> list[dict]:
    """``d[key]``, a list of objects (absent: none)."""
    xs = d.get(key)
    if xs is None:
        return []
    if not isinstance(xs, list) or not all(isinstance(x, dict) for x in xs):
        raise _fail(f"{where}.{key}", "must be a list of objects")
    return xs


def _numbers(v: Any, where: str) -> None:
    if v is not None and (not isinstance(v, list) or not all(_is_num(x) and x >= 0 for x in v)):
        raise _fail(where, "must be a list of non-negative numbers (seconds)")


def _analysis(d: dict) -> None:
    """The fields of an analysis.json / profile.json the store reads (db.analysis_tags, db._rows)."""
    a = d.get("assumptions")
    if not isinstance(a, dict):
        raise _fail("assumptions", "must be an object (workload, hardware, dtype, batch, seq ...)")
    for k in ("workload", "hardware"):
        if not isinstance(a.get(k), str) or not a[k]:
            raise _fail(f"assumptions.{k}", "must be a non-empty string")
    for k in ("dtype", "fusion_policy", "opmap_version", "torch_version"):
        _opt(a, k, "str", "assumptions")
    for k in INT_TAGS:
        _opt(a, k, "int", "assumptions", 1)
        if _is_int(a.get(k)) and a[k] >= 2 ** 63:
            raise _fail(f"assumptions.{k}", f"{a[k]} does not fit a 64-bit integer")
    _opt(d, "phase", "dict", "run")
    _opt(d.get("phase") or {}, "name", "str", "phase")
    _opt(d, "graph_hash", "str", "run")
    par = d.get("parallelism")
    if par is not None and (not isinstance(par, dict) or not all(_is_int(par.get(k)) for k in ("tp", "pp", "dp",
                                                                                                "ep"))):
        raise _fail("parallelism", "must be an object of integers tp, pp, dp, ep")
    for i, n in enumerate(_each(d, "nodes", "run")):
        w = f"nodes[{i}]"
        for k, t in (("id", "int"), ("op", "str"), ("module", "str"), ("layer_type", "str")):
            _opt(n, k, t, w)
        _opt(n, "flops", "num", w, 0)
        for side in ("inputs", "outputs"):
            for j, t in enumerate(_each(n, side, w)):
                s = t.get("shape", [])
                if not isinstance(s, list) or not all(_is_int(x) and x >= 0 for x in s):
                    raise _fail(f"{w}.{side}[{j}].shape", "must be a list of non-negative integers")
                _opt(t, "dtype", "str", f"{w}.{side}[{j}]")
    for i, k in enumerate(_each(d, "kernels", "run")):
        w = f"kernels[{i}]"
        for key in ("predicted_s", "measured_s", "flops", "bytes", "traffic_bytes", "memory_stall_s"):
            _opt(k, key, "num", w, 0)
        for key in ("bound", "layer_type", "op", "collective"):
            _opt(k, key, "str", w)
        _opt(k, "anchor", "int", w)
        if not isinstance(k.get("nodes", []), list) or not all(_is_int(x) for x in k.get("nodes", [])):
            raise _fail(f"{w}.nodes", "must be a list of node ids (integers)")
        _numbers(k.get("measured_samples_s"), f"{w}.measured_samples_s")
    lts = d.get("layer_types")
    if lts is not None and not (isinstance(lts, dict) and all(isinstance(v, dict) for v in lts.values())):
        raise _fail("layer_types", "must be an object of layer type -> object")
    for lt, v in (lts or {}).items():
        for key in ("predicted_s", "share_of_time", "matrix_flops", "bytes"):
            _opt(v, key, "num", f"layer_types.{lt}", 0)
        _opt(v, "measured", "dict", f"layer_types.{lt}")
        for key in ("measured_s", "memory_stall"):
            _opt(v.get("measured") or {}, key, "num", f"layer_types.{lt}.measured", 0)
    _opt(d, "totals", "dict", "run")
    for key in ("matrix_flops", "predicted_latency_s", "predicted_mfu"):
        _opt(d.get("totals") or {}, key, "num", "totals", 0)
    _opt(d, "latency", "dict", "run")
    _numbers((d.get("latency") or {}).get("samples_s"), "latency.samples_s")
    samples = d.get("samples")
    if samples is not None and not isinstance(samples, dict):
        raise _fail("samples", "must be an object of metric -> list of seconds")
    for m, xs in (samples or {}).items():
        _numbers(xs, f"samples.{m}")


def validate_run(d: Any) -> None:
    """One run as ``opmap runs import`` takes it from a profile.json / analysis.json (or another kind's JSON:
    ``kind`` names it); raises a one-line OpmapError naming the first bad field. Touches no store."""
    if not isinstance(d, dict) or not d:
        raise OpmapError("a run must be a non-empty JSON object: the profile.json / analysis.json opmap wrote")
    finite(d, "run")
    kind = d.get("kind", "analyze")
    if kind not in KINDS:
        raise _fail("kind", f"{kind!r:.40} is not a run kind; accepted: {', '.join(KINDS)}")
    need = REQUIRED.get(kind)
    if need and d.get(need) is None:
        raise _fail(need, f"missing: a {kind} run's file always has it")
    if kind in ("analyze", "profile"):
        _analysis(d)


def check_entry(e: Any) -> None:
    """A spool entry (db.record's body: id, kind, time_utc, tags, payload, rows) as the ingest inserts it: the
    types its columns take (a command's own run may carry an infinite figure, which DuckDB stores; an import is
    checked for finite numbers as well, by validate_run or the caller)."""
    if not isinstance(e, dict):
        raise OpmapError("a spool entry must be a JSON object")
    if not isinstance(e.get("id"), str) or not ID.fullmatch(e["id"]):
        raise _fail("id", "must be letters, digits, '.', '_' or '-' (at most 128)")
    for k in ("kind", "time_utc"):
        if not isinstance(e.get(k), str):
            raise _fail(k, "must be a string")
    if not isinstance(e.get("payload"), dict):
        raise _fail("payload", "must be an object")
    tags = e.get("tags")
    if not isinstance(tags, dict):
        raise _fail("tags", "must be an object")
    for k, v in tags.items():
        if k in INT_TAGS:
            _opt(tags, k, "int", "tags")
        elif v is not None and not isinstance(v, (str, int, float, bool, dict, list)):
            raise _fail(f"tags.{k}", "must be JSON")
    rows = e.get("rows") or {}
    if not isinstance(rows, dict):
        raise _fail("rows", "must be an object")
    for table, types in ROW_TYPES.items():
        rs = rows.get(table) or []
        if not isinstance(rs, list):
            raise _fail(f"rows.{table}", "must be a list")
        for i, r in enumerate(rs):
            if not isinstance(r, list) or len(r) != len(types):
                raise _fail(f"rows.{table}[{i}]", f"must be a list of {len(types)} values")
            for v, t in zip(r, types):
                if v is not None and not {"int": _is_int, "num": _is_num, "str": lambda x: isinstance(x, str)}[t](v):
                    raise _fail(f"rows.{table}[{i}]", f"{v!r:.40} is not {'a string' if t == 'str' else 'a number'}")
                if t == "int" and v is not None and not -2 ** 31 <= v < 2 ** 31:  # an INTEGER column
                    raise _fail(f"rows.{table}[{i}]", f"{v} does not fit a 32-bit integer")
                if t == "num" and _is_int(v) and abs(v) >= BIND_INT:
                    raise _fail(f"rows.{table}[{i}]", f"an integer of {v.bit_length()} bits is too large (at most 127)")
    for k, v in tags.items():
        if _is_int(v) and abs(v) >= BIND_INT:
            raise _fail(f"tags.{k}", f"an integer of {v.bit_length()} bits is too large (at most 127)")
    if not all(_is_int(tags.get(k)) and abs(tags[k]) < 2 ** 63 for k in INT_TAGS if tags.get(k) is not None):
        raise _fail("tags", "batch and seq must fit a 64-bit integer")
    try:  # the whole entry as the insert binds it: one C pass, walked for the field only when it fails
        json.dumps(e, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise _fail(_not_utf8(e, "run") or "run", NOT_UTF8) from None
    except (TypeError, ValueError, RecursionError) as err:
        raise _fail("run", f"is not JSON ({type(err).__name__})") from None


def _not_utf8(v: Any, where: str) -> str | None:
    """The first field of ``v`` (any JSON) holding a string or key that is not valid UTF-8, else None."""
    if isinstance(v, str):
        return None if _utf8(v) else where
    if isinstance(v, dict):
        for k, x in v.items():
            if isinstance(k, str) and not _utf8(k):
                return f"{where} key {k!r:.40}"
            if (found := _not_utf8(x, f"{where}.{k}")) is not None:
                return found
    if isinstance(v, list):
        for i, x in enumerate(v):
            if (found := _not_utf8(x, f"{where}[{i}]")) is not None:
                return found
    return None
