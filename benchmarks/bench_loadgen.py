"""The load client's own ceiling: requests/s and tokens/s `opmap bench`'s client (opmap.bench.client.run_load)
drives against the null streaming server (opmap.bench.nullserver, in a process of its own: it answers at once,
so the client and the machine are the only limits). A server slower than this ceiling is what a real run
measures; near it, the figures are the client's.

Cases (closed loop at concurrency C, K output tokens a request, one SSE event per token, the stream's usage and
[DONE] after them): C=64 K=25 (the goal's mix: 2,000 requests/s x 25 = 50,000 tokens/s), C=64 K=1 (requests
bound), C=16 K=200 (tokens bound); and an open loop at a constant 1,000 requests/s (K=25) for its send lag.
Each closed case runs --rounds times, the case order rotated each round; the table gives the median and the
spread (min-max), the client's CPU time per request (user + system, this process) and the server's (its
process), so a reader sees which side was busy; the 1-core ceiling is 1 / (client CPU per request): what the
client would drive with a core to itself, the figure that survives a machine shared with other work.
Goal (issue 21): at least 2,000 requests/s and 50,000 tokens/s on 2 cores (C=64 K=25). Writes
benchmarks/results/bench_loadgen.json; exit 0 when the goal is met, 1 otherwise.

    PYTHONPATH=src python benchmarks/bench_loadgen.py [--rounds 3] [--seconds 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, now_iso, write_json  # noqa: E402

GOAL_REQUESTS_PER_S = 2000.0
GOAL_TOKENS_PER_S = 50000.0
CASES = ((64, 25), (64, 1), (16, 200))
OPEN_RATE = 1000.0


def _cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _cpu_of(pid: int) -> float:
    """A process's CPU seconds (user + system) from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server() -> tuple[subprocess.Popen, int]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    p = subprocess.Popen([sys.executable, "-m", "opmap.bench.nullserver", "--port", "0"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, text=True, env=env)
    line = p.stdout.readline()
    if not line.startswith("listening on"):
        p.kill()
        raise SystemExit(f"the null server did not start: {line!r}")
    return p, int(line.rsplit(":", 1)[1])


def closed_case(port: int, server_pid: int, c: int, k: int, n: int) -> dict:
    from opmap.bench.client import run_load
    from opmap.bench.metrics import summarize
    from opmap.bench.records import RequestSpec

    specs = [RequestSpec(i, None, "one two three four", 4, k) for i in range(n)]
    cpu0, srv0 = _cpu_self(), _cpu_of(server_pid)
    res = run_load(f"http://127.0.0.1:{port}", "null", specs, concurrency=c)
    cpu, srv = _cpu_self() - cpu0, _cpu_of(server_pid) - srv0
    s = summarize(res.records, min_duration_s=0, min_queries=0)
    ok = s["requests"]["ok"]
    if ok != n:
        raise SystemExit(f"{n - ok} of {n} requests failed against the null server: {s['errors']}")
    return {"requests_per_s": s["throughput"]["requests_per_s"],
            "tokens_per_s": s["throughput"]["output_tokens_per_s"], "requests": n, "wall_s": res.wall_s,
            "client_cpu_per_request_s": cpu / n, "server_cpu_per_request_s": srv / n,
            "ttft_p50_s": s["latency"]["ttft"]["p50_s"]}


def open_case(port: int, seconds: float) -> dict:
    import numpy as np

    from opmap.bench.client import run_load
    from opmap.bench.metrics import summarize
    from opmap.bench.records import RequestSpec

    n = int(OPEN_RATE * seconds)
    specs = [RequestSpec(i, float(t), "one two three four", 4, 25) for i, t in
             enumerate(np.arange(1, n + 1) / OPEN_RATE)]
    res = run_load(f"http://127.0.0.1:{port}", "null", specs)
    s = summarize(res.records, min_duration_s=0, min_queries=0)
    lag = s["scheduler_lag"]
    return {"offered_per_s": OPEN_RATE, "achieved_per_s": s["rate"]["achieved_per_s"], "requests": n,
            "lag_p50_s": lag["p50_s"], "lag_p99_s": lag["p99_s"], "lag_max_s": lag["max_s"], "behind": lag["behind"],
            "peak_in_flight": res.options["peak_in_flight"], "ok": s["requests"]["ok"]}


def spread(rows: list[dict], key: str) -> dict:
    xs = [r[key] for r in rows]
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "samples": xs}


