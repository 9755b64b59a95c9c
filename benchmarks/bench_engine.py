"""The same sweep and fit matrix inline, on the local process pool and on a local Ray instance: wall time side by
side, and the results compared.

Claim under test (issue 12, "Scale-out"): sweeps and fit matrices give identical results on every engine; the
table shows what each engine costs or saves on this machine. Cases:

- sweep: llama-3-8b prefill on h100-sxm, seq 512, 1024, 2048, 4096 x batch 1 to 32 (24 points, 4 tasks: one per
  sequence length, its batch family's four captures and its six points re-priced);
- fit: gpt2 and llama-3-8b x h100-sxm, l4, mi300x (6 cells, 6 tasks: pricing and a capacity search each),
  SLO p99 TTFT 500 ms, TPOT 50 ms, 256 in / 32 out, 150 requests a run.

Engines: inline (``LocalEngine(workers=1)``: this process, one task after another), local (the process pool,
min(tasks, CPUs) workers, started and shut down inside each call, so its start-up is in the figure) and ray (a
local instance of all CPUs; its start-up, ``ray.init``, is timed apart, once, and the rounds run on it warm: Ray
workers are reused across calls). The rounds interleave the engines; the table gives the median and the spread.
The capture cache is off (OPMAP_GRAPH_CACHE=0) so no engine reads what another wrote.

Run:  .venv/bin/python benchmarks/bench_engine.py [--rounds 2]     Writes benchmarks/results/bench_engine.json.
Exit 0 when every engine gave the same points and cells as inline, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from opmap.record import record

HERE = Path(__file__).resolve().parent
SWEEP = ("llama-3-8b", (1, 2, 4, 8, 16, 32), (512, 1024, 2048, 4096))
FIT = (("gpt2", "llama-3-8b"), ("h100-sxm", "l4", "mi300x"))


def run_sweep(engine: str, workers: int | None) -> str:
    from opmap.explore.sweep import sweep
    from opmap.hardware import get_hardware

    model, batches, seqs = SWEEP
    r = sweep(model, get_hardware("h100-sxm"), batches, seqs, "prefill", "bf16", engine=engine, workers=workers)
    return json.dumps(record(r)["points"], sort_keys=True)


def run_fit(engine: str, workers: int | None) -> str:
    from opmap.explore.fit import fit_matrix
    from opmap.serve.metrics import Slo

    r = fit_matrix(list(FIT[0]), list(FIT[1]), Slo(0.5, 0.05), "256", "32", 150, engine=engine, workers=workers)
    return json.dumps(record(r)["cells"], sort_keys=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    os.environ["OPMAP_GRAPH_CACHE"] = "0"
    sys.path.insert(0, str(HERE))
    from rich.console import Console
    from rich.table import Table

    from _common import SCHEMA_VERSION, machine, now_iso, write_json

    con = Console()
    engines = [("inline", "local", 1), ("local pool", "local", None)]
    ray_init_s = None
    try:
        import ray  # noqa: F401

        from opmap.explore.engine import ray_init

        t0 = time.perf_counter()
        ray_init()
        ray_init_s = time.perf_counter() - t0
        engines.append(("ray", "ray", None))
    except ImportError:
        con.print("ray is not installed: the ray rows are skipped (pip install 'opmap[ray]')")
    cases = (("sweep", run_sweep), ("fit", run_fit))
    times: dict[str, dict[str, list[float]]] = {c: {e[0]: [] for e in engines} for c, _ in cases}
    outs: dict[str, dict[str, list[str]]] = {c: {e[0]: [] for e in engines} for c, _ in cases}
    for rnd in range(args.rounds):
        order = engines[rnd % len(engines):] + engines[:rnd % len(engines)]  # no engine always first
        for case, fn in cases:
            for label, eng, workers in order:
                t0 = time.perf_counter()
                outs[case][label].append(fn(eng, workers))
                times[case][label].append(time.perf_counter() - t0)
                con.print(f"round {rnd + 1}: {case} on {label}: {times[case][label][-1]:.2f} s")
    # every run of every engine against the first inline run
    same = {c: {e: all(o == outs[c]["inline"][0] for o in runs) for e, runs in outs[c].items()} for c in outs}
    med = {c: {e: statistics.median(v) for e, v in t.items()} for c, t in times.items()}
    t = Table(title=f"engines on this host ({os.cpu_count()} CPUs), {args.rounds} interleaved rounds")
    for col in ("case", "engine", "median s", "spread s", "vs inline", "same results"):
        t.add_column(col)
    for case in times:
        for label in times[case]:
            v = times[case][label]
            t.add_row(case, label, f"{med[case][label]:.2f}", f"{min(v):.2f}-{max(v):.2f}",
                      f"{med[case]['inline'] / med[case][label]:.2f}x", str(same[case][label]))
    con.print(t)
    if ray_init_s is not None:
        con.print(f"ray.init (a local instance, once): {ray_init_s:.2f} s, not in the ray rows")
    ok = all(all(v.values()) for v in same.values())
    path = write_json(Path(__file__).stem, {
        "schema_version": SCHEMA_VERSION, "benchmark": "bench_engine", "created": now_iso(), "machine": machine(),
        "config": {"sweep": {"model": SWEEP[0], "batches": SWEEP[1], "seqs": SWEEP[2], "hardware": "h100-sxm"},
                   "fit": {"models": FIT[0], "hardware": FIT[1], "slo_ttft_s": 0.5, "slo_tpot_s": 0.05,
                           "input_len": 256, "output_len": 32, "requests": 150},
                   "rounds": args.rounds},
        "times_s": times, "median_s": med, "ray_init_s": ray_init_s, "same_results": same, "pass": ok})
    con.print(f"wrote {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
