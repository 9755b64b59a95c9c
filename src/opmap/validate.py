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
from dataclasses import dataclass, replace
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


@dataclass(frozen=True)
class Rule:
    """What a number read from outside must be: finite, within [lo, hi] (open ends with ``lo_open`` /
    ``hi_open``), an integer with ``integer``; ``unit`` is named in the refusal. ``check`` applies it."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    integer: bool = False
    unit: str = ""

    def check(self, value: Any, field: str) -> Any:
        """``value`` as a float (an int with ``integer``), or OpmapError naming ``field`` (``finite_number``)."""
        return finite_number(value, field, lo=self.lo, hi=self.hi, lo_open=self.lo_open, hi_open=self.hi_open,
                             integer=self.integer, unit=self.unit)

    def but(self, **changes: Any) -> Rule:
        """This rule with some bounds changed: ``INT_GE1.but(hi=65535)``."""
        return replace(self, **changes)


def positive(value: Any, field: str, *, hi: float | None = None, unit: str = "") -> float:
    """A finite number > 0, at most ``hi`` (by default the unit's plausibility ceiling, ``CEILINGS``)."""
    rule = positive_in(unit)
    return (rule.but(hi=hi) if hi is not None else rule).check(value, field)


def count(value: Any, field: str, *, lo: int = 1, hi: int | None = None) -> int:
    """An integer >= lo (1 by default), at most ``hi``."""
    return finite_number(value, field, lo=lo, hi=hi, integer=True)


def options(checks: Mapping[str, tuple[Any, Rule]]) -> None:
    """Check command-line options in one call: ``{"--batch": (batch, INT_GE1), ...}``; an option left at None
    (not given) is skipped."""
    for name, (value, rule) in checks.items():
        if value is not None:
            rule.check(value, name)


# Rules for ``options``. A size or count past 2**31 - 1 is a typo, not a workload (torch's shape arithmetic and
# the tiler's int32 grid both overflow beyond it).
INT_MAX = 2**31 - 1
INT_GE1 = Rule(lo=1, hi=INT_MAX, integer=True)  # sizes and counts: batch, sequence, devices, iterations
INT_GE0 = Rule(lo=0, hi=INT_MAX, integer=True)  # rows shown (0: all), warm-up iterations
SEED = Rule(lo=0, hi=SEED_MAX, integer=True)
POSITIVE = Rule(lo=0, lo_open=True)


# Plausibility ceilings, by unit. A finite number far past anything real is a typo or a unit slip (1e308 for 1e3),
# and carried through the arithmetic it gives figures without a word (``--service-time fixed:1e308``: a p99 TTFT of
# inf). Each ceiling sits far above the largest real value of its kind, named beside it; a refusal quotes it:
# "--slo-ttft must be a number > 0 and <= 86400000 ms (one day at most) (got 1e+308)".
CEILINGS: dict[str, tuple[float, str]] = {
    # latency limits (SLOs), service times, batching waits: serving targets are milliseconds to seconds (MLPerf
    # llama2-70b: TTFT 2 s, TPOT 200 ms); no request waits a day. MAX_REQUESTS such requests in a row stay finite
    "ms": (86_400_000.0, "one day"),
    # a bench run's length, one request's time limit: soak tests run hours to days
    "s": (7 * 86_400.0, "one week"),
    # offered load: a million requests a second is past any one endpoint (a day of it is 8.6e10 requests);
    # beyond it the gaps between arrivals fall under the float spacing of the times they are added to
    "requests/s": (1e6, ""),
    # a deployment's power draw: the largest AI campuses announced are about a gigawatt (one fit cell is a node)
    "W": (1e9, "a gigawatt"),
    # a device-hour: cloud GPUs rent at about 1 to 12 USD an hour (H100, B200 on-demand, 2025)
    "USD per hour": (1e4, ""),
    # an HTML report's size limit: a page of a terabyte opens in no browser
    "MB": (1e6, "a terabyte"),
}


def plausible(unit: str, *, lo: float = 0, lo_open: bool = False) -> Rule:
    """The rule of a finite number from ``lo`` to ``unit``'s plausibility ceiling (``CEILINGS``; no ceiling for a
    unit not listed there): for ``options`` and ``Rule.check``."""
    if unit not in CEILINGS:
        return Rule(lo=lo, lo_open=lo_open, unit=unit)
    hi, why = CEILINGS[unit]
    return Rule(lo=lo, hi=hi, lo_open=lo_open, unit=f"{unit} ({why} at most)" if why else unit)


def positive_in(unit: str) -> Rule:
    """The rule of a finite number > 0 in ``unit`` (ms, W, MB), at most its plausibility ceiling: for ``options``."""
    return plausible(unit, lo_open=True)


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
