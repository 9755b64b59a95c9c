"""Compare two recorded runs: per layer type and per kernel deltas, and a verdict a CI can gate on.

Kernels are matched by identity where the two runs captured the same graph (same ``graph_hash``: the kernel at
the same index), else by op signature (the anchor op at its module path, in order of appearance). Times are the
measured ones where both runs measured, else the predicted ones.

The verdict on the run: with raw latency samples on both sides (profile runs), a regression is called only when
a Mann-Whitney U test (Mann & Whitney 1947; two-sided, the normal approximation with the tie correction and a
continuity correction) rejects "same distribution" at ``alpha`` AND the median moved by more than
``min_effect``; a significant move the other way is an improvement; anything else is "no significant change".
Predicted-only runs (analyze) have no samples, so no test applies: "predicted change" when the predicted total
moved by more than ``min_effect``, else "no change". Runs whose hardware, precision, phase or workload differ are
refused, naming the tags that differ, unless ``force``.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opmap.errors import OpmapError

MUST_MATCH = ("workload", "hardware", "precision", "phase")


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


_KCOLS = ("idx", "name", "layer_type", "predicted_s", "measured_s", "bytes", "node_ids", "signature", "mfu",
          "stall_fraction")


def _kernels(con, run_id: str) -> list[dict[str, Any]]:
    rows = con.execute(f"SELECT {', '.join(_KCOLS)} FROM kernels WHERE run_id = ? ORDER BY idx", [run_id]).fetchall()
    return [dict(zip(_KCOLS, r)) for r in rows]


def _samples(con, run_id: str) -> tuple[list[float], dict[int, list[float]]]:
    """(the run's latency samples, each kernel's per-iteration samples by kernel index)."""
    lat: list[float] = []
    per: dict[int, list[float]] = defaultdict(list)
    for metric, v in con.execute("SELECT metric, value_s FROM samples WHERE run_id = ? ORDER BY metric, i",
                                 [run_id]).fetchall():
        if metric == "latency_s":
            lat.append(v)
        elif metric.startswith("kernel:"):
            per[int(metric[7:])].append(v)
    return lat, per


def _time(k: dict[str, Any], measured: bool) -> float:
    return (k["measured_s"] if measured else k["predicted_s"]) or 0.0


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


def _verdicts(items: list[dict[str, Any]], alpha: float, min_effect: float) -> None:
    """Each item's ``verdict`` from its rank test (p, BH-corrected over the family) and its median ``effect``."""
    for it, rej in zip(items, bh_reject([it.get("p") for it in items], alpha)):
        if it.get("p") is None:
            e = it.get("rel")
            it["verdict"] = ("no test" if it.get("measured") else
                             "predicted change" if e is not None and abs(e) > min_effect else "no change")
        else:
            e = it["effect"]
            it["verdict"] = ("regression" if rej and e > min_effect else "improvement" if rej and e < -min_effect
                             else "no significant change")


def _test(xa: list[float], xb: list[float]) -> dict[str, Any]:
    if len(xa) < 2 or len(xb) < 2:
        return {}
    _, p = mann_whitney(xa, xb)
    ma = statistics.median(xa)
    return {"p": p, "effect": statistics.median(xb) / ma - 1 if ma else 0.0, "n_a": len(xa), "n_b": len(xb)}


def _iter_sums(per: dict[int, list[float]], idxs: list[int]) -> list[float]:
    """Per-iteration sums over kernels (empty unless every kernel has samples of one length)."""
    vs = [per.get(i) for i in idxs]
    if not vs or not all(vs) or len({len(v) for v in vs}) != 1:
        return []
    return [sum(x) for x in zip(*vs)]


