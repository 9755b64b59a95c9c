"""The capacity search over arrival rates (``find_capacity``): a geometric grid of rates probed at once, shifted by
its width while all valid / all invalid, then rounds of evenly spaced probes inside the valid / invalid bracket,
to a relative tolerance; the probes depend only on the starting rate, so every engine (inline, process pool, Ray)
gives the same answer. What a probe runs (a steady-state run at a rate) is ``opmap.serve.capacity.RateProbe``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from opmap.errors import Interrupted, OpmapError

GRID_EXPONENTS = tuple(range(-3, 5))  # the first grid: rate0 x 2^-3 .. rate0 x 2^4, eight rates probed at once
GRID_SHIFTS = 3  # the grid moves by its own width at most this often up (all valid) or down (all invalid)
PROBES = 4  # evenly spaced rates per refinement round: the bracket shrinks 5x a round
DESCENT = 2  # under a ceiling, rates probed together on the way down (an engine's two workers kept busy)


class Verdict(Protocol):
    valid: bool
    reason: str


class Probed(Protocol):
    """What a probe's run reports (a ServeReport from RateProbe): its verdict, and its steady state (``alone``:
    every request served alone, RateProbe._alone), None where it has none."""

    @property
    def validity(self) -> Verdict: ...

    @property
    def steady_state(self) -> Any: ...


@dataclass(frozen=True)
class ProbeRun:
    """One rate probed: its verdict and why."""

    rate_per_s: float
    valid: bool
    reason: str


@dataclass(frozen=True)
class CapacitySearch:
    """``find_capacity``'s answer: ``rate_per_s`` the highest valid rate found (0.0: none), the valid / invalid
    ``bracket`` around the edge (None: that side not found), whether it ``converged`` to ``rel_tol``, what
    ``limited_by`` it ("slo", "ceiling", "search range", "interrupted", "floor"), every run recorded, and the
    ``summary`` of the run at ``rate_per_s`` (None where none was valid)."""

    rate_per_s: float
    bracket: tuple[float | None, float | None]
    converged: bool
    rel_tol: float
    limited_by: str
    runs: tuple[ProbeRun, ...]
    summary: Any = None  # a Probed (the run function's value): a ServeReport from RateProbe


Run = Callable[[float], Probed]
MapFn = Callable[[Run, list[float]], list[Probed]]


def _inline(fn: Run, rates: list[float]) -> list[Probed]:
    return [fn(r) for r in rates]


def find_capacity(run: Run, rate0: float, rel_tol: float = 0.01, max_runs: int = 64, map_fn: MapFn | None = None,
                  ceiling: float | None = None, skip_alone: bool = True,
                  floor: float | None = None) -> CapacitySearch:
    """The highest arrival rate (requests/s) whose ``run(rate)`` summary is VALID.

    The probes are fixed by ``rate0`` alone, never by which probe finished first, so that any ``map_fn``
    (``map_fn(run, rates) -> [run(r) for r in rates]``, in order: inline by default, or a process pool / Ray
    engine's map) gives the same answer. First a geometric grid, rate0 x 2^k for k in ``GRID_EXPONENTS``,
    probed together; all valid, the grid moves up by its width, all invalid, down (``GRID_SHIFTS`` times at
    most). The bracket is the last valid grid rate below the first invalid one. Then rounds of ``PROBES``
    evenly spaced rates inside the bracket, probed together, each round keeping the last valid probe below the
    first invalid one, until the bracket is within ``rel_tol`` of its low end. Each run uses the same seed
    (common random numbers), so validity is near-monotone in the rate; where it is not, the lowest invalid
    probe of a round decides.

    ``ceiling`` (requests/s, the saturation rate of ``steady_capacity``): no probe above it. The grid is then
    ceiling x 2^k for k = 0, -1, -2, ..., probed from the top down (the ceiling alone, then ``DESCENT`` rates
    at a time) and only until a valid rate is found: the ceiling valid, it is the answer (``limited_by``
    "ceiling"); else the bracket is the first valid rate below it and the invalid one above. Validity falls
    with the rate (near-monotone, above), so this is the bracket the whole grid gives, without running its low
    rates, which cost the most to simulate (a batch of one runs a step per token: ceiling / 128 took most of a
    fit cell's time). ``skip_alone``: a descent probe that is invalid with every request served alone (its summary's
    ``steady_state.alone``, RateProbe) ends the descent: every lower rate serves them alone too, alike, and is
    recorded with the same verdict, unrun. The summary of the run at the answer is returned as ``summary``.

    ``floor`` (requests/s): a rate the caller has no use for an answer under (a layout search's runner-up, in this
    layout's requests/s): once a rate under it is invalid, the answer lies below it and the search stops
    there (``limited_by`` "floor", ``rate_per_s`` the best valid rate so far or 0) instead of descending to it."""
    if ceiling is not None:
        if not ceiling > 0:
            raise OpmapError(f"the capacity search needs a ceiling > 0 requests/s, got {ceiling!r}")
        rate0 = ceiling
    if not rate0 > 0:
        raise OpmapError("--find-capacity needs a starting rate > 0 (poisson:RATE or gamma:RATE,CV)")
    map_fn = map_fn or _inline
    tried: list[ProbeRun] = []
    kept: dict[float, Probed] = {}  # the valid runs' summaries, by rate: the answer's is returned
    alone: dict[float, str] = {}  # invalid runs whose requests were each served alone (RateProbe._alone): reasons

    def note(rates: list[float], out: dict[int, Probed]) -> None:
        for i, r in enumerate(rates):
            if i in out:
                v = out[i].validity
                tried.append(ProbeRun(r, v.valid, v.reason))
                steady = out[i].steady_state
                if skip_alone and not v.valid and steady is not None and steady.alone:
                    alone[r] = v.reason
                if v.valid:
                    kept[r] = out[i]

    def probe(rates: list[float]) -> list[bool]:
        try:
            out = map_fn(run, rates)
        except KeyboardInterrupt as e:  # the probes of this round that finished count too
            note(rates, getattr(e, "done", {}))
            raise
        note(rates, dict(enumerate(out)))
        return [s.validity.valid for s in out]

    try:
        return _search(probe, rate0, rel_tol, max_runs, ceiling, tried, kept, parallel=map_fn is not _inline,
                       alone=alone, floor=floor)
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM: the runs so far, and the best rate they found, kept
        stop = Interrupted.of(e)
        if tried:
            lo, hi = _bracket(tried)
            stop.partial = CapacitySearch(lo or 0.0, (lo, hi), False, rel_tol, "interrupted", tuple(tried),
                                          kept.get(lo) if lo else None)
        raise stop from None


def _bracket(tried: list[ProbeRun]) -> tuple[float | None, float | None]:
    """Over every rate probed so far: (the highest valid rate below the lowest invalid one, that invalid one). A
    grid all valid followed by one all invalid brackets the edge between the two grids."""
    bad = [t.rate_per_s for t in tried if not t.valid]
    first_bad = min(bad) if bad else None
    good = [t.rate_per_s for t in tried if t.valid and (first_bad is None or t.rate_per_s < first_bad)]
    return (max(good) if good else None), first_bad


def _under(hi: float | None, floor: float | None) -> bool:
    """An invalid rate ``hi`` under ``floor``: every answer the search could still give lies below it."""
    return floor is not None and hi is not None and hi < floor


def _floored(lo: float | None, hi: float, rel_tol: float, tried: list[ProbeRun],
             kept: dict[float, Probed]) -> CapacitySearch:
    """The record of a search stopped at its ``floor``: the capacity is under ``hi``, not searched further."""
    return CapacitySearch(lo or 0.0, (lo, hi), False, rel_tol, "floor", tuple(tried), kept.get(lo) if lo else None)


def _split(rates: list[float], ok: list[bool]) -> tuple[float | None, float | None]:
    """(last valid rate below the first invalid one, the first invalid one); None where there is none."""
    first_bad = next((i for i, v in enumerate(ok) if not v), None)
    if first_bad is None:
        return rates[-1], None
    return (rates[first_bad - 1] if first_bad > 0 else None), rates[first_bad]


def _upward(probe: Callable[[list[float]], list[bool]], rates: list[float]) -> list[bool]:
    """A refinement round run one rate at a time from the lowest, stopping at the first invalid one: ``_split``
    reads no probe above it, so the round's answer is the one probing them all gives (the rates above, the
    costliest runs of an overloaded queue, are marked invalid here and never run)."""
    ok: list[bool] = []
    for r in rates:
        ok += probe([r])
        if not ok[-1]:
            return ok + [False] * (len(rates) - len(ok))
    return ok


def _round(probe: Callable[[list[float]], list[bool]], rates: list[float], tried: list[ProbeRun],
           kept: dict[float, Probed]) -> list[bool]:
    """A refinement round probed together (a pool's workers kept busy), recorded as ``_upward`` records it: the
    runs above the round's first invalid rate decide nothing and leave the record, so serve.json and fit.json are
    the same on every engine."""
    before = len(tried)
    ok = probe(rates)
    first_bad = next((i for i, v in enumerate(ok) if not v), None)
    if first_bad is None:
        return ok
    above = set(rates[first_bad + 1:])
    tried[before:] = [t for t in tried[before:] if t.rate_per_s not in above]
    for r in above:
        kept.pop(r, None)
    return ok[:first_bad + 1] + [False] * len(above)


def _search(probe: Callable[[list[float]], list[bool]], rate0: float, rel_tol: float, max_runs: int,
            ceiling: float | None, tried: list[ProbeRun], kept: dict[float, Probed],
            parallel: bool = True, alone: dict[float, str] | None = None,
            floor: float | None = None) -> CapacitySearch:
    """find_capacity's search from ``rate0``; ``probe(rates)`` runs them and adds them to ``tried`` and ``kept``.
    Not ``parallel`` (probes run one by one, inline), a refinement round stops at its first invalid rate
    (``_upward``): the same answer, fewer runs."""
    width = len(GRID_EXPONENTS)
    lo = hi = None
    if ceiling is not None:  # capped: ceiling x 2^0, 2^-1, ... 2^(1 - width), from the top until one is valid
        exps = list(range(0, -width * (GRID_SHIFTS + 1), -1))  # as far down as the grid moves uncapped
        chunks = [exps[:1]] + [exps[i:i + DESCENT] for i in range(1, len(exps), DESCENT)]
        for i, chunk in enumerate(chunks):
            probe([rate0 * 2.0 ** k for k in chunk])
            lo, hi = _bracket(tried)
            if _under(hi, floor):
                return _floored(lo, hi, rel_tol, tried, kept)
            if lo is not None:
                break
            why = (alone or {}).get(rate0 * 2.0 ** chunk[-1])
            if why is not None:  # served alone and invalid: every rate below runs alike
                tried += [ProbeRun(rate0 * 2.0 ** k, False, why) for c in chunks[i + 1:] for k in c]
                lo, hi = _bracket(tried)
                break
        if lo is not None and hi is None:  # the ceiling itself is valid: it is the answer, never above it
            return CapacitySearch(lo, (lo, None), True, rel_tol, "ceiling", tuple(tried), kept[lo])
        if lo is None:
            return CapacitySearch(0.0, (None, hi), False, rel_tol, "search range", tuple(tried))
    for shift in range(GRID_SHIFTS + 1 if ceiling is None else 0):
        probe([rate0 * 2.0 ** k for k in GRID_EXPONENTS])
        lo, hi = _bracket(tried)
        if _under(hi, floor):
            return _floored(lo, hi, rel_tol, tried, kept)
        if lo is not None and hi is not None:
            break
        direction = 1 if hi is None else -1  # all valid: look higher; nothing valid below the lowest invalid: lower
        if shift < GRID_SHIFTS:
            rate0 = rate0 * 2.0 ** (direction * width)
    if lo is None or hi is None:
        return CapacitySearch(lo or 0.0, (lo, hi), False, rel_tol, "search range", tuple(tried),
                              kept.get(lo) if lo else None)
    runs = len(tried)  # the budget counts every probe of a round, run or skipped: the same rounds either way
    while hi - lo > rel_tol * lo and runs + PROBES <= max_runs:
        rates = [lo + (hi - lo) * j / (PROBES + 1) for j in range(1, PROBES + 1)]
        ok = _round(probe, rates, tried, kept) if parallel else _upward(probe, rates)
        runs += PROBES
        new_lo, new_hi = _split(rates, ok)
        lo, hi = (new_lo if new_lo is not None else lo), (new_hi if new_hi is not None else hi)
        if _under(hi, floor):
            return _floored(lo, hi, rel_tol, tried, kept)
    return CapacitySearch(lo, (lo, hi), hi - lo <= rel_tol * lo, rel_tol, "slo", tuple(tried), kept[lo])
