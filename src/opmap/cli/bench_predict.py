"""``opmap bench --launch CONFIG`` and ``--predict``: the local server's life around a bench run, and the run
joined to opmap's simulation of the same workload (opmap.bench.launch, opmap.bench.predict); ``opmap compare
BENCH_RUN SERVE_RUN`` prints the same join from the store."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

from opmap.cli.common import console
from opmap.errors import OpmapError
from opmap.report.text import plain, safe
from opmap.tags import Tags

if TYPE_CHECKING:
    from opmap.bench.metrics import BenchFigures

PROBE_INPUT = 32  # the overhead probe's prompt, tokens: a short prefill, so the step overhead dominates its TTFT
PROBE_OUTPUT = 32  # its long answers, tokens: enough steps for a per-token median
PROBE_REPS = 10  # answers of each length: the overhead is their median (the spread is recorded)
PROBE_BATCH = 4  # sequences decoded together for the per-sequence overhead, open loop (closed: the concurrency)
PROBE_MAX_BATCH = 32


def check_target(url: str | None, model: str | None, launch: str | None, predict: bool, hardware: str | None,
                 config: str | None) -> None:
    """One line where the target options do not make a run: a URL and --model, or --launch alone; --predict
    against a URL needs the served model's config and the hardware."""
    if launch is not None and url is not None:
        raise OpmapError("--launch starts its own server: give --launch CONFIG or a URL, not both")
    if launch is None and url is None:
        raise OpmapError("opmap bench needs a URL (the server's base, with or without /v1) or --launch CONFIG")
    if launch is None and not model:
        raise OpmapError("--model is required with a URL (the model name as the server's /v1/models lists it)")
    if launch is not None and model:
        raise OpmapError("--model names a URL's model; --launch serves its own (its id is read from /v1/models)")
    if predict and launch is None and (config is None or hardware is None):
        raise OpmapError("--predict against a URL needs --config (the served model's Hugging Face config) and "
                         "--hardware (the catalog device it runs on)")


@contextlib.contextmanager
def launched(config: str | None, device: str, threads: int | None, kv_blocks: int | None):
    """The launched server (opmap.bench.launch.launch_server) with a status line while it starts, or None without
    --launch."""
    if config is None:
        yield None
        return
    from opmap.bench.launch import DEFAULT_KV_BLOCKS, launch_server

    with contextlib.ExitStack() as stack:
        with console.status(f"starting transformers serve on a random-weight {safe(config)} ({safe(device)})"):
            srv = stack.enter_context(launch_server(config, device=device, threads=threads,
                                                    kv_blocks=kv_blocks or DEFAULT_KV_BLOCKS))
        s = srv.settings
        console.print(f"launched {safe(srv.model_id)} at {srv.base_url} (pid {srv.pid}): {s.parameters:,} "
                      f"parameters {s.dtype}, {s.threads} torch threads, {s.kv_blocks} KV blocks of "
                      f"{s.page_tokens} tokens, {s.max_batch_tokens} tokens a step; up in "
                      f"{s.write_s + s.startup_s:.3g} s", highlight=False)
        yield srv
    console.print(f"stopped the server (pid {srv.pid})", highlight=False)


def price(config: str, hardware: str, dtype: str, runtime: str, max_context: int | None,
          longest_prompt: int | None = None):
    """The step cost of ``config`` on ``hardware`` (opmap.serve.model_cost), priced before anything starts;
    ``longest_prompt``: the load's longest prompt, where the prefill points reach (as serve prices them)."""
    from opmap.serve.model_cost import model_table_cost

    with console.status(f"pricing {safe(config)} on {safe(hardware)}") as st:
        return model_table_cost(config, hardware, dtype, runtime=runtime, max_context=max_context,
                                progress=lambda s: st.update(safe(s)), longest_prompt=longest_prompt)


def launched_dtype(config: str) -> str:
    """The dtype a launched model is written in (its config's torch_dtype; fp32 where unset), opmap's name."""
    from opmap.workloads.hf import load_config

    c = load_config(config)
    d = str(getattr(c, "dtype", None) or getattr(c, "torch_dtype", None) or "float32").removeprefix("torch.")
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(d, "fp32")


