"""Speed of `opmap plan`: llama-3-70b over 64 H100s, training (goal: under 10 s). Prints a table, writes JSON.

Each repeat runs the CLI in a fresh process, as a user does (`opmap plan MODEL --devices N --phase train
--no-store`, the capture cache off), and records its wall time and the CPU time it used (user + sys of the child:
on a shared machine the wall time carries the other processes' load, the CPU time much less of it) with the
one-minute load average at the start. ``--src`` times another checkout's source (the before of a change).

    PYTHONPATH=src python benchmarks/bench_plan.py [--repeats 3] [--src /path/to/other/src] [--tag after]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, now_iso, write_json  # noqa: E402

GOAL_S = 10.0


def run_once(src: str, model: str, devices: int, phase: str) -> dict:
    env = dict(os.environ, PYTHONPATH=src, OPMAP_GRAPH_CACHE="0")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "opmap.cli", "plan", model, "--devices", str(devices), "--phase", phase,
                        "--no-store", "--rows", "1"], env=env, capture_output=True, text=True, timeout=900,
                       stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode:
        raise SystemExit(f"opmap plan failed: {p.stderr.strip()[-400:]}")
    text = " ".join(p.stdout.split())
    m = re.search(r"(\d+) of (\d+) layouts legal and fitting", text)
    best = re.search(r"│\s+1 │ ([^│]+)│", p.stdout)
    return {"wall_s": wall, "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "load_1min": load, "legal_fitting": int(m.group(1)) if m else None,
            "layouts": int(m.group(2)) if m else None, "best": best.group(1).strip() if best else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3-70b")
    ap.add_argument("--devices", type=int, default=64)
    ap.add_argument("--phase", default="train")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--src", default=str(Path(__file__).resolve().parents[1] / "src"))
    ap.add_argument("--tag", default="current")
    args = ap.parse_args()
    runs = [run_once(args.src, args.model, args.devices, args.phase) for _ in range(args.repeats)]
    wall = [r["wall_s"] for r in runs]
    cpu = [r["cpu_s"] for r in runs]
    row = {"schema_version": 1, "date": now_iso(), "machine": machine(), "tag": args.tag, "src": args.src,
           "model": args.model, "devices": args.devices, "phase": args.phase, "goal_s": GOAL_S,
           "wall_median_s": statistics.median(wall), "wall_min_s": min(wall), "wall_max_s": max(wall),
           "cpu_median_s": statistics.median(cpu), "cpu_min_s": min(cpu), "cpu_max_s": max(cpu),
           "layouts": runs[0]["layouts"], "legal_fitting": runs[0]["legal_fitting"], "best": runs[0]["best"],
           "runs": runs}
    print("| tag | model | devices | layouts | fitting | wall median (min-max) s | CPU median (min-max) s | "
          "load | best |\n|---|---|---|---|---|---|---|---|---|")
    print(f"| {args.tag} | {args.model} | {args.devices} | {row['layouts']} | {row['legal_fitting']} | "
          f"{row['wall_median_s']:.1f} ({min(wall):.1f}-{max(wall):.1f}) | {row['cpu_median_s']:.1f} "
          f"({min(cpu):.1f}-{max(cpu):.1f}) | {statistics.median(r['load_1min'] for r in runs):.1f} | "
          f"{row['best']} |")
    out = write_json(f"bench_plan_{args.tag}" if args.tag != "current" else "bench_plan", row)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
