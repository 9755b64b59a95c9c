"""The closure memo of a recorded run: findings with owners, evidence, a bounded fix, a rollback boundary, a risk.

Each layer type holding at least ``MIN_SHARE`` of the run's time (measured where the run measured, else
predicted) is a finding, assigned by its bottleneck class to the layer that owns the fix:

- ``memory`` bound (or a measured memory-stall fraction above a half): the **ML compiler** owner (fusion, layout,
  precision of activations); the fix is fusing the layer type's elementwise work into its producers, bounded by
  the bytes it moves;
- ``overhead`` bound (launch and dispatch, or a measured "other" share above a half): the **runtime** owner
  (batching, CUDA graphs, fewer launches); the fix removes launches, bounded by the layer type's time;
- ``compute`` bound: the **ML compiler** owner (tiling, precision of the matrix engine); the fix is a faster
  format or a better tile, bounded by the distance to the achievable rate;
- a predicted / measured ratio outside 0.75-1.33 for the layer type: the **performance modelling** owner.

The expected gain comes from the model itself: ``opmap analyze`` of the same workload under ``--fusion compiler``
(the fusion the compiler owner would ship) against the run's own prediction, or the layer type's time for the
runtime fix. The field's pitfalls are checks with a verdict each: averages without p95 / p99 (a predicted run has
no distribution), a precision without quality evidence, a calibration older than the runtime or drifted, a
synthetic shape with no production-shape comparison in the store.
"""

from __future__ import annotations

from typing import Any

MIN_SHARE = 0.10
BAND = (0.75, 1.33)


def _share(lt: dict[str, Any]) -> float:
    m = lt.get("measured") or {}
    return m.get("share_of_measured") if m.get("share_of_measured") is not None else lt.get("share_of_time", 0.0)


def findings(run: dict[str, Any], fusion_gain_s: float | None = None) -> list[dict[str, Any]]:
    p = run["payload"]
    stall = ((p.get("stall_fraction") or {}).get("layer_types") or {})
    out = []
    for name, lt in sorted((p.get("layer_types") or {}).items(), key=lambda kv: -_share(kv[1])):
        share = _share(lt)
        if share < MIN_SHARE:
            continue
        m = lt.get("measured") or {}
        st = stall.get(name, {})
        t = m.get("measured_s") or lt.get("predicted_s") or 0.0
        bound = lt.get("bound", "-")
        if st.get("memory_stall", 0.0) > 0.5 or bound == "memory":
            owner, fix = "ML compiler", "fuse the layer type's elementwise work into its producers (--fusion compiler)"
            gain = fusion_gain_s
            risk = "low: numerics unchanged by fusion; watch compile time"
        elif st.get("other", 0.0) > 0.5 or bound == "overhead":
            owner, fix = "runtime", "remove launches: capture the step in a CUDA graph or batch more work per launch"
            gain = t
            risk = "medium: graph capture fixes shapes; dynamic shapes need buckets"
        else:
            owner, fix = "ML compiler", "a narrower matrix format or a better tile for its GEMMs"
            gain = None
            risk = "high without quality evidence for the narrower format (opmap quality)"
        text = (f"{name} holds {share:.0%} of the time, {bound}-bound"
                + (f", stall fraction {st['memory_stall']:.2f}" if "memory_stall" in st else ""))
        out.append({"finding": text, "owner": owner, "fix": fix, "expected_gain_s": gain, "risk": risk,
                    "rollback": f"the baseline is run {run['id']}: compare a new run against it (opmap compare)"})
        ratio = m.get("predicted_over_measured")
        if ratio is not None and not BAND[0] <= ratio <= BAND[1]:
            out.append({"finding": f"{name}: predicted / measured {ratio:.2f}, outside {BAND[0]}-{BAND[1]}",
                        "owner": "performance modelling", "fix": "recalibrate (opmap calibrate) and look at the "
                        "layer type's kernels in the profile sheet", "expected_gain_s": None,
                        "risk": "low: the model only", "rollback": "keep the current calibration file"})
    return out


def pitfalls(run: dict[str, Any], production_compared: bool) -> list[dict[str, str]]:
    p = run["payload"]
    a = p.get("assumptions", {})
    lat = p.get("latency") or {}
    out = [{"check": "averages without p95 / p99",
            "verdict": ("ok: p50 / p95 / p99 over " + str(lat.get("n")) + " runs") if "p99_s" in lat else
            "flag: a predicted run has no distribution; measure it (opmap profile) before quoting a latency"}]
    evidence = str(a.get("precision_evidence", ""))
    out.append({"check": "precision without quality evidence",
                "verdict": "flag: " + evidence if evidence.startswith("unverified") else "ok: " + (evidence or "-")})
    cal = p.get("calibration_check")
    if cal is None:
        verdict = "ok: a catalog device, no calibration involved" if run["kind"] == "analyze" else "flag: no check"
    else:
        ratio = cal.get("ratio")
        drifted = cal.get("drifted") if "drifted" in cal else (ratio is not None and abs(ratio - 1) > 0.1)
        verdict = (("flag: " if drifted else "ok: ") + f"{cal.get('what', 'the calibration check')}: now / calibrated "
                   + (f"{ratio:.2f}" if ratio is not None else "-") + " (a drift beyond 10% flags)")
    out.append({"check": "calibration older than the runtime or drifted", "verdict": verdict})
    out.append({"check": "synthetic shapes without production-shape validation",
                "verdict": "ok: compared with another run of the workload" if production_compared else
                "flag: no other run of this workload in the store to validate the shapes against"})
    return out


def memo_markdown(run: dict[str, Any], fs: list[dict[str, Any]], pits: list[dict[str, str]],
                  command: str) -> str:
    t = run["tags"]
    lines = [f"# Closure memo: {t.get('workload')} on {t.get('hardware')} ({t.get('phase')}, {t.get('precision')})",
             "", f"Evidence: run {run['id']} ({run['kind']}, {run['time_utc']}) in the run store; reproduce with "
             f"`{t.get('command') or command}`.", "", "## Findings", "",
             "| finding | owner | fix | expected gain | rollback boundary | risk |", "|---|---|---|---|---|---|"]
    for f in fs:
        g = "-" if f["expected_gain_s"] is None else f"{f['expected_gain_s'] * 1e3:.3g} ms (from the model)"
        lines.append(f"| {f['finding']} | {f['owner']} | {f['fix']} | {g} | {f['rollback']} | {f['risk']} |")
    if not fs:
        lines.append("| no layer type holds 10% of the time | - | - | - | - | - |")
    lines += ["", "## Pitfall checks", ""] + [f"- {c['check']}: {c['verdict']}" for c in pits]
    return "\n".join(lines) + "\n"
