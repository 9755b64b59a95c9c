"""The mapping sheet: rich tables in the terminal; sheet.csv, sheet.md and analysis.json on disk.

Files are written as one set (report.outputs.write_set: a temporary folder, then renamed into place, never
through a symbolic link), so a failure never leaves a half-written or mixed set behind. User strings (module
names, the workload's name) are printed as text (report.text): never read as markup, controls removed.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from opmap.analyze import Analysis, NodeResult
from opmap.assumptions import Assumptions
from opmap.phases.result import TrainStep
from opmap.record import record
from opmap.report.outputs import check_out_dir as check_out_dir  # re-exported: the commands import them here
from opmap.report.outputs import write_set as write_set
from opmap.report.text import clean, plain, safe
from opmap.validate import json_text

_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""))


def si(x: float, unit: str = "", digits: int = 3) -> str:
    """SI rendering: 38.65e9 -> '38.7 G'. Seconds go down to ns. A figure that is not a finite number is named
    as such ('not finite (inf)'), never rendered as if it were a value ('inf s')."""
    if not math.isfinite(x):
        return f"not finite ({x})"
    if x == 0:
        return f"0 {unit}".strip()
    if unit == "s":
        for scale, p in ((1.0, ""), (1e-3, "m"), (1e-6, "µ"), (1e-9, "n")):
            if abs(x) >= scale:
                return f"{x / scale:.{digits}g} {p}s"
        return f"{x / 1e-9:.{digits}g} ns"
    for scale, p in _PREFIXES:
        if abs(x) >= scale:
            return f"{x / scale:.{digits}g} {p}{unit}".strip()
    return f"{x:.{digits}g} {unit}".strip()


def shapes(r: NodeResult) -> str:
    ins = ",".join("x".join(map(str, t.shape)) or "scalar" for t in r.node.inputs)
    outs = ",".join("x".join(map(str, t.shape)) or "scalar" for t in r.node.outputs)
    return f"{ins} -> {outs}"


def op_label(op: str) -> str:
    """'aten.addmm.default' -> 'addmm'; other overloads stay ('add.Tensor')."""
    return op.removeprefix("aten.").removesuffix(".default")


SHEET_COLUMNS = ("id", "op", "module", "layer_type", "shapes", "dtype", "flops", "matrix_flops", "bytes",
                 "intensity", "predicted_s", "bound", "limiter")


def sheet_rows(a: Analysis) -> list[dict]:
    rows = []
    for r in a.results:
        dt = r.node.outputs[0].dtype if r.node.outputs else ""
        rows.append({
            "id": r.node.id, "op": r.node.op.removeprefix("aten."), "module": r.node.module,
            "layer_type": r.node.layer_type, "shapes": shapes(r), "dtype": dt, "flops": r.cost.flops,
            "matrix_flops": r.cost.matrix_flops, "bytes": r.cost.bytes, "intensity": r.cost.intensity,
            "predicted_s": r.pred.predicted_s, "bound": r.pred.bound, "limiter": r.pred.limiter,
        })
    return rows


KERNEL_COLUMNS = ("id", "nodes", "ops", "kernel_class", "tile", "runner_up_tile", "sram_bytes", "tiles", "waves",
                  "tile_efficiency", "wave_efficiency", "feed_efficiency", "format", "layout", "min_bytes",
                  "traffic_bytes", "predicted_s", "bound", "why")


def kernel_rows(a: Analysis) -> list[dict]:
    rows = []
    for k in a.kernel_results:
        d = record(k)
        d["ops"] = "+".join(op_label(a.results[i].node.op) for i in k.kernel.nodes)
        d["nodes"] = " ".join(map(str, k.kernel.nodes))
        d["tile"] = k.tile.label() if k.tile else ""
        d["runner_up_tile"] = k.runner_up.label() if k.runner_up else ""
        rows.append({c: ("" if d.get(c) is None else d.get(c)) for c in KERNEL_COLUMNS})
    return rows


def to_csv(columns, rows: list[dict]) -> str:
    """Rows as CSV text with a header, in the order of ``columns``."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def render_kernels_csv(a: Analysis) -> str:
    return to_csv(KERNEL_COLUMNS, kernel_rows(a))


def render_csv(a: Analysis) -> str:
    return to_csv(SHEET_COLUMNS, sheet_rows(a))


def _rate_text(s: Assumptions) -> str:
    r = s.matrix_rate_flops_per_s
    if r.kind == "dense peak":
        return ""
    return f", run at {si(r.value, 'FLOP/s')} ({r.of_peak:.0%} of peak, {r.kind})"


