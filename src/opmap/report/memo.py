"""The closure memo of a recorded run: findings with owners, evidence, a bounded fix, a rollback boundary, a risk.

Each layer type holding at least ``MIN_SHARE`` of the run's time (measured where the run measured, else
predicted) is a finding, assigned by its bottleneck class to the layer that owns the fix:

- ``memory`` bound (or a measured memory-stall fraction above a half): the **ML compiler** owner (fusion, layout,
  precision of activations); the fix is fusing the layer type's elementwise work into its producers, bounded by
  the bytes it moves;
- ``overhead`` bound (launch and dispatch, or a measured "other" share above a half): the **runtime** owner
  (batching, CUDA graphs, fewer launches); the fix removes launches, bounded by the layer type's time;
- ``compute`` bound: the **ML compiler** owner (tiling, precision of the matrix engine); the fix is the next
  narrower matrix format, its gain bounded by the ratio of the device's dense peaks (the layer type's time x
  (1 - peak(now) / peak(narrower))), and high-risk until ``opmap quality`` shows the format holds;
- ``interconnect`` bound (collectives of a sharded run): the **runtime** owner (overlap the collective with
  compute, bucket it, or change the parallel layout: ``opmap plan``); the gain is bounded by the layer type's
  time, all of which an ideal overlap would hide;
- a predicted / measured ratio outside 0.75-1.33 for the layer type: the **performance modelling** owner.

The expected gain comes from the model itself: ``opmap analyze`` of the same workload under ``--fusion compiler``
(the fusion the compiler owner would ship) against the run's own prediction, or the layer type's time for the
runtime fix. The field's pitfalls are checks with a verdict each: averages without p95 / p99 (a predicted run has
no distribution), a precision without quality evidence, a calibration older than the runtime or drifted, a
synthetic shape with no production-shape comparison in the store.

These rules are for runs of one graph's kernels (analyze, profile); fit, plan, sweep, serve, shape-check and
calibrate runs get the findings their results support (memo_kinds.py), through ``memo_parts``.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from opmap.report.finding import Check, Finding
from opmap.store.source import Run

MIN_SHARE = 0.10
BAND = (0.75, 1.33)


def _share(lt: dict[str, Any]) -> float:
    m = lt.get("measured") or {}
    return m.get("share_of_measured") if m.get("share_of_measured") is not None else lt.get("share_of_time", 0.0)


def findings(run: Run, fusion_gain_s: float | None = None,
             format_step: tuple[str, float] | None = None) -> list[Finding]:
    """The findings of a run. ``format_step``: (the next narrower matrix format, the ratio of its dense peak to
    the run's format's) on the run's hardware, where there is one."""
    p = run.payload
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
        elif bound == "interconnect":
            owner, fix = "runtime", "overlap the collective with compute or change the parallel layout (opmap plan)"
            gain = t
            risk = "medium: overlap needs spare memory bandwidth and streams; a new layout moves memory per device"
        elif st.get("other", 0.0) > 0.5 or bound == "overhead":
            owner, fix = "runtime", "remove launches: capture the step in a CUDA graph or batch more work per launch"
            gain = t
            risk = "medium: graph capture fixes shapes; dynamic shapes need buckets"
        else:
            owner = "ML compiler"
            if format_step is not None and format_step[1] > 1:
                fix = f"its GEMMs in {format_step[0]} (the matrix peak x{format_step[1]:.3g}), or a better tile"
                gain = t * (1 - 1 / format_step[1])
            else:
                fix, gain = "a better tile for its GEMMs (no narrower matrix format on this device)", None
            risk = "high without quality evidence for the narrower format (opmap quality)"
        text = (f"{name} holds {share:.0%} of the time, {bound}-bound"
                + (f", stall fraction {st['memory_stall']:.2f}" if "memory_stall" in st else ""))
        out.append(Finding(text, owner, fix, gain, None, risk,
                           f"the baseline is run {run.id}: compare a new run against it (opmap compare)"))
        ratio = m.get("predicted_over_measured")
        if ratio is not None and not BAND[0] <= ratio <= BAND[1]:
            out.append(Finding(f"{name}: predicted / measured {ratio:.2f}, outside {BAND[0]}-{BAND[1]}",
                               "performance modelling", "recalibrate (opmap calibrate) and look at the layer type's "
                               "kernels in the profile sheet", None, None, "low: the model only",
                               "keep the current calibration file"))
    return out