def main() -> int:
    from rich.console import Console
    from rich.table import Table

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0, help="about how long each closed case runs")
    a = ap.parse_args()
    con = Console(width=170)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    proc, port = start_server()
    try:
        runs: dict[tuple[int, int], list[dict]] = {c: [] for c in CASES}
        closed_case(port, proc.pid, 16, 25, 500)  # warm-up: connections, imports, the server's first requests
        for rnd in range(a.rounds):
            for c, k in CASES[rnd % len(CASES):] + CASES[:rnd % len(CASES)]:
                guess = {1: 1500, 25: 1000, 200: 150}[k]  # requests/s, about, on a quiet 2-core machine
                runs[(c, k)].append(closed_case(port, proc.pid, c, k, int(guess * a.seconds)))
        open_row = open_case(port, a.seconds)
    finally:
        proc.terminate()
        proc.wait(10)
    rows = []
    t = Table(title=f"opmap bench client ceiling against the null server (load average {' '.join(load)} on "
                    f"{os.cpu_count()} cores at start; median, min-max over {a.rounds} rounds)", title_justify="left")
    for col in ("C", "K", "requests/s", "tokens/s", "client CPU/request", "1-core ceiling", "server CPU/request",
                "TTFT p50"):
        t.add_column(col, justify="right")
    for (c, k), rs in runs.items():
        rq, tk = spread(rs, "requests_per_s"), spread(rs, "tokens_per_s")
        cc, sc = spread(rs, "client_cpu_per_request_s"), spread(rs, "server_cpu_per_request_s")
        tt = spread(rs, "ttft_p50_s")
        ceiling = 1 / cc["median"]  # requests/s one core spends entirely on the client would drive
        rows.append({"concurrency": c, "tokens": k, "requests_per_s": rq, "tokens_per_s": tk,
                     "client_cpu_per_request_s": cc, "client_one_core_ceiling_requests_per_s": ceiling,
                     "server_cpu_per_request_s": sc, "ttft_p50_s": tt})
        t.add_row(str(c), str(k), f"{rq['median']:,.0f} ({rq['min']:,.0f}-{rq['max']:,.0f})",
                  f"{tk['median']:,.0f} ({tk['min']:,.0f}-{tk['max']:,.0f})", f"{cc['median'] * 1e6:,.0f} us",
                  f"{ceiling:,.0f} req/s, {ceiling * k:,.0f} tok/s", f"{sc['median'] * 1e6:,.0f} us",
                  f"{tt['median'] * 1e3:.2f} ms")
    con.print(t)
    con.print(f"open loop constant:{OPEN_RATE:g} (K=25, {open_row['requests']} requests): achieved "
              f"{open_row['achieved_per_s']:,.0f} requests/s; send lag p50 {open_row['lag_p50_s'] * 1e3:.2f} ms, "
              f"p99 {open_row['lag_p99_s'] * 1e3:.2f} ms, max {open_row['lag_max_s'] * 1e3:.2f} ms"
              + (" (behind schedule)" if open_row["behind"] else ""), highlight=False)
    goal = next(r for r in rows if (r["concurrency"], r["tokens"]) == (64, 25))
    met = (goal["requests_per_s"]["median"] >= GOAL_REQUESTS_PER_S
           and goal["tokens_per_s"]["median"] >= GOAL_TOKENS_PER_S)
    verdict = "PASS" if met else "FAIL"
    con.print(f"goal (C=64 K=25): >= {GOAL_REQUESTS_PER_S:,.0f} requests/s and {GOAL_TOKENS_PER_S:,.0f} tokens/s: "
              f"{verdict} (median {goal['requests_per_s']['median']:,.0f} requests/s, "
              f"{goal['tokens_per_s']['median']:,.0f} tokens/s; client and null server share these cores)",
              highlight=False)
    out = write_json("bench_loadgen", {"schema_version": 1, "when": now_iso(), "machine": machine(),
                                       "load_average_at_start": [float(x) for x in load],
                                       "config": {"rounds": a.rounds, "seconds": a.seconds, "cases": CASES,
                                                  "open_rate_per_s": OPEN_RATE},
                                       "rows": rows, "open_loop": open_row,
                                       "goal": {"requests_per_s": GOAL_REQUESTS_PER_S,
                                                "tokens_per_s": GOAL_TOKENS_PER_S, "verdict": verdict}})
    con.print(f"wrote {out}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