def probe(root: str, model: str, prompt, *, api: str, ignore_eos: bool, timeout_s: float, batch: int,
          when: str) -> tuple[tuple, tuple]:
    """The records of one probe of the server's overhead (opmap.bench.predict.probe_records): PROBE_REPS
    sequential 1-token and PROBE_OUTPUT-token answers on a PROBE_INPUT-token prompt, then ``batch`` long answers
    together (the run's concurrency; PROBE_BATCH for an open loop) with 1-token requests among them. The bench
    probes before and after its run and pools both, so the overhead brackets the run on a machine whose load
    moves."""
    import numpy as np

    from opmap.bench.predict import probe_records
    from opmap.bench.workload import word_prompt

    text = (prompt or word_prompt)(0, PROBE_INPUT, np.random.default_rng(12345))
    with console.status(f"measuring the server's overhead ({when} the run)"):
        return probe_records(root, model, text, PROBE_INPUT, reps=PROBE_REPS, long_out=PROBE_OUTPUT,
                             batch=min(batch, PROBE_MAX_BATCH), api=api, ignore_eos=ignore_eos, timeout_s=timeout_s)


def overhead(cost, before: tuple[tuple, tuple], after: tuple[tuple, tuple], batch: int):
    """The server's overhead from the probes before and after the run, pooled (``batch``: as ``probe``'s)."""
    from opmap.bench.predict import overhead_from_probe

    return overhead_from_probe(before[0] + after[0], cost, PROBE_INPUT, PROBE_OUTPUT, before[1] + after[1],
                               min(batch, PROBE_MAX_BATCH))


def predict_and_report(result, figures: BenchFigures, cost, policy, overhead, stack, assumptions: dict,
                       bench_tags: Tags, out: Path | None, store: Path | None, no_store: bool):
    """Simulate the run's workload, print measured / predicted, write bench_predict.json, record the prediction
    as a serve run (the figures of the last variant: with the overhead where measured); the BenchPrediction."""
    from dataclasses import replace

    from opmap.bench.predict import SCHEMA_VERSION, predict_run
    from opmap.cli.common import record_run
    from opmap.record import record

    with console.status("simulating the same workload"):
        # the measured side is the bench run's own figures (opmap.bench.metrics), as compare will read them
        rep = replace(predict_run(result, cost, policy, overhead=overhead, measured=figures, stack=stack),
                      assumptions=assumptions)
    doc = record(rep)
    print_join(doc)
    if stack is not None:
        console.print(safe(stack.line()), highlight=False)
        why = stack.outside(concurrency=result.concurrency) if result.mode == "closed" else ""
        if why:
            console.print(f"[yellow]outside the profile's range[/]: {safe(why)}", highlight=False)
    if out is not None:
        from opmap.cli.common import print_wrote
        from opmap.report.outputs import write_set
        from opmap.validate import json_text

        print_wrote(write_set(out, {"bench_predict.json": json_text(doc, indent=2) + "\n"}))
    last = rep.last()
    fig = record(last.figures)
    payload = {"schema_version": SCHEMA_VERSION, "latency": fig["latency"], "throughput": fig["throughput"],
               "requests": {"count": fig["requests"], "output_tokens": fig["output_tokens"], "span_s": fig["span_s"]},
               "policy": doc["policy"], "assumptions": {**assumptions, "prediction": last.name,
                                                        "overhead": doc.get("overhead")},
               "predicted_from": "bench", "join": list(last.rows)}
    record_run("serve", payload, Tags("serve-predicted", workload=assumptions["model"],
                                      hardware=assumptions["hardware"], phase="serve",
                                      precision=assumptions["dtype"], parallelism=bench_tags.parallelism,
                                      predicted_from="bench", endpoint=bench_tags.endpoint), store, no_store)
    return rep


def _fmt(x: float | None, unit: str) -> str:
    from opmap.report.sheet import si

    return "-" if x is None else si(x, unit)


