"""Compare two measured load runs (``opmap bench``): per latency metric, a rank test on the per-request
samples, and a verdict a CI can gate on.

For each of TTFT, TPOT and end-to-end latency, the two runs' per-request values (s; warm-up requests excluded,
ok requests only) go through compare's Mann-Whitney U test (store/compare.py ``mann_whitney``: two-sided,
normal approximation, tie and continuity corrected), Benjamini-Hochberg over the three metrics at ``alpha``.
A metric regressed when its test rejects "same distribution" AND its median rose by more than ``min_effect``;
improved when significant and it fell by more than that. The run is a regression when any metric regressed.
Throughput (requests/s, output tokens/s) is one number per run: its change is shown, untested.

Runs are comparable when they served the same model under the same workload spec (load, lengths, seed):
different endpoints, servers or versions are what a comparison is for; a different load is refused, naming it,
unless ``force``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, ClassVar

from opmap.errors import OpmapError
from opmap.record import key

METRICS = ("ttft_s", "tpot_s", "e2e_s")
MUST_MATCH = ("workload", "workload_spec")
THROUGHPUT = ("requests_per_s", "output_tokens_per_s", "tokens_per_s")
TEST = ("Mann-Whitney U (two-sided, normal approximation, tie and continuity corrected) on per-request samples, "
        "Benjamini-Hochberg over TTFT, TPOT and e2e")


@dataclass(frozen=True)
class MetricChange:
    """One latency metric (ttft, tpot, e2e) on both sides: samples a side, the rank test (``u``, ``p``; None with
    fewer than 2 samples a side), p50 and p99 (s), the change of the p50 and its verdict."""

    metric: str
    n_a: int
    n_b: int
    p: float | None
    u: float | None
    a_p50_s: float | None
    b_p50_s: float | None
    a_p99_s: float | None
    b_p99_s: float | None
    rel: float | None
    verdict: str


@dataclass(frozen=True)
class ThroughputChange:
    """A throughput (one value a run, untested) on both sides and its change."""

    name: str  # requests_per_s, output_tokens_per_s or tokens_per_s
    a: float | None
    b: float | None
    rel: float | None


@dataclass(frozen=True)
class Sides:
    """One value of each run: A's and B's (an endpoint, a validity verdict; None where the run has none)."""

    a: str | None
    b: str | None


@dataclass(frozen=True)
class Test:
    """The test the latency metrics went through, by name."""

    name: str = TEST


@dataclass(frozen=True)
class BenchComparison:
    """Bench run B against bench run A: each latency metric's change with its test, the throughputs, the verdict
    (a regression where any metric regressed), the endpoints and each run's validity verdict. Its record is the
    JSON ``opmap compare --json`` prints, ``kind`` bench first and the throughputs keyed by name."""

    RECORD: ClassVar[tuple[Any, ...]] = ("kind", ...)
    kind: ClassVar[str] = "bench"
    a: str
    b: str
    forced_tags: tuple[str, ...]
    metrics: tuple[MetricChange, ...]
    throughput: tuple[ThroughputChange, ...] = field(metadata=key(mapping="name"))
    verdict: str
    verdict_line: str
    min_effect: float
    alpha: float
    test: Test
    endpoints: Sides
    validity: Sides

    @property
    def regressed(self) -> bool:
        return self.verdict == "regression"


def _samples(run, con) -> dict[str, list[float]]:
    """The run's per-request samples by metric: from the store's samples table, or a folder's bench.json."""
    if run.stored:
        rows = con.execute("SELECT metric, value_s FROM samples WHERE run_id = ? AND metric IN (SELECT unnest(?)) "
                           "ORDER BY metric, i", [run.id, list(METRICS)]).fetchall()
        out: dict[str, list[float]] = {m: [] for m in METRICS}
        for m, v in rows:
            out[m].append(float(v))
        return out
    s = run.payload.get("samples") if isinstance(run.payload.get("samples"), dict) else {}
    return {m: [float(x) for x in (s.get(m) or []) if isinstance(x, (int, float))] for m in METRICS}


def check(a, b, force: bool) -> list[str]:
    """The tags among MUST_MATCH that differ; refused unless ``force``."""
    for r in (a, b):
        if r.kind != "bench":
            raise OpmapError(f"a bench run is compared with another bench run; {r.id} is a {r.kind} run")
    differ = [(t, a.tags.get(t), b.tags.get(t)) for t in MUST_MATCH if a.tags.get(t) != b.tags.get(t)]
    if differ and not force:
        raise OpmapError("the bench runs differ in " + ", ".join(f"{t} ({x} vs {y})" for t, x, y in differ)
                         + ": not the same load (--force to compare)")
    return [t for t, _, _ in differ]


def compare_bench(a, b, con, rank_test, bh_reject, force: bool = False, min_effect: float = 0.05,
                  alpha: float = 0.05) -> BenchComparison:
    """Run B against run A (store/source.py Runs of kind bench); ``con``: the store's connection where either is
    stored. ``rank_test`` and ``bh_reject``: compare's Mann-Whitney U and Benjamini-Hochberg (store/compare.py
    passes its own: it imports this module, so this one cannot import it)."""
    differ = check(a, b, force)
    sa, sb = _samples(a, con), _samples(b, con)
    tested = []
    for m in METRICS:
        xa, xb = sa[m], sb[m]
        pa, pb = (statistics.median(xa) if xa else None), (statistics.median(xb) if xb else None)
        u, p = rank_test(xa, xb) if len(xa) >= 2 and len(xb) >= 2 else (None, None)
        tested.append((m[:-2], xa, xb, p, u, pa, pb, pb / pa - 1 if pa and pb is not None else None))
    rows = []
    for (metric, xa, xb, p, u, pa, pb, rel), rejected in zip(tested, bh_reject([t[3] for t in tested], alpha)):
        verdict = ("no test (fewer than 2 samples a side)" if p is None else
                   "regression" if rejected and rel is not None and rel > min_effect else
                   "improvement" if rejected and rel is not None and rel < -min_effect else
                   "no significant change")
        rows.append(MetricChange(metric, len(xa), len(xb), p, u, pa, pb, _p99(xa), _p99(xb), rel, verdict))
    verdicts = [r.verdict for r in rows]
    verdict = ("regression" if "regression" in verdicts else "improvement" if "improvement" in verdicts
               else "no significant change")
    moved = [r for r in rows if r.verdict == verdict] if verdict != "no significant change" else []
    line = (f"{verdict}: " + ", ".join(f"{r.metric} p50 {r.rel:+.1%} (p {r.p:.2g})" for r in moved)
            + f", beyond the minimum effect {min_effect:.1%}" if moved else
            f"no significant change in TTFT, TPOT or e2e (minimum effect {min_effect:.1%}, alpha {alpha:g})")
    ta, tb = a.payload.get("throughput") or {}, b.payload.get("throughput") or {}
    throughput = tuple(ThroughputChange(k, ta.get(k), tb.get(k),
                                        tb[k] / ta[k] - 1 if ta.get(k) and tb.get(k) is not None else None)
                       for k in THROUGHPUT)
    return BenchComparison(a.id, b.id, tuple(differ), tuple(rows), throughput, verdict, line, min_effect, alpha,
                           Test(), Sides(a.tags.get("endpoint"), b.tags.get("endpoint")),
                           Sides((a.payload.get("validity") or {}).get("verdict"),
                                 (b.payload.get("validity") or {}).get("verdict")))


def _p99(x: list[float]) -> float | None:
    if not x:
        return None
    import numpy as np

    return float(np.percentile(x, 99))