def assumption_lines(a: Analysis) -> list[str]:
    s = a.assumptions
    mp, bw, lo = s.matrix_peak_flops_per_s, s.memory_bandwidth_bytes_per_s, s.launch_overhead_s
    lines = [
        f"workload {s.workload}  batch {s.batch}  seq {s.seq}  dtype {s.dtype} "
        f"(weights {s.weights_dtype}, activations {s.activations_dtype}, accumulate {s.accumulate_dtype})",
        f"hardware {s.hardware} ({s.hardware_display_name}): matrix peak {si(mp.value, 'FLOP/s')} "
        f"[{s.matrix_dtype}, {mp.kind}]" + _rate_text(s)
        + f", bandwidth {si(bw.value, 'B/s')} [{bw.kind}], launch overhead {si(lo.value, 's')} [{lo.kind}]",
        f"time model: {s.time_model}" + ("" if "transcendental/rate" in s.time_model else
                                         f"; transcendental = {s.transcendental_slots:g} vector slots"),
        *([s.runtime_line] if s.runtime_line else []),
        *([s.confidence.line] if s.confidence is not None else []),
        f"fusion: {s.fusion_policy}; tiling: {s.tiling}; captured on {s.capture_device}",
        f"torch {s.torch_version}, opmap {s.opmap_version}, python {s.python_version}",
    ]
    if s.dtype_resolution:  # an alias (--dtype fp4) resolved on this device: the format used and why
        lines.insert(1, f"dtype: --dtype {s.dtype_requested} -> {s.dtype}: {s.dtype_resolution}")
    ph = a.phase_figures
    if ph is not None and ph.text:
        lines.append("phase: " + ph.text)
    if isinstance(ph, TrainStep):
        lines.append("phase: " + ph.mfu_definition)
        if ph.recompute_note:
            lines.append("phase: recompute " + ph.recompute_note)
    lines.append("memory: " + a.memory_text)
    if s.precision_note:
        lines.append("precision: " + s.precision_note)
    lines += [f"fp8: {n}" for n in (s.fp8_training.notes if s.fp8_training is not None else ())]
    if s.fp8_inference:
        lines.append("fp8: " + s.fp8_inference)
    if s.moe_grid:  # the MoE layers priced off the device's measured MoE grid (opmap.mapping.moe_measured)
        lines.append("moe: " + s.moe_grid)
    if s.precision_evidence:
        lines.append("precision evidence: " + s.precision_evidence)
    lines += [f"note: {n}" for n in s.workload_notes + s.capture_notes]
    if s.layer_type_overrides:
        lines.append("layer-type overrides: " + ", ".join(s.layer_type_overrides))
    return lines


def render_markdown(a: Analysis) -> str:
    d = {"totals": a.totals_dict(), "layer_types": a.layer_types_dict(), "uncounted": a.uncounted}
    t = d["totals"]
    out = [f"# opmap analysis: {a.workload} on {a.hardware.name}", "", "## Assumptions", ""]
    out += [f"- {line}" for line in assumption_lines(a)]
    out += ["", "## Totals", "", "| params | FLOPs | matrix FLOPs | bytes | kernels | predicted latency | "
            "predicted MFU |", "|---|---|---|---|---|---|---|",
            f"| {si(t['params'])} | {si(t['flops'])} | {si(t['matrix_flops'])} | {si(t['bytes'], 'B')} | "
            f"{t['kernels']} | {si(t['predicted_latency_s'], 's')} | {t['predicted_mfu']:.1%} |", ""]
    out += ["## Layer types", "", "| layer type | nodes | FLOPs share | bytes share | time share | bound |",
            "|---|---|---|---|---|---|"]
    for lt, s in d["layer_types"].items():
        out.append(f"| {lt} | {s['nodes']} | {_share(s['flops'], t['flops'])} | {_share(s['bytes'], t['bytes'])} | "
                   f"{s['share_of_time']:.1%} | {s['bound']} |")
    if d["uncounted"]:
        out += ["", "## Uncounted ops (no cost rule)", ""] + [f"- {op}: {n}" for op, n in d["uncounted"].items()]
    if a.plan is not None:
        f = a.plan.to_dict()
        out += ["", "## Kernels", "", f"{f['kernels']} kernels under {f['policy']} ({f['eager_kernels']} eager); "
                f"{si(f['bytes_saved'], 'B')} and {f['launches_saved']} launches saved", "",
                "| " + " | ".join(KERNEL_COLUMNS) + " |", "|" + "---|" * len(KERNEL_COLUMNS)]
        for row in kernel_rows(a):
            out.append("| " + " | ".join(_kcell(k, v) for k, v in row.items()) + " |")
    if a.sharded is not None:
        out += ["", "## Parallelism and collectives", "", parallelism_line(a.sharded), "",
                "| collective | purpose | phase | count | message | group | link | algorithm | predicted (one) |",
                "|---|---|---|---|---|---|---|---|---|"]
        for c in a.sharded.collectives:
            out.append(f"| {c.collective.kind} | {c.purpose} | {c.stage} | {c.count} | "
                       f"{si(c.collective.message_bytes, 'B')} | {c.collective.group_size} | {c.link} | "
                       f"{c.algorithm} | {si(c.predicted_s, 's')} |")
    out += ["", "## Operators", "", "| " + " | ".join(SHEET_COLUMNS) + " |",
            "|" + "---|" * len(SHEET_COLUMNS)]
    for row in sheet_rows(a):
        cells = [cell(k, v) for k, v in row.items()]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def _kcell(key: str, v) -> str:
    if v == "":
        return ""
    if key in ("min_bytes", "traffic_bytes", "sram_bytes"):
        return si(v, "B")
    if key == "predicted_s":
        return si(v, "s")
    if key in ("tile_efficiency", "wave_efficiency", "feed_efficiency"):
        return f"{v:.0%}"
    return str(v).replace("|", "\\|")