def _r(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def print_join(rep: dict) -> None:
    """measured | predicted | predicted / measured per row, one column pair per prediction variant (``rep``:
    bench_predict.json's body, or compare's rows in its shape)."""
    from rich.table import Table

    names = list(rep["predictions"])
    a = rep.get("assumptions", {})
    t = Table(title=plain(f"measured vs predicted ({a.get('hardware')}, {rep['policy']['spec']}, runtime "
                          f"{a.get('runtime')}): {rep['workload']['requests']} requests, {rep['workload']['mode']} "
                          "loop"), title_justify="left")
    t.add_column("figure")
    t.add_column("measured", justify="right")
    for n in names:
        t.add_column(f"predicted ({n})", justify="right")
        t.add_column("ratio", justify="right")
    rows = {n: rep["predictions"][n]["rows"] for n in names}
    for i, row in enumerate(rows[names[0]]):
        if row["stat"] == "mean":
            continue
        label = f"{row['metric']} {row['stat']}" if row["unit"] == "s" else f"{row['metric']}/s"
        unit = "s" if row["unit"] == "s" else ""
        cells = [label, _fmt(row["measured"], unit) if unit else f"{row['measured']:.4g}"]
        for n in names:
            r = rows[n][i]
            cells += [_fmt(r["predicted"], unit) if unit else f"{r['predicted']:.4g}", _r(r["ratio"])]
        t.add_row(*cells)
    console.print(t)
    ov = rep.get("overhead")
    if ov:
        b = ov["basis"]
        console.print(f"server overhead (probe: {b['probe']}; {b.get('batch_probe', 'no batch probe')}): "
                      f"{ov['step_s'] * 1e3:.3g} ms a step + {ov['per_seq_s'] * 1e3:.3g} ms a decoding sequence "
                      f"(measured "
                      f"{b['measured_s_per_token'] * 1e3:.3g} ms a token vs the model's decode step "
                      f"{b['model_decode_step_s'] * 1e3:.3g} ms), {ov['request_s'] * 1e3:.3g} ms a request (1-token "
                      f"answer {b['measured_e2e_1_token_s'] * 1e3:.3g} ms vs the model's prefill "
                      f"{b['model_prefill_s'] * 1e3:.3g} ms)" + (
                          f", {ov['request_load_s'] * 1e3:.3g} ms a request among {ov['load_batch']} decoding "
                          f"(1-token answer {b['measured_e2e_1_token_load_s'] * 1e3:.3g} ms vs the model's mixed "
                          f"step {b['model_mixed_step_s'] * 1e3:.3g} ms)" if ov.get("request_load_s") is not None
                          else ""), highlight=False)


def bench_vs_serve(a: str, b: str, store: Path | None, as_json: bool) -> bool:
    """``opmap compare`` of a bench run and a serve run (either order): the measured / predicted table; False
    where the two runs are not one of each (compare goes on as before)."""
    from opmap.store.source import load, reading

    with reading(store, needed=not (Path(a).exists() and Path(b).exists())) as con:
        ra, rb = load(a, store, con), load(b, store, con)
    if {ra.kind, rb.kind} != {"bench", "serve"}:
        return False
    from opmap.bench.predict import join

    m, p = (ra, rb) if ra.kind == "bench" else (rb, ra)
    for r in (m, p):
        if not isinstance(r.payload.get("latency"), dict) or not isinstance(r.payload.get("throughput"), dict):
            raise OpmapError(f"run {r.id} ({r.kind}) has no latency and throughput figures to compare")
    rows = join(m.payload, p.payload)
    if as_json:
        from opmap.validate import json_text

        print(json_text({"schema_version": 1, "bench": m.id, "serve": p.id, "rows": rows}, indent=2))
        return True
    pol = p.payload.get("policy") or {}
    rep = {"predictions": {"serve run " + p.id: {"rows": rows}}, "policy": {"spec": pol.get("spec", "?")},
           "workload": {"requests": (m.payload.get("requests") or {}).get("ok", "?"),
                        "mode": "open" if (m.payload.get("spec") or {}).get("arrival") else "closed"},
           "assumptions": {"hardware": p.tags.get("hardware"),
                           "runtime": ((p.payload.get("assumptions") or {}).get("runtime"))}}
    console.print(f"bench run {safe(m.id)} (measured) against serve run {safe(p.id)} (predicted)", highlight=False)
    print_join(rep)
    return True
