"""``opmap serve``'s terminal rendering: serve.json's figures as lines and a latency table, the capacity line, the
latency CDF figure (cli/serve.py parses and runs; this module only renders what serve.json holds)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from opmap.phases.runtime import Runtime
from opmap.report.figures import png_metadata
from opmap.report.sheet import si
from opmap.report.text import plain


def print_serve(console: Console, r: dict[str, Any], model: str, hardware: str) -> None:
    """serve.json's figures as the terminal shows them: the title, the assumptions' lines, the latency table,
    throughput and goodput, the engine's KV blocks and preemptions, validity, disaggregation, capacity."""
    t = _latency_table(r, model, hardware)
    _print_assumptions(console, r["assumptions"])
    console.print(t)
    _print_figures(console, r)


def _latency_table(r: dict[str, Any], model: str, hardware: str) -> Table:
    """The latency table (mean and percentiles of e2e, TTFT, queueing, TPOT, ITL) under the run's title: model,
    layout, device, policy, arrivals, requests, how steps were priced."""
    a = r["assumptions"]
    lay = f"{a['tp']} x {a['layout']['pp']}" if a.get("layout") and a["layout"]["pp"] > 1 else f"{a['tp']}"
    t = Table(title=plain(f"opmap serve {model} on {a['replicas']} x {lay} {hardware}: {r['policy']['spec']}, "
                          f"{r['arrival']}, {r['requests']['count']} requests ({a['cost']}"
                          + (f", runtime {a['runtime']['name']})" if a.get("runtime") else ")")), title_justify="left")
    for col in ("latency", "mean", "p50", "p90", "p95", "p99"):
        t.add_column(col, justify="left" if col == "latency" else "right")
    for k in ("e2e", "ttft", "queue", "tpot", "itl"):
        s = r["latency"][k]
        t.add_row(k, *[si(s[f], "s") if s[f] is not None else "-" for f in
                       ("mean_s", "p50_s", "p90_s", "p95_s", "p99_s")])
    return t


def _print_assumptions(console: Console, a: dict[str, Any]) -> None:
    """The lines over the table: the format priced, the confidence, the runtime, the engine preset, the memory per
    device, DP attention, speculative decoding."""
    if a.get("dtype_line"):  # the format priced; an alias resolved and a fallback, why
        console.print(plain("dtype: " + a["dtype_line"]), highlight=False)
    if a.get("confidence"):  # how far to trust these figures: the weakest input that priced them
        console.print(plain(a["confidence"]["line"]), highlight=False)
    rt = a.get("runtime")
    if rt:
        console.print(plain(Runtime.from_dict(rt).line()), highlight=False)
    ep = a.get("engine_preset")
    if ep:  # the engine whose defaults and sizing rules set the scheduler (opmap.engines)
        console.print(plain(f"engine preset {ep['engine']}@{ep['version']} ({ep['name']}; {ep['release']}): "
                            f"{ep['max_num_seqs']} sequences, {ep['max_num_batched_tokens']} tokens a step, "
                            f"{'chunked' if ep['chunked_prefill'] else 'whole'} prompts, KV blocks of {ep['kv_block']}"
                            f", {'GUARANTEED_NO_EVICT' if ep['no_evict'] else 'preemption by recompute'}, memory "
                            f"{ep['memory']['fraction']:g} of {ep['memory']['of']}"
                            + (f"; overridden: {', '.join(ep['overrides'])}" if ep["overrides"] else "")),
                      highlight=False)
    m = a.get("memory")
    if m and m.get("utilization_of") in ("static", "free"):
        console.print(plain(_memory_line(m, a.get("kv_dtype"))), highlight=False)
    elif m:
        g = 2 ** 30
        draft = f" - draft weights {m['draft_weights_bytes'] / g:.4g} GiB" if "draft_weights_bytes" in m else ""
        console.print(f"memory per device: {m['capacity_bytes'] / g:.4g} GiB x {m['utilization']:g} - weights "
                      f"{m['weights_bytes'] / g:.4g} GiB{draft} - reserve {m['reserve_bytes'] / g:.3g} GiB = KV "
                      f"{m['kv_bytes'] / g:.4g} GiB ({m['kv_capacity_tokens']:,} tokens, {a.get('kv_dtype')})",
                      highlight=False)
    lay_ = a.get("layout") or {}
    if lay_.get("dp_attention"):
        n = lay_["attention_ranks"]
        pp = lay_.get("pp", 1)
        each = "one device each" if pp == 1 else f"each a pipeline of {pp} stages, one device a stage"
        console.print(f"DP attention: {n} attention ranks a replica, {each}, each its own batch, scheduler "
                      f"and KV pool (the memory line's KV, per rank: not split by TP); E / {n} experts a device; "
                      f"requests round-robin over the ranks; the ranks step in lockstep, each step as long as the "
                      f"busiest rank's (its batch priced as if every rank carried it, with the dispatch and combine "
                      f"all-to-all of every MoE layer)", highlight=False)
    if a.get("speculative_decoding"):
        console.print(plain(a["speculative_decoding"]["line"]), highlight=False)


