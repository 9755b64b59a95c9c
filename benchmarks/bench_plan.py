"""Speed of `opmap plan`: llama-3-70b over 64 H100s (goal: under 60 s). Prints a table, writes JSON.

    PYTHONPATH=src python benchmarks/bench_plan.py [--out benchmarks/results/bench_plan.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OPMAP_GRAPH_CACHE", "0")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3-70b")
    ap.add_argument("--devices", type=int, default=64)
    ap.add_argument("--phase", default="train")
    ap.add_argument("--out", default="benchmarks/results/bench_plan.json")
    args = ap.parse_args()
    from opmap.explore.plan import plan
    from opmap.hardware import get_hardware
    from opmap.workloads import load_workload

    hw = get_hardware("h100-sxm")
    t0 = time.perf_counter()
    r = plan(lambda mb: load_workload(args.model, mb, None, "bf16", "meta"), hw, args.devices, args.phase)
    wall = time.perf_counter() - t0
    best = r["ranked"][0] if r["ranked"] else None
    row = {"model": args.model, "devices": args.devices, "phase": args.phase, "wall_s": wall,
           "layouts": r["layouts"], "legal_fitting": r["legal_fitting"], "goal_s": 60.0,
           "best": best and {k: best[k] for k in ("layout", "tokens_per_s", "step_s", "mfu", "memory_bytes")}}
    print(f"| model | devices | phase | layouts | fitting | wall (s) | best |\n|---|---|---|---|---|---|---|\n"
          f"| {args.model} | {args.devices} | {args.phase} | {r['layouts']} | {r['legal_fitting']} | {wall:.1f} | "
          f"{best['layout'] if best else '-'} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(row, indent=1) + "\n")


if __name__ == "__main__":
    main()
