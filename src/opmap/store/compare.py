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
from collections import defaultdict
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


def _kernels(con, run_id: str) -> list[dict[str, Any]]:
    rows = con.execute("SELECT idx, name, layer_type, predicted_s, measured_s, bytes FROM kernels WHERE run_id = ? "
                       "ORDER BY idx", [run_id]).fetchall()
    return [dict(zip(("idx", "name", "layer_type", "predicted_s", "measured_s", "bytes"), r)) for r in rows]


def _time(k: dict[str, Any], measured: bool) -> float:
    return (k["measured_s"] if measured else k["predicted_s"]) or 0.0


def compare(a_id: str, b_id: str, path: Path | None = None, force: bool = False, min_effect: float = 0.05,
            alpha: float = 0.05) -> dict[str, Any]:
    from opmap.store.db import _read, show_run

    a, b = show_run(a_id, path), show_run(b_id, path)
    differ = [t for t in MUST_MATCH if a["tags"].get(t) != b["tags"].get(t)]
    if differ and not force:
        raise OpmapError("the runs differ in " + ", ".join(f"{t} ({a['tags'].get(t)} vs {b['tags'].get(t)})"
                                                          for t in differ) + ": not comparable (--force to compare)")
    con = _read(path)
    try:
        ka, kb = _kernels(con, a_id), _kernels(con, b_id)
        sa = [r[0] for r in con.execute("SELECT value_s FROM samples WHERE run_id = ? AND metric = 'latency_s' "
                                        "ORDER BY i", [a_id]).fetchall()]
        sb = [r[0] for r in con.execute("SELECT value_s FROM samples WHERE run_id = ? AND metric = 'latency_s' "
                                        "ORDER BY i", [b_id]).fetchall()]
    finally:
        con.close()
    measured = all(k["measured_s"] is not None for k in ka + kb) and bool(ka) and bool(kb)
    same_graph = a["tags"].get("graph_hash") == b["tags"].get("graph_hash")
    pairs, unmatched = _match(ka, kb, same_graph)
    kernels = []
    for x, y in pairs:
        ta, tb = _time(x, measured), _time(y, measured)
        kernels.append({"a_idx": x["idx"], "b_idx": y["idx"], "name": x["name"], "layer_type": x["layer_type"],
                        "a_s": ta, "b_s": tb, "delta_s": tb - ta, "rel": (tb - ta) / ta if ta else None,
                        "bytes_delta": (y["bytes"] or 0.0) - (x["bytes"] or 0.0)})
    by_lt: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for k in kernels:
        by_lt[k["layer_type"] or "-"][0] += k["a_s"]
        by_lt[k["layer_type"] or "-"][1] += k["b_s"]
    layer_types = {lt: {"a_s": v[0], "b_s": v[1], "rel": (v[1] - v[0]) / v[0] if v[0] else None}
                   for lt, v in sorted(by_lt.items(), key=lambda kv: -abs(kv[1][1] - kv[1][0]))}
    out: dict[str, Any] = {"a": a_id, "b": b_id, "forced_tags": differ, "matched_by": "node identity" if same_graph
                           else "op signature", "times": "measured" if measured else "predicted",
                           "kernels": sorted(kernels, key=lambda k: -abs(k["delta_s"])), "unmatched": unmatched,
                           "layer_types": layer_types, "min_effect": min_effect, "alpha": alpha}
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


def _match(ka: list[dict], kb: list[dict], same_graph: bool):
    if same_graph and len(ka) == len(kb):
        return list(zip(ka, kb)), []
    queues: dict[str, list[dict]] = defaultdict(list)
    for k in kb:
        queues[k["name"]].append(k)
    pairs, unmatched = [], []
    for k in ka:
        q = queues.get(k["name"])
        if q:
            pairs.append((k, q.pop(0)))
        else:
            unmatched.append({"side": "a", "idx": k["idx"], "name": k["name"]})
    for name, q in queues.items():
        unmatched += [{"side": "b", "idx": k["idx"], "name": name} for k in q]
    return pairs, unmatched
