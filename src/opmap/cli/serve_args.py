"""``opmap serve``'s options gathered (``Options``) and checked, each in one line, before anything is priced;
what they parse to (``Parsed``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from opmap.errors import OpmapError
from opmap.formats import registry
from opmap.validate import INT_GE1, SEED, Rule, options, positive_in


@dataclass(frozen=True)
class Options:
    """The command's options as given (checked by ``parse``, in one line each, before anything is priced)."""

    model: str
    hardware: str
    tp: int
    pp: int
    runtime: str
    kv_dtype: str | None
    gpu_memory_utilization: float
    allow_long_context: bool
    arrival: str
    requests: int
    input_len: str
    output_len: str
    policy: str | None
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    kv_block: int | None
    replicas: int
    router: str
    disaggregate: str | None
    slo_ttft: float | None
    slo_tpot: float | None
    slo_p99: float | None
    find_capacity: bool
    engine: str
    seed: int
    service_time: str | None
    dtype: str
    out: Path | None
    spec: str | None = None
    spec_accept: float | None = None
    spec_accepted: float | None = None
    prefix_share: float | None = None
    prefix_groups: int | None = None
    ep: int = 1
    ep_imbalance: float | None = None
    chunked_prefill: bool | None = None
    engine_preset: str | None = None
    stack_path: Path | None = None
    dp_attention: bool = False


@dataclass(frozen=True)
class Parsed:
    """What the options parse to: the arrival process, the lengths, the policy, the SLO, the disaggregation (P, D)
    or None, the replicas (P + D with --disaggregate) and the speculative decoding (or None)."""

    arrival: Any
    input_len: Any
    output_len: Any
    policy: Any
    slo: Any
    pd: tuple[int, int] | None
    replicas: int
    spec: Any = None
    prefix: Any = None  # opmap.serve.prefix.PrefixShare, with --prefix-share
    preset: Any = None  # an EnginePreset (--engine-preset), or None
    setting: Any = None  # its EngineSetting once the replica is priced (opmap.engines), or None
    stack: Any = None  # opmap.calibrate.stack_profile.StackProfile (--stack), or None


def on_device(o: Options) -> tuple[Options, Any]:
    """The options with --dtype as the format priced on --hardware (an alias resolved: ``--dtype fp4``), the
    --kv-dtype checked on the device, and the DtypeChoice the header names."""
    from opmap.api import dtype_on
    from opmap.hardware import get_hardware
    from opmap.precision import check_kv_format, check_requestable

    check_requestable(o.dtype)
    hw = get_hardware(o.hardware)
    choice = dtype_on(hw, o.dtype)
    if o.kv_dtype is not None and o.kv_dtype in registry().names(kv=True):
        check_kv_format(hw, o.kv_dtype)
    return replace(o, dtype=choice.format), choice


def parse(o: Options) -> Parsed:
    """Every input checked before the pricing and the simulation."""
    from opmap.explore.engine import check_engine
    from opmap.phases.runtime import check_runtime
    from opmap.report.sheet import check_out_dir
    from opmap.serve import parse_arrival, parse_length
    from opmap.serve.model_cost import check_kv_dtype

    _check_options(o.tp, o.pp, o.gpu_memory_utilization, o.requests, o.replicas, o.seed, o.slo_ttft, o.slo_tpot,
                   o.slo_p99)
    options({"--ep": (o.ep, INT_GE1)})
    if o.ep_imbalance is not None:
        options({"--ep-imbalance": (o.ep_imbalance, Rule(lo=1.0, hi=float(max(1, o.ep))))})
    _check_dp_attention(o)
    check_runtime(o.runtime)
    check_kv_dtype(o.kv_dtype, o.dtype)
    arr = parse_arrival(o.arrival)
    ilen, olen = parse_length(o.input_len), parse_length(o.output_len)
    spec = _spec(o)
    preset = _preset(o)
    pol = policy(o.policy if o.policy is not None or spec is None else "continuous", o.disaggregate is not None,
                  o.max_num_seqs, o.max_num_batched_tokens, o.kv_block, o.chunked_prefill)
    slo = _slo(o.slo_ttft, o.slo_tpot, o.slo_p99)
    check_engine(o.engine)
    if o.find_capacity and arr.kind not in ("poisson", "gamma"):
        raise OpmapError("--find-capacity varies the arrival rate: use --arrival poisson:RATE or gamma:RATE,CV")
    pd = _disaggregation(o.disaggregate, o.replicas, o.service_time, o.router, pol)
    if o.dp_attention and pol.name not in ("engine", "continuous", "chunked"):
        raise OpmapError(f"--dp-attention runs its ranks' iterations in lockstep: use --policy engine, continuous or "
                         f"chunked, got {pol.spec()!r}")
    prefix = _prefix(o.prefix_share, o.prefix_groups, pol, pd)
    if o.out is not None:
        check_out_dir(o.out)
    if spec is not None and (pol.name not in ("continuous", "chunked") or pd is not None):
        raise OpmapError(f"--spec {spec.spec()} is simulated under --policy continuous[:TOKEN_BUDGET] (its default) "
                         f"or chunked:CHUNK, without --disaggregate; got --policy {pol.spec()}"
                         + (" with --disaggregate" if pd is not None else ""))
    stack = _stack(o)
    return Parsed(arr, ilen, olen, pol, slo, pd, pd[0] + pd[1] if pd is not None else o.replicas, spec, prefix, preset,
                   stack=stack)