def _share(x: float, total: float) -> str:
    return f"{x / total:.1%}" if total else "-"


def cell(key: str, v) -> str:
    if key in ("flops", "matrix_flops"):
        return si(v)
    if key == "bytes":
        return si(v, "B")
    if key == "predicted_s":
        return si(v, "s")
    if key == "intensity":
        return f"{v:.3g}"
    return str(v).replace("|", "\\|")


def parallelism_line(s) -> str:
    p = s.parallelism
    what = "iteration" if s.training else "batch"
    return (f"{p.label()} on {p.devices} devices: {p.microbatches} microbatches, bubble {s.bubble_fraction:.1%}, "
            f"slowest stage {si(s.microbatch_s, 's')} per microbatch, {what} {si(s.step_s, 's')}, "
            f"{si(s.tokens_per_s)} tokens/s")


def collective_table(s) -> Table:
    """The collective kernels of a layout (class collective, bound interconnect)."""
    t = Table(title="Collectives (class collective, bound interconnect): " + parallelism_line(s), title_justify="left")
    for col in ("collective", "purpose", "phase", "count", "message", "group", "link", "algorithm", "predicted"):
        t.add_column(col, justify="right" if col in ("count", "message", "group", "predicted") else "left")
    for c in s.collectives:
        t.add_row(c.collective.kind, c.purpose, c.stage, str(c.count), si(c.collective.message_bytes, "B"),
                  str(c.collective.group_size), c.link, c.algorithm, si(c.predicted_s, "s"))
    return t


# Past this many rows a rich Table (which measures every cell to lay the table out) takes minutes: DeepSeek-R1's
# 64,936 kernels and 142,806 operators under --rows 0 took 325 s and 3 GB on a 2-core host. Longer tables print
# as plain fixed-width lines, one write per row, in a time linear in the rows.
RICH_ROWS = 2000
PAD_MAX = 60


def print_rows(console: Console, title: str, columns: tuple[str, ...], right: set[str], rows: list[tuple]) -> None:
    """One table of text cells (each cleaned of controls, never read as markup): a rich Table up to RICH_ROWS
    rows, else a title line, a header and a line per row, columns padded to their widest cell (at most PAD_MAX)."""
    cells = [tuple(clean(c) for c in row) for row in rows]
    if len(cells) <= RICH_ROWS:
        t = Table(title=plain(title), title_justify="left")
        for col in columns:
            t.add_column(col, overflow="fold", justify="right" if col in right else "left")
        for row in cells:
            t.add_row(*map(Text, row))
        console.print(t)
        return
    # columns padded to their widest cell up to PAD_MAX characters: a longer cell runs on, its row alone shifted
    widths = [min(PAD_MAX, max([len(col)] + [len(row[i]) for row in cells])) for i, col in enumerate(columns)]

    def line(row) -> str:
        return "  ".join(c.rjust(w) if col in right else c.ljust(w)
                         for c, w, col in zip(row, widths, columns)).rstrip()

    out = console.file
    out.write(clean(title) + "\n" + line(columns) + "\n")
    for row in cells:
        out.write(line(row) + "\n")
    out.flush()