def compare(a_id: str, b_id: str, path: Path | None = None, force: bool = False, min_effect: float = 0.05,
            alpha: float = 0.05) -> dict[str, Any]:
    from opmap.store.db import _read, show_run

    if not (0 < alpha < 1) or min_effect < 0:
        raise OpmapError(f"--alpha takes a value in (0, 1) and --min-effect one >= 0, got {alpha} and {min_effect}")
    a, b = show_run(a_id, path), show_run(b_id, path)
    differ = [t for t in MUST_MATCH if a["tags"].get(t) != b["tags"].get(t)]
    if differ and not force:
        raise OpmapError("the runs differ in " + ", ".join(f"{t} ({a['tags'].get(t)} vs {b['tags'].get(t)})"
                                                          for t in differ) + ": not comparable (--force to compare)")
    con = _read(path)
    try:
        ka, kb = _kernels(con, a_id), _kernels(con, b_id)
        (sa, pa), (sb, pb) = _samples(con, a_id), _samples(con, b_id)
        lts_a, lts_b = _layer_rows(con, a_id), _layer_rows(con, b_id)
    finally:
        con.close()
    measured = all(k["measured_s"] is not None for k in ka + kb) and bool(ka) and bool(kb)
    pairs, unmatched, how = _match(ka, kb)
    kernels = []
    for (x, y), by in zip(pairs, how):
        ta, tb = _time(x, measured), _time(y, measured)
        kernels.append({"a_idx": x["idx"], "b_idx": y["idx"], "name": x["name"], "layer_type": x["layer_type"],
                        "matched_by": by, "a_s": ta, "b_s": tb, "delta_s": tb - ta,
                        "rel": (tb - ta) / ta if ta else None, "measured": measured,
                        "mfu_a": x["mfu"], "mfu_b": y["mfu"], "mfu_delta": _delta(x["mfu"], y["mfu"]),
                        "stall_a": x["stall_fraction"], "stall_b": y["stall_fraction"],
                        "stall_delta": _delta(x["stall_fraction"], y["stall_fraction"]),
                        "bytes_a": x["bytes"], "bytes_b": y["bytes"], "bytes_delta": _delta(x["bytes"], y["bytes"]),
                        **_test(pa.get(x["idx"], []), pb.get(y["idx"], []))})
    _verdicts(kernels, alpha, min_effect)
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for k in kernels:
        groups[k["layer_type"] or "-"].append(k)
    layer_types = []
    for lt, ks in groups.items():
        ta, tb = sum(k["a_s"] for k in ks), sum(k["b_s"] for k in ks)
        ra, rb = lts_a.get(lt, {}), lts_b.get(lt, {})
        layer_types.append({"layer_type": lt, "kernels": len(ks), "a_s": ta, "b_s": tb, "delta_s": tb - ta,
                            "rel": (tb - ta) / ta if ta else None, "measured": measured,
                            "mfu_delta": _delta(ra.get("mfu"), rb.get("mfu")),
                            "stall_delta": _delta(ra.get("stall_fraction"), rb.get("stall_fraction")),
                            "bytes_delta": _delta(ra.get("bytes"), rb.get("bytes")),
                            **_test(_iter_sums(pa, [k["a_idx"] for k in ks]),
                                    _iter_sums(pb, [k["b_idx"] for k in ks]))})
    _verdicts(layer_types, alpha, min_effect)
    layer_types.sort(key=lambda v: -abs(v["delta_s"]))
    by_lt = {v.pop("layer_type"): v for v in layer_types}
    out: dict[str, Any] = {"a": a_id, "b": b_id, "forced_tags": differ,
                           "matched_by": dict(sorted(Counter(how).items())),
                           "times": "measured" if measured else "predicted",
                           "kernels": sorted(kernels, key=lambda k: -abs(k["delta_s"])), "unmatched": unmatched,
                           "layer_types": by_lt, "min_effect": min_effect, "alpha": alpha,
                           "per_kernel_test": "Mann-Whitney U on the profiled iterations of each kernel (and of each "
                                              "layer type's kernels summed), Benjamini-Hochberg over the family; "
                                              "the run's verdict rests on its latency samples alone"}
    if len(sa) >= 2 and len(sb) >= 2:
        u, p = mann_whitney(sa, sb)
        effect = statistics.median(sb) / statistics.median(sa) - 1
        verdict = ("regression" if p < alpha and effect > min_effect else
                   "improvement" if p < alpha and effect < -min_effect else "no significant change")
        out.update(test={"name": "Mann-Whitney U (two-sided, normal approximation, tie and continuity corrected)",
                         "u": u, "p": p, "n_a": len(sa), "n_b": len(sb)},
                   effect=effect, verdict=verdict)
    else:
        ta, tb = sum(k["a_s"] for k in kernels), sum(k["b_s"] for k in kernels)
        effect = tb / ta - 1 if ta else 0.0
        out.update(test=None, effect=effect,
                   verdict="predicted change" if abs(effect) > min_effect else "no change",
                   note="no latency samples on both sides: no significance test applies (deltas only)")
    return out


def _layer_rows(con, run_id: str) -> dict[str, dict[str, Any]]:
    """A run's layer-type rows (MFU, stall fraction, bytes) as the store holds them."""
    rows = con.execute("SELECT layer_type, mfu, stall_fraction, bytes FROM layer_types WHERE run_id = ?",
                       [run_id]).fetchall()
    return {r[0]: {"mfu": r[1], "stall_fraction": r[2], "bytes": r[3]} for r in rows}


def _match(ka: list[dict], kb: list[dict]) -> tuple[list[tuple[dict, dict]], list[dict], list[str]]:
    """Kernel pairs: by node identity (the same node ids, op and module), then by op signature (op with its input
    dtypes and shapes, in order of appearance) among the rest, then by op at module path (in order) among the rest:
    the last step pairs the same layer's kernels across batch or sequence lengths."""
    left_a, left_b = list(ka), list(kb)
    pairs: list[tuple[dict, dict]] = []
    how: list[str] = []
    steps = (("node identity", lambda k: (k["node_ids"], k["name"]) if k["node_ids"] else None),
             ("op signature", lambda k: k["signature"]),
             ("op at module", lambda k: k["name"] or None))
    for label, key in steps:
        queues: dict[Any, list[dict]] = defaultdict(list)
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
    unmatched = ([{"side": "a", "idx": k["idx"], "name": k["name"]} for k in left_a]
                 + [{"side": "b", "idx": k["idx"], "name": k["name"]} for k in left_b])
    return pairs, unmatched, how
