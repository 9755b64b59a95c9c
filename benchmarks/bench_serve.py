"""Speed of the serving simulator: 100,000 requests under in-flight (engine) and continuous batching (goal: under
10 s), priced by opmap's cost model of gpt2 on an H100 SXM (the pricing is timed apart). Prints a rich table, writes
benchmarks/results/bench_serve.json.

    PYTHONPATH=src python benchmarks/bench_serve.py [--requests 100000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OPMAP_GRAPH_CACHE", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, now_iso, write_json  # noqa: E402

GOAL_S = 10.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--hardware", default="h100-sxm")
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--arrival", default="poisson:400")
    ap.add_argument("--input-len", default="uniform:128,1024")
    ap.add_argument("--output-len", default="uniform:32,256")
    ap.add_argument("--policies", default="engine,continuous,chunked:512,static:16")
    args = ap.parse_args()
    from rich.console import Console
    from rich.table import Table

    from opmap.serve import make_requests, parse_policy, simulate, summarize
    from opmap.serve.model_cost import model_table_cost

    t0 = time.perf_counter()
    cost = model_table_cost(args.model, args.hardware)
    pricing_s = time.perf_counter() - t0
    reqs = make_requests(args.arrival, args.input_len, args.output_len, args.requests, seed=0)
    rows = []
    for spec in args.policies.split(","):
        pol = parse_policy(spec)
        t0 = time.perf_counter()
        res = simulate(reqs, pol, cost)
        sim_s = time.perf_counter() - t0
        s = summarize(res)
        rows.append({"policy": pol.spec(), "requests": len(reqs), "steps": res.steps, "simulate_s": sim_s,
                     "summarize_s": time.perf_counter() - t0 - sim_s,
                     "output_tokens_per_s": s["throughput"]["output_tokens_per_s"],
                     "ttft_p99_s": s["latency"]["ttft"]["p99_s"], "tpot_p99_s": s["latency"]["tpot"]["p99_s"],
                     "validity": s["validity"]["verdict"],
                     "goal_s": GOAL_S if pol.name in ("engine", "continuous") else None})
    t = Table(title=f"opmap serve speed: {args.requests} requests, {args.model} on {args.hardware} "
                    f"({args.arrival}, in {args.input_len}, out {args.output_len}); pricing {pricing_s:.1f} s",
              title_justify="left")
    for c in ("policy", "steps", "simulate (s)", "summarize (s)", "out tok/s", "p99 TTFT", "p99 TPOT", "goal"):
        t.add_column(c, justify="left" if c == "policy" else "right")
    for r in rows:
        goal = "-" if r["goal_s"] is None else ("met" if r["simulate_s"] + r["summarize_s"] < GOAL_S else "MISSED")
        t.add_row(r["policy"], f"{r['steps']:,}", f"{r['simulate_s']:.2f}", f"{r['summarize_s']:.2f}",
                  f"{r['output_tokens_per_s']:,.0f}", f"{r['ttft_p99_s'] * 1e3:.2f} ms",
                  f"{r['tpot_p99_s'] * 1e3:.2f} ms", goal)
    Console(width=140).print(t)
    path = write_json("bench_serve", {"schema_version": 1, "when": now_iso(), "machine": machine(),
                                      "config": vars(args), "pricing_s": pricing_s, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
