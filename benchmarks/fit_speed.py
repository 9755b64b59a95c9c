"""Speed of `opmap fit`: gpt2, llama-3-8b and llama-3-70b on h100-sxm, l4, mi300x and gaudi3 at p99 2 s end to end
(12 cells, issue 35; goal: under 60 s). Prints a table, writes JSON.

Each repeat runs the CLI in a fresh process, as a user does (`opmap fit --models ... --hardware ... --slo-p99 2000
--no-store --out DIR`), and records its wall time and the CPU time it used (user + sys of the child and its pool
workers: on a shared machine the wall time carries the other processes' load, the CPU time much less of it) with
the one-minute load average at the start; from the fit.json it wrote, the layouts each cell simulated (a capacity
search), pruned (its saturation bound under the runner-up's figure, or a request alone already over the SLO) or
skipped (does not fit in memory). The capture cache is the user's as it stands (``--cold``: an empty one each run,
every model built and captured again). ``--src`` times another checkout's source (the before of a change);
``--small`` runs gpt2 on two devices instead (a quick check).

    PYTHONPATH=src python benchmarks/fit_speed.py [--repeats 3] [--src /path/to/other/src] [--tag after] [--small]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, now_iso, timed_fit, write_json  # noqa: E402

GOAL_S = 60.0
FULL = (["gpt2", "llama-3-8b", "llama-3-70b"], ["h100-sxm", "l4", "mi300x", "gaudi3"])
SMALL = (["gpt2"], ["h100-sxm", "l4"])


def layouts(cells: list[dict]) -> dict[str, int]:
    """Layouts over every cell: searched (a capacity search run), pruned (not searched: bound or alone), skipped
    (no fit in memory or no pricing)."""
    n = {"layouts": 0, "searched": 0, "pruned": 0, "skipped": 0}
    for c in cells:
        for lay in c.get("layouts", []):
            n["layouts"] += 1
            if lay.get("limited_by") == "pruned" or str(lay.get("reason", "")).startswith("no rate meets the SLO: a "
                                                                                          "request of"):
                n["pruned"] += 1
            elif lay.get("capacity") is not None:
                n["searched"] += 1
            else:
                n["skipped"] += 1
    return n


def run_once(src: str, models: list[str], hardware: list[str], cold: bool) -> dict:
    r = timed_fit(src, ["--models", ",".join(models), "--hardware", ",".join(hardware), "--slo-p99", "2000"], cold)
    fit = r["fit"]
    chosen = {f"{c['model']} on {c['hardware']}": (c["layout"], c["throughput_per_device"]) for c in fit["cells"]}
    return {"wall_s": r["wall_s"], "cpu_s": r["cpu_s"], "load_1min": r["load_1min"], "cells": len(fit["cells"]),
            **layouts(fit["cells"]),
            "chosen": {k: {"layout": v[0] and {x: v[0][x] for x in ("tp", "pp", "replicas")},
                           "tokens_per_s_per_device": v[1]} for k, v in chosen.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--src", default=str(Path(__file__).resolve().parents[1] / "src"))
    ap.add_argument("--tag", default="current")
    ap.add_argument("--small", action="store_true", help="gpt2 on h100-sxm and l4 only")
    ap.add_argument("--cold", action="store_true", help="an empty capture cache each run")
    args = ap.parse_args()
    models, hardware = SMALL if args.small else FULL
    runs = [run_once(args.src, models, hardware, args.cold) for _ in range(args.repeats)]
    wall = [r["wall_s"] for r in runs]
    cpu = [r["cpu_s"] for r in runs]
    cells = runs[0]["cells"]
    row = {"schema_version": 1, "date": now_iso(), "machine": machine(), "tag": args.tag, "src": args.src,
           "models": models, "hardware": hardware, "slo_p99_ms": 2000, "cache": "cold" if args.cold else "as found",
           "goal_s": GOAL_S, "cells": cells, "wall_median_s": statistics.median(wall), "wall_min_s": min(wall),
           "wall_max_s": max(wall), "cpu_median_s": statistics.median(cpu), "cpu_min_s": min(cpu),
           "cpu_max_s": max(cpu), **{k: runs[0][k] for k in ("layouts", "searched", "pruned", "skipped")},
           "runs": runs}
    print("| tag | cells | wall median (min-max) s | s per cell | CPU median (min-max) s | layouts searched / pruned / "
          "skipped | load |\n|---|---|---|---|---|---|---|")
    print(f"| {args.tag} | {cells} | {row['wall_median_s']:.1f} ({min(wall):.1f}-{max(wall):.1f}) | "
          f"{row['wall_median_s'] / max(1, cells):.1f} | {row['cpu_median_s']:.1f} ({min(cpu):.1f}-{max(cpu):.1f}) | "
          f"{row['searched']} / {row['pruned']} / {row['skipped']} of {row['layouts']} | "
          f"{statistics.median(r['load_1min'] for r in runs):.1f} |")
    stem = "fit_speed" + ("_small" if args.small else "") + (f"_{args.tag}" if args.tag != "current" else "")
    print(f"wrote {write_json(stem, row)}")


if __name__ == "__main__":
    main()
