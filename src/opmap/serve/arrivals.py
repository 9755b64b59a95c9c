"""Arrival processes and request-length distributions, parsed from one-line specs and drawn from a seeded
numpy Generator.

Arrivals: ``poisson:RATE`` (exponential gaps, RATE requests/s), ``gamma:RATE,CV`` (gamma gaps with mean 1/RATE
and coefficient of variation CV; CV=1 is Poisson, CV>1 burstier), ``offline`` (every request at t=0, the MLPerf
Offline scenario), ``trace:FILE``.

Lengths (tokens): ``N``, ``uniform:A,B`` (integers A..B inclusive), ``normal:MEAN,STD`` (rounded, clipped to
1..MAX_TOKENS), ``lognormal:MEDIAN,SIGMA`` (exp of a normal with mean ln MEDIAN and std SIGMA, rounded, clipped
the same), ``trace`` (the lengths in the trace file; needs ``trace:FILE`` arrivals). ``normal`` and ``lognormal``
take an optional third number, MAX: no length above it (a data set's prompt limit, a max_tokens cap), drawn
again until under it (a truncated distribution, as a set that drops its longer samples).

Trace file format: UTF-8 JSON Lines, one object per request with ``arrival_s`` and optionally ``input_len`` and
``output_len`` (JSON numbers), or CSV with a header row naming the same columns. Arrival times are seconds from
the start of the run, from 0 to MAX_ARRIVAL_S (one year); lengths are integers from 1 to MAX_TOKENS; rows need
not be sorted (they are sorted on load). Lines starting with ``#`` and blank lines are skipped. JSONL rows in
Mooncake's format (``timestamp`` in ms, ``input_length``, ``output_length``, ``hash_ids``: opmap.serve.mooncake)
are read as such: their prompts' shared blocks come with them (``Requests.prompt``; lengths ``trace``).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from opmap.errors import OpmapError
from opmap.safeio import LIMIT_TRACE_BYTES, read_bounded
from opmap.serve.mooncake import is_mooncake, mooncake_columns, mooncake_prompts
from opmap.serve.prefix import Prompts
from opmap.validate import Rule, count, positive_in, shown

ARRIVALS_ACCEPTED = "poisson:RATE, gamma:RATE,CV, offline, trace:FILE"
LENGTHS_ACCEPTED = "N, uniform:A,B, normal:MEAN,STD[,MAX], lognormal:MEDIAN,SIGMA[,MAX], trace"
TRACE_ACCEPTED = "expected JSONL or CSV (UTF-8, a header row) of arrival_s,input_len,output_len"
# The latest arrival time accepted (s): one year. Production traces span days to months (BurstGPT: 121 days,
# 1.05e7 s); past ~1e9 s the float64 spacing of a time (t x 2.2e-16) exceeds the microseconds a token latency
# is measured in, and at 1e30 s every latency rounds to 0 s.
MAX_ARRIVAL_S = 365 * 86400.0
# The longest prompt or output accepted (tokens): 10M, the longest context window published (Llama 4 Scout);
# beyond it a length is a typo, and past 2**63 it no longer fits the int64 the simulator counts tokens in.
MAX_TOKENS = 10_000_000
# A gamma process's coefficient of variation: below 1e-3 the gaps are constant to 6 digits (the shape 1/CV^2
# passes 1e6), above 1e3 nearly every request arrives at once; outside, the gamma draw under- or overflows.
CV_RANGE = (1e-3, 1e3)
# The most requests one run simulates: 10M (a day of a busy endpoint at ~100 requests/s is 8.6M; the simulator
# does 100k in ~0.5 s, so 10M in about a minute). Past it the arrays alone outgrow memory (2e9 requests: 16 GB
# per column).
MAX_REQUESTS = 10_000_000
ARRIVAL_RULE = Rule(lo=0, hi=MAX_ARRIVAL_S, unit="s (one year at most)")
LENGTH_RULE = Rule(lo=1, hi=MAX_TOKENS, integer=True)


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
    cap: int | None = None  # normal / lognormal: the longest length drawn (truncated there)

    def spec(self) -> str:
        cap = f",{self.cap}" if self.cap is not None else ""
        return {"fixed": f"{int(self.a)}", "uniform": f"uniform:{int(self.a)},{int(self.b)}",
                "normal": f"normal:{self.a:g},{self.b:g}{cap}", "lognormal": f"lognormal:{self.a:g},{self.b:g}{cap}",
                "trace": "trace"}[self.kind]

    def longest(self) -> int | None:
        """The longest length this distribution draws: N, B, or a normal / lognormal's cap; None where no bound is
        known before drawing (an uncapped normal / lognormal, a trace)."""
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return int(self.b)
        return self.cap


@dataclass(frozen=True)
class Requests:
    """The workload: per-request arrival time (s, sorted), prompt and output lengths (tokens, >= 1); ``prompt``:
    what each prompt holds where prompts share prefixes (None: every prompt its own; opmap.serve.prefix)."""

    arrival_s: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    arrival: str = ""
    prompt: Prompts | None = None

    def __len__(self) -> int:
        return len(self.arrival_s)


def _floats(spec: str, body: str, n: int, what: str) -> list[float]:
    parts = body.split(",")
    try:
        vals = [float(p) for p in parts]
    except ValueError:
        vals = []
    if len(vals) != n:
        accepted = ARRIVALS_ACCEPTED if what == "arrival" else LENGTHS_ACCEPTED
        raise OpmapError(f"bad {what} {spec!r}: accepted: {accepted}")
    return vals


def _spec_number(value: float, field: str, accepted: str, rule: Rule) -> float:
    """``finite_number`` for a number inside a one-line spec: its message ends with the accepted forms."""
    try:
        return rule.check(value, field)
    except OpmapError as e:
        raise OpmapError(f"{e}; accepted: {accepted}") from None


def parse_arrival(spec: str) -> Arrival:
    """``poisson:RATE``, ``gamma:RATE,CV``, ``offline`` or ``trace:FILE``; RATE a finite number > 0 (requests/s),
    CV within CV_RANGE."""
    s = spec.strip()
    kind, _, body = s.partition(":")
    if kind == "offline" and not body:
        return Arrival("offline")
    if kind == "trace" and body:
        return Arrival("trace", path=body)
    rate_rule = positive_in("requests/s")  # at most the plausibility ceiling (opmap.validate.CEILINGS)
    if kind == "poisson":
        (rate,) = _floats(spec, body, 1, "arrival")
        return Arrival("poisson", _spec_number(rate, f"arrival {spec!r}: RATE", ARRIVALS_ACCEPTED, rate_rule))
    if kind == "gamma":
        rate, cv = _floats(spec, body, 2, "arrival")
        return Arrival("gamma", _spec_number(rate, f"arrival {spec!r}: RATE", ARRIVALS_ACCEPTED, rate_rule),
                       _spec_number(cv, f"arrival {spec!r}: CV", ARRIVALS_ACCEPTED,
                                   Rule(lo=CV_RANGE[0], hi=CV_RANGE[1])))
    raise OpmapError(f"bad arrival {spec!r}: accepted: {ARRIVALS_ACCEPTED}")


def parse_length(spec: str | int) -> Length:
    """``N``, ``uniform:A,B``, ``normal:MEAN,STD``, ``lognormal:MEDIAN,SIGMA`` or ``trace`` (tokens): N, A, B,
    MEAN and MEDIAN from 1 to MAX_TOKENS (A, B integers, A <= B), STD and SIGMA finite and >= 0."""
    s = str(spec).strip()
    if s.isdigit():
        return Length("fixed", _spec_number(int(s), f"length {s}", LENGTHS_ACCEPTED, LENGTH_RULE))
    kind, _, body = s.partition(":")
    if kind == "trace" and not body:
        return Length("trace")
    if kind in ("uniform", "normal", "lognormal") and body:
        capped = kind != "uniform" and body.count(",") == 2
        vals = _floats(spec, body, 3 if capped else 2, "length")
        a, b = vals[0], vals[1]
        names = {"uniform": ("A", "B"), "normal": ("MEAN", "STD"), "lognormal": ("MEDIAN", "SIGMA")}[kind]
        a = _spec_number(a, f"length {spec!r}: {names[0]}", LENGTHS_ACCEPTED,
                         Rule(lo=1, hi=MAX_TOKENS, integer=kind == "uniform"))
        b_rule = Rule(lo=a, hi=MAX_TOKENS, integer=True) if kind == "uniform" else Rule(lo=0)
        b = _spec_number(b, f"length {spec!r}: {names[1]}", LENGTHS_ACCEPTED, b_rule)
        cap = None
        if capped:  # at least the median / mean: a cap below it would redraw most draws
            cap = int(_spec_number(vals[2], f"length {spec!r}: MAX", LENGTHS_ACCEPTED,
                                   Rule(lo=max(1.0, a), hi=MAX_TOKENS, integer=True)))
        return Length(kind, a, b, cap)
    raise OpmapError(f"bad length {spec!r} (tokens must be >= 1): accepted: {LENGTHS_ACCEPTED}")


def _decode(data: str | bytes, origin: str) -> str:
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise OpmapError(f"trace file {origin} is not UTF-8 text (byte {e.start}): {TRACE_ACCEPTED}") from None


def _rows(lines: list[str], origin: str) -> tuple[list[dict], bool]:
    """The rows of a trace's non-comment lines, and whether they are CSV (text cells): JSON objects (JSONL) or
    CSV records under a header row."""
    if not lines[0].lstrip().startswith("{"):
        header = next(csv.reader([lines[0]]))
        if "arrival_s" not in [h.strip() for h in header]:
            raise OpmapError(f"trace file {origin}: no arrival_s column in the header row {lines[0][:60]!r}: "
                             f"{TRACE_ACCEPTED}")
        return [{k.strip(): v for k, v in r.items() if k is not None} for r in csv.DictReader(lines)], True
    rows = []
    for i, ln in enumerate(lines):
        try:
            r = json.loads(ln)
        except (ValueError, RecursionError) as e:
            raise OpmapError(f"trace file {origin}: row {i + 1} is not JSON ({str(e)[:80]}): "
                             f"{TRACE_ACCEPTED}") from None
        if not isinstance(r, dict):
            raise OpmapError(f"trace file {origin}: row {i + 1} is not a JSON object (got {shown(r)}): "
                             f"{TRACE_ACCEPTED}")
        rows.append(r)
    return rows, False


def _cell(v, field: str, rule: Rule, text: bool):
    """One trace value checked by ``rule``: a JSON value as it is (a string is refused), a CSV cell read as a
    number first."""
    if text and isinstance(v, str):
        try:
            v = float(v.strip())
        except ValueError:
            pass  # finite_number refuses the text, quoting it
    return rule.check(v, field)


def parse_trace(data: str | bytes, origin: str = "<trace>") -> dict[str, np.ndarray]:
    """Columns of a trace (JSONL or CSV text, see the module docstring), sorted by arrival_s: arrival_s (s,
    float64) and, where every row has them, input_len / output_len (tokens, int64). Reads nothing and writes
    nothing; OpmapError (one line naming the row and the field) on bad input: not UTF-8 text, no rows, a row
    without arrival_s, an arrival time that is not a number from 0 to MAX_ARRIVAL_S, a length that is not an
    integer from 1 to MAX_TOKENS, a length column some rows have and others do not."""
    text = _decode(data, origin)
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise OpmapError(f"trace file {origin} holds no requests (empty, or only comments): {TRACE_ACCEPTED}")
    rows, text_cells = _rows(lines, origin)
    if not rows:
        raise OpmapError(f"trace file {origin} holds a header row and no requests: {TRACE_ACCEPTED}")
    if not text_cells and is_mooncake(rows[0]):
        return mooncake_columns(rows, origin, ARRIVAL_RULE, LENGTH_RULE)
    cols: dict[str, list] = {"arrival_s": [], "input_len": [], "output_len": []}
    for i, r in enumerate(rows):
        for k, rule in (("arrival_s", ARRIVAL_RULE), ("input_len", LENGTH_RULE), ("output_len", LENGTH_RULE)):
            v = r.get(k)
            if v is None or v == "":
                if k == "arrival_s":
                    raise OpmapError(f"trace file {origin}: row {i + 1} has no arrival_s: {TRACE_ACCEPTED}")
                continue
            cols[k].append(_cell(v, f"trace file {origin}: row {i + 1}: {k}", rule, text_cells))
    n = len(rows)
    order = np.argsort(np.asarray(cols["arrival_s"], dtype=np.float64), kind="stable")
    out = {"arrival_s": np.asarray(cols["arrival_s"], dtype=np.float64)[order]}
    for k in ("input_len", "output_len"):
        if len(cols[k]) == n:
            out[k] = np.asarray(cols[k], dtype=np.int64)[order]
        elif cols[k]:
            raise OpmapError(f"trace file {origin}: {k} is given on {len(cols[k])} of {n} rows: give it on every "
                             "row or on none")
    return out


def read_trace(path: str | Path) -> dict[str, np.ndarray]:
    """Columns of a trace file (JSONL or CSV, see the module docstring; ``parse_trace``), sorted by arrival_s. The
    path is the user's (their own link is followed); what it names must be a regular file of at most
    LIMIT_TRACE_BYTES (opmap.safeio): a folder, a device or a FIFO is named as such, with what is accepted."""
    p = Path(path)
    try:
        data = read_bounded(p, LIMIT_TRACE_BYTES, "trace file", follow_links=True)
    except OpmapError as e:
        raise OpmapError(f"{e}; accepted: {TRACE_ACCEPTED.removeprefix('expected ')}") from None
    return parse_trace(data, repr(str(p)))


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
    if length.kind not in ("normal", "lognormal"):
        raise OpmapError("length 'trace' needs trace:FILE arrivals whose file has the length columns")

    def draw(k: int) -> np.ndarray:
        x = (rng.normal(length.a, length.b, k) if length.kind == "normal"
             else rng.lognormal(math.log(length.a), length.b, k))
        return np.clip(np.rint(x), 1, MAX_TOKENS).astype(np.int64)

    out = draw(n)
    if length.cap is not None:  # truncated: the draws over the cap drawn again (the cap is at least the median)
        over = out > length.cap
        while over.any():
            out[over] = draw(int(over.sum()))
            over = out > length.cap
    return out


def make_requests(arrival: Arrival | str, input_len: Length | str | int, output_len: Length | str | int,
                  n: int | None = None, seed: int = 0, max_span_s: float | None = MAX_ARRIVAL_S) -> Requests:
    """Draw the workload. ``n`` requests (with a trace: at most n rows of it, all when None). One
    ``np.random.default_rng(seed)`` draws arrivals, then input lengths, then output lengths, so a seed fixes all.
    Drawn arrivals later than ``max_span_s`` are refused (a rate too low for n); a capacity search, which moves
    the rate itself, passes None."""
    arrival = parse_arrival(arrival) if isinstance(arrival, str) else arrival
    ilen = input_len if isinstance(input_len, Length) else parse_length(input_len)
    olen = output_len if isinstance(output_len, Length) else parse_length(output_len)
    rng = np.random.default_rng(seed)
    trace = None
    if n is not None or arrival.kind != "trace":
        count(n, "--requests", hi=MAX_REQUESTS)
    if arrival.kind == "trace":
        trace = read_trace(arrival.path or "")
        m = len(trace["arrival_s"]) if n is None else min(n, len(trace["arrival_s"]))
        t = trace["arrival_s"][:m]
    else:
        m, t = n, arrival_times(arrival, n, rng)
        if max_span_s is not None and t[-1] > max_span_s:
            raise OpmapError(f"{n} requests at {arrival.spec()} arrive over {t[-1]:.3g} s; arrival times must stay "
                             f"within {max_span_s:.0f} s (one year): raise RATE or lower --requests")
    lens = []
    for name, ln in (("input_len", ilen), ("output_len", olen)):
        if ln.kind == "trace":
            if trace is None or name not in trace:
                raise OpmapError(f"length 'trace' for {name} needs trace:FILE arrivals whose file has a {name} column")
            lens.append(np.maximum(trace[name][:m], 1))
        else:
            lens.append(draw_lengths(ln, m, rng))
    prompt = None
    if trace is not None and "hash_ids" in trace:  # a Mooncake trace: its prompts' blocks are its lengths'
        if ilen.kind != "trace":
            raise OpmapError(f"trace file {arrival.path!r} is a Mooncake trace: its hash_ids give each prompt's "
                             "blocks, so its prompt lengths are the trace's: use --input-len trace")
        prompt = mooncake_prompts(trace["hash_ids"][:m], lens[0])
    return Requests(t, lens[0], lens[1], arrival.spec(), prompt)
