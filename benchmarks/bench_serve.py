"""Speed of the serving simulator: 100,000 requests under in-flight (engine) and continuous batching (goal: under
10 s), priced by opmap's cost model of gpt2 on an H100 SXM (the pricing is timed apart); and one whole `opmap serve`
process of 1000 requests on Llama-3-70B at tp 4 (issue 20's goal: under 3 s), wall and CPU time, beside the process
that only imports torch, torch._dynamo (every meta capture imports it) and the CLI: the floor no pricing can go under.
Prints rich tables, writes benchmarks/results/bench_serve.json.

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
from opmap.record import record

GOAL_S = 10.0
FIT_GOAL_S = 30.0
SERVE_70B_GOAL_S = 3.0
SERVE_70B = ("serve", "llama-3-70b", "--hardware", "h100-sxm", "--tp", "4", "--requests", "1000", "--no-store")


def _process(args: list[str], **env: str) -> dict:
    """Wall and CPU seconds (user + system) of one child process (``env`` added to its environment)."""
    import resource
    import subprocess

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"), **env})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode:
        raise SystemExit(r.stderr.decode()[-2000:])
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return {"wall_s": wall, "cpu_s": cpu}


def serve_70b() -> dict:
    """The 70B serve command as a whole process: first with an empty capture cache (the model built, its 2-layer
    graphs captured and kept), then again (the summary and graphs from the cache: nothing built, nothing
    captured); and the import-only floor of a process that captures."""
    import tempfile

    py = sys.executable
    with tempfile.TemporaryDirectory() as d:
        cold = _process([py, "-m", "opmap.cli", *SERVE_70B], OPMAP_GRAPH_CACHE="1", XDG_CACHE_HOME=d)
        warm = _process([py, "-m", "opmap.cli", *SERVE_70B], OPMAP_GRAPH_CACHE="1", XDG_CACHE_HOME=d)
    floor = _process([py, "-c", "import torch, torch._dynamo, opmap.cli, opmap.analyze, opmap.serve"])
    return {"command": "opmap " + " ".join(SERVE_70B), "cold": cold, "warm": warm, "import_floor": floor,
            "goal_s": SERVE_70B_GOAL_S}


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
    ap.add_argument("--skip-70b", action="store_true", help="Skip the whole-process 70B serve run.")
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
                     "output_tokens_per_s": s.throughput.output_tokens_per_s,
                     "ttft_p99_s": s.latency.ttft.p99_s, "tpot_p99_s": s.latency.tpot.p99_s,
                     "validity": s.validity.verdict,
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
    big = None if args.skip_70b else serve_70b()
    if big is not None:
        t2 = Table(title=f"whole process: {big['command']}", title_justify="left")
        for c in ("process", "wall (s)", "cpu (s)", "goal"):
            t2.add_column(c, justify="left" if c == "process" else "right")
        for name in ("cold", "warm"):
            r = big[name]
            t2.add_row(f"opmap serve, {name} capture cache", f"{r['wall_s']:.2f}", f"{r['cpu_s']:.2f}",
                       f"< {SERVE_70B_GOAL_S:g} s: " + ("met" if r["wall_s"] < SERVE_70B_GOAL_S else "MISSED"))
        t2.add_row("imports of a capturing process (floor)", f"{big['import_floor']['wall_s']:.2f}",
                   f"{big['import_floor']['cpu_s']:.2f}", "-")
        Console(width=140).print(t2)
    path = write_json("bench_serve", {"schema_version": 2, "when": now_iso(), "machine": machine(),
                                      "config": vars(args), "pricing_s": pricing_s, "rows": rows,
                                      "serve_70b": big})
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
    for c in record(r)["cells"]:  # fit.json's cells
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