def _check_dp_attention(o: Options) -> None:
    """--dp-attention against the layout (opmap.serve.model_cost.check_dp_attention) and the options that do not
    run with it, in one line each."""
    if not o.dp_attention:
        return
    from opmap.serve.model_cost import check_dp_attention

    check_dp_attention(o.tp, o.pp, o.ep, True)
    clash = [f for f, v in (("--service-time", o.service_time), ("--disaggregate", o.disaggregate),
                            ("--spec", o.spec)) if v is not None]
    if clash:
        raise OpmapError(f"--dp-attention simulates one pool of attention ranks stepping in lockstep, priced by the "
                         f"cost model, without speculative decoding: drop {clash[0]}")
    if o.router == "shared":
        raise OpmapError("--dp-attention deals each replica's requests over its attention ranks: use --router "
                         "round_robin or least_loaded, not shared")


def _stack(o: Options):
    """--stack read and checked (opmap.calibrate.stack_profile): None without it."""
    if o.stack_path is None:
        return None
    if o.service_time is not None:
        raise OpmapError("--stack scales the cost model's steps, which --service-time replaces: give one")
    from opmap.calibrate.stack_profile import read_stack_profile

    return read_stack_profile(o.stack_path)


def _spec(o: Options):
    """--spec with its acceptance, checked (opmap.serve.spec.parse_spec); None without it."""
    # their ranges first: a bad number is named as such, with or without --spec (below K + 1: parse_spec's)
    from opmap.serve.spec import MAX_K

    options({"--spec-accept": (o.spec_accept, Rule(lo=0, hi=1, hi_open=True)),
             "--spec-accepted": (o.spec_accepted, Rule(lo=1, hi=MAX_K + 1, hi_open=True))})
    if o.spec is None:
        if o.spec_accept is not None or o.spec_accepted is not None:
            raise OpmapError("--spec-accept and --spec-accepted set speculative decoding's acceptance: give --spec too")
        return None
    if o.service_time is not None:
        raise OpmapError("--spec prices draft and verify passes, which a service time does not have: drop "
                         "--service-time")
    from opmap.serve.spec import parse_spec

    return parse_spec(o.spec, o.spec_accept, o.spec_accepted, o.seed)


def _preset(o: Options):
    """--engine-preset parsed and checked against the options it replaces (None without one)."""
    if o.engine_preset is None:
        return None
    from opmap.engines import parse_preset

    preset = parse_preset(o.engine_preset)
    clash = [f for f, v in (("--policy", o.policy), ("--disaggregate", o.disaggregate),
                            ("--service-time", o.service_time)) if v is not None]
    if clash:
        raise OpmapError(f"--engine-preset sets the engine policy from {preset.display}'s defaults; {clash[0]} "
                         "replaces it: drop one (--max-num-seqs, --max-num-batched-tokens, --kv-block, "
                         "--[no-]chunked-prefill and --gpu-memory-utilization override a preset's values)")
    return preset


def _check_options(tp, pp, gpu_memory_utilization, requests, replicas, seed, slo_ttft, slo_tpot, slo_p99) -> None:
    """The numeric options against their ranges, in one line each."""
    from opmap.serve.arrivals import MAX_REQUESTS
    from opmap.serve.sim import MAX_REPLICAS

    options({"--tp": (tp, INT_GE1), "--pp": (pp, INT_GE1),
             "--gpu-memory-utilization": (gpu_memory_utilization, Rule(lo=0, hi=1, lo_open=True)),
             "--requests": (requests, INT_GE1.but(hi=MAX_REQUESTS)),
             "--replicas": (replicas, INT_GE1.but(hi=MAX_REPLICAS)),
             "--seed": (seed, SEED), **{k: (v, positive_in("ms")) for k, v in (
                 ("--slo-ttft", slo_ttft), ("--slo-tpot", slo_tpot), ("--slo-p99", slo_p99))}})


