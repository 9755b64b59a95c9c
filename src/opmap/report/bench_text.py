"""``opmap bench``'s terminal output: the figures of a run (measured or imported) as a table, and the lines under it
(rates, errors, usage check, send lag, validity, the server's /metrics)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opmap.report.text import plain, safe

if TYPE_CHECKING:
    from opmap.bench.metrics import BenchFigures


def print_summary(console, f: BenchFigures, result, spec: dict) -> None:
    """The figures as a terminal table on ``console``, and the lines under it (rates, errors, usage, lag, validity)."""
    from rich.table import Table

    from opmap.report.sheet import si

    r = f.requests
    load = f"open loop {spec['arrival']}" if spec["arrival"] else f"closed loop, concurrency {spec['concurrency']}"
    t = Table(title=plain(f"opmap bench {result.base_url} {result.model} ({result.api}): {load}, {r.ok} of "
                          f"{r.measured} requests ok over {r.window_s:.3g} s"), title_justify="left")
    for col in ("latency", "mean", "p50", "p90", "p95", "p99"):
        t.add_column(col, justify="left" if col == "latency" else "right")
    for k in ("ttft", "tpot", "itl", "e2e"):
        x = getattr(f.latency, k)
        t.add_row(k, *[si(v, "s") if v is not None else "-" for v in (x.mean_s, x.p50_s, x.p90_s, x.p95_s, x.p99_s)])
    console.print(t)
    th, g = f.throughput, f.goodput
    offered = f"offered {f.offered_per_s:.4g} req/s, " if f.offered_per_s else ""
    console.print(f"throughput {_g(th.requests_per_s)} req/s ({offered}achieved {_g(th.requests_per_s)}), "
                  f"{_si(th.output_tokens_per_s, 'tok/s')} out, {_si(th.tokens_per_s, 'tok/s')} total; "
                  f"goodput {_g(g.requests_per_s)} req/s ({g.attainment:.1%} of requests)", highlight=False)
    print_errors(console, f)
    u = f.usage_check
    if u.output_mismatches or u.input_mismatches or u.requests_without_usage:
        console.print(f"usage check: output tokens differ from max_tokens on {u.output_mismatches} requests "
                      f"(mean {_signed(u.output_diff_mean)}), prompt tokens from the asked length on "
                      f"{u.input_mismatches} (mean {_signed(u.input_diff_mean)}); "
                      f"{u.requests_without_usage} without usage", highlight=False)
    if u.implausible:
        console.print(f"usage check: {u.implausible} requests reported implausible counts, set aside (first: "
                      f"{safe(u.implausible_example)})", highlight=False)
    lag = f.scheduler_lag
    if lag.open_loop and lag.stats is not None:
        console.print(f"send lag behind schedule: p50 {si(lag.stats.p50_s, 's')}, p99 {si(lag.stats.p99_s, 's')}, "
                      f"max {si(lag.max_s, 's')}" + (" [bold red]: the sends fell behind schedule[/]" if lag.behind
                                                     else ""), highlight=False)
    if result.interrupted:
        console.print(f"interrupted: {len(result.records)} requests kept, {result.in_flight_at_stop} in flight "
                      "cancelled", highlight=False)
    v = f.validity
    console.print(f"MLPerf-style validity: {v.verdict} ({safe(v.reason)})", highlight=False)
    if result.server_metrics is not None:
        console.print(server_metrics_line(result.server_metrics.to_dict()), highlight=False)


def server_metrics_line(m: dict) -> str:
    """One line of what the server's /metrics said during the run (bench.json's ``server_metrics``)."""
    if m["status"] != "scraped":
        return f"server metrics: {m['status']} ({safe(m['detail'])})"
    parts = []
    for name, what, fmt in (("kv_usage", "KV cache in use, peak", "{:.0%}"), ("running", "running, peak", "{:g}"),
                            ("waiting", "waiting, peak", "{:g}")):
        vals = [x for x in m["series"].get(name, []) if x is not None]
        if vals:
            parts.append(f"{what} {fmt.format(max(vals))}")
    for name, what in (("preemptions", "preemptions"), ("prefix_hits", "prefix-cache hit tokens")):
        vals = [x for x in m["series"].get(name, []) if x is not None]
        if len(vals) > 1:
            parts.append(f"{what} {vals[-1] - vals[0]:g} during the run")
    blocks = f", {m['num_gpu_blocks']} KV blocks" if m.get("num_gpu_blocks") else ""
    return (f"server metrics ({safe(m['engine'])}{blocks}; {len(m['times_s'])} scrapes of {safe(m['url'])}): "
            + ("; ".join(parts) or "no watched series"))


def print_errors(console, f: BenchFigures) -> None:
    """The failures by kind, each with the first one's reason; a line saying so when every request failed."""
    errs = {k: v for k, v in f.errors if v}
    if not errs:
        return
    console.print("errors: " + ", ".join(f"{k} {v}" for k, v in errs.items()), highlight=False)
    for k, why in f.error_examples:
        console.print(f"  {k}: {safe(why)}", highlight=False)
    if f.all_failed:
        console.print(f"[bold red]every one of the {f.requests.measured} measured requests failed[/]: "
                      "exit status 1", highlight=False)


def _g(x: float | None) -> str:
    """A rate as printed; "-" where an imported run's tool reported none."""
    return "-" if x is None else f"{x:.4g}"


def _si(x: float | None, unit: str) -> str:
    from opmap.report.sheet import si

    return "-" if x is None else si(x, unit)


def _signed(x: float | None) -> str:
    return "-" if x is None else f"{x:+.3g}"
