"""Speed of the serving simulator: 100,000 requests under in-flight (engine) and continuous batching (goal: under
10 s), priced by opmap's cost model of gpt2 on an H100 SXM (the pricing is timed apart). Prints a rich table, writes
benchmarks/results/bench_serve.json.

With ``--fit``: the fit matrix instead, 3 models x 3 devices with the layout search (devices per replica 1, 2, 4, 8
as TP x PP, replicas filling one node; each layout priced and its steady-state capacity searched), the whole
matrix timed (goal: under 30 s); per cell the chosen layout and the runner-up. Writes
benchmarks/results/bench_fit_cache_{fresh,off}.json.

    PYTHONPATH=src python benchmarks/bench_serve.py [--requests 100000]
    PYTHONPATH=src python benchmarks/bench_serve.py --fit [--models gpt2,llama-3-8b,llama-3-70b]
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
FIT_GOAL_S = 30.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--hardware", default="h100-sxm")
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--arrival", default="poisson:400")
    ap.add_argument("--input-len", default="uniform:128,1024")
    ap.add_argument("--output-len", default="uniform:32,256")
    ap.add_argument("--policies", default="engine,continuous,chunked:512,static:16")
    ap.add_argument("--fit", action="store_true", help="time the fit matrix with the layout search instead")
    ap.add_argument("--models", default="gpt2,llama-3-8b,llama-3-70b")
    ap.add_argument("--devices", default="h100-sxm,mi300x,l4")
    ap.add_argument("--slo-ttft", type=float, default=2000.0)
    ap.add_argument("--slo-tpot", type=float, default=200.0)
    ap.add_argument("--graph-cache", choices=("fresh", "off"), default="fresh",
                    help="--fit: the graph cache on and empty at the start (a first fit: layouts and devices of one "
                         "model share its captures), or off (every layout captured anew)")
    args = ap.parse_args()
    if args.fit:
        fit_bench(args)
        return
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


def fit_bench(args) -> None:
    """The fit matrix over --models x --devices with the layout search, timed whole (pricing included)."""
    import tempfile

    from rich.console import Console
    from rich.table import Table

    from opmap.explore.fit import fit_matrix
    from opmap.explore.layouts import label
    from opmap.serve.metrics import Slo

    models, devices = args.models.split(","), args.devices.split(",")
    if args.graph_cache == "fresh":  # read at each capture, inherited by the pool's workers
        os.environ["OPMAP_GRAPH_CACHE"] = "1"
        os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="opmap-bench-fit-")
    else:
        os.environ["OPMAP_GRAPH_CACHE"] = "0"
    t0 = time.perf_counter()
    r = fit_matrix(models, devices, Slo(args.slo_ttft / 1e3, args.slo_tpot / 1e3), "512", "128")
    wall = time.perf_counter() - t0
    rows = []
    for c in r["cells"]:
        tried = c["layouts"]
        rows.append({"model": c["model"], "hardware": c["hardware"], "layouts_tried": len(tried),
                     "layouts_priced": sum(1 for lay in tried if lay["fits"]),
                     "chosen": label(c["layout"]) if c["layout"] else None,
                     "per_device_tokens_per_s": c["throughput_per_device"],
                     "runner_up": label(c["runner_up"]) if c["runner_up"] else None,
                     "runner_up_per_device_tokens_per_s": (c["runner_up"] or {}).get("per_device_tokens_per_s"),
                     "rate_per_s_per_replica": (c.get("capacity") or {}).get("rate_per_s"),
                     "saturation_per_s_per_replica": (c.get("capacity") or {}).get("saturation_per_s"),
                     "run_requests": ((c.get("capacity") or {}).get("run") or {}).get("requests"),
                     "excluded_reason": c["excluded_reason"]})
    t = Table(title=f"opmap fit speed: {len(models)} models x {len(devices)} devices with the layout search, "
                    f"{wall:.1f} s ({'met' if wall < FIT_GOAL_S else 'MISSED'} the {FIT_GOAL_S:g} s goal); "
                    f"runtime {r['runtime']}, graph cache {args.graph_cache}", title_justify="left")
    for col in ("model", "device", "priced/tried", "chosen", "tok/s/device", "runner-up", "tok/s/device ",
                "rate/replica", "saturation", "run"):
        t.add_column(col, justify="left" if col in ("model", "device", "chosen", "runner-up") else "right")
    for w in rows:
        def f(x, fmt=",.0f"):
            return "-" if x is None else format(x, fmt)
        t.add_row(w["model"], w["hardware"], f"{w['layouts_priced']}/{w['layouts_tried']}", w["chosen"] or "-",
                  f(w["per_device_tokens_per_s"]), w["runner_up"] or "-", f(w["runner_up_per_device_tokens_per_s"]),
                  f(w["rate_per_s_per_replica"], ".4g"), f(w["saturation_per_s_per_replica"], ".4g"),
                  f(w["run_requests"], "d"))
    Console(width=160).print(t)
    path = write_json(f"bench_fit_cache_{args.graph_cache}",
                      {"schema_version": 1, "when": now_iso(), "machine": machine(), "config": vars(args),
                       "wall_s": wall, "goal_s": FIT_GOAL_S, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