def _slo(slo_ttft: float | None, slo_tpot: float | None, slo_p99: float | None):
    """The SLO from its flags (ms): p99 end to end, or p99 TTFT and TPOT (defaults 2000 and 200 ms)."""
    from opmap.serve import Slo

    if slo_p99 is not None and (slo_ttft is not None or slo_tpot is not None):
        raise OpmapError("--slo-p99 replaces --slo-ttft and --slo-tpot: give one or the other")
    if slo_p99 is not None:
        return Slo(None, None, slo_p99 / 1e3)
    return Slo(2.0 if slo_ttft is None else slo_ttft / 1e3, 0.2 if slo_tpot is None else slo_tpot / 1e3)


def _prefix(share: float | None, groups: int | None, pol, pd):
    """--prefix-share R [--prefix-groups G] checked (the engine policy, one pool): a PrefixShare, or None."""
    if groups is not None:  # its range first: a bad number is named as such, with or without --prefix-share
        from opmap.serve.prefix import MAX_GROUPS
        from opmap.validate import count

        count(groups, "--prefix-groups", hi=MAX_GROUPS)
    if share is None:
        if groups is not None:
            raise OpmapError("--prefix-groups G splits the prefix --prefix-share R shares: give --prefix-share too")
        return None
    from opmap.serve.prefix import PrefixShare

    if pd is not None or pol.name != "engine":
        raise OpmapError("--prefix-share is served from the prefix cache of the engine policy's paged KV, in one "
                         f"pool: use --policy engine without --disaggregate (got {pol.spec()!r}"
                         + (", --disaggregate)" if pd is not None else ")"))
    return PrefixShare(share, 1 if groups is None else groups)


def _disaggregation(disaggregate: str | None, replicas: int, service_time: str | None, router: str, pol):
    """--disaggregate P:D checked against the options it excludes: (P, D), or None without it."""
    if disaggregate is None:
        return None
    from opmap.serve.disagg import parse_disaggregate

    pd = parse_disaggregate(disaggregate)
    if replicas != 1:
        raise OpmapError("--disaggregate P:D sets the replicas (P prefill + D decode): drop --replicas")
    if service_time is not None:
        raise OpmapError("--disaggregate splits a request into prefill and decode steps, which a service "
                         "time does not have: drop --service-time")
    if router not in ("round_robin", "least_loaded"):
        raise OpmapError(f"--disaggregate routes to prefill replicas with round_robin or least_loaded, "
                         f"not {router}")
    if pol.name != "continuous":
        raise OpmapError(f"--disaggregate runs iteration-level batching in both pools: use --policy "
                         f"continuous[:TOKEN_BUDGET], got {pol.spec()!r}")
    return pd


def policy(spec: str | None, disaggregate: bool, max_num_seqs: int | None, max_num_batched_tokens: int | None,
            kv_block: int | None, chunked_prefill: bool | None = None):
    """--policy (default engine; continuous with --disaggregate) and the engine's sizes from their flags."""
    from opmap.serve import Engine, parse_policy

    flags = {"--max-num-seqs": max_num_seqs, "--max-num-batched-tokens": max_num_batched_tokens,
             "--kv-block": kv_block, "--[no-]chunked-prefill": chunked_prefill}
    given = [k for k, v in flags.items() if v is not None]
    if spec is None:
        spec = "continuous" if disaggregate and not given else "engine"
    pol = parse_policy(spec)
    if not given:
        return pol
    if not isinstance(pol, Engine) or spec.strip() != "engine":
        raise OpmapError(f"{', '.join(given)} set the engine policy's sizes: use --policy engine (or leave it out), "
                         f"got {spec!r}")
    return Engine(*(d if v is None else v for v, d in ((max_num_seqs, pol.max_num_seqs),
                                                       (max_num_batched_tokens, pol.max_num_batched_tokens),
                                                       (kv_block, pol.kv_block),
                                                       (chunked_prefill, pol.chunked_prefill))))


def check_router(router: str, replicas: int) -> None:
    """The router by name and the replicas (P + D with --disaggregate) against the simulator's limit."""
    from opmap.serve.sim import MAX_REPLICAS, check_router
    from opmap.validate import count

    check_router(router)
    count(replicas, "--replicas", hi=MAX_REPLICAS)
