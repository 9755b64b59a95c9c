"""The profile report: the analyze sheet with measured columns, the run-level figures with their methods.

Files: profile.json (analysis.json plus measured blocks), sheet.csv and sheet.md (measured columns added),
trace.json (Perfetto: measured and predicted tracks, node ids in the args) and torch_trace.json (the
profiler's own trace with the telemetry tags), written together as one set.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from opmap.measure.profile import Profile
from opmap.record import record
from opmap.report.sheet import (
    SHEET_COLUMNS,
    assumption_lines,
    cell,
    op_label,
    shapes,
    sheet_rows,
    si,
    to_csv,
    write_set,
)
from opmap.report.text import clean, safe
from opmap.validate import json_text

MEASURED_COLUMNS = ("measured_s", "predicted_over_measured", "achieved_flops_per_s", "achieved_bytes_per_s",
                    "compute_busy_s", "memory_stall_s", "other_s")
# The unit each measured column renders with (rates are per second, not seconds).
MEASURED_UNITS = {"measured_s": "s", "achieved_flops_per_s": "FLOP/s", "achieved_bytes_per_s": "B/s",
                  "compute_busy_s": "s", "memory_stall_s": "s", "other_s": "s"}


def profile_rows(p: Profile) -> list[dict]:
    rows = sheet_rows(p.analysis)
    for i, row in enumerate(rows):
        m = p.measured_block(i)
        for k in MEASURED_COLUMNS:
            row[k] = getattr(m, k) if m is not None else ""
    return rows


def render_profile_csv(p: Profile) -> str:
    return to_csv(SHEET_COLUMNS + MEASURED_COLUMNS, profile_rows(p))


def _ratio(x) -> str:
    return "-" if x is None or x == "" else f"{x:.2f}"


def run_lines(p: Profile, d: dict) -> list[str]:
    lat, prof, mfu, en, acc = d["latency"], d["profiler"], d["mfu"], d["energy"], d["accuracy"]
    lines = [
        f"latency ({lat['mode']}, n={lat['n']}, warm-up {lat['warmup']}): p50 {si(lat['p50_s'], 's')}  "
        f"p95 {si(lat['p95_s'], 's')}  p99 {si(lat['p99_s'], 's')}  mean {si(lat['mean_s'], 's')}  "
        f"std {si(lat['std_s'], 's')}  [{lat['method']}]",
        f"predicted {si(acc['predicted_s'], 's')}: predicted / measured = {_ratio(acc['predicted_over_measured'])}",
        f"{mfu['formula']}",
        f"  calibrated peak {si(mfu['calibrated']['peak_flops_per_s'], 'FLOP/s')} [{mfu['calibrated']['kind']}]: "
        f"MFU {mfu['calibrated']['mfu']:.1%}",
    ]
    ds = mfu["datasheet"]
    if ds.get("mfu") is not None:
        lines.append(f"  datasheet peak {si(ds['peak_flops_per_s'], 'FLOP/s')} ({ds['hardware']}, {ds['kind']}): "
                     f"MFU {ds['mfu']:.1%}")
    else:
        lines.append(f"  datasheet MFU: not computed ({ds['why']})")
    lines.append(f"  HFU: {mfu['hfu']['why']}")
    noise = (" (within noise: profiled iterations ran faster than the plain ones)" if prof["overhead"] < 0
             else "")
    lines.append(f"profiler: {prof['iterations']} iterations, overhead {prof['overhead']:+.1%} against the plain "
                 f"loop{noise}, {prof['coverage']:.0%} of kernels matched, {si(prof['unattributed_s'], 's')} per "
                 f"iteration between ops (unattributed)")
    if en["joules"] is not None:
        lines.append(f"energy: {en['joules']:.3g} J over {en['seconds']:.3g} s, {en['average_w']:.3g} W average, "
                     f"{si(en.get('flops_per_joule', 0), 'FLOP/J')} [{en['method']}]")
    else:
        lines.append(f"energy: {en['method']}")
    lines.append(f"stall fractions: {d['stall_fraction']['method']}")
    chk = d.get("calibration_check")
    if chk:
        lines.append(f"calibration check: {chk['what']} runs at {chk['ratio']:.2f}x its calibrated rate now"
                     + ("" if chk["within_tolerance"] else
                        f" (beyond ±{chk['tolerance']:.0%}: the device is loaded or throttled, or changed since "
                        "calibration; predictions scale with it: recalibrate on a quiet device)"))
    opt = d.get("optimizer")
    if opt:
        lines.append(f"optimizer: {opt['name']} in the prediction and the measured step; its state "
                     f"{si(opt['predicted_state_bytes'], 'B')} predicted, {si(opt['measured_state_bytes'], 'B')} "
                     "held in the run")
    lines += [f"warning: {w}" for w in d.get("warnings", ())]
    return lines


def render_profile_markdown(p: Profile, d: dict) -> str:
    out = [f"# opmap profile: {p.analysis.workload} on {p.device_name}", "", "## Assumptions", ""]
    out += [f"- {line}" for line in assumption_lines(p.analysis)]
    out += ["", "## Run", ""] + [f"- {line.strip()}" for line in run_lines(p, d)]
    out += ["", "## Layer types", "", "| layer type | measured | share | predicted | predicted / measured | "
            "compute-busy | memory-stall | other |", "|---|---|---|---|---|---|---|---|"]
    for lt, s in d["layer_types"].items():
        m = s.get("measured")
        if not m:
            continue
        out.append(f"| {lt} | {si(m['measured_s'], 's')} | {m['share_of_measured']:.1%} | {si(m['predicted_s'], 's')} "
                   f"| {_ratio(m['predicted_over_measured'])} | {m['compute_busy']:.0%} | {m['memory_stall']:.0%} | "
                   f"{m['other']:.0%} |")
    cols = SHEET_COLUMNS + MEASURED_COLUMNS
    out += ["", "## Mapping sheet with measurements", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in profile_rows(p):
        cells = []
        for k, v in row.items():
            if k in MEASURED_COLUMNS:
                cells.append("" if v == "" else f"{v:.2f}" if k == "predicted_over_measured" else
                             si(v, MEASURED_UNITS[k]))
            else:
                cells.append(cell(k, v))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def print_profile_report(p: Profile, console: Console, rows: int = 25, d: dict | None = None) -> None:
    d = d or p.to_dict()
    a = p.analysis
    console.print(f"[bold]opmap profile[/bold] {safe(a.workload)} on {safe(p.device_name)} ({safe(p.device)}), "
                  f"predicted with {safe(a.hardware.name)}")
    for line in assumption_lines(a) + run_lines(p, d):
        console.print(f"  {clean(line)}", highlight=False, markup=False)
    measured = sorted(((i, t) for i, t in p.attribution.timings.items()), key=lambda it: -it[1].median_s)
    shown = measured if rows <= 0 else measured[:rows]
    t = Table(title=f"Nodes by measured time: {len(shown)} of {len(measured)} matched (all rows in sheet.csv)",
              title_justify="left")
    for col, just in (("id", "right"), ("op", "left"), ("layer type", "left"), ("shapes", "left"),
                      ("measured", "right"), ("predicted", "right"), ("pred/meas", "right"),
                      ("achieved", "right"), ("bandwidth", "right"), ("bound", "left")):
        t.add_column(col, justify=just, overflow="fold")
    for i, _ in shown:
        r = a.results[i]
        m = p.measured_block(i)
        t.add_row(str(r.node.id), op_label(r.node.op), r.node.layer_type, shapes(r), si(m.measured_s, "s"),
                  si(r.pred.predicted_s, "s"), _ratio(m.predicted_over_measured),
                  si(m.achieved_flops_per_s, "FLOP/s"), si(m.achieved_bytes_per_s, "B/s"), r.pred.bound)
    console.print(t)
    lt = Table(title="Layer types: measured against predicted, memory-stall fraction (roofline-estimated)",
               title_justify="left")
    for col in ("layer type", "measured", "share", "predicted", "pred/meas", "compute-busy", "memory-stall", "other"):
        lt.add_column(col, justify="left" if col == "layer type" else "right")
    by_measured = sorted(((n, s) for n, s in d["layer_types"].items() if s.get("measured")),
                         key=lambda kv: -kv[1]["measured"]["measured_s"])
    for name, s in by_measured:
        m = s["measured"]
        lt.add_row(name, si(m["measured_s"], "s"), f"{m['share_of_measured']:.1%}", si(m["predicted_s"], "s"),
                   _ratio(m["predicted_over_measured"]), f"{m['compute_busy']:.0%}", f"{m['memory_stall']:.0%}",
                   f"{m['other']:.0%}")
    console.print(lt)


def write_profile_outputs(p: Profile, out_dir: Path, d: dict | None = None) -> list[Path]:
    from opmap.report.trace import chrome_trace, tagged_torch_trace_json

    d = d or p.to_dict()
    contents = {
        "profile.json": json_text(d, indent=1) + "\n",
        "sheet.csv": render_profile_csv(p),
        "sheet.md": render_profile_markdown(p, d),
        "trace.json": json_text(record(chrome_trace(p))) + "\n",
    }
    raw = tagged_torch_trace_json(p)
    if raw is not None:
        contents["torch_trace.json"] = raw + "\n"
    return write_set(out_dir, contents, remove=["torch_trace.json"])  # an earlier run's trace never stays
