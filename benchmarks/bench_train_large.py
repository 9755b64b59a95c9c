"""Training analyses of the largest presets, whole process: wall time and peak RSS.

Claim under test (issue 11): llama-3.1-405b training at tp 8, pp 16 is analysed in under 30 s, whole process,
and under 3 GB. Each run is one fresh ``opmap analyze`` process with the capture cache off (so the capture is
timed), ``--phase train`` at microbatch 1 over a global batch of 512 on 1,024 H100s (tp 8 x pp 16 x dp 8), the
sheet cut to 3 rows. Peak RSS is the child's ``ru_maxrss`` (RUSAGE_CHILDREN, KiB on Linux), the wall time the
parent's clock around the child.

Run:  .venv/bin/python benchmarks/bench_train_large.py [--repeats 2]
Writes benchmarks/results/bench_train_large.json.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CASES = [("llama-3.1-405b", ["--tp", "8", "--pp", "16", "--dp", "8", "--global-batch", "512"])]
MAX_WALL_S, MAX_RSS_BYTES = 30.0, 3e9


def run(model: str, extra: list[str]) -> dict:
    opmap = Path(sys.executable).with_name("opmap")
    cmd = [str(opmap), "analyze", model, "--hardware", "h100-sxm", "--phase", "train", "--microbatch", "1",
           "--rows", "3", *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OPMAP_GRAPH_CACHE": "0"},
                       timeout=600)
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # max over children so far
    line = next((ln.strip() for ln in p.stdout.splitlines() if "phase: train" in ln), "")
    return {"model": model, "args": extra, "rc": p.returncode, "wall_s": wall, "peak_rss_bytes": rss,
            "rss_grew": rss > before * 1024, "phase_line": line, "stderr_tail": p.stderr.strip()[-300:]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from rich.console import Console
    from rich.table import Table

    from _common import SCHEMA_VERSION, machine, now_iso, write_json

    con = Console()
    rows = []
    for model, extra in CASES:
        runs = [run(model, extra) for _ in range(args.repeats)]
        ok_runs = [r for r in runs if r["rc"] == 0]
        med = statistics.median(r["wall_s"] for r in ok_runs) if ok_runs else float("nan")
        rss = max(r["peak_rss_bytes"] for r in runs)
        passed = len(ok_runs) == len(runs) and med < MAX_WALL_S and rss < MAX_RSS_BYTES
        rows.append({"model": model, "args": extra, "runs": runs, "median_wall_s": med, "peak_rss_bytes": rss,
                     "pass": passed})
    t = Table(title="opmap analyze --phase train, whole process, capture cache off")
    for c in ("model", "layout", "runs", "median wall s", "spread s", "peak RSS", "verdict"):
        t.add_column(c)
    for r in rows:
        walls = [x["wall_s"] for x in r["runs"]]
        t.add_row(r["model"], " ".join(r["args"]), str(len(walls)), f"{r['median_wall_s']:.1f}",
                  f"{min(walls):.1f}-{max(walls):.1f}", f"{r['peak_rss_bytes'] / 1e9:.2f} GB",
                  "PASS" if r["pass"] else "FAIL")
    con.print(t)
    for r in rows:
        con.print(r["runs"][0]["phase_line"] or r["runs"][0]["stderr_tail"])
    con.print(f"gate: median wall < {MAX_WALL_S:.0f} s and peak RSS < {MAX_RSS_BYTES / 1e9:.0f} GB")
    path = write_json(Path(__file__).stem, {"schema_version": SCHEMA_VERSION, "benchmark": "bench_train_large",
                                            "created": now_iso(), "machine": machine(), "rows": rows,
                                            "claim": "llama-3.1-405b training at tp 8, pp 16 < 30 s, < 3 GB",
                                            "pass": all(r["pass"] for r in rows)})
    con.print(f"wrote {path}")
    return 0 if all(r["pass"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
