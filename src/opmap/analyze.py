"""The analyze pipeline: workload -> OpGraph -> OpCost per node -> Prediction per node -> Analysis.

Each stage is a pure function of its inputs plus the explicit assumptions recorded here. ``Analysis``
renders to analysis.json (``to_dict``), the public contract documented in the README.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opmap.assumptions import Assumptions, build_assumptions
from opmap.capture import capture
from opmap.costs import cost_graph, uncounted
from opmap.costs.base import OpCost
from opmap.errors import OpmapError
from opmap.formats import get_format
from opmap.graph import Node, OpGraph
from opmap.hardware.spec import HardwareSpec
from opmap.mapping.fp8 import (
    FP8_INFERENCE_NOTE,
    cast_formats,
    fp8_assumptions,
    fp8_operand_bytes,
    inference_bf16_nodes,
    plan_fp8_training,
)
from opmap.mapping.fusion import FusionPlan, plan_fusion
from opmap.mapping.kernels import KernelResult, map_kernels
from opmap.mapping.memory import (
    MemoryFit,
    fit_inference,
    held_weight_bytes,
    inflight_activation_bytes,
    kv_geometry,
    train_formats,
    training_state_bytes,
)
from opmap.mapping.moe_measured import price_measured_moe
from opmap.precision import (
    Precision,
    attention_core_precision,
    power_limited,
    reference,
    resolve_dtype,
    resolve_precision,
    resolve_training_precision,
)
from opmap.predict import Prediction, mfu, predict_cost, ridge_point
from opmap.record import record
from opmap.workloads.zoo import Workload

if TYPE_CHECKING:
    from opmap.phases.result import PhaseResult, TrainStep

# 2: ``phase`` (prefill / decode / train figures) and ``memory`` (the per-device fit) at the top level
SCHEMA_VERSION = 2


@dataclass(frozen=True)
class NodeResult:
    node: Node
    cost: OpCost
    pred: Prediction


@dataclass(frozen=True)
class LayerSummary:
    layer_type: str
    nodes: int
    flops: float
    matrix_flops: float
    bytes: float
    predicted_s: float
    bound: str  # the bound holding the most predicted time within this layer type


@dataclass(frozen=True)
class Analysis:
    workload: str
    graph: OpGraph
    results: tuple[NodeResult, ...]
    hardware: HardwareSpec
    precision: Precision
    assumptions: Assumptions
    plan: FusionPlan | None = None
    kernel_results: tuple[KernelResult, ...] = ()
    # a layout over several devices (opmap.mapping.sharding.Sharded); None: one device, today's output
    sharded: Any = None
    # set by opmap.phases (analyze_phase, with_figures; opmap.phases.result): None: no phase
    phase_figures: PhaseResult | TrainStep | None = None
    fit: MemoryFit | None = None  # set by analyze_phase (decode, train); None: ``memory`` computes inference's
    kept_gemms: frozenset[int] = frozenset()  # GEMMs a quantized checkpoint keeps in bf16 (weights and rate)

    # -- totals ---------------------------------------------------------------------------------------
    @cached_property
    def total(self) -> OpCost:
        """The counted nodes' costs added up in node order (``OpCost.__add__`` field by field, without its
        per-node OpCost: 142,806 nodes for DeepSeek-R1)."""
        return OpCost.sum(r.cost for r in self.results)

    @cached_property
    def predicted_latency_s(self) -> float:
        """Kernel times (the fusion plan's kernels) plus what non-kernel nodes cost (host dispatch of views)."""
        if not self.kernel_results:
            return sum(r.pred.predicted_s for r in self.results)
        return (sum(k.predicted_s for k in self.kernel_results)
                + sum(r.pred.predicted_s for r in self.results if not r.cost.kernel))

    @property
    def runtime_per_step_s(self) -> float:
        """What the runtime adds once per step (a graph launch, an engine's scheduler gap; 0 under eager), from
        the runtime recorded in the assumptions (``with_runtime``)."""
        rt = self.assumptions.runtime
        return float(rt.per_step_s) if rt is not None else 0.0

    @property
    def headline(self) -> tuple[str, float]:
        """The one step time this analysis states (the phase line, the Totals box and ``totals.predicted_latency_s``
        all print it): prefill's time to first token, decode's time per output token, train's iteration; under a
        layout over several devices, the layout's; the runtime's per-step time included."""
        if self.phase_figures is not None:
            return self.phase_figures.headline
        return "latency", self.predicted_latency_s + self.runtime_per_step_s

    @property
    def headline_mfu(self) -> float:
        """MFU at the headline time: the phase's (train: PaLM's model FLOPs), else the matrix FLOPs per device over
        the headline step."""
        f = self.phase_figures
        if f is not None and f.mfu is not None:
            return f.mfu
        devices = self.sharded.parallelism.devices if self.sharded is not None else 1
        return mfu(self.total.matrix_flops / devices, self.headline[1], self.precision)

    @property
    def kernels(self) -> int:
        return len(self.kernel_results) if self.kernel_results else sum(1 for r in self.results if r.cost.kernel)

    @property
    def predicted_mfu(self) -> float:
        return mfu(self.total.matrix_flops, self.predicted_latency_s, self.precision)

    @cached_property
    def weights_held_bytes(self) -> float:
        """The weights the model holds at their stored formats (opmap.mapping.memory.held_weight_bytes: a quantized
        run's embedding and kept GEMMs in bf16)."""
        return held_weight_bytes(self.graph, self.precision.weight_scale, self.kept_gemms)

    @cached_property
    def memory(self) -> MemoryFit:
        """Inference on one device (opmap.mapping.memory.fit_inference): the weights at their stored format, the
        KV cache of the captured batch and sequence (read off the graph's causal attention calls), the
        activations in flight (the largest op's working set, scaled with batch x sequence) and the assumed
        workspace; the largest batch and longest context that fit. A training graph adds AdamW state at ZeRO
        stage 0 on one device and no KV cache; its saved activations are not counted here (saved_activation_bytes
        measures them from the module; analyze_phase does)."""
        if self.fit is not None:
            return self.fit
        weights = self.weights_held_bytes
        geo = kv_geometry(self.graph)
        batch = int(self.assumptions.batch or 1)
        seq = self.assumptions.seq
        tokens = batch * (seq or 1)
        inflight = inflight_activation_bytes(self.graph)
        fit = fit_inference(weights, geo.bytes_per_token, self.hardware.memory_bytes, batch, seq or 1,
                            activations=lambda b, s: inflight * b * s / tokens, max_context=1 << 24,
                            window=geo.window, kv_bytes=geo.sequence_bytes, kv_text=geo.text)
        if seq is None:
            fit = replace(fit, max_context=None)
        fit = cap_at_positions(fit, self.assumptions, seq)
        if self.assumptions.training and self.precision.requested in train_formats():
            st = training_state_bytes(self.graph.params, 0, 1, self.precision.requested)
            fit = replace(fit, gradients_bytes=st.gradients_bytes, optimizer_bytes=st.optimizer_bytes,
                          kv_cache_bytes=0.0,
                          phase="training (saved activations not counted)", max_batch=None, max_context=None,
                          assumptions=fit.assumptions + (st.note,))
        return fit

    @property
    def memory_text(self) -> str:
        """The memory fit's verdict (``memory``) in one sentence: what the weights and the rest take at the stored
        format against the device, why it does not fit and what to do, the largest batch and longest context that
        fit (analysis.json's ``totals.memory_fit.text``; the sheet's memory line)."""
        m = self.memory
        fmt = self.precision.policy["weights"]
        if m.weights_bytes > self.graph.param_bytes * self.precision.weight_scale * (1 + 1e-9):
            fmt += " (the embedding and the GEMMs the checkpoint keeps unquantized in bf16)"
        have = m.capacity_bytes
        w, total = m.weights_bytes, m.total_bytes
        # a training step's memory holds gradients, optimizer state and saved activations; inference's a KV cache
        train = m.phase.startswith("training")
        rest = ("gradients, optimizer state, saved activations and workspace" if train else
                "KV cache, activations in flight and workspace")
        shorter = "the microbatch / sequence" if train else "the batch / context"
        if m.fits:
            text = f"fits: the weights take {_bytes(w)} at {fmt}; with {rest} {_bytes(total)} of {_bytes(have)}"
        elif w > have:
            text = (f"does not fit: the weights need {_bytes(w)} at {fmt}, the device has {_bytes(have)} "
                    f"({w / have:.2f}x its memory: shard across devices or store the weights narrower)")
        else:
            text = (f"does not fit: the weights take {_bytes(w)} at {fmt}, with {rest} {_bytes(total)}; the device "
                    f"has {_bytes(have)} ({total / have:.2f}x: {m.reason.split('; ')[-1]}; shard, store narrower or "
                    f"shorten {shorter})")
        if m.max_batch is not None:
            capped = any("capped at the model's" in x for x in m.assumptions)
            text += f"; largest {'microbatch' if train else 'batch'} {m.max_batch}" + (
                f", longest {'sequence' if train else 'context'} {m.max_context}"
                + (" (the model's position limit)" if capped else "") if m.max_context is not None else "")
        return text

    @property
    def uncounted(self) -> dict[str, int]:
        return uncounted(self.graph, [r.cost for r in self.results])

    def layer_types(self) -> list[LayerSummary]:
        """Per layer type; a fused kernel's time counts under its anchor node's layer type."""
        groups: dict[str, list[NodeResult]] = defaultdict(list)
        for r in self.results:
            groups[r.node.layer_type].append(r)
        kernel_time: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for k in self.kernel_results:
            kernel_time[self.results[k.kernel.anchor].node.layer_type][k.bound] += k.predicted_s
        out = []
        for lt, rs in groups.items():
            by_bound: dict[str, float] = defaultdict(float)
            if self.kernel_results:
                for b, t in kernel_time[lt].items():
                    by_bound[b] += t
                for r in rs:
                    if not r.cost.kernel:
                        by_bound[r.pred.bound] += r.pred.predicted_s
            else:
                for r in rs:
                    by_bound[r.pred.bound] += r.pred.predicted_s
            real = {b: t for b, t in by_bound.items() if b not in ("view", "alloc")}
            bound = max(real, key=real.get) if real else "view"
            out.append(LayerSummary(
                lt, len(rs), sum(r.cost.flops for r in rs), sum(r.cost.matrix_flops for r in rs),
                sum(r.cost.bytes for r in rs), sum(by_bound.values()), bound))
        return sorted(out, key=lambda s: -s.predicted_s)

    # -- the JSON contract ----------------------------------------------------------------------------
    def to_dict(self, nodes: bool = True) -> dict[str, Any]:
        """analysis.json. ``nodes=False``: each node as its id, op, module, layer type and FLOPs only (what the
        run store keeps of them), skipping the per-tensor detail that makes a 70B model's JSON large.
        A computed shape: totals, layer types, nodes, kernels and the layout are built from the pipeline's results,
        not this class's fields."""
        mem = self.memory
        return {
            "schema_version": SCHEMA_VERSION,
            "assumptions": record(self.assumptions),
            "totals": self.totals_dict(),
            "layer_types": self.layer_types_dict(),
            # each node: its graph row, its cost and its prediction (a later key keeps the earlier's place)
            "nodes": _node_rows(self.results) if nodes else [
                {"id": r.node.id, "op": r.node.op, "module": r.node.module, "layer_type": r.node.layer_type,
                 "flops": r.cost.flops} for r in self.results],
            "kernels": [record(k) for k in self.kernel_results] + (
                [record(c) for c in self.sharded.collectives] if self.sharded is not None else []),
            "fusion": self.plan.to_dict() if self.plan else None,
            "uncounted": self.uncounted,
            # the figures a phase set (``phase_figures``, typed: opmap.phases.result); empty without a phase
            "phase": record(self.phase_figures) if self.phase_figures is not None else {},
            "memory": record(mem),
        } | ({} if (s := self.sharded) is None else {  # a layout over several devices: its block, its collectives
            "parallelism": {**record(s), "kernel_per_device_s": list(s.kernel_s)},
            "collectives": [record(c) for c in s.collectives]})

    def totals_dict(self) -> dict[str, Any]:
        """analysis.json's ``totals`` (the sheet's Totals box prints it without building the node rows)."""
        total = self.total
        lat = self.predicted_latency_s
        head, head_s = self.headline
        mem = self.memory
        return {
            "params": self.graph.params,
            "param_bytes": self.weights_held_bytes,
            "flops": total.flops,
            "matrix_flops": total.matrix_flops,
            "vector_flops": total.vector_flops,
            "transcendental_flops": total.transcendental_flops,
            "macs": total.macs,
            "skipped_flops": total.skipped_flops,
            "bytes": total.bytes,
            "bytes_read": total.bytes_read,
            "param_bytes_read": total.param_bytes_read,
            "bytes_written": total.bytes_written,
            "nodes": len(self.results),
            "kernels": self.kernels,
            # the headline (``headline``): the phase's step time, which the phase line and the Totals box print
            "predicted_latency_s": head_s,
            "predicted_latency_name": head,
            "predicted_mfu": self.headline_mfu,
            "kernel_time_s": lat,  # the kernels (and view dispatch) of the captured step on one device
            "runtime_per_step_s": self.runtime_per_step_s,
            "ridge_point_flops_per_byte": ridge_point(self.precision, self.hardware),
            # the memory fit on one device: the weights at their stored format, the verdict and its sentence
            "memory_fit": {"weights_bytes": mem.weights_bytes, "weights_format": self.precision.policy["weights"],
                           "device_memory_bytes": mem.capacity_bytes, "fits": mem.fits, "text": self.memory_text,
                           **record(mem)},
        }

    def layer_types_dict(self) -> dict[str, dict[str, Any]]:
        """analysis.json's ``layer_types``: ``layer_types()`` with each one's share of the kernel time."""
        lat = self.predicted_latency_s
        return {s.layer_type: {"nodes": s.nodes, "flops": s.flops, "matrix_flops": s.matrix_flops,
                               "bytes": s.bytes, "predicted_s": s.predicted_s,
                               "share_of_time": s.predicted_s / lat if lat else 0.0, "bound": s.bound}
                for s in self.layer_types()}



def _node_rows(results: Sequence[NodeResult]) -> list[dict[str, Any]]:
    """Each node's row of analysis.json: its graph row, its cost and its prediction (a later key keeps the earlier's
    place). Nodes of one signature share their cost and prediction objects (cost_graph, analyze_graph): each one's
    dict is made once and copied into the rows."""
    made: dict[int, dict[str, Any]] = {}
    for r in results:
        for x in (r.cost, r.pred):
            if id(x) not in made:
                made[id(x)] = x.to_dict()
    return [{**r.node.to_dict(), **made[id(r.cost)], **made[id(r.pred)], "counted": r.cost.counted} for r in results]


def cap_at_positions(fit: MemoryFit, assumptions: Assumptions, length: int | None) -> MemoryFit:
    """``fit`` with its longest context cut to the model's position limit (``assumptions.position_limit``) where
    memory alone holds more and the captured ``length`` is within it (a run past it, --allow-long-context, keeps
    memory's figure)."""
    pos = assumptions.position_limit
    limit = pos.max_positions if pos is not None else None
    if not limit or not fit.max_context or fit.max_context <= limit or (length or 0) > limit:
        return fit
    way = ("past it takes rope scaling, --allow-long-context" if pos is not None and pos.rope else
           "learned positions: no rope scaling goes past it")
    return replace(fit, max_context=limit, assumptions=fit.assumptions + (
        f"longest context capped at the model's {limit} positions (max_position_embeddings, or its rope-scaled "
        f"maximum; memory alone holds {fit.max_context}): {way}",))


def _bytes(x: float) -> str:
    """Binary units, as vendors state device memory (an H100's 80 GB of HBM is 80 GiB), four significant digits
    (131.4 GiB against 131 GiB must not read as equal)."""
    for scale, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if x >= scale:
            return f"{x / scale:.4g} {unit}"
    return f"{x:.4g} B"


def stored_weights(costs: Sequence[OpCost], prec: Precision) -> list[OpCost]:
    """The costs with parameter reads at the stored weight format (int8, int4, fp8 store weights narrower than
    the graph was captured in): one rescaling, so node rows, kernels, totals and times all count the same
    bytes."""
    if prec.weight_scale == 1.0:
        return list(costs)
    made: dict[int, OpCost] = {}  # one rescaled cost per cost object: nodes that shared a cost share its rescaling
    out = []
    for c in costs:
        if c.param_bytes_read:
            r = made.get(id(c))
            if r is None:
                r = made[id(c)] = replace(c, param_bytes_read=c.param_bytes_read * prec.weight_scale)
            c = r
        out.append(c)
    return out


def analyze_graph(graph: OpGraph, workload: Workload, hw: HardwareSpec, dtype: str,
                  overrides: Sequence[tuple[str, str]] = (), fusion: str = "eager", plan_file=None,
                  evidence: str = "", repeats: float = 1) -> Analysis:
    """Cost, map and predict a captured graph. ``repeats``: how many times the step runs back to back (a
    benchmark loop; ``math.inf``: steady load, a serving run). On a power-limited card with sustained rates in the
    catalog, a run busy past its power window drops from its boost to its sustained matrix rate
    (``precision.power_limited``)."""
    if getattr(workload, "geometry", None) is not None and graph.geometry is None:
        graph = replace(graph, geometry=workload.geometry)  # the model's layers as its config says them
    training = any(n.args.get("phase") == "backward" for n in graph.nodes)
    choice = resolve_dtype(hw, dtype)  # an alias (--dtype fp4) names a format only on a device
    dtype = choice.format
    prec = resolve_training_precision(hw, dtype) if training else resolve_precision(hw, dtype)
    # fp8 training (Transformer Engine): the Linear GEMMs at the fp8 rate, their casts as kernels, the rest bf16
    fmt = get_format(dtype)
    fp8 = plan_fp8_training(graph) if training and fmt.train_scaled_gemms else None
    graph = fp8.graph if fp8 is not None else graph
    # a quantized float checkpoint (fp8, fp8-block, nvfp4, mx) on its engine: the LM head and MoE router GEMMs stay
    # bf16, weights and rate (ModelOpt's default configs leave them out for every format)
    keep, kept = (inference_bf16_nodes(graph, checkpoint_unquantized(graph.geometry, fmt.name))
                  if not training and _keeps_bf16_head(fmt, prec) else (frozenset(), ()))
    raw = cost_graph(graph)
    costs = stored_weights(raw, prec)
    costs = [raw[i] if i in keep else c for i, c in enumerate(costs)] if keep else costs
    costs = fp8_operand_bytes(costs, fp8.fp8_nodes) if fp8 is not None else costs
    curves = hw.curves
    plan = plan_fusion(graph, costs, fusion, plan_file)
    # inference in a sub-byte format: the fused attention products at fp8 (precision.attention_core_precision)
    core = None if training else attention_core_precision(hw, prec)
    attn = frozenset(i for i, c in enumerate(costs) if c.problem is not None and c.problem.family.attention) \
        if core is not None else frozenset()
    mixed = fp8 is not None or bool(keep) or bool(attn)

    def node_preds(prec: Precision, other: Precision, core: Precision | None):
        if fp8 is not None:
            precs = [prec if i in fp8.fp8_nodes else other for i in range(len(costs))]
        else:
            precs = [core if i in attn else other if i in keep else prec for i in range(len(costs))]
        # one prediction per distinct (cost, precision): a pure function of them, and 58 MoE layers x 256 experts
        # repeat a few hundred costs (DeepSeek-R1's 142,806 nodes); looked up by the cost object first (nodes of
        # one signature share it, cost_graph), then by value
        memo: dict[tuple[OpCost, int], Prediction] = {}
        by_id: dict[tuple[int, int], Prediction] = {}
        preds = []
        for c, p in zip(costs, precs):
            pred = by_id.get((id(c), id(p)))
            if pred is None:
                pred = memo.get((c, id(p)))
                if pred is None:
                    pred = memo[(c, id(p))] = predict_cost(c, hw, p, curves)
                by_id[(id(c), id(p))] = pred
            preds.append(pred)
        return precs, preds

    other = resolve_precision(hw, "bf16") if keep or fp8 is not None else prec
    prec, precs, preds = _at_run_rate(node_preds, prec, other, core, hw, repeats)
    kernels = tuple(map_kernels(plan, graph.nodes, costs, preds, hw, prec, curves,
                                node_prec=precs if mixed else None))
    kernels = cast_formats(kernels, graph.nodes) if fp8 is not None else kernels
    moe_line = None
    if not training:  # the measured MoE grids time an inference forward (opmap.mapping.moe_measured)
        kernels, moe_line = price_measured_moe(kernels, graph.nodes, costs, hw, prec, graph.geometry)
        kernels = tuple(kernels)
    results = tuple(NodeResult(n, c, p) for n, c, p in zip(graph.nodes, costs, preds))
    assumptions = build_assumptions(workload, hw, prec, graph, overrides, plan.policy, evidence or (
        "reference precision" if reference(dtype) else "unverified: no quality evidence"))
    assumptions = replace(
        assumptions, fp8_training=fp8_assumptions(fp8, other) if fp8 is not None else None,
        fp8_inference=FP8_INFERENCE_NOTE.format(what=" and ".join(kept), fmt=dtype) if kept else None,
        dtype_requested=choice.requested if choice.resolved else None,
        dtype_resolution=choice.reason if choice.resolved else None, moe_grid=moe_line)
    return Analysis(workload.name, graph, results, hw, prec, assumptions, plan, kernels, kept_gemms=keep)


def _at_run_rate(node_preds, prec: Precision, other: Precision, core: Precision | None, hw: HardwareSpec,
                 repeats: float) -> tuple[Precision, list, list]:
    """(the run's precision, each node's, each node's prediction: ``node_preds(prec, other, core)``) at the rate the
    run sustains: a power-limited card's from the nodes' busy time at boost (steady load, ``repeats`` infinite: the
    sustained rate, with no predictions at boost to make first), so the kernels are mapped and tiled once, at that
    rate. ``other``: the precision of the nodes kept apart (``prec`` itself where none are); ``core``: the attention
    products' (opmap.precision.attention_core_precision), or None."""
    limits = hw.sustained_matrix_flops_per_s and hw.power_window_s is not None
    if not limits:
        return (prec, *node_preds(prec, other, core))
    precs = preds = None
    if math.isinf(repeats):
        busy = math.inf
    else:
        precs, preds = node_preds(prec, other, core)
        busy = repeats * sum(p.predicted_s for p in preds)
    limited = power_limited(prec, hw, busy)
    if limited is not prec:
        other = power_limited(other, hw, busy) if other is not prec else limited
        core = power_limited(core, hw, busy) if core is not None else None
        prec = limited
        precs, preds = node_preds(prec, other, core)
    elif preds is None:
        precs, preds = node_preds(prec, other, core)
    return prec, precs, preds


def checkpoint_unquantized(geo, fmt: str) -> tuple[str, ...]:
    """The modules the model's published checkpoint keeps in bf16 (opmap.workloads.hf_geometry.
    checkpoint_quantization) where the run stores its weights in that checkpoint's format (fp8 and block fp8 one
    family; W4A8's weights are mxfp4)."""
    if geo is None or not geo.unquantized:
        return ()
    fp8 = {"fp8", "fp8-block"}
    stored = get_format(fmt).policy.weights.split(" ")[0]  # the stored format first: W4A8 stores mxfp4
    same = geo.checkpoint_format in (fmt, stored) or (fmt in fp8 and geo.checkpoint_format in fp8)
    return geo.unquantized if same else ()


def _keeps_bf16_head(fmt, prec: Precision) -> bool:
    """A narrow float format whose GEMMs run on its own engine (not the weight-only fallback): its checkpoints keep
    the LM head and routers in bf16."""
    return (fmt.kind == "float" and fmt.bits <= 8 and fmt.policy is not None and fmt.policy.quantized
            and prec.fallback_policy is None and prec.matrix == fmt.fallback[0])


def check_analysis_inputs(hw: HardwareSpec, dtype: str, fusion: str, plan_file=None) -> None:
    """What an analysis refuses before any capture runs: a dtype the hardware lacks, an unknown fusion policy,
    a plan file that does not exist."""
    resolve_precision(hw, resolve_dtype(hw, dtype).format)
    from opmap.mapping.fusion import POLICIES

    if plan_file is None and fusion not in POLICIES:
        raise OpmapError(f"unknown fusion policy {fusion!r}; accepted: {', '.join(POLICIES)}, or --fusion-plan FILE")
    if plan_file is not None and not Path(plan_file).is_file():
        raise OpmapError(f"fusion plan {plan_file} does not exist")


def analyze(workload: Workload, hw: HardwareSpec, dtype: str,
            overrides: Sequence[tuple[str, str]] = (), fusion: str = "eager", plan_file=None,
            evidence: str = "") -> Analysis:
    """Capture, cost, map and predict ``workload`` on ``hw`` at ``dtype`` under the ``fusion`` policy."""
    check_analysis_inputs(hw, dtype, fusion, plan_file)
    graph = workload.graph if workload.graph is not None else capture(workload.module, workload.inputs,
                                                                      overrides=overrides)
    return analyze_graph(graph, workload, hw, dtype, overrides, fusion, plan_file, evidence)
