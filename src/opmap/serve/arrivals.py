"""Arrival processes and request-length distributions, parsed from one-line specs and drawn from a seeded
numpy Generator.

Arrivals: ``poisson:RATE`` (exponential gaps, RATE requests/s), ``gamma:RATE,CV`` (gamma gaps with mean 1/RATE
and coefficient of variation CV; CV=1 is Poisson, CV>1 burstier), ``offline`` (every request at t=0, the MLPerf
Offline scenario), ``trace:FILE``.

Lengths (tokens): ``N``, ``uniform:A,B`` (integers A..B inclusive), ``normal:MEAN,STD`` (rounded, clipped to
>= 1), ``lognormal:MEDIAN,SIGMA`` (exp of a normal with mean ln MEDIAN and std SIGMA, rounded, >= 1),
``trace`` (the lengths in the trace file; needs ``trace:FILE`` arrivals).

Trace file format: JSON Lines, one object per request with ``arrival_s`` and optionally ``input_len`` and
``output_len``, or CSV with a header row naming the same columns. Arrival times are seconds from the start of
the run; rows need not be sorted (they are sorted on load). Lines starting with ``#`` and blank lines are skipped.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from opmap.errors import OpmapError

ARRIVALS_ACCEPTED = "poisson:RATE, gamma:RATE,CV, offline, trace:FILE"
LENGTHS_ACCEPTED = "N, uniform:A,B, normal:MEAN,STD, lognormal:MEDIAN,SIGMA, trace"


@dataclass(frozen=True)
class Arrival:
    """An arrival process. ``kind`` is poisson | gamma | offline | trace; rate in requests/s."""

    kind: str
    rate_per_s: float | None = None
    cv: float | None = None
    path: str | None = None

    def spec(self) -> str:
        if self.kind == "poisson":
            return f"poisson:{self.rate_per_s:g}"
        if self.kind == "gamma":
            return f"gamma:{self.rate_per_s:g},{self.cv:g}"
        if self.kind == "trace":
            return f"trace:{self.path}"
        return "offline"

    def with_rate(self, rate_per_s: float) -> Arrival:
        """The same process at another rate (poisson and gamma only; used by find_capacity)."""
        if self.kind not in ("poisson", "gamma"):
            raise OpmapError(f"arrival {self.spec()!r} has no rate to change: use poisson:RATE or gamma:RATE,CV")
        return Arrival(self.kind, rate_per_s, self.cv, self.path)


@dataclass(frozen=True)
class Length:
    """A token-length distribution. ``kind`` is fixed | uniform | normal | lognormal | trace."""

    kind: str
    a: float = 0.0
    b: float = 0.0

    def spec(self) -> str:
        return {"fixed": f"{int(self.a)}", "uniform": f"uniform:{int(self.a)},{int(self.b)}",
                "normal": f"normal:{self.a:g},{self.b:g}", "lognormal": f"lognormal:{self.a:g},{self.b:g}",
                "trace": "trace"}[self.kind]


@dataclass(frozen=True)
class Requests:
    """The workload: per-request arrival time (s, sorted), prompt and output lengths (tokens, >= 1)."""

    arrival_s: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    arrival: str = ""

    def __len__(self) -> int:
        return len(self.arrival_s)


def _floats(spec: str, body: str, n: int, what: str) -> list[float]:
    parts = body.split(",")
    try:
        vals = [float(p) for p in parts]
    except ValueError:
        vals = []
    if len(vals) != n or not all(math.isfinite(v) for v in vals):
        accepted = ARRIVALS_ACCEPTED if what == "arrival" else LENGTHS_ACCEPTED
        raise OpmapError(f"bad {what} {spec!r}: accepted: {accepted}")
    return vals


def parse_arrival(spec: str) -> Arrival:
    s = spec.strip()
    kind, _, body = s.partition(":")
    if kind == "offline" and not body:
        return Arrival("offline")
    if kind == "trace" and body:
        return Arrival("trace", path=body)
    if kind == "poisson":
        (rate,) = _floats(spec, body, 1, "arrival")
        if rate > 0:
            return Arrival("poisson", rate)
    elif kind == "gamma":
        rate, cv = _floats(spec, body, 2, "arrival")
        if rate > 0 and cv > 0:
            return Arrival("gamma", rate, cv)
    raise OpmapError(f"bad arrival {spec!r} (rates and CV must be > 0): accepted: {ARRIVALS_ACCEPTED}")


def parse_length(spec: str | int) -> Length:
    s = str(spec).strip()
    if s.isdigit() and int(s) >= 1:
        return Length("fixed", int(s))
    kind, _, body = s.partition(":")
    if kind == "trace" and not body:
        return Length("trace")
    if kind in ("uniform", "normal", "lognormal") and body:
        a, b = _floats(spec, body, 2, "length")
        ok = {"uniform": 1 <= a <= b and a == int(a) and b == int(b), "normal": a >= 1 and b >= 0,
              "lognormal": a >= 1 and b >= 0}[kind]
        if ok:
            return Length(kind, a, b)
    raise OpmapError(f"bad length {spec!r} (tokens must be >= 1): accepted: {LENGTHS_ACCEPTED}")


def read_trace(path: str | Path) -> dict[str, np.ndarray]:
    """Columns of a trace file (JSONL or CSV, see the module docstring), sorted by arrival_s."""
    p = Path(path)
    if not p.is_file():
        raise OpmapError(f"trace file {str(p)!r} not found: expected JSONL or CSV of arrival_s,input_len,output_len")
    text = p.read_text()
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    try:
        if lines and lines[0].lstrip().startswith("{"):
            rows = [json.loads(ln) for ln in lines]
        else:
            rows = list(csv.DictReader(lines))
        cols: dict[str, list[float]] = {"arrival_s": [], "input_len": [], "output_len": []}
        for r in rows:
            for k in cols:
                if k in r and r[k] not in (None, ""):
                    cols[k].append(float(r[k]))
    except (ValueError, json.JSONDecodeError) as e:
        raise OpmapError(f"trace file {str(p)!r} unreadable ({e}): expected JSONL or CSV with a header row of "
                         "arrival_s,input_len,output_len") from None
    n = len(rows)
    if n == 0 or len(cols["arrival_s"]) != n:
        raise OpmapError(f"trace file {str(p)!r}: every row needs arrival_s (JSONL or CSV of "
                         "arrival_s,input_len,output_len)")
    order = np.argsort(np.asarray(cols["arrival_s"]), kind="stable")
    out = {"arrival_s": np.asarray(cols["arrival_s"], dtype=np.float64)[order]}
    for k in ("input_len", "output_len"):
        if len(cols[k]) == n:
            out[k] = np.asarray(cols[k], dtype=np.int64)[order]
    return out


def arrival_times(arrival: Arrival, n: int, rng: np.random.Generator) -> np.ndarray:
    """n arrival times (s, sorted) of a poisson / gamma / offline process; the first arrival comes one gap in."""
    if arrival.kind == "offline":
        return np.zeros(n)
    if arrival.kind == "poisson":
        gaps = rng.exponential(1.0 / arrival.rate_per_s, n)
    elif arrival.kind == "gamma":
        shape = 1.0 / (arrival.cv * arrival.cv)  # CV of a gamma = 1/sqrt(shape); mean = shape * scale
        gaps = rng.gamma(shape, 1.0 / (arrival.rate_per_s * shape), n)
    else:
        raise OpmapError(f"arrival {arrival.spec()!r} is read from its file, not drawn")
    return np.cumsum(gaps)


def draw_lengths(length: Length, n: int, rng: np.random.Generator) -> np.ndarray:
    if length.kind == "fixed":
        return np.full(n, int(length.a), dtype=np.int64)
    if length.kind == "uniform":
        return rng.integers(int(length.a), int(length.b) + 1, n, dtype=np.int64)
    if length.kind == "normal":
        x = rng.normal(length.a, length.b, n)
    elif length.kind == "lognormal":
        x = rng.lognormal(math.log(length.a), length.b, n)
    else:
        raise OpmapError("length 'trace' needs trace:FILE arrivals whose file has the length columns")
    return np.maximum(np.rint(x), 1).astype(np.int64)


def make_requests(arrival: Arrival | str, input_len: Length | str | int, output_len: Length | str | int,
                  n: int | None = None, seed: int = 0) -> Requests:
    """Draw the workload. ``n`` requests (with a trace: at most n rows of it, all when None). One
    ``np.random.default_rng(seed)`` draws arrivals, then input lengths, then output lengths, so a seed fixes all."""
    arrival = parse_arrival(arrival) if isinstance(arrival, str) else arrival
    ilen = input_len if isinstance(input_len, Length) else parse_length(input_len)
    olen = output_len if isinstance(output_len, Length) else parse_length(output_len)
    rng = np.random.default_rng(seed)
    trace = None
    if arrival.kind == "trace":
        trace = read_trace(arrival.path or "")
        m = len(trace["arrival_s"]) if n is None else min(n, len(trace["arrival_s"]))
        t = trace["arrival_s"][:m]
    else:
        if n is None or n < 1:
            raise OpmapError(f"--requests must be >= 1 (got {n})")
        m, t = n, arrival_times(arrival, n, rng)
    lens = []
    for name, ln in (("input_len", ilen), ("output_len", olen)):
        if ln.kind == "trace":
            if trace is None or name not in trace:
                raise OpmapError(f"length 'trace' for {name} needs trace:FILE arrivals whose file has a {name} column")
            lens.append(np.maximum(trace[name][:m], 1))
        else:
            lens.append(draw_lengths(ln, m, rng))
    return Requests(t, lens[0], lens[1], arrival.spec())
