"""Numbers read from outside opmap (command-line options, hardware TOML, traces, plans, quality.json), checked
in one place: a bool, a string, NaN, an infinity or a value out of range is refused with one line naming the
field and the accepted range, such as ``--slo-ttft must be a number > 0 ms (got nan)``.

Also ``json_text``: every JSON opmap writes goes through it, so no output ever holds a bare ``NaN`` (which is
not JSON: strict parsers such as ``jq`` and browsers refuse it).

A leaf module: it imports only ``opmap.errors``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

from opmap.errors import OpmapError

# Seeds: numpy's and torch's generators both take 0 .. 2**32 - 1 everywhere (the legacy numpy API stops there).
SEED_MAX = 2**32 - 1
_FLOAT_MAX = 1.7976931348623157e308


def shown(value: Any) -> str:
    """A value as the message quotes it: JSON words for bools and None, repr for text, %g for floats."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        return format(value, "g")
    if isinstance(value, int):
        digits = str(value)
        return digits if len(digits) <= 24 else f"{digits[:12]}... ({len(digits.lstrip('-'))} digits)"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def visible(path: Any) -> str:
    """A file or folder name (or other text from outside) as a message or the terminal shows it: as it is where
    every character prints and none could be misread (no backslash, no leading quote), else quoted as Python's
    repr, each control character (ESC, a newline, a bidirectional override) shown as its escape (``\\x1b``): the
    name printed is the name written, and a terminal acts on nothing in it."""
    s = os.fspath(path) if isinstance(path, os.PathLike) else str(path)
    if isinstance(s, bytes):
        s = os.fsdecode(s)
    if s.isprintable() and "\\" not in s and not s.startswith(("'", '"')):
        return s
    return repr(s)


def _g(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else format(x, "g")


def accepted(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False,
             integer: bool = False, unit: str = "") -> str:
    """The accepted range in words: 'an integer >= 1', 'a number > 0 ms', 'a number from 0 to 1'."""
    what = "an integer" if integer else "a number"
    u = f" {unit}" if unit else ""
    if lo is not None and hi is not None:
        if not lo_open and not hi_open:
            return f"{what} from {_g(lo)} to {_g(hi)}{u}"
        return f"{what} {'>' if lo_open else '>='} {_g(lo)} and {'<' if hi_open else '<='} {_g(hi)}{u}"
    if lo is not None:
        return f"{what} {'>' if lo_open else '>='} {_g(lo)}{u}"
    if hi is not None:
        return f"{what} {'<' if hi_open else '<='} {_g(hi)}{u}"
    return f"{'an integer' if integer else 'a finite number'}{u}"


def finite_number(value: Any, field: str, *, lo: float | None = None, hi: float | None = None,
                  lo_open: bool = False, hi_open: bool = False, integer: bool = False, unit: str = "") -> Any:
    """``value`` as a float (an int with ``integer``), or OpmapError: 'FIELD must be RANGE (got X)'.

    Refused: bools (JSON ``true`` is not 1), strings (``"1"``), NaN, infinities, numbers outside [lo, hi] (open
    ends with ``lo_open`` / ``hi_open``) and, with ``integer``, numbers with a fraction (1.9; 2.0 is taken as 2).
    """
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and isinstance(value, float):
        ok = math.isfinite(value) and (not integer or value.is_integer())
    if ok:  # an int is compared as it is (exact, and 10**400 does not overflow a float on the way)
        ok = ((lo is None or (value > lo if lo_open else value >= lo))
              and (hi is None or (value < hi if hi_open else value <= hi)))
    if ok and not integer:
        ok = abs(value) <= _FLOAT_MAX  # an int past the largest float has no float value
    if not ok:
        rng = accepted(lo, hi, lo_open=lo_open, hi_open=hi_open, integer=integer, unit=unit)
        raise OpmapError(f"{field} must be {rng} (got {shown(value)})")
    return int(value) if integer else float(value)


def positive(value: Any, field: str, *, hi: float | None = None, unit: str = "") -> float:
    """A finite number > 0 (at most ``hi``)."""
    return finite_number(value, field, lo=0, lo_open=True, hi=hi, unit=unit)


def count(value: Any, field: str, *, lo: int = 1, hi: int | None = None) -> int:
    """An integer >= lo (1 by default), at most ``hi``."""
    return finite_number(value, field, lo=lo, hi=hi, integer=True)


def options(checks: Mapping[str, tuple[Any, dict[str, Any]]]) -> None:
    """Check command-line options in one call: ``{"--batch": (batch, dict(lo=1, integer=True)), ...}``; an
    option left at None (not given) is skipped."""
    for name, (value, rule) in checks.items():
        if value is not None:
            finite_number(value, name, **rule)


# Rules for ``options``. A size or count past 2**31 - 1 is a typo, not a workload (torch's shape arithmetic and
# the tiler's int32 grid both overflow beyond it).
INT_MAX = 2**31 - 1
INT_GE1 = {"lo": 1, "hi": INT_MAX, "integer": True}  # sizes and counts: batch, sequence, devices, iterations
INT_GE0 = {"lo": 0, "hi": INT_MAX, "integer": True}  # rows shown (0: all), warm-up iterations
SEED = {"lo": 0, "hi": SEED_MAX, "integer": True}
POSITIVE = {"lo": 0, "lo_open": True}


def positive_in(unit: str) -> dict[str, Any]:
    """The rule of a finite number > 0 in ``unit`` (ms, W, MB): for ``options``."""
    return {**POSITIVE, "unit": unit}


def _clean(x: Any, path: str, bad: dict[str, str]) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        bad[path or "$"] = format(x, "g")
        return None
    if isinstance(x, Mapping):
        return {k: _clean(v, f"{path}.{k}" if path else str(k), bad) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v, f"{path}[{i}]", bad) for i, v in enumerate(x)]
    return x


def json_text(obj: Any, **dumps_kw: Any) -> str:
    """``json.dumps(obj, allow_nan=False, **dumps_kw)`` that never fails on a non-finite float: each one is
    written as null, and a top-level object gains ``non_finite``: {path: "nan" | "inf" | "-inf"} saying which
    (so a null is never silent). Other types ``json.dumps`` refuses are still refused (TypeError)."""
    bad: dict[str, str] = {}
    clean = _clean(obj, "", bad)
    if bad and isinstance(clean, dict):
        clean["non_finite"] = {**bad}
    return json.dumps(clean, allow_nan=False, **dumps_kw)