def print_report(a: Analysis, console: Console, rows: int = 25) -> None:
    # analysis.json's blocks the sheet prints, without its node and kernel rows (DeepSeek-R1: 142,806 nodes)
    d = {"totals": a.totals_dict(), "layer_types": a.layer_types_dict(), "uncounted": a.uncounted}
    t = d["totals"]
    console.print(f"[bold]opmap analyze[/bold] {safe(a.workload)} on {safe(a.hardware.display_name)}")
    for line in assumption_lines(a):
        console.print(f"  {clean(line)}", highlight=False, markup=False)

    if a.kernel_results:
        ks = sorted(a.kernel_results, key=lambda k: -k.predicted_s)
        kshown = ks if rows <= 0 else ks[:rows]
        f = a.plan.to_dict()
        title = (f"Kernels ({f['policy']}): {len(kshown)} of {f['kernels']} by predicted time; "
                 f"{f['eager_kernels']} eager, {si(f['bytes_saved'], 'B')} and {f['launches_saved']} "
                 "launches saved (all rows in kernels.csv)")
        cols = ("id", "ops", "module", "class", "tile", "SRAM", "waves", "format", "layout", "bytes", "traffic",
                "predicted", "bound", "why")
        body = []
        for k in kshown:
            tl = k.tile
            body.append((
                str(k.kernel.id), "+".join(op_label(a.results[i].node.op) for i in k.kernel.nodes),
                a.results[k.kernel.anchor].node.module or "-", k.kernel.kernel_class, tl.label() if tl else "-",
                si(tl.sram_bytes, "B") if tl else "-", f"{tl.waves} ({tl.wave_efficiency:.0%})" if tl else "-",
                k.format, k.layout, si(k.kernel.min_bytes, "B"), si(k.traffic_bytes, "B"), si(k.predicted_s, "s"),
                k.bound, k.why))
        print_rows(console, title, cols, {"id", "bytes", "traffic", "predicted"}, body)
    if a.sharded is not None:
        console.print(collective_table(a.sharded))
    ranked = sorted((r for r in a.results if r.cost.kernel), key=lambda r: -r.pred.predicted_s)
    shown = ranked if rows <= 0 else ranked[:rows]
    n_kernel_nodes = sum(1 for r in a.results if r.cost.kernel)
    title = (f"Operators: {len(shown)} of {n_kernel_nodes} by predicted time "
             f"({len(a.results) - n_kernel_nodes} views and allocations; all rows in sheet.csv)")
    cols = ("id", "op", "module", "layer type", "shapes", "FLOPs", "bytes", "FLOP/B", "predicted", "bound")
    body = [(str(r.node.id), op_label(r.node.op), r.node.module or "-", r.node.layer_type, shapes(r),
             si(r.cost.flops), si(r.cost.bytes, "B"), f"{r.cost.intensity:.3g}", si(r.pred.predicted_s, "s"),
             r.pred.bound) for r in shown]
    print_rows(console, title, cols, {"id", "FLOPs", "bytes", "FLOP/B", "predicted"}, body)

    lt = Table(title="Layer types", title_justify="left")
    for col in ("layer type", "nodes", "FLOPs", "share", "bytes", "share", "predicted", "share", "bound"):
        lt.add_column(col, justify="left" if col in ("layer type", "bound") else "right")
    for name, s in d["layer_types"].items():
        lt.add_row(plain(name), str(s["nodes"]), si(s["flops"]), _share(s["flops"], t["flops"]), si(s["bytes"], "B"),
                   _share(s["bytes"], t["bytes"]), si(s["predicted_s"], "s"), f"{s['share_of_time']:.1%}",
                   s["bound"])
    console.print(lt)

    tot = Table(title="Totals", title_justify="left", show_header=False)
    tot.add_column("what")
    tot.add_column("value", justify="right")
    for k, v in (("parameters", si(t["params"])), ("FLOPs", si(t["flops"])),
                 ("matrix FLOPs", si(t["matrix_flops"])),
                 ("vector / transcendental FLOPs", f"{si(t['vector_flops'])} / {si(t['transcendental_flops'])}"),
                 ("MACs", si(t["macs"])),
                 ("bytes (min)", si(t["bytes"], "B")),
                 ("kernels / nodes", f"{t['kernels']} / {t['nodes']}"),
                 # the one headline (Analysis.headline): the phase line and analysis.json print the same number
                 (f"predicted {t['predicted_latency_name']}", si(t["predicted_latency_s"], "s")),
                 ("predicted MFU", f"{t['predicted_mfu']:.1%}"),
                 ("ridge point", f"{t['ridge_point_flops_per_byte']:.0f} FLOP/B")):
        tot.add_row(k, v)
    if t["skipped_flops"]:
        tot.add_row("causal attention FLOPs skipped", si(t["skipped_flops"]))
    console.print(tot)
    if d["uncounted"]:
        console.print("[yellow]uncounted ops (no cost rule, launch overhead only):[/yellow] "
                      + ", ".join(f"{safe(op)} x{n}" for op, n in d["uncounted"].items()))
    else:
        console.print("every op has a cost rule (0 uncounted)")


def write_outputs(a: Analysis, out_dir: Path) -> list[Path]:
    """Write sheet.csv, sheet.md and analysis.json into ``out_dir``, atomically per file and as a set."""
    return write_set(out_dir, {
        "analysis.json": json_text(a.to_dict(), indent=1) + "\n",
        "sheet.csv": render_csv(a),
        "sheet.md": render_markdown(a),
        "kernels.csv": render_kernels_csv(a),
    })
