"""Compare two runs: per layer type and per kernel deltas, and a verdict a CI can gate on.

A run is a run id in the store or an output folder (store/source.py). Kernels are matched by identity where the
two runs captured the same graph (same ``graph_hash``: the kernel at the same index), else by op signature (the
anchor op at its module path, in order of appearance). Times are the measured ones where both runs measured,
else the predicted ones; a measured kernel's time is the median of its profiled iterations after the warm-up
rule (store/noise.py) where the run kept them.

The verdict on the run, with raw latency samples on both sides (profile runs): side A is A and its repeats
(same tags, code and host: store/noise.py; ``rerun`` adds fresh ones, interleaved with B's), side B likewise.
A regression is called only when a Mann-Whitney U test (Mann & Whitney 1947; two-sided, the normal
approximation with the tie and continuity corrections) on the two sides' samples rejects "same distribution"
at ``alpha`` AND the change of the sides' mean log run time exceeds the minimum effect = max(``min_effect``, the
host's noise floor between runs); a significant move the other way beyond it is an improvement; a significant
move within the floor is "no significant change", said as not significant at this host's noise. Where too few
runs measure the floor (fewer than 4 in all: noise.MIN_DOF), the verdict is "inconclusive: noise not measured",
A against B alone, with how to measure it (``--rerun``): no floor is assumed, since same-code runs in fresh
processes differed by up to 29% on a quiet host (issue 35), past any floor one could assume. Kernels and
layer types get the same test on their profiled iterations (Benjamini-Hochberg over the family), A against B,
against a kernel floor measured the same way from the repeats' kernel times (else assumed).
Each run's total counts every one of its kernels, matched or not (a kernel fused into another in B leaves its A
kernel without a partner; a layer type's time holds its unmatched kernels too): the matched kernels alone can
stand still while the run got 19% faster. Predicted-only runs (analyze) have no samples, so no test applies:
"predicted change" when that total moved by more than ``min_effect``, else "no change". Runs whose hardware,
precision, phase, workload or measuring host differ are refused, naming what differs, unless ``force``.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from opmap.errors import OpmapError
from opmap.store.bench_compare import BenchComparison
from opmap.store.comparison import (
    Comparison,
    Evidence,
    KernelChange,
    LayerTypeChange,
    Noise,
    RankTest,
    RunTest,
    Totals,
    Unmatched,
    Unpartnered,
    Verdict,
    Warmup,
)
from opmap.store.noise import (
    ASSUMED_KERNEL_NOISE,
    MIN_DOF,
    Floor,
    drop_warmup,
    floor,
    host_fingerprint,
    repeat_key,
    run_time,
)
from opmap.store.source import (
    KernelRow,
    LayerRow,
    Run,
    Series,
    is_run_id,
    kernel_rows,
    load,
    reading,
    series,
    stored_like,
)

MUST_MATCH = ("workload", "hardware", "precision", "phase")
COMPARABLE = ("analyze", "profile")
WARMUP_RULE = ("warm-up rule: leading samples dropped while each exceeds the median of the later ones by more "
               "than 3.5 x 1.4826 MAD (Iglewicz-Hoaglin modified z > 3.5; MAD floored at 1% of the median; at "
               "most half a series)")


def seconds(t: float) -> str:
    """A time in s, ms or us, 3 significant digits (the store sits below report's formatting)."""
    for scale, unit in ((1.0, "s"), (1e-3, "ms")):
        if abs(t) >= scale:
            return f"{t / scale:.3g} {unit}"
    return f"{t / 1e-6:.3g} µs"


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def bh_reject(ps: list[float | None], alpha: float) -> list[bool]:
    """Benjamini-Hochberg (1995) at false-discovery rate ``alpha``: reject the k smallest p-values, k the largest
    rank with p_(k) <= k alpha / m (None: no test, never rejected)."""
    tested = sorted((p, i) for i, p in enumerate(ps) if p is not None)
    m, k = len(tested), 0
    for rank, (p, _) in enumerate(tested, 1):
        if p <= rank * alpha / m:
            k = rank
    out = [False] * len(ps)
    for _, i in tested[:k]:
        out[i] = True
    return out


_Row = TypeVar("_Row", KernelChange, LayerTypeChange)


def _verdicts(items: list[_Row], alpha: float, min_effect: float) -> list[_Row]:
    """The items with their ``verdict`` from their rank test (p, BH-corrected over the family) and its median
    ``effect``."""
    out = []
    for it, rej in zip(items, bh_reject([it.test.p if it.test else None for it in items], alpha)):
        if it.test is None:
            e = it.rel
            verdict = ("no test" if it.measured else
                       "predicted change" if e is not None and abs(e) > min_effect else "no change")
        else:
            e = it.test.effect
            verdict = ("regression" if rej and e > min_effect else "improvement" if rej and e < -min_effect
                       else "no significant change")
        out.append(replace(it, verdict=verdict))
    return out


def _test(xa: list[float], xb: list[float]) -> RankTest | None:
    """The rank test of two sample series after the warm-up rule, and the change of their medians."""
    xa, xb = drop_warmup(xa)[0], drop_warmup(xb)[0]
    if len(xa) < 2 or len(xb) < 2:
        return None
    _, p = mann_whitney(xa, xb)
    ma = statistics.median(xa)
    return RankTest(p, statistics.median(xb) / ma - 1 if ma else 0.0, len(xa), len(xb))


def _iter_sums(per: dict[int, list[float]], idxs: list[int]) -> list[float]:
    """Per-iteration sums over kernels (empty unless every kernel has samples of one length)."""
    vs = [per.get(i) for i in idxs]
    if not vs or not all(vs) or len({len(v) for v in vs}) != 1:
        return []
    return [sum(x) for x in zip(*vs)]


def _kernel_time(k: KernelRow, per: dict[int, list[float]], measured: bool) -> float:
    """A kernel's time, s: the median of its profiled iterations after the warm-up rule, else as stored."""
    if measured and len(per.get(k.idx) or ()) >= 2:
        return run_time(per[k.idx]) or 0.0
    return (k.measured_s if measured else k.predicted_s) or 0.0


def _check(a: Run, b: Run, force: bool) -> list[str]:
    """What differs between two runs among MUST_MATCH and the measuring host; refused unless ``force``."""
    for r in (a, b):
        if r.kind not in COMPARABLE:
            raise OpmapError(f"compare takes analyze and profile runs (kernels to match); {r.id} is a {r.kind} "
                             "run (opmap memo reads it)")
    pairs = [(t, a.tags.get(t), b.tags.get(t)) for t in MUST_MATCH]
    ha, hb = host_fingerprint(a.payload), host_fingerprint(b.payload)
    if ha is not None and hb is not None:
        pairs.append(("host", ha, hb))
    differ = [(t, x, y) for t, x, y in pairs if x != y]
    if differ and not force:
        raise OpmapError("the runs differ in " + ", ".join(f"{t} ({x} vs {y})" for t, x, y in differ)
                         + ": not comparable (--force to compare)")
    return [t for t, _, _ in differ]


def _sides(a: Run, b: Run, new_a: list[str], new_b: list[str], con) -> tuple[list[Run], list[Run]]:
    """Side A: A, its fresh re-runs and its stored repeats; side B likewise (B's repeats only where B's key
    differs from A's: else the stored repeats are A's). A folder run has no stored repeats."""
    if not (a.stored and b.stored):
        return [a], [b]
    ka, kb = repeat_key(a.kind, a.tags, a.payload), repeat_key(b.kind, b.tags, b.payload)
    fresh = set(new_a) | set(new_b)
    like = {r.id: r for r in stored_like(a, con) + (stored_like(b, con) if kb[1] != ka[1] else [])}
    rest = [r for r in like.values() if r.id not in fresh | {a.id, b.id}]
    side_a = [a] + [like[i] for i in new_a if i in like] + [r for r in rest
                                                            if repeat_key(r.kind, r.tags, r.payload) == ka]
    side_b = [b] + [like[i] for i in new_b if i in like]
    if kb != ka:
        side_b += [r for r in rest if repeat_key(r.kind, r.tags, r.payload) == kb]
    return side_a, side_b


def _log_times(side: list[Run], ser: dict[str, Series]) -> list[float]:
    """The log run times (median latency after the warm-up rule) of a side's runs with 2 samples or more."""
    return [math.log(t) for r in side if len(ser[r.id][0]) >= 2 and (t := run_time(ser[r.id][0]))]


def _kernel_floor(side_a: list[Run], side_b: list[Run], ser: dict[str, Series]) -> Floor:
    """The floor of one kernel's change A to B: the kernels' log times within each side, pooled over kernels."""
    groups = []
    for side in (side_a, side_b):
        pers = [ser[r.id][1] for r in side]
        for idx in set.intersection(*(set(p) for p in pers)) if len(pers) > 1 else ():
            ts = [run_time(p[idx]) for p in pers]
            if all(ts):
                groups.append([math.log(t) for t in ts])
    return floor(groups, 1, 1, ASSUMED_KERNEL_NOISE)


def compare(a_id: str, b_id: str, path: Path | None = None, force: bool = False, min_effect: float = 0.05,
            alpha: float = 0.05, rerun: int = 0,
            progress: Callable[[str], None] | None = None) -> Comparison | BenchComparison:
    """Compare run B with run A (run ids or output folders); ``rerun``: re-run both recorded commands that many
    more times each, interleaved, first (store/rerun.py)."""
    if not (0 < alpha < 1) or not min_effect >= 0 or not math.isfinite(min_effect):
        raise OpmapError(f"--alpha takes a value in (0, 1) and --min-effect one >= 0, got {alpha} and {min_effect}")
    if rerun < 0:
        raise OpmapError(f"--rerun takes a number of re-runs >= 1, got {rerun}")
    stored = is_run_id(a_id) or is_run_id(b_id)
    with reading(path, stored) as con:  # closed before the re-runs: their runs land when it opens again
        a, b = load(a_id, path, con), load(b_id, path, con)
        if "bench" in (a.kind, b.kind):  # measured load runs: per-request samples, no kernels
            from opmap.store.bench_compare import compare_bench

            if rerun:
                raise OpmapError("--rerun re-runs profile commands; a bench run is compared on its requests")
            return compare_bench(a, b, con, mann_whitney, bh_reject, force, min_effect, alpha)
    differ = _check(a, b, force)
    new_a, new_b = [], []
    if rerun:
        from opmap.store.rerun import rerun as run_again

        new_a, new_b = run_again(a, b, rerun, path, progress)
    with reading(path, stored) as con:
        (ka, lts_a), (kb, lts_b) = kernel_rows(a, con), kernel_rows(b, con)
        side_a, side_b = _sides(a, b, new_a, new_b, con)
        ser = series(side_a + side_b, con)
    (sa, pa), (sb, pb) = ser[a.id], ser[b.id]
    measured = all(k.measured_s is not None for k in ka + kb) and bool(ka) and bool(kb)
    kfloor = _kernel_floor(side_a, side_b, ser)
    kernels, how, unmatched = _kernel_rows(ka, kb, pa, pb, measured)
    k_effect = max(min_effect, kfloor.noise) if measured else min_effect
    kernels = _verdicts(kernels, alpha, k_effect)
    by_lt = _verdicts(_layer_type_rows(kernels, unmatched, lts_a, lts_b, pa, pb, measured), alpha, k_effect)
    totals = _totals(kernels, unmatched)
    times = "measured" if measured else "predicted"
    if len(sa) >= 2 and len(sb) >= 2:
        verdict = _run_verdict(side_a, side_b, ser, min_effect, alpha, host_fingerprint(a.payload))
    else:
        verdict = _total_verdict(totals, times, min_effect)
    return Comparison(
        a.id, b.id, tuple(differ), tuple(sorted(Counter(how).items())), times,
        tuple(sorted(kernels, key=lambda k: -abs(k.delta_s))), tuple(unmatched), totals, tuple(by_lt), min_effect,
        alpha, "Mann-Whitney U on the profiled iterations of each kernel (and of each layer type's kernels summed) "
               "after the warm-up rule, A against B, Benjamini-Hochberg over the family; minimum effect "
               "max(--min-effect, the kernel floor: " + kfloor.rule + "); the run's verdict rests on its latency "
               "samples alone", kfloor, WARMUP_RULE, verdict)


def _totals(kernels: list[KernelChange], unmatched: list[Unmatched]) -> Totals:
    """Each run's total: every one of its kernels, matched or not (a fused kernel in B has no partner for the
    kernels it absorbed in A); the matched and the unmatched part of each."""
    only = {side: [u.time_s for u in unmatched if u.side == side] for side in ("a", "b")}
    return Totals(sum(k.a_s for k in kernels), sum(k.b_s for k in kernels),
                  *(Unpartnered(len(only[side]), sum(only[side])) for side in ("a", "b")))


def _total_verdict(totals: Totals, times: str, min_effect: float) -> Verdict:
    """Runs without latency samples on both sides: the change of the totals (every kernel), no test."""
    effect = totals.rel or 0.0
    verdict = "predicted change" if abs(effect) > min_effect else "no change"
    return Verdict(verdict, f"{verdict}: {times} total {seconds(totals.a_s)} -> {seconds(totals.b_s)} "
                            f"({effect:+.1%}; every kernel, matched or not; minimum effect {min_effect:.1%})",
                   effect, note="no latency samples on both sides: no significance test applies (deltas only)")


def _kernel_rows(ka: list[KernelRow], kb: list[KernelRow], pa: dict[int, list[float]], pb: dict[int, list[float]],
                 measured: bool) -> tuple[list[KernelChange], list[str], list[Unmatched]]:
    """The matched kernel pairs with their times, deltas and rank tests; (rows, how each matched, unmatched)."""
    pairs, alone, how = _match(ka, kb)
    per = {"a": pa, "b": pb}
    unmatched = [Unmatched(side, k.idx, k.name, k.layer_type, _kernel_time(k, per[side], measured))
                 for side, k in alone]
    rows = []
    for (x, y), by in zip(pairs, how):
        ta, tb = _kernel_time(x, pa, measured), _kernel_time(y, pb, measured)
        rows.append(KernelChange(
            x.idx, y.idx, x.name, x.layer_type, ta, tb, tb - ta, (tb - ta) / ta if ta else None, measured,
            x.mfu, y.mfu, _delta(x.mfu, y.mfu), x.stall_fraction, y.stall_fraction,
            _delta(x.stall_fraction, y.stall_fraction), x.bytes, y.bytes, _delta(x.bytes, y.bytes),
            _test(pa.get(x.idx, []), pb.get(y.idx, [])), by))
    return rows, how, unmatched


def _layer_type_rows(kernels: list[KernelChange], unmatched: list[Unmatched], lts_a: dict[str, LayerRow],
                     lts_b: dict[str, LayerRow], pa: dict[int, list[float]], pb: dict[int, list[float]],
                     measured: bool) -> list[LayerTypeChange]:
    """Per layer type: the times of its kernels summed, matched or not (``kernels``: the pairs, ``only_a`` /
    ``only_b``: the kernels without a partner), the store's MFU / stall / bytes deltas, the rank test on the
    per-iteration sums; largest absolute change first."""
    groups: dict[str, list[KernelChange]] = defaultdict(list)
    alone: dict[str, list[Unmatched]] = defaultdict(list)
    for k in kernels:
        groups[k.layer_type or "-"].append(k)
    for u in unmatched:
        alone[u.layer_type or "-"].append(u)
    rows = []
    none = LayerRow(None, None, None)
    for lt in list(groups) + [x for x in alone if x not in groups]:
        ks, only = groups.get(lt, []), {s: [u for u in alone.get(lt, []) if u.side == s] for s in "ab"}
        ta = sum(k.a_s for k in ks) + sum(u.time_s for u in only["a"])
        tb = sum(k.b_s for k in ks) + sum(u.time_s for u in only["b"])
        ra, rb = lts_a.get(lt, none), lts_b.get(lt, none)
        rows.append(LayerTypeChange(
            lt, len(ks), len(only["a"]), len(only["b"]), ta, tb, tb - ta, (tb - ta) / ta if ta else None, measured,
            _delta(ra.mfu, rb.mfu), _delta(ra.stall_fraction, rb.stall_fraction), _delta(ra.bytes, rb.bytes),
            _test(_iter_sums(pa, [k.a_idx for k in ks] + [u.idx for u in only["a"]]),
                  _iter_sums(pb, [k.b_idx for k in ks] + [u.idx for u in only["b"]]))))
    return sorted(rows, key=lambda r: -abs(r.delta_s))


def _run_verdict(side_a: list[Run], side_b: list[Run], ser: dict[str, Series], min_effect: float,
                 alpha: float, host: str | None) -> Verdict:
    """The run's verdict: the rank test on the sides' samples and the change of their mean log run time against
    max(min_effect, the host's noise floor). Where too few runs measure the floor (fewer than MIN_DOF degrees of
    freedom: one run a side, or two against one) the verdict is "inconclusive": A against B alone, the change and
    the test shown, no regression or improvement called on an assumed floor (same-code runs in fresh processes
    differed by up to 29% on a quiet host, issue 35), and the line says how to measure the noise."""
    la, lb = _log_times(side_a, ser), _log_times(side_b, ser)
    fl = floor([la, lb], len(la), len(lb), math.nan)
    runs = (len(side_a), len(side_b))
    if not fl.measured:
        side_a, side_b = side_a[:1], side_b[:1]
        la, lb = _log_times(side_a, ser), _log_times(side_b, ser)
    xa = [x for r in side_a for x in drop_warmup(ser[r.id][0])[0]]
    xb = [x for r in side_b for x in drop_warmup(ser[r.id][0])[0]]
    u, p = mann_whitney(xa, xb)
    effect = math.exp(statistics.fmean(lb) - statistics.fmean(la)) - 1
    need = max(min_effect, fl.noise) if fl.measured else min_effect
    ids_a, ids_b = tuple(r.id for r in side_a), tuple(r.id for r in side_b)
    if not fl.measured:
        verdict, noise = "inconclusive", _unmeasured(runs, min_effect, ids_a, ids_b)
        line = (f"inconclusive: noise not measured: {effect:+.1%} (A against B; p {p:.2g}), but {runs[0]} + "
                f"{runs[1]} runs cannot tell a change from this host's noise between runs; measure it: "
                + _measure_hint(side_a[0], side_b[0]))
    else:
        verdict = ("regression" if p < alpha and effect > need else
                   "improvement" if p < alpha and effect < -need else "no significant change")
        noise = Noise(fl.noise, fl.measured, fl.n_a, fl.n_b, fl.sd_log, fl.dof, fl.t, fl.rule,
                      f"max(--min-effect {min_effect:.1%}, floor {fl.noise:.1%}) = {need:.1%}", ids_a, ids_b)
        line = _measured_line(verdict, effect, p, need, fl, min_effect, alpha, runs)
    warmup = Warmup(WARMUP_RULE, tuple(drop_warmup(ser[r.id][0])[1] for r in side_a),
                    tuple(drop_warmup(ser[r.id][0])[1] for r in side_b))
    return Verdict(verdict, line, effect, RunTest(u, p, len(xa), len(xb)),
                   evidence=Evidence(need, noise, warmup, host))


def _measured_line(verdict: str, effect: float, p: float, need: float, fl: Floor, min_effect: float, alpha: float,
                   runs: tuple[int, int]) -> str:
    """The verdict line where the floor is measured."""
    where = f"A's {runs[0]} runs against B's {runs[1]}"
    if verdict != "no significant change":
        return f"{verdict}: {effect:+.1%} ({where}; p {p:.2g}), beyond the minimum effect {need:.1%}"
    if p < alpha and abs(effect) > min_effect:
        return (f"no significant change: {effect:+.1%} ({where}) is not significant at this host's noise "
                f"({fl.noise:.1%})")
    return f"no significant change: {effect:+.1%} ({where}; p {p:.2g}; minimum effect {need:.1%})"


def _unmeasured(runs: tuple[int, int], min_effect: float, ids_a: tuple[str, ...], ids_b: tuple[str, ...]) -> Noise:
    """The noise block where the floor is not measured: how many runs there are and how many it needs."""
    rule = (f"not measured: {runs[0]} + {runs[1]} runs give {max(0, sum(runs) - 2)} degrees of freedom, a floor "
            f"needs {MIN_DOF} (4 runs in all, e.g. 2 a side; 5 a side tell +20% from same-code noise)")
    return Noise(None, False, runs[0], runs[1], None, 0, None, rule,
                 f"--min-effect {min_effect:.1%}; no floor: the noise is not measured", ids_a, ids_b)


def _measure_hint(a: Run, b: Run) -> str:
    """How to measure the noise between runs for A and B: ``--rerun`` where both are stored profile runs with a
    recorded command, else repeats recorded by hand."""
    from opmap.store.rerun import rerun_argv

    try:
        ok = a.stored and b.stored and bool(rerun_argv(a)) and bool(rerun_argv(b))
    except OpmapError:
        ok = False
    if ok:
        return (f"opmap compare {a.id} {b.id} --rerun 4 (re-runs both recorded profile commands, interleaved: 5 "
                "runs a side)")
    return ("profile each side 3 or more times into the store (same command, code and host) and compare the run "
            "ids, or use --rerun N on them")


def mann_whitney(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """(U of ``a``, two-sided p-value): U = R_a - n_a (n_a + 1) / 2 with average ranks for ties; z from
    mean n_a n_b / 2 and variance n_a n_b / 12 ((n + 1) - sum(t^3 - t) / (n (n - 1))), continuity-corrected."""
    na, nb = len(a), len(b)
    if na < 2 or nb < 2:
        raise OpmapError(f"a rank test needs at least 2 samples a side, got {na} and {nb}")
    pooled = sorted([(x, 0) for x in a] + [(x, 1) for x in b])
    ranks = [0.0] * len(pooled)
    ties = []
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        avg = (i + j) / 2 + 1
        for k in range(i, j + 1):
            ranks[k] = avg
        ties.append(j - i + 1)
        i = j + 1
    ra = sum(r for r, (_, side) in zip(ranks, pooled) if side == 0)
    u = ra - na * (na + 1) / 2
    n = na + nb
    mean = na * nb / 2
    var = na * nb / 12 * ((n + 1) - sum(t ** 3 - t for t in ties) / (n * (n - 1)))
    if var <= 0:
        return u, 1.0
    z = (abs(u - mean) - 0.5) / math.sqrt(var)
    p = 2 * (1 - 0.5 * (1 + math.erf(max(z, 0.0) / math.sqrt(2))))
    return u, min(1.0, p)


def _match(ka: list[KernelRow], kb: list[KernelRow]) -> tuple[list[tuple[KernelRow, KernelRow]],
                                                               list[tuple[str, KernelRow]], list[str]]:
    """Kernel pairs: by node identity (the same node ids, op and module), then by op signature (op with its input
    dtypes and shapes, in order of appearance) among the rest, then by op at module path (in order) among the rest:
    the last step pairs the same layer's kernels across batch or sequence lengths. (pairs, the kernels left
    without a partner with their side "a" or "b", how each pair matched)."""
    left_a, left_b = list(ka), list(kb)
    pairs: list[tuple[KernelRow, KernelRow]] = []
    how: list[str] = []
    steps = (("node identity", lambda k: (k.node_ids, k.name) if k.node_ids else None),
             ("op signature", lambda k: k.signature),
             ("op at module", lambda k: k.name or None))
    for label, key in steps:
        queues: dict[Any, list[KernelRow]] = defaultdict(list)
        for k in left_b:
            if key(k) is not None:
                queues[key(k)].append(k)
        rest_a = []
        taken = set()
        for k in left_a:
            q = queues.get(key(k)) if key(k) is not None else None
            if q:
                y = q.pop(0)
                taken.add(id(y))
                pairs.append((k, y))
                how.append(label)
            else:
                rest_a.append(k)
        left_a, left_b = rest_a, [k for k in left_b if id(k) not in taken]
    return pairs, [("a", k) for k in left_a] + [("b", k) for k in left_b], how
