"""Speed of `opmap fit` over the 2026 datacenter accelerators (issue 37): llama-3-8b, llama-3-70b and llama-3.1-405b
on b200, b300, gb200, gb300, h200-nvl, rtx-pro-6000, mi325x, mi350x, mi355x, tpu-v6e, tpu-v7 and trn2 (36 cells;
``--baseline`` adds h200 and h100-sxm) at one SLO, p99 TTFT 2 s and p99 TPOT 100 ms, prompts of 512 and outputs of
128 tokens, bf16, each platform's default budget (one node: ``opmap.explore.layouts.default_budget``). Goal: under
60 s on a 2-core machine, with progress. Prints a table, writes results/fit_2026.json.

Each repeat runs the CLI in a fresh process, as a user does (`opmap fit --models ... --hardware ... --slo-ttft 2000
--slo-tpot 100 --no-store --out DIR`); its progress bar (rich, on stderr) goes to this terminal. Recorded per run:
the wall time, the CPU time it used (user + sys of the child and its pool workers: on a shared machine the wall
time carries the other processes' load, the CPU time much less of it), the one-minute load average at the start,
and from the fit.json it wrote each cell's chosen layout, its output tokens/s per device and p99, or why the cell
has none (no layout fits in memory, no rate meets the SLO). Each repeat runs twice: with the user's capture cache
as it stands (warm: a first run fills it) and with an empty one (cold: every model built and captured again).
``--per-cell`` also runs each cell alone, inline in this process (no pool), and records its CPU time: where a fit's
time goes. ``--src`` times another checkout's source (the before of a change).

    PYTHONPATH=src python benchmarks/fit_2026.py [--repeats 1] [--per-cell] [--baseline] [--src DIR] [--tag after]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, now_iso, timed_fit, write_json  # noqa: E402

GOAL_S = 60.0
CORES = 2  # the machine the goal names
MODELS = ["llama-3-8b", "llama-3-70b", "llama-3.1-405b"]
HARDWARE = ["b200", "b300", "gb200", "gb300", "h200-nvl", "rtx-pro-6000", "mi325x", "mi350x", "mi355x", "tpu-v6e",
            "tpu-v7", "trn2"]
BASELINE = ["h200", "h100-sxm"]
SLO_TTFT_MS, SLO_TPOT_MS = 2000.0, 100.0


def _label(lay: dict | None) -> str:
    if not lay:
        return "-"
    return f"{lay['replicas']} x tp{lay['tp']}" + (f" pp{lay['pp']}" if lay["pp"] > 1 else "")


def cells_of(fit: dict) -> dict[str, dict]:
    """Per cell: the chosen layout, its output tokens/s per device and p99 end to end, or why it has none."""
    return {f"{c['model']} on {c['hardware']}": {
        "layout": _label(c.get("layout")), "tokens_per_s_per_device": c.get("throughput_per_device"),
        "p99_s": c.get("latency_p99_s"), "why_not": c.get("excluded_reason") or ""} for c in fit["cells"]}


def run_once(src: str, models: list[str], hardware: list[str], cold: bool) -> dict:
    r = timed_fit(src, ["--models", ",".join(models), "--hardware", ",".join(hardware), "--slo-ttft", str(SLO_TTFT_MS),
                        "--slo-tpot", str(SLO_TPOT_MS)], cold, progress=True)
    return {"cache": "cold" if cold else "warm", "wall_s": r["wall_s"], "cpu_s": r["cpu_s"],
            "load_1min": r["load_1min"], "cells": cells_of(r["fit"])}


def per_cell(models: list[str], hardware: list[str]) -> dict[str, float]:
    """Each cell alone, inline here (no pool): its CPU seconds (``time.process_time``)."""
    from opmap.explore.fit import CellJob, cell_task, default_policy
    from opmap.serve.capacity import CAPACITY_REQUESTS
    from opmap.serve.metrics import Slo

    slo, out = Slo(SLO_TTFT_MS / 1e3, SLO_TPOT_MS / 1e3), {}
    for m in models:
        for h in hardware:
            t0 = time.process_time()
            cell_task(CellJob(m, h, slo, "512", "128", CAPACITY_REQUESTS, "bf16", None, None, None, 0,
                              policy=default_policy()))
            out[f"{m} on {h}"] = time.process_time() - t0
            print(f"  {m} on {h}: {out[f'{m} on {h}']:.2f} s CPU", file=sys.stderr, flush=True)
    return out


def _table(row: dict) -> None:
    runs = row["runs"]
    print("| run | cache | wall s | CPU s | CPU / 2 cores s | load (1 min) |\n|---|---|---|---|---|---|")
    for i, r in enumerate(runs, 1):
        print(f"| {i} | {r['cache']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['cpu_s'] / CORES:.1f} | "
              f"{r['load_1min']:.1f} |")
    cpu = row.get("per_cell_cpu_s") or {}
    print("\n| cell | chosen layout | tok/s per device | p99 s | CPU s alone |\n|---|---|---|---|---|")
    for k, c in runs[0]["cells"].items():
        tps = f"{c['tokens_per_s_per_device']:.4g}" if c["tokens_per_s_per_device"] else "-"
        p99 = f"{c['p99_s']:.2f}" if c["p99_s"] else "-"
        what = c["layout"] if c["layout"] != "-" else f"none: {c['why_not'][:90]}"
        print(f"| {k} | {what} | {tps} | {p99} | {cpu[k]:.1f} |" if k in cpu else f"| {k} | {what} | {tps} | {p99} | |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=1, help="runs with the cache warm, and as many cold")
    ap.add_argument("--src", default=str(Path(__file__).resolve().parents[1] / "src"))
    ap.add_argument("--tag", default="current")
    ap.add_argument("--baseline", action="store_true", help="add h200 and h100-sxm")
    ap.add_argument("--per-cell", action="store_true", help="also each cell alone, inline: its CPU time")
    args = ap.parse_args()
    hardware = HARDWARE + (BASELINE if args.baseline else [])
    runs = []
    for _ in range(args.repeats):
        runs += [run_once(args.src, MODELS, hardware, False), run_once(args.src, MODELS, hardware, True)]
    answers = {json.dumps(r["cells"], sort_keys=True) for r in runs}
    row = {"schema_version": 1, "date": now_iso(), "machine": machine(), "tag": args.tag, "src": args.src,
           "models": MODELS, "hardware": hardware, "slo": {"ttft_p99_ms": SLO_TTFT_MS, "tpot_p99_ms": SLO_TPOT_MS},
           "input_len": 512, "output_len": 128, "dtype": "bf16", "goal_s": GOAL_S, "cores": CORES,
           "cells": len(runs[0]["cells"]), "same_answers_every_run": len(answers) == 1, "runs": runs}
    for cache in ("warm", "cold"):
        w = [r["wall_s"] for r in runs if r["cache"] == cache]
        c = [r["cpu_s"] for r in runs if r["cache"] == cache]
        row[cache] = {"wall_median_s": statistics.median(w), "cpu_median_s": statistics.median(c),
                      "cpu_over_cores_s": statistics.median(c) / CORES}
    if args.per_cell:
        row["per_cell_cpu_s"] = per_cell(MODELS, hardware)
    _table(row)
    print(f"\nwarm: wall {row['warm']['wall_median_s']:.1f} s, CPU {row['warm']['cpu_median_s']:.1f} s; cold: wall "
          f"{row['cold']['wall_median_s']:.1f} s, CPU {row['cold']['cpu_median_s']:.1f} s (goal {GOAL_S:g} s on "
          f"{CORES} cores); same answers every run: {row['same_answers_every_run']}")
    stem = "fit_2026" + (f"_{args.tag}" if args.tag != "current" else "")
    print(f"wrote {write_json(stem, row)}")


if __name__ == "__main__":
    main()