def pitfalls(run: Run, production_compared: bool | dict[str, Any]) -> list[Check]:
    """The field's pitfalls as checks. ``production_compared``: the newest production-shape check of this run
    (``opmap compare RUN --production P``: its payload with its ``run`` id), else True where another shape of the
    workload is in the store, False where neither is."""
    p = run.payload
    a = p.get("assumptions") if isinstance(p.get("assumptions"), dict) else {}
    lat = p.get("latency") if isinstance(p.get("latency"), dict) else {}
    out = [Check("averages without p95 / p99",
                 ("ok: p50 / p95 / p99 over " + str(lat.get("n")) + " runs") if "p99_s" in lat else
                 "flag: a predicted run has no distribution; measure it (opmap profile) before quoting a latency")]
    evidence = str(a.get("precision_evidence", ""))
    out.append(Check("precision without quality evidence",
                     "flag: " + evidence if evidence.startswith("unverified") else "ok: " + (evidence or "-")))
    cal = p.get("calibration_check")
    if cal is None:
        verdict = "ok: a catalog device, no calibration involved" if run.kind == "analyze" else "flag: no check"
    else:
        ratio = cal.get("ratio")
        drifted = cal.get("drifted") if "drifted" in cal else (ratio is not None and abs(ratio - 1) > 0.1)
        verdict = (("flag: " if drifted else "ok: ") + f"{cal.get('what', 'the calibration check')}: now / calibrated "
                   + (f"{ratio:.2f}" if ratio is not None else "-") + " (a drift beyond 10% flags)")
    out.append(Check("calibration older than the runtime or drifted", verdict))
    synthetic = ".py:" in str(run.tags.get("workload", ""))  # a user's file: a slice, not the product
    if isinstance(production_compared, dict):
        c = production_compared
        cls = [x for x in c.get("classes", []) if x.get("production_kernels")]
        text = (f"shape check {c.get('run')} against production run {c.get('production')}: "
                + (", ".join(f"{x['class']} {x['verdict']} ({x['represented_share_of_class']:.0%} of the class's "
                             "production time represented)" for x in cls) or "no kernel class in common"))
        verdict = ("ok: " if cls and all(x["verdict"] == "carries over" for x in cls) else "flag: ") + text
    elif synthetic:
        verdict = ("flag: a synthetic slice never checked against the production workload's kernels (opmap "
                   "compare RUN --production PROD)")
    else:
        verdict = ("ok: the workload itself, and another of its shapes is in the store" if production_compared else
                   "flag: one shape of the workload only; sweep the production range (opmap sweep) before "
                   "generalising")
    out.append(Check("synthetic shapes without production-shape validation", verdict))
    return out


KERNEL_KINDS = ("analyze", "profile")


def memo_parts(run: Run, production_compared: bool | dict[str, Any] = False,
               fusion_gain_s: float | None = None, format_step: tuple[str, float] | None = None
               ) -> tuple[list[Finding], list[Check]]:
    """(findings, pitfall checks) of a run of any kind; the keyword arguments serve analyze and profile runs."""
    from opmap.errors import OpmapError
    from opmap.report.memo_kinds import KINDS

    if run.kind in KERNEL_KINDS:
        return findings(run, fusion_gain_s, format_step), pitfalls(run, production_compared)
    if run.kind not in KINDS:
        raise OpmapError(f"no memo rules for a {run.kind} run; accepted kinds: "
                         + ", ".join((*KERNEL_KINDS, *KINDS)))
    fs, pits = KINDS[run.kind]
    return fs(run), pits(run)


def _title(tags: dict[str, Any], kind: str) -> str:
    """The memo's heading: workload on hardware (phase, precision), each part only where the run has it (a bench
    run names a served model and an endpoint, not a phase: "(bench, None)" was printed)."""
    what = " on ".join(str(tags[k]) for k in ("workload", "hardware") if tags.get(k)) or f"a {kind} run"
    how = ", ".join(str(tags[k]) for k in ("phase", "precision") if tags.get(k))
    return what + (f" ({how})" if how else "")


def memo_markdown(run: Run, fs: list[Finding], pits: list[Check], command: str,
                  folder: bool = False) -> str:
    """The memo as Markdown; ``folder``: the run is an output folder (its ``id``), not a stored run. Every text
    that holds a value of the run (a model id from a server, an imported tag, a folder's name) is written as
    Markdown text (report.text.md: one line, no heading, link, image or HTML), the command as one code span."""
    from opmap.report.text import md, md_code

    t = run.tags
    when = run.time_utc  # a folder's or an imported run's may be unknown: left out, never "None"
    where = (f"the {run.kind} output in {run.id}" + (f" ({when})" if when else "") if folder else
             f"run {run.id} ({', '.join(str(x) for x in (run.kind, when) if x)}) in the run store")
    title = _title(t, run.kind)
    lines = [f"# Closure memo: {md(title)}", "",
             f"Evidence: {md(where)}; reproduce with {md_code(t.get('command') or command)}.", "", "## Findings", "",
             "| finding | owner | fix | expected gain | rollback boundary | risk |", "|---|---|---|---|---|---|"]
    for f in fs:
        g = f.expected_gain or ("-" if f.expected_gain_s is None else
                                f"{f.expected_gain_s * 1e3:.3g} ms (from the model)")
        cells = (f.finding, f.owner, f.fix, g, f.rollback, f.risk)
        lines.append("| " + " | ".join(md(c) for c in cells) + " |")
    if not fs:
        empty = ("no layer type holds 10% of the time" if run.kind in KERNEL_KINDS else
                 f"nothing in this {run.kind} result calls for a fix")
        lines.append(f"| {md(empty)} | - | - | - | - | - |")
    lines += ["", "## Pitfall checks", ""] + [f"- {md(c.check)}: {md(c.verdict)}" for c in pits]
    return "\n".join(lines) + "\n"


def memo_json(run: Run, fs: list[Finding], pits: list[Check]) -> str:
    """memo.json's text (schema 1): the run, its kind, the findings and the pitfall checks. A kernel run's findings
    (analyze, profile) have no ``expected_gain`` key: their gain is in seconds only (schema 1 as written)."""
    from opmap.validate import json_text

    kernel = run.kind in KERNEL_KINDS
    found = [{k: v for k, v in asdict(f).items() if not (kernel and k == "expected_gain")} for f in fs]
    return json_text({"schema_version": 1, "run": run.id, "kind": run.kind, "findings": found,
                      "pitfalls": [asdict(c) for c in pits]}, indent=1)
