"""The fit matrix (fit.json's body, opmap.explore.fit) in words: the header a buyer reads first (the workload's
lengths, the SLO, the engine settings, the budgets and prices), one table per workload sized to the terminal
(the platform names, what --hardware takes, never cut; the other columns wrap), and fit.md."""

from __future__ import annotations

from typing import Any

from opmap.report.sheet import si
from opmap.report.text import clean


def slo_words(slo: dict[str, Any]) -> str:
    """'p99 end to end 3000 ms' or 'p99 TTFT 2000 ms, p99 TPOT 200 ms'."""
    if slo.get("p99_s") is not None:
        return f"p99 end to end {slo['p99_s'] * 1e3:g} ms"
    return f"p99 TTFT {slo['ttft_s'] * 1e3:g} ms, p99 TPOT {slo['tpot_s'] * 1e3:g} ms"


def _tokens(spec: Any) -> str:
    s = clean(spec)
    return f"{s} tokens" if s.isdigit() else f"{s} (tokens)"


def engine_words(es: dict[str, Any], runtime: str) -> str:
    """The engine settings every cell ran under, as serve's options name them."""
    pol = f"policy {es.get('policy')}"
    if es.get("max_num_seqs") is not None:
        n = es["max_num_seqs"]
        pol += (f": at most {n} sequence{'s' if n != 1 else ''} (--max-num-seqs) and {es['max_num_batched_tokens']} "
                f"tokens a step (--max-num-batched-tokens), KV blocks of {es['kv_block']} tokens")
    src = "--kv-dtype" if es.get("kv_dtype_source") == "--kv-dtype" else "default: the model dtype's"
    stacks = es.get("engine_presets")
    if stacks:  # fit --engine-preset: the stacks' own sizes per cell; the policy above only where a vendor has none
        return (f"engine: runtime {runtime}; engine stacks {', '.join(f'{v}={s}' for v, s in stacks.items())} (each "
                f"cell's sizes and memory in its notes); elsewhere {pol}; KV cache {es.get('kv_dtype')} ({src})")
    return (f"engine: runtime {runtime}, {pol}; KV cache {es.get('kv_dtype')} ({src}) in "
            f"{es.get('gpu_memory_utilization'):g} of each device's memory (--gpu-memory-utilization)")


def header(r: dict[str, Any]) -> list[str]:
    """What the fit assumed, a line each: the title, the workload, the SLO, the engine, the budgets and prices."""
    lines = [f"opmap fit: output tokens/s per device at the SLO{stopped_words(r)}",
             f"workload: input {_tokens(r['input_len'])}, output {_tokens(r['output_len'])} a request; "
             f"{r['requests']} requests a capacity run; {r['dtype']}",
             f"SLO: {slo_words(r['slo'])}"]
    if r.get("engine_settings"):
        lines.append(engine_words(r["engine_settings"], r["runtime"]))
    budget = [f"devices budget {r['devices_budget']} per platform" if r.get("devices_budget") else
              "devices budget: one node of each platform"]
    if r.get("power_budget_w") is not None:
        budget.append(f"power budget {r['power_budget_w']:g} W")
    if r.get("prices_usd_per_device_hour"):
        budget.append("prices " + ", ".join(f"{h} ${p:g}/device-hour"
                                            for h, p in r["prices_usd_per_device_hour"].items())
                      + ": ranked by cost per million output tokens")
    lines.append("; ".join(budget))
    return [clean(x) for x in lines]


def stopped_words(r: dict[str, Any]) -> str:
    """The words that mark a fit stopped by a signal (its finished cells only), empty for a whole one."""
    i = r.get("interrupted")
    return "" if not i else clean(f": INTERRUPTED by {i['signal']}, {i['cells_done']} of {i['cells_total']} cells "
                                   f"run (not run: {', '.join(i['cells_not_run'])})")


def _notes(c: dict[str, Any]) -> str:
    from opmap.explore.layouts import label

    parts = [f"dtype {c['dtype_line']}"] if c.get("dtype_line") else []  # the format priced, and why
    conf = c.get("confidence")
    if conf:  # how far to trust the cell: its label and weakest input (opmap.hardware.trust)
        parts.insert(0, f"{conf['label']} (weakest: {conf['weakest']['name']}, {conf['weakest']['kind']})")
    ep = c.get("engine_preset")
    if ep:  # the engine stack this platform ran (fit --engine-preset)
        parts.insert(0, f"stack {ep['engine']}@{ep['version']} ({ep['max_num_seqs']} seqs, "
                        f"{ep['max_num_batched_tokens']} tokens, memory {ep['memory']['fraction']:g} of "
                        f"{ep['memory']['of']})")
    if c.get("throughput_at_slo") is not None:
        ppw = "power not modelled" if c["perf_per_watt"] is None else f"{c['perf_per_watt']:.3g} tok/J"
        parts.append(f"p99 {si(c['latency_p99_s'], 's')}, {ppw}, {c['bound']}, risk {c['risk']}")
        if c.get("runner_up"):
            parts.append(f"runner-up {label(c['runner_up'])}: {si(c['runner_up']['per_device_tokens_per_s'])}"
                         "/device")
        if c.get("power_limited"):
            parts.append(f"power: {c['power_limited']}")
    from opmap.explore.fit_quality import words

    if words(c):
        parts.append(words(c))
    if c.get("datasheet_only"):
        parts.append("datasheet only")
    if c.get("excluded_reason"):
        parts.append(("struck: " if c.get("throughput_at_slo") is not None else "") + c["excluded_reason"])
    return clean("; ".join(parts))


