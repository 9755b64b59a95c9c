"""The serving layout of one model on one platform: how many devices a replica spans, split how (TP x PP), and
how many replicas fill a device budget.

- **candidates** (``candidates``): TP the powers of two up to one scale-up fabric (``replica_span``: the catalog's
  outermost bounded tier, 72 on an NVL72 rack, 8 on an HGX board) and the budget that divide the model's heads
  (and with its KV heads, one divides the other); PP the powers of two up to the layers, within the budget,
  at most ``PP_HEADROOM`` x the fewest stages that hold the weights (stages past one fabric cross the scale-out
  network: nine 8-GPU b200 nodes run tp8 pp2 over InfiniBand); by devices per replica, tensor parallelism first;
- **each candidate**: skipped where the zoo model's published weights alone outgrow the devices' memory, else
  priced (``opmap.serve.model_cost.model_table_cost`` at that tp and pp), its steady-state
  capacity found for one replica (``opmap.serve.capacity.steady_capacity``: the highest Poisson rate meeting the
  SLO with a stationary queue, never above the offline saturation rate), and ``budget // devices`` replicas
  filling the budget, each receiving its share of the traffic (a random split: every replica sees a Poisson
  stream at the per-replica rate);
- **figure of merit**: output tokens per second per device of the budget (the budget's output tokens per second,
  replicas x one replica's, over the budget's devices: devices a layout leaves idle count against it);
- **chosen**: the best figure among the candidates that fit and meet the SLO; ties go to fewer devices per
  replica, then to more TP (the order tried). The runner-up is the next best.
- **bound and prune**: a layout's capacity never exceeds its offline saturation rate (all requests at t = 0), so
  each priced layout is first bounded by its saturation run (its output tokens/s per device of the budget), the
  capacity searches run in order of that bound, and a layout whose bound is below the runner-up found so far
  is not searched (``limited_by`` "pruned": its capacity cannot beat either); a layout on which one request of the
  shortest lengths, served alone, already breaks the SLO is answered "no rate" without a search
  (``opmap.serve.capacity.alone_breaks_slo``: at any rate every request takes at least that long). The chosen
  layout and its runner-up are the ones an exhaustive search finds (``PRUNE = False``), at a fraction of the runs;
- **progress**: two notes a layout (pricing it, then its capacity search or why none), for fit's progress bar.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from opmap.errors import OpmapError
from opmap.explore.results import LayoutResult, LayoutSearch
from opmap.record import record

# prune layouts that provably cannot be chosen nor be the runner-up (the module docstring's bound and prune, and
# capacity.alone_breaks_slo); False searches every layout that fits (the tests compare the two)
PRUNE = True
# a capacity run can be longer than the saturation run (lengthened to a stationary span), so its mean output
# length can differ from the saturation run's by sampling: the bound is loosened by this much before it prunes
BOUND_SLACK = 0.05
# pipeline stages past the fewest that hold the weights: serving splits a model into stages to hold it (each more
# stage adds a hop and a stage's latency, Narayanan et al. 2021), one doubling past that gives the KV cache room
PP_HEADROOM = 2


def replica_span(hw) -> int:
    """The most devices a replica's TP group spans: one scale-up fabric (the interconnect's outermost bounded tier:
    an HGX board's 8, an NVL72 rack's 72, a Trn2 UltraServer's 64, a TPU pod's ICI torus); 1 where the catalog
    gives none (a device with no scale-up link holds a replica alone)."""
    return hw.interconnect.fabric_size or 1


def default_budget(hw) -> int:
    """The devices a cell is given when no budget is: one domain of the innermost tier (a node; 1 without one)."""
    return hw.interconnect.domain_size or 1


def _powers(top: int) -> list[int]:
    return [1 << k for k in range(max(1, top).bit_length()) if 1 << k <= top]


def tp_allowed(geo, tp: int) -> bool:
    """tp divides the attention heads, and tp and the KV heads divide one another (opmap.mapping.shard_types'
    Parallelism.check: tp above the KV heads replicates each over tp / kv ranks); True without a geometry."""
    spec = geo.attention[0] if geo is not None and geo.attention else None
    if spec is None or not spec.n_heads:
        return True
    kv = spec.n_kv_heads or spec.n_heads
    return spec.n_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)


def candidates(span: int, budget: int, devices: int | None = None, geo=None,
               stages_needed: Callable[[int], int] | None = None) -> list[tuple[int, int]]:
    """(tp, pp) of every layout tried, by devices per replica, highest tp first. tp: the powers of two up to the
    scale-up ``span`` (``replica_span``) and the budget that the model's heads allow (``tp_allowed`` on ``geo``);
    pp: powers of two up to the layers, tp x pp within the budget (stages past one fabric run across the
    scale-out network), at most PP_HEADROOM x the fewest stages that hold the weights at that tp
    (``stages_needed(tp)``, 1 when not given); ``devices``: only layouts of that many devices."""
    layers = geo.layers if geo is not None and geo.layers else budget
    out = []
    for tp in _powers(min(span, budget)):
        if not tp_allowed(geo, tp):
            continue
        most = PP_HEADROOM * (stages_needed(tp) if stages_needed else 1)
        out += [(tp, pp) for pp in _powers(min(layers, budget // tp, most))
                if devices is None or tp * pp == devices]
    return sorted(out, key=lambda x: (x[0] * x[1], -x[0]))


def model_geometry(model: str):
    """The model's geometry without building it (a zoo model's spec, a Hugging Face config read as JSON); None for a
    model file or a config no adapter reads (the pricing then refuses an illegal split itself)."""
    from opmap.workloads.hf import is_hf_target, load_config
    from opmap.workloads.hf_geometry import hf_geometry
    from opmap.workloads.zoo import zoo_geometry

    try:
        geo = zoo_geometry(model)
        return geo if geo is not None or not is_hf_target(model) else hf_geometry(load_config(model))
    except (OpmapError, TypeError, ValueError, ZeroDivisionError):  # as workloads.hf reads it: no geometry
        return None


def layout_candidates(model: str, hw, budget: int, dtype: str, devices: int | None = None) -> list[tuple[int, int]]:
    """``candidates`` of ``model`` on ``hw``: its geometry, the fewest stages that hold its weights at each tp."""
    def stages(tp: int) -> int:
        return next((pp for pp in _powers(budget // tp) if weights_outgrow(model, hw, dtype, tp * pp) is None),
                    max(1, budget // tp))

    return candidates(replica_span(hw), budget, devices, model_geometry(model), stages)


def price_layout(model: str, hardware: str, dtype: str, tp: int, pp: int = 1, runtime: str = "engine",
                 progress: Callable[[str], None] | None = None, max_context: int | None = None,
                 kv_dtype: str | None = None, gpu_memory_utilization: float = 0.9, ep: int = 1,
                 memory_of: str = "total", dp_attention: bool = False, longest_prompt: int | None = None):
    """``model_table_cost`` for one layout: ``max_context`` is the longest prompt + output the run holds (refused
    past the model's positions), ``longest_prompt`` its longest prompt (where the prefill points reach, as serve
    prices them); ``kv_dtype`` and ``gpu_memory_utilization`` as serve's --kv-dtype and
    --gpu-memory-utilization (``memory_of``: what that fraction is of, an engine preset's); ``ep``: the experts
    over the tp group, at the default expert load imbalance; ``dp_attention``: the attention data-parallel over the
    ep = tp ranks (serve's --dp-attention), each rank ``pp`` stages."""
    from opmap.serve.model_cost import model_table_cost

    return model_table_cost(model, hardware, dtype, tp, pp=pp, runtime=runtime, max_context=max_context,
                            progress=progress, kv_dtype=kv_dtype, gpu_memory_utilization=gpu_memory_utilization,
                            ep=ep, memory_of=memory_of, dp_attention=dp_attention, longest_prompt=longest_prompt)


def _with_ep(todo: list[tuple[int, int]], geo) -> list[tuple[int, int, int, bool]]:
    """(tp, pp, ep, DP attention) of every layout tried: each (tp, pp) with tensor-parallel experts, and for a MoE
    model whose experts tp divides, beside it the experts over the tp group (ep = tp: E / tp whole experts a device,
    as vLLM's --enable-expert-parallel lays them) and the same experts under DP attention (the tp devices of a stage
    tp attention ranks, each its own batch and KV pool: SGLang --enable-dp-attention, TensorRT-LLM's DEP; at pp > 1
    each rank a pipeline of pp devices, TensorRT-LLM's DEP2 PP2), priced at the default expert load imbalance."""
    experts = getattr(geo, "n_experts", 0) or 0
    out = []
    for tp, pp in todo:
        out.append((tp, pp, 1, False))
        if tp > 1 and experts and experts % tp == 0:
            out += [(tp, pp, tp, False), (tp, pp, tp, True)]
    return out


def weights_outgrow(model: str, hw, dtype: str, devices: int) -> str | None:
    """Why a layout of ``devices`` cannot hold a zoo model, from its published parameter count alone: its weights
    in ``dtype``, split over the devices, outgrow one device's whole memory (a pre-check that spares pricing a
    layout that cannot fit; the pricing's own memory fit decides every other one). None where that is not
    known to fail."""
    from opmap.precision import format_bytes
    from opmap.workloads import MODELS

    spec = MODELS.get(model)
    cap = hw.memory_bytes
    try:
        per = spec.published_params * format_bytes(dtype) / devices if spec is not None else None
    except OpmapError:
        per = None
    if per is None or not cap or per <= cap:
        return None
    return (f"{model}'s {spec.published_params / 1e9:.3g}B parameters in {dtype} need {per / 2**30:.1f} GiB per "
            f"device over {devices}, more than the {cap / 2**30:.1f} GiB a {hw.name} holds")


def figure_of_merit(layout: LayoutResult) -> float:
    """Output tokens per second per device of the budget (0 for a layout without a rate at the SLO)."""
    return layout.figure_of_merit


def choose(tried: Sequence[LayoutResult]) -> tuple[LayoutResult | None, LayoutResult | None]:
    """(chosen, runner-up) among the layouts ``tried`` with a rate at the SLO, by ``figure_of_merit``; ties to the
    earlier one (fewer devices per replica, then more TP)."""
    ok = [lay for lay in tried if lay.rate_per_s]
    ranked = sorted(range(len(ok)), key=lambda i: (-figure_of_merit(ok[i]), i))
    first = ok[ranked[0]] if ranked else None
    second = ok[ranked[1]] if len(ranked) > 1 else None
    return first, second


def label(layout: LayoutResult | Mapping[str, Any]) -> str:
    """'2 x tp4' or '1 x tp2 pp2': replicas x the split of one (a LayoutResult or fit.json's form of one)."""
    tp, pp, replicas = ((layout["tp"], layout["pp"], layout["replicas"]) if isinstance(layout, Mapping)
                        else (layout.tp, layout.pp, layout.replicas))
    ep = layout.get("ep", 1) if isinstance(layout, Mapping) else layout.ep
    dpa = layout.get("dp_attention", False) if isinstance(layout, Mapping) else layout.dp_attention
    split = f"tp{tp}" + (f" pp{pp}" if pp > 1 else "") + (f" ep{ep}" if ep > 1 else "") + (" dpa" if dpa else "")
    return f"{replicas} x {split}"


def search(model: str, hw, budget: int, slo, input_len: str, output_len: str, requests: int, dtype: str,
           runtime: str, policy, seed: int = 0, devices: int | None = None,
           progress: Callable[[str], None] | None = None, *, kv_dtype: str | None = None,
           gpu_memory_utilization: float = 0.9, preset=None) -> LayoutSearch:
    """Every candidate layout of ``model`` on ``hw`` priced and served (see the module docstring); a layout that
    does not fit or meets the SLO at no rate is kept with its ``reason``; one priced keeps its per-device
    ``memory`` (the KV cache at ``kv_dtype`` in ``gpu_memory_utilization`` of each device, as serve sizes it).
    ``preset`` (an opmap.engines.apply.Applied): each layout sized and scheduled as that engine would (its memory
    rule, its scheduler sizes from the layout's KV capacity), instead of ``policy`` and ``gpu_memory_utilization``."""
    from opmap.serve.arrivals import Arrival, make_requests, parse_length

    ilen, olen = parse_length(input_len), parse_length(output_len)
    drawn = make_requests(Arrival("poisson", 1.0), ilen, olen, requests, seed, max_span_s=None)
    # as serve prices it: the longest request drawn (prompt + output) and the longest prompt
    longest = (int((drawn.input_len + drawn.output_len).max()), int(drawn.input_len.max()))
    todo = _with_ep(layout_candidates(model, hw, budget, dtype, devices), model_geometry(model))
    say = progress or (lambda s: None)  # two notes a layout: priced (or skipped), then searched (or not)
    tried: list[LayoutResult] = []
    bounded: list[tuple[int, Any, Any]] = []  # (index in tried, its RateProbe, its saturation run: a ServeReport)
    rt: dict[str, Any] | None = None
    settings: dict[tuple[int, int, int, bool], Any] = {}
    means = (float(drawn.input_len.mean()), float(drawn.output_len.mean()))
    for tp, pp, ep, dpa in todo:
        lay = LayoutResult.of(tp, pp, budget, ep, dpa)
        say(f"{model} on {hw.name}: layout {len(tried) + 1} of {len(todo)}, {label(lay)}: pricing")
        engine = (preset, means, settings) if preset is not None else None
        lay, probe, sat, runtime_used = _bound(lay, model, hw, budget, slo, ilen, olen, requests, dtype, runtime,
                                              policy, seed, longest, kv_dtype, gpu_memory_utilization, engine)
        rt = rt or runtime_used
        tried.append(lay)
        if sat is not None:
            bounded.append((len(tried) - 1, probe, sat))
    # capacity searches in order of the bound; stop once no unsearched layout can beat the runner-up
    bounded.sort(key=lambda x: -tried[x[0]].bound_per_device_tokens_per_s)
    for _ in range(len(todo) - len(bounded)):
        say(f"{model} on {hw.name}: a layout that does not fit, not searched")
    found: list[float] = []
    for k, (i, probe, sat) in enumerate(bounded, 1):
        say(f"{model} on {hw.name}: capacity {k} of {len(bounded)}, {label(tried[i])}")
        tried[i] = _searched(tried[i], probe, sat, budget, found)
        if tried[i].per_device_tokens_per_s is not None:
            found.append(tried[i].per_device_tokens_per_s)
    chosen, runner = choose(tried)
    return LayoutSearch(tuple(tried), chosen, runner, rt, settings if preset is not None else None)


def _bound(lay: LayoutResult, model: str, hw, budget: int, slo, ilen, olen, requests: int, dtype: str,
           runtime: str, policy, seed: int, longest: tuple[int, int], kv_dtype: str | None,
           gpu_memory_utilization: float, engine: tuple | None = None):
    """``lay`` skipped (weights outgrow the devices, or its pricing refused) or priced and bounded by its offline
    saturation run: (the layout, its RateProbe, the saturation summary, the runtime priced under); the last
    three None where it was not priced or not bounded. ``longest``: (the longest request, the longest prompt)
    drawn. ``engine``: (an Applied preset, the run's mean lengths,
    the search's settings by (tp, pp, ep, dp_attention), filled here) sizes the memory and the policy as that
    engine would."""
    from opmap.serve.arrivals import Arrival
    from opmap.serve.capacity import RateProbe

    why = weights_outgrow(model, hw, dtype, lay.devices_per_replica)
    if why:
        return replace(lay, reason=why), None, None, None
    memory = engine[0].memory(hw, lay.tp, lay.pp) if engine is not None else None
    try:
        cost = price_layout(model, hw.name, dtype, lay.tp, lay.pp, runtime, max_context=longest[0], kv_dtype=kv_dtype,
                            gpu_memory_utilization=memory.fraction if memory else gpu_memory_utilization,
                            memory_of=memory.of if memory else "total", ep=lay.ep, dp_attention=lay.dp_attention,
                            longest_prompt=longest[1])
        if engine is not None:
            policy = _preset_policy(engine, model, dtype, hw, lay, cost, memory)
    except OpmapError as e:
        return replace(lay, reason=str(e)), None, None, None
    lay = replace(lay, fits=True, memory={"kv_dtype": cost.kv_dtype,
                                          **{k: v for k, v in (cost.memory or {}).items() if k != "reserve"}})
    probe = RateProbe(Arrival("poisson", 1.0), ilen, olen, requests, policy, cost, 1, "round_robin", seed, slo)
    try:
        sat = probe.saturation()
    except OpmapError as e:  # a request the KV cache cannot hold
        return replace(lay, reason=str(e)), None, None, dict(cost.runtime)
    lay = replace(lay, bound_per_device_tokens_per_s=sat.throughput.output_tokens_per_s * lay.replicas / budget,
                  saturation_per_s=float(sat.throughput.requests_per_s))
    return lay, probe, sat, dict(cost.runtime)


def _preset_policy(engine: tuple, model: str, dtype: str, hw, lay: LayoutResult, cost, memory):
    """The engine preset's policy for this priced layout (its setting kept in the search's settings)."""
    from opmap.engines.apply import sizing_inputs

    applied, (isl, osl), settings = engine
    s = applied.setting(sizing_inputs(model, dtype, hw, lay.tp, lay.pp, cost, isl, osl, False), memory)
    settings[(lay.tp, lay.pp, lay.ep, lay.dp_attention)] = s  # ep / DP-attention twins size apart
    return s.policy()


def _floor(lay: LayoutResult, sat, budget: int, bar: float | None) -> float | None:
    """The rate (requests/s of one replica) under which ``lay`` cannot beat the runner-up's ``bar`` (output tokens/s
    per device): its output tokens a request, as its saturation run served them, times the replicas over the budget,
    loosened by BOUND_SLACK as the saturation bound is (a capacity search stops once a rate under it is invalid:
    every rate it could still find lies under that one). None without a runner-up."""
    tput = sat.throughput  # the saturation run (a ServeReport)
    if bar is None or not tput.requests_per_s > 0:
        return None
    per_request = tput.output_tokens_per_s / tput.requests_per_s
    return bar / (1 + BOUND_SLACK) * budget / (lay.replicas * per_request)


def _searched(lay: LayoutResult, probe, sat, budget: int, found: list[float]) -> LayoutResult:
    """``lay`` pruned (its saturation bound under the runner-up's figure among ``found``) or its capacity searched
    (``steady_capacity``): the figures of the run at the rate found, or the reason no rate meets the SLO."""
    from opmap.serve.capacity import steady_capacity

    bound = lay.bound_per_device_tokens_per_s
    bar = sorted(found)[-2] if PRUNE and len(found) >= 2 else None  # the runner-up so far
    if bar is not None and bound * (1 + BOUND_SLACK) < bar:
        return replace(lay, limited_by="pruned", reason=(
            f"not searched: its saturation bound {bound:.4g} tokens/s per device is below the runner-up's "
            f"{bar:.4g}"))
    try:
        cap = steady_capacity(probe, saturation=sat, prune=PRUNE, floor=_floor(lay, sat, budget, bar))
    except OpmapError as e:  # an offline run that completes nothing
        return replace(lay, reason=str(e))
    head = cap.headline
    lay = replace(lay, capacity=record(cap), saturation_per_s=cap.saturation_per_s)  # as fit.json writes it
    if cap.limited_by == "floor":
        return replace(lay, limited_by="pruned", reason=f"searched in part: its {cap.reason} (the rate whose "
                                                        f"output tokens/s per device match the runner-up's {bar:.4g})")
    if head is None:
        return replace(lay, reason=cap.reason)
    out_tok = head.throughput.output_tokens_per_s
    return replace(lay, rate_per_s=cap.rate_per_s, limited_by=cap.limited_by,
                   output_tokens_per_s=out_tok * lay.replicas, per_device_tokens_per_s=out_tok * lay.replicas / budget,
                   latency_p99_s=head.latency.e2e.p99_s, utilization=list(head.utilization))
