"""``opmap serve``: simulate serving a model under an arrival process and a batching policy."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import typer

from opmap.cli.common import console, exit_if_stopped, print_wrote
from opmap.cli.serve_args import Options, Parsed, check_router, on_device, parse
from opmap.formats import registry, spoken
from opmap.phases.runtime import RUNTIME_HELP
from opmap.record import jsonable, record
from opmap.report.text import safe
from opmap.validate import json_text

_KV = spoken(registry().names(kv=True))  # --kv-dtype accepts the registry's KV formats


# the command's options (typer reads them from the signature's defaults)
_MODEL = typer.Argument(..., help="A decoder: a zoo name (opmap models list), path/to/config.json, hf:NAME "
                                  "or path/to/file.py:factory.")
_HARDWARE = typer.Option("h100-sxm", "--hardware", "-H", help="Catalog name (opmap hardware list).")
_TP = typer.Option(1, "--tp", help="Tensor-parallel devices per replica.")
_PP = typer.Option(1, "--pp", help="Pipeline stages per replica (the layers split over them; a replica is "
                                   "tp x pp devices).")
_EP = typer.Option(1, "--ep", help="MoE: the experts over each replica's tp group, E / ep a device (divides "
                                   "--tp; the attention stays tensor-parallel, or with --dp-attention data-parallel "
                                   "over ep = tp ranks).")
_DP_ATTENTION = typer.Option(False, "--dp-attention", help="MoE, with --ep N --tp N: N attention ranks of one "
                             "device each (SGLang --enable-dp-attention, TensorRT-LLM enable_attention_dp), each its "
                             "own batch, scheduler and KV pool, requests round-robin over them, E / N experts a "
                             "device, the ranks' steps in lockstep; with --pp P each rank P pipeline stages.")
_EP_IMBALANCE = typer.Option(None, "--ep-imbalance", help="With --ep: the busiest EP rank's routed "
                                                         "tokens over the mean, >= 1 (default from "
                                                         "a published measurement).")
_RUNTIME = typer.Option("engine", "--runtime", help=RUNTIME_HELP + ".")
_KV_DTYPE = typer.Option(None, "--kv-dtype", help=f"KV cache format: {_KV} "
                                                  "(default: the model dtype's activations').")
_GPU_MEMORY_UTILIZATION = typer.Option(None, "--gpu-memory-utilization",
                                       help="Fraction of each device's memory the engine takes (0 < "
                                            "u <= 1): weights, runtime reserve and the KV cache "
                                            "(default 0.9; with --engine-preset, in that engine's "
                                            "sense: SGLang's mem_fraction_static, TensorRT-LLM's "
                                            "free_gpu_memory_fraction).")
_ALLOW_LONG_CONTEXT = typer.Option(False, "--allow-long-context",
                                   help="Allow prompt + output past the model's max_position_embeddings "
                                        "(rope scaling).")
_ARRIVAL = typer.Option("poisson:10", help="poisson:RATE, gamma:RATE,CV, offline or trace:FILE.")
_REQUESTS = typer.Option(1000, "--requests", help="Requests to simulate (a trace: at most this many; "
                                                  "--find-capacity: at least this many a run, more where "
                                                  "they span under 20 request lifetimes).")
_INPUT_LEN = typer.Option("512", "--input-len", help="N, uniform:A,B, normal:MEAN,STD, "
                                                     "lognormal:MEDIAN,SIGMA ([,MAX]) or trace.")
_OUTPUT_LEN = typer.Option("128", "--output-len", help="As --input-len.")
_PREFIX_SHARE = typer.Option(None, "--prefix-share", help="engine: the fraction R (0 to 1) of each "
                             "prompt that is a prefix shared with its group (a system prompt of R x "
                             "input_len tokens), served from the prefix cache; a Mooncake trace "
                             "(--arrival trace:FILE with hash_ids) brings its own.")
_PREFIX_GROUPS = typer.Option(None, "--prefix-groups", help="With --prefix-share: G distinct shared "
                                                            "prefixes, request i in group i mod G "
                                                            "(default 1).")
_POLICY = typer.Option(None, help="engine (in-flight batching as vLLM / TensorRT-LLM: the default; "
                                  "continuous with --disaggregate), none, static:B, dynamic:B,WAIT_MS, "
                                  "continuous[:TOKEN_BUDGET], chunked:CHUNK.")
_MAX_NUM_SEQS = typer.Option(None, "--max-num-seqs", help="engine: most sequences running in a "
                                                           "step (default 256, vLLM's).")
_MAX_NUM_BATCHED_TOKENS = typer.Option(None, "--max-num-batched-tokens",
                                       help="engine: tokens per step, decodes first, the rest "
                                            "prompt chunks (default 8192).")
_KV_BLOCK = typer.Option(None, "--kv-block", help="engine: KV cache block, tokens (default 16); "
                                                  "blocks run out: preemption by recompute.")
_CHUNKED_PREFILL = typer.Option(None, "--chunked-prefill/--no-chunked-prefill",
                                help="engine: split prompts over steps (default on; a preset's "
                                     "default otherwise).")
_ENGINE_PRESET = typer.Option(None, "--engine-preset",
                              help="vllm, sglang, trtllm or trtllm-bench (NAME@VERSION for a "
                                   "version): that engine's scheduler defaults and sizing rules "
                                   "(max sequences, token budget, chunking, KV block, memory "
                                   "fraction, CUDA graphs), each sourced; flags given override.")
_STACK = typer.Option(None, "--stack", help="A stack profile (opmap calibrate --from-bench): its "
                                           "fitted host times and decode / prefill scales applied "
                                           "to every priced step.")
_REPLICAS = typer.Option(1, "--replicas", help="Model replicas, each of --tp devices.")
_ROUTER = typer.Option("round_robin", help="round_robin, least_loaded, shared (one queue) or "
                       "batched:SIZE,WAIT_MS (a harness batcher: groups of up to SIZE, one at least WAIT_MS after "
                       "the last, each to the next replica).")
_DISAGGREGATE = typer.Option(None, "--disaggregate", help="P:D prefill and decode replicas "
                             "(DistServe-style), each of --tp devices, the KV cache moved "
                             "between them over the device's links; instead of --replicas.")
_SLO_TTFT = typer.Option(None, "--slo-ttft", help="TTFT limit at p99, ms (default 2000).")
_SLO_TPOT = typer.Option(None, "--slo-tpot", help="TPOT limit at p99, ms (default 200).")
_SLO_P99 = typer.Option(None, "--slo-p99", help="End-to-end latency limit at p99, ms "
                                                "(instead of TTFT and TPOT).")
_FIND_CAPACITY = typer.Option(False, "--find-capacity", help="Search for the highest arrival rate "
                             "meeting the SLO with a stationary queue, never above the offline "
                             "saturation rate; the run printed is the one at that rate (probes run in "
                             "parallel).")
_ENGINE = typer.Option("local", help="Where --find-capacity's probes run: local (a process pool here) or "
                                     "ray (a Ray cluster, the ray extra); the same capacity either way.")
_SEED = typer.Option(0, "--seed", help="Seeds arrivals, lengths and service times.")
_SERVICE_TIME = typer.Option(None, "--service-time", help="fixed:MS or exp:MS: a per-request "
                                                          "service time instead of the cost model.")
_DTYPE = typer.Option("bf16", help="Precision of the priced model.")
_SPEC = typer.Option(None, "--spec", help="Speculative decoding: mtp:K (the model's MTP module), "
                     "eagle:K (an EAGLE-3 head) or draft:MODEL:K (a draft model), K drafted tokens "
                     "a step; policy continuous (the default with --spec) or chunked.")
_SPEC_ACCEPT = typer.Option(None, "--spec-accept", help="--spec: probability each drafted token "
                            "is accepted (0 <= RATE < 1; default: the kind's published figure).")
_SPEC_ACCEPTED = typer.Option(None, "--spec-accepted", help="--spec: mean tokens a step emits "
                              "(1 <= A < K + 1), instead of --spec-accept.")
_OUT = typer.Option(None, help="Write serve.json (and latency_cdf.png with matplotlib) here.")
_STORE = typer.Option(None, "--store", help="Run store file (default $OPMAP_STORE).")
_NO_STORE = typer.Option(False, "--no-store", help="Do not record this run in the run store.")


def serve(
    model: str = _MODEL,
    hardware: str = _HARDWARE,
    tp: int = _TP,
    pp: int = _PP,
    ep: int = _EP,
    ep_imbalance: float | None = _EP_IMBALANCE,
    dp_attention: bool = _DP_ATTENTION,
    runtime: str = _RUNTIME,
    kv_dtype: str | None = _KV_DTYPE,
    gpu_memory_utilization: float | None = _GPU_MEMORY_UTILIZATION,
    allow_long_context: bool = _ALLOW_LONG_CONTEXT,
    arrival: str = _ARRIVAL,
    requests: int = _REQUESTS,
    input_len: str = _INPUT_LEN,
    output_len: str = _OUTPUT_LEN,
    prefix_share: float | None = _PREFIX_SHARE,
    prefix_groups: int | None = _PREFIX_GROUPS,
    policy: str | None = _POLICY,
    max_num_seqs: int | None = _MAX_NUM_SEQS,
    max_num_batched_tokens: int | None = _MAX_NUM_BATCHED_TOKENS,
    kv_block: int | None = _KV_BLOCK,
    chunked_prefill: bool | None = _CHUNKED_PREFILL,
    engine_preset: str | None = _ENGINE_PRESET,
    stack: Path | None = _STACK,
    replicas: int = _REPLICAS,
    router: str = _ROUTER,
    disaggregate: str | None = _DISAGGREGATE,
    slo_ttft: float | None = _SLO_TTFT,
    slo_tpot: float | None = _SLO_TPOT,
    slo_p99: float | None = _SLO_P99,
    find_capacity: bool = _FIND_CAPACITY,
    engine: str = _ENGINE,
    seed: int = _SEED,
    service_time: str | None = _SERVICE_TIME,
    dtype: str = _DTYPE,
    spec: str | None = _SPEC,
    spec_accept: float | None = _SPEC_ACCEPT,
    spec_accepted: float | None = _SPEC_ACCEPTED,
    out: Path | None = _OUT,
    store: Path | None = _STORE,
    no_store: bool = _NO_STORE,
) -> None:
    """A discrete-event simulation of serving: prefill and decode steps priced by opmap's cost model for the
    batch actually formed, admission limited by the KV cache that fits; TTFT, TPOT, ITL, goodput, MLPerf-style
    validity."""
    o = Options(model, hardware, tp, pp, runtime, kv_dtype, gpu_memory_utilization, allow_long_context, arrival,
                 requests, input_len, output_len, policy, max_num_seqs, max_num_batched_tokens, kv_block, replicas,
                 router, disaggregate, slo_ttft, slo_tpot, slo_p99, find_capacity, engine, seed, service_time, dtype,
                 out, spec, spec_accept, spec_accepted, prefix_share, prefix_groups, ep, ep_imbalance,
                 chunked_prefill, engine_preset, stack, dp_attention)
    o, choice = on_device(o)
    p = parse(o)
    reqs, cost, transfer, probe, p = _price(o, p)
    report, res, stop = _run(reqs, p.arrival, p.policy, cost, p.replicas, o.router, o.seed, p.slo, p.pd, transfer,
                             probe, o.engine, out is not None)
    _render(o, p, report, res, cost, store, no_store, choice)
    exit_if_stopped(stop)


def _price(o: Options, p: Parsed):
    """(the requests, the step cost, the KV move of a disaggregated run, the --find-capacity probe)."""
    from opmap.serve import make_requests

    reqs = make_requests(p.arrival, p.input_len, p.output_len, o.requests, o.seed)
    if p.prefix is not None:
        reqs = p.prefix.apply(reqs)
    memory = _memory(o, p.preset)
    cost = _cost(reqs, p.policy, p.replicas, o.router, o.service_time, o.model, o.hardware, o.dtype, o.tp, o.pp,
                 o.runtime, o.kv_dtype, memory.fraction, o.allow_long_context, memory.of, p.spec,
                 (o.ep, o.ep_imbalance, o.dp_attention))
    if p.stack is not None:  # the fitted host times and scales on every priced step (opmap.bench.stack_fit)
        from opmap.bench.predict import with_stack

        cost = with_stack(cost, p.stack)[0]
    if p.preset is not None:
        p = _with_setting(o, p, reqs, cost, memory)
    transfer = _kv_transfer(p.pd, o.hardware, cost, o.tp * o.pp, p.replicas)
    probe = None
    if o.find_capacity:
        from opmap.serve.capacity import RateProbe

        probe = RateProbe(p.arrival, p.input_len, p.output_len, o.requests, p.policy, cost, p.replicas, o.router,
                          o.seed, p.slo, p.pd, transfer, prefix=p.prefix)
    return reqs, cost, transfer, probe, p


def _applied(o: Options, preset):
    """The preset with the flags given over it (opmap.engines.apply.Applied)."""
    from opmap.engines.apply import Applied

    return Applied(preset, o.gpu_memory_utilization, o.max_num_seqs, o.max_num_batched_tokens, o.kv_block,
                   o.chunked_prefill)


def _memory(o: Options, preset):
    """The memory fraction priced and what it is of: --gpu-memory-utilization (default 0.9 of the whole device),
    or the preset's rule on this device and layout (a value given wins, in the engine's sense)."""
    from opmap.engines import MemoryRule

    if preset is None:
        u = 0.9 if o.gpu_memory_utilization is None else o.gpu_memory_utilization
        return MemoryRule(u, "total", "--gpu-memory-utilization" if o.gpu_memory_utilization is not None else
                          "opmap's default (vLLM's)")
    from opmap.hardware import get_hardware

    return _applied(o, preset).memory(get_hardware(o.hardware), o.tp, o.pp)


def _with_setting(o: Options, p: Parsed, reqs, cost, memory) -> Parsed:
    """``p`` with the preset's engine setting for the priced replica (its KV capacity, the run's mean lengths,
    offline or not), the flags given applied over it, and the policy it runs. With --dp-attention the cost's KV
    capacity and bytes a token are one rank's (one device's, the KV whole), so a rule that reads the replica's KV as
    bytes a token x tp (trtllm-bench's) sizes the requests of tp devices' memory at tp x a rank's KV each: one rank's
    requests, the batch each rank's scheduler runs."""
    from opmap.engines.apply import sizing_inputs
    from opmap.hardware import get_hardware

    x = sizing_inputs(o.model, o.dtype, get_hardware(o.hardware), o.tp, o.pp, cost, reqs.input_len.mean(),
                      reqs.output_len.mean(), p.arrival.kind == "offline")
    s = _applied(o, p.preset).setting(x, memory)
    return replace(p, policy=s.policy(), setting=s)


def _render(o: Options, p: Parsed, report: dict, res, cost, store: Path | None, no_store: bool,
            choice=None) -> None:
    """The run's assumptions set on the report; printed, written with --out, recorded in the run store."""
    from opmap.cli.common import record_run
    from opmap.tags import Tags

    pd, tp, pp, replicas = p.pd, o.tp, o.pp, p.replicas
    report["assumptions"] = {"model": o.model, "hardware": o.hardware, "tp": tp, "dtype": o.dtype,
                             "confidence": _confidence(o, p, cost),
                             **({"dtype_line": choice.header(), **choice.to_dict()} if choice is not None else {}),
                             "replicas": replicas, "disaggregate": f"{pd[0]}:{pd[1]}" if pd else None,
                             "router": o.router, "seed": o.seed, "input_len": p.input_len.spec(),
                             "output_len": p.output_len.spec(),
                             "cost": "service time " + o.service_time if o.service_time else "opmap cost model",
                             "kv_cache": _kv_words(p.policy), **_pricing_assumptions(cost, tp, pp, replicas),
                             **({"engine_preset": record(p.setting)} if p.setting is not None else {})}
    if p.spec is not None:  # only with --spec: the outputs of a run without it are unchanged
        report["assumptions"]["speculative_decoding"] = {**p.spec.to_dict(), "line": p.spec.text()}
    if p.prefix is not None:
        report["assumptions"]["prefix"] = p.prefix.spec()
    from opmap.report.serve_text import print_serve

    print_serve(console, report, o.model, o.hardware)
    if o.out is not None:
        _write(o.out, report, res)
    dpa = f" ep{o.ep} dpa" if o.dp_attention else ""
    record_run("serve", report, Tags("serve", workload=o.model, hardware=o.hardware, phase="serve", precision=o.dtype,
                                     parallelism=f"tp{tp}{f' pp{pp}' if pp > 1 else ''}{dpa} x {replicas} replicas"
                                                 + (f" (prefill:decode {pd[0]}:{pd[1]})" if pd else "")),
               store, no_store)


def _confidence(o: Options, p: Parsed, cost=None) -> dict:
    """How far to trust the run's figures (opmap.hardware.trust): the weakest input that priced its steps; a
    service time is the user's own figure."""
    from opmap.hardware import get_hardware
    from opmap.hardware.trust import Input, Trust, moe_input, trust

    if o.service_time is not None:
        given = Input("service time", "assumed", f"--service-time {o.service_time}")
        return {**Trust("datasheet", given, (given,)).to_dict(), "line": f"confidence: datasheet (weakest input: "
                                                                       f"the given service time {o.service_time})"}
    extra = ()
    if p.spec is not None:
        published = p.spec.basis.startswith("default")  # a published measurement (spec_defaults.toml), else given
        extra = (Input("speculative acceptance", "measured" if published else "assumed",
                       f"{p.spec.alpha:.4g} per token ({p.spec.basis})"),)
    hw = get_hardware(o.hardware)
    if getattr(cost, "moe_grid", None):
        extra = (*extra, moe_input(hw, o.dtype, cost.moe_grid))
    t = trust(hw, o.dtype, o.runtime, o.tp * o.pp, extra, stack=p.stack)
    return {**t.to_dict(), "line": t.line()}


def _cost(reqs, pol, replicas, router, service_time, model, hardware, dtype, tp, pp, runtime, kv_dtype,
          gpu_memory_utilization, allow_long_context, memory_of: str = "total", spec=None, ep=(1, None, False)):
    """The step pricing: a service time, or opmap's cost model of MODEL on HARDWARE (the router, and the policy
    against a service time, checked first, so a bad one is refused before the pricing)."""
    from opmap.serve import parse_service_time
    from opmap.serve.policies import check_with_service_time

    check_router(router, replicas)
    if service_time is not None:
        cost = parse_service_time(service_time)
        check_with_service_time(pol)
        return cost
    from opmap.hardware import get_hardware

    get_hardware(hardware)
    from opmap.serve.model_cost import model_table_cost

    longest = int((reqs.input_len + reqs.output_len).max()) if len(reqs.input_len) else None
    with console.status(f"pricing {safe(model)} on {safe(hardware)}") as st:
        kw = dict(runtime=runtime, kv_dtype=kv_dtype, gpu_memory_utilization=gpu_memory_utilization,
                  allow_long_context=allow_long_context, max_context=longest, progress=lambda s: st.update(safe(s)),
                  longest_prompt=int(reqs.input_len.max()) if len(reqs.input_len) else None,
                  ep=ep[0], ep_imbalance=ep[1], memory_of=memory_of)
        if len(ep) > 2 and ep[2]:
            kw["dp_attention"] = True
        if spec is not None:
            from opmap.serve.spec_cost import spec_table_cost

            return spec_table_cost(model, hardware, dtype, tp, spec, pp=pp, **kw)
        return model_table_cost(model, hardware, dtype, tp, pp=pp, **kw)


def _kv_transfer(pd, hardware: str, cost, devices: int, replicas: int):
    """The KV move between the pools of a disaggregated run; None without --disaggregate."""
    if pd is None:
        return None
    from opmap.hardware import get_hardware
    from opmap.serve.disagg import kv_transfer_for

    return kv_transfer_for(get_hardware(hardware), cost.kv_bytes_per_token, devices, replicas)


def _run(reqs, arr, pol, cost, replicas, router, seed, slo, pd, transfer, probe, engine, figure):
    """(the report, the simulated run for the CDF figure, the stop): the run at the capacity found with
    --find-capacity (``probe``), else the one run of ``reqs``. Stopped before any rate met the SLO: the runs'
    finding is printed and the command ends."""
    from opmap.serve import simulate, summarize

    report = capacity = res = stop = None
    if probe is not None:  # the printed run is the run at the capacity found (warm-up excluded), not another one
        capacity, res, stop = _find_capacity(probe, engine, figure)
        if capacity.headline is None and stop is not None:  # stopped before any rate met the SLO: no table
            from opmap.report.serve_text import capacity_line

            console.print(capacity_line({**record(capacity), "engine": engine}), highlight=False)
            exit_if_stopped(stop)
        report = record(capacity.headline) if capacity.headline is not None else None  # serve.json
    if report is None:
        with console.status(f"simulating {len(reqs)} requests ({safe(pol.spec())}, {safe(arr.spec())})"):
            if pd is not None:
                from opmap.serve.disagg import simulate_disaggregated

                res = simulate_disaggregated(reqs, pol, cost, pd[0], pd[1], transfer, router, seed)
            else:
                res = simulate(reqs, pol, cost, replicas, router, seed)
            report = record(summarize(res, slo))  # serve.json
    if capacity is not None:
        report["capacity"] = {**record(capacity), "engine": engine}
        if stop is not None:
            report["interrupted"] = jsonable(capacity.interrupted)  # its record (None: no run made)
    return report, res, stop


def _write(out: Path, report: dict, res) -> None:
    """serve.json and latency_cdf.png (with matplotlib), as one set; an earlier run's PNG never stays."""
    from opmap.report.sheet import write_set

    files = {"serve.json": json_text(report, indent=2) + "\n"}
    from opmap.report.serve_text import cdf_png

    png = cdf_png(res, console) if res is not None else None
    if png is not None:
        files["latency_cdf.png"] = png
    print_wrote(write_set(out, files, remove=["latency_cdf.png"]))


def _find_capacity(probe, engine: str, figure: bool):
    """--find-capacity on ``engine``: (the capacity record, the run at the rate found again for the CDF figure where
    ``figure``, the stop). Ctrl-C or SIGTERM keeps the runs so far (the stop is returned): the best valid rate among
    them is reported, marked interrupted; no headline where none was valid yet."""
    from opmap.cli.common import kept, step_progress
    from opmap.explore.engine import get_engine
    from opmap.serve.capacity import steady_capacity

    stop = res = None
    try:
        with step_progress("finding capacity") as progress, get_engine(engine) as eng:
            def map_fn(fn, rates):
                return eng.map(fn, rates, progress=progress, label=lambda r: f"finding capacity: {r:.4g} requests/s")

            capacity = steady_capacity(probe, map_fn=map_fn)
    except KeyboardInterrupt as e:
        capacity, stop = kept(e)
    if capacity.headline is not None and figure and stop is None:
        res = probe.measured(capacity.rate_per_s)  # the same run again (same seed), for the CDF figure
    return capacity, res, stop


def _kv_words(pol) -> str:
    if pol.name == "engine" and getattr(pol, "no_evict", False):
        return (f"paged in blocks of {pol.kv_block} tokens; a request admitted only when its KV to its last token "
                "fits beside every running request's (TensorRT-LLM's GUARANTEED_NO_EVICT): no preemption")
    if pol.name == "engine":
        return (f"paged in blocks of {pol.kv_block} tokens, taken as tokens are produced; preemption by "
                "recompute when blocks run out")
    return "reserved in full (input + output) at admission, no preemption"


def _pricing_assumptions(cost, tp: int, pp: int, replicas: int) -> dict:
    """What the step pricing assumed (opmap.serve.model_cost): runtime, KV format, layout, memory per device."""
    rt = getattr(cost, "runtime", None)
    return {"runtime": rt, "kv_dtype": getattr(cost, "kv_dtype", None),
            "layout": {"tp": tp, "pp": pp, "replicas": replicas,
                       **{k: v for k, v in (getattr(cost, "layout", None) or {}).items()
                          if k.startswith("ep") or k in ("dp_attention", "attention_ranks")}},
            "memory": getattr(cost, "memory", None),
            **({"moe_grid": cost.moe_grid} if getattr(cost, "moe_grid", None) else {})}