def workload_table(r: dict[str, Any], model: str):
    """One workload's platforms, ranked first: platform (never cut), rank, tok/s per device, cost per million
    output tokens (with prices), layout, notes (p99, tok/J, bound, risk, runner-up, why struck); a table that
    fits the console's width (the notes and the layout wrap)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from opmap.explore.layouts import label

    priced = bool(r.get("prices_usd_per_device_hour"))
    t = Table(title=Text(clean(model)), title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("platform", no_wrap=True, min_width=max(len(h) for h in r["hardware"]))
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column("tok/s /device", justify="right", overflow="fold")
    if priced:
        t.add_column("$/M tok", justify="right", overflow="fold")
    t.add_column("layout", overflow="fold")
    t.add_column("notes", overflow="fold")
    cells = {c["hardware"]: c for c in r["cells"] if c["model"] == model}
    order = sorted(r["hardware"], key=lambda h: (cells.get(h) is None, (cells.get(h) or {}).get("rank") is None,
                                                 (cells.get(h) or {}).get("rank") or 0))
    for h in order:
        c = cells.get(h)
        if c is None:
            t.add_row(Text(h), "", "-", *(["-"] if priced else []), "-", Text("not run: interrupted", "yellow"))
            continue
        run = c.get("throughput_per_device") is not None
        style = "strike" if c.get("excluded_reason") and run else ""
        cost = c.get("cost_per_million_output_tokens")
        row = [Text(h), str(c["rank"]) if c.get("rank") else "-",
               Text(f"{si(c['throughput_per_device'])}" if run else "-", style)]
        if priced:
            row.append(Text(f"${cost:.3g}" if cost is not None else "-", style))
        row += [Text(label(c["layout"]) if c.get("layout") else "-", style), Text(_notes(c))]
        t.add_row(*row)
    return t


def markdown(r: dict[str, Any]) -> str:
    """fit.md: the header as a list, then a row per cell."""
    from opmap.explore.layouts import label

    md = [f"# opmap fit ({slo_words(r['slo'])}){stopped_words(r)}", "", *[f"- {x}" for x in header(r)[1:]],
          *[f"- {a}" for a in r["assumptions"]], "",
          "| workload | platform | layout | runner-up | devices | tok/s at SLO | tok/s per device | p99 e2e (s) | "
          "W | tok/J | J/tok | tok/$ | $/M tok | bound | risk | rank | excluded | quality |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def f(x, fmt=".4g"):
        return "-" if x is None else format(x, fmt)

    from opmap.explore.fit_quality import words

    for c in r["cells"]:
        lay = label(c["layout"]) if c["layout"] else "-"
        run = (f"{label(c['runner_up'])} ({c['runner_up']['per_device_tokens_per_s']:.4g}/device)"
               if c["runner_up"] else "-")
        ds = f" (datasheet only: {', '.join(c['datasheet_only'])})" if c["datasheet_only"] else ""
        ds += f" [dtype {c['dtype_line']}]" if c.get("dtype_line") else ""  # the format priced there, and why
        ep = c.get("engine_preset")
        ds += f" [stack {ep['engine']}@{ep['version']}]" if ep else ""  # the engine stack it ran
        conf = c.get("confidence")
        ds += f" [{conf['label']}: {conf['weakest']['name']}]" if conf else ""  # how far to trust it
        md.append(f"| {c['model']} | {c['hardware']}{ds} | {lay} | {run} | {f(c.get('devices'), 'd')} | "
                  f"{f(c['throughput_at_slo'])} | {f(c['throughput_per_device'])} | {f(c['latency_p99_s'])} | "
                  f"{f(c['power_w'], '.0f')} | {f(c['perf_per_watt'])} | {f(c['energy_per_token_j'])} | "
                  f"{f(c['perf_per_dollar'])} | {f(c.get('cost_per_million_output_tokens'))} | {c['bound'] or '-'} | "
                  f"{c['risk']} | {f(c['rank'], 'd')} | {c['excluded_reason'] or '-'} | {clean(words(c)) or '-'} |")
    return "\n".join(md) + "\n"