def _print_figures(console: Console, r: dict[str, Any]) -> None:
    """The lines under the table: throughput and goodput, the engine's KV blocks, preemptions and prefix cache,
    validity, disaggregation, capacity."""
    th, g = r["throughput"], r["goodput"]
    console.print(f"throughput {th['requests_per_s']:.4g} req/s, {si(th['tokens_per_s'], 'tok/s')} "
                  f"({si(th['output_tokens_per_s'], 'tok/s')} out); goodput {g['requests_per_s']:.4g} req/s; "
                  f"SLO attainment {r['slo_attainment']:.1%}; queueing share {r['queueing_share']:.1%}",
                  highlight=False)
    if r["policy"]["name"] == "engine":
        p, kv = r["preemptions"], r.get("kv_cache", {})
        blocks = (f"KV {kv['peak_blocks_used']} of {kv['blocks']} blocks of {kv['kv_block']} tokens at peak"
                  if kv.get("blocks") is not None else f"KV unlimited, blocks of {kv.get('kv_block')} tokens")
        console.print(f"{blocks}; preemptions {p['total']} ({p['requests_preempted']} requests, recomputed)",
                      highlight=False)
        pc = r.get("prefix_cache")
        if pc:
            console.print(f"prefix cache ({plain(pc['prompts'])}): hit rate {pc['hit_rate']:.1%} ({pc['hit_tokens']:,} "
                          f"of {pc['prompt_tokens']:,} prompt tokens cached at admission, blocks of {pc['kv_block']}); "
                          f"{pc['recompute_hit_tokens']:,} more found by preempted requests' recompute",
                          highlight=False)
    v = r["validity"]
    console.print(f"MLPerf-style validity: {v['verdict']} ({v['reason']})", highlight=False)
    if "disaggregation" in r:
        d = r["disaggregation"]
        k = d["kv_transfer"]
        console.print(f"disaggregated {d['prefill_replicas']}:{d['decode_replicas']} (prefill:decode): KV moved "
                      f"over {k['link']} at {si(k['bandwidth_bytes_per_s'], 'B/s')}, "
                      f"{si(k['bytes_per_token'], 'B')}/token/device, mean {si(d['kv_transfer_s']['mean_s'], 's')}; "
                      f"wait for a decode slot mean {si(d['decode_admission_wait_s']['mean_s'], 's')}",
                      highlight=False)
    if "capacity" in r:
        console.print(capacity_line(r["capacity"]), highlight=False)


def _memory_line(m: dict[str, Any], kv_dtype: str | None) -> str:
    """serve.json's memory of an engine whose fraction is not of the whole device (ServingMemory.fraction_of)."""
    g = 2 ** 30
    if m["utilization_of"] == "static":
        return (f"memory per device: {m['capacity_bytes'] / g:.4g} GiB x {m['utilization']:g} (weights + KV) - weights "
                f"{m['weights_bytes'] / g:.4g} GiB = KV {m['kv_bytes'] / g:.4g} GiB ({m['kv_capacity_tokens']:,} "
                f"tokens, {kv_dtype}); reserve {m['reserve_bytes'] / g:.3g} GiB outside it")
    return (f"memory per device: {m['utilization']:g} x ({m['capacity_bytes'] / g:.4g} GiB - weights "
            f"{m['weights_bytes'] / g:.4g} GiB - reserve {m['reserve_bytes'] / g:.3g} GiB) = KV "
            f"{m['kv_bytes'] / g:.4g} GiB ({m['kv_capacity_tokens']:,} tokens, {kv_dtype})")


def capacity_line(c: dict[str, Any]) -> str:
    """The capacity found, once, with its run length and the saturation rate beside it."""
    sat = f"saturation {c['saturation_per_s']:.4g} requests/s offline, {c['saturation']['requests']} requests at t = 0"
    stopped = c.get("interrupted")
    if c["rate_per_s"] is None:
        return f"capacity: none ({sat}): {c['reason']}" + (f" (INTERRUPTED by {stopped['signal']})" if stopped else "")
    run = c["run"]
    if stopped:  # a lower bound: the best valid rate of the runs finished
        hi = c["bracket"][1]
        return (f"capacity: at least {c['rate_per_s']:.4g} requests/s meet the SLO ({sat}); INTERRUPTED by "
                f"{stopped['signal']} after {len(c['runs'])} runs, not converged"
                + (f" (the lowest invalid rate: {hi:.4g} requests/s)" if hi is not None else "")
                + f"; the run above: {run['requests']} requests, queue {run['verdict']}")
    return (f"capacity: {c['rate_per_s']:.4g} requests/s meet the SLO ({sat}; limited by {c['limited_by']}); "
            f"the run above: {run['requests']} requests, the first {run['warmup_requests']} and last "
            f"{run['cooldown_requests']} excluded (warm-up, cool-down), "
            f"{run['span_s']:.4g} s measured, queue {run['verdict']}; {len(c['runs'])} runs"
            + ("" if c["converged"] else ", not converged"))


def cdf_png(res, console: Console) -> bytes | None:
    """The latency CDFs (e2e, TTFT, queue) of a simulated run as PNG bytes; None, saying so, without matplotlib."""
    import importlib.util
    import io

    if importlib.util.find_spec("matplotlib") is None:
        console.print("note: matplotlib is not installed, latency_cdf.png skipped", highlight=False)
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np


    fig, ax = plt.subplots(figsize=(6, 4))
    for name, x in (("e2e", res.finish_s - res.arrival_s), ("ttft", res.first_s - res.arrival_s),
                    ("queue", res.start_s - res.arrival_s)):
        xs = np.sort(x)
        ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=name)
    ax.set_xlabel("latency (s)")
    ax.set_ylabel("fraction of requests")
    ax.legend()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata=png_metadata())
    plt.close(fig)
    return buf.getvalue()
