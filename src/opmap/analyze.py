"""The analyze pipeline: workload -> OpGraph -> OpCost per node -> Prediction per node -> Analysis.

Each stage is a pure function of its inputs plus the explicit assumptions recorded here. ``Analysis``
renders to analysis.json (``to_dict``), the public contract documented in the README.
"""

from __future__ import annotations

import math
import platform
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from opmap import __version__
from opmap.capture import capture
from opmap.costs import cost_graph, uncounted
from opmap.costs.base import OpCost
from opmap.errors import OpmapError
from opmap.graph import Node, OpGraph
from opmap.hardware.spec import HardwareSpec
from opmap.mapping.fusion import FusionPlan, plan_fusion
from opmap.mapping.kernels import KernelResult, map_kernels
from opmap.mapping.memory import (
    TRAIN_BYTES,
    MemoryFit,
    SavedActivations,
    ServingMemory,
    fit_inference,
    fit_training,
    inflight_activation_bytes,
    kv_geometry,
    runtime_reserve,
    saved_activation_bytes,
    training_state_bytes,
)
from opmap.precision import Precision, power_limited, resolve_precision
from opmap.predict import TRANSCENDENTAL_SLOTS, Prediction, mfu, predict_cost, ridge_point
from opmap.workloads.zoo import Workload

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
    assumptions: dict[str, Any]
    plan: FusionPlan | None = None
    kernel_results: tuple[KernelResult, ...] = ()
    # a layout over several devices (opmap.mapping.sharding.Sharded); None: one device, today's output
    sharded: Any = None
    phase_figures: dict[str, Any] | None = None  # set by analyze_phase; None: prefill (or a bare training step)
    fit: MemoryFit | None = None  # set by analyze_phase (decode, train); None: ``memory`` computes inference's

    # -- totals ---------------------------------------------------------------------------------------
    @cached_property
    def total(self) -> OpCost:
        t = OpCost()
        for r in self.results:
            t = t + r.cost if r.cost.counted else t
        return t

    @property
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
        rt = self.assumptions.get("runtime")
        return float(rt["per_step_s"]) if isinstance(rt, dict) else 0.0

    @property
    def headline(self) -> tuple[str, float]:
        """The one step time this analysis states (the phase line, the Totals box and ``totals.predicted_latency_s``
        all print it): prefill's time to first token, decode's time per output token, train's iteration; under a
        layout over several devices, the layout's; the runtime's per-step time included."""
        ph = self.phase
        for key, name in (("iteration_s", "iteration"), ("tpot_s", "time per output token"),
                          ("ttft_s", "time to first token")):
            if key in ph:
                return name, float(ph[key])
        return "latency", self.predicted_latency_s + self.runtime_per_step_s

    @property
    def headline_mfu(self) -> float:
        """MFU at the headline time: the phase's (train: PaLM's model FLOPs), else the matrix FLOPs per device over
        the headline step."""
        ph = self.phase
        if "mfu" in ph:
            return float(ph["mfu"])
        devices = self.sharded.parallelism.devices if self.sharded is not None else 1
        return mfu(self.total.matrix_flops / devices, self.headline[1], self.precision)

    @property
    def kernels(self) -> int:
        return len(self.kernel_results) if self.kernel_results else sum(1 for r in self.results if r.cost.kernel)

    @property
    def predicted_mfu(self) -> float:
        return mfu(self.total.matrix_flops, self.predicted_latency_s, self.precision)

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
        weights = self.graph.param_bytes * self.precision.weight_scale
        geo = kv_geometry(self.graph)
        batch = int(self.assumptions.get("batch") or 1)
        seq = self.assumptions.get("seq")
        tokens = batch * (seq or 1)
        inflight = inflight_activation_bytes(self.graph)
        fit = fit_inference(weights, geo.bytes_per_token, self.hardware.memory_bytes, batch, seq or 1,
                            activations=lambda b, s: inflight * b * s / tokens, max_context=1 << 24)
        if seq is None:
            fit = replace(fit, max_context=None)
        limit = _position_limit(self.workload)
        if limit and fit.max_context and fit.max_context > limit and (seq or 0) <= limit:
            fit = replace(fit, max_context=limit, assumptions=fit.assumptions + (
                f"longest context capped at the model's {limit} positions (max_position_embeddings; memory alone "
                f"holds {fit.max_context}): past it takes rope scaling, --allow-long-context",))
        training = self.assumptions.get("mode") == "training step"
        if training and self.precision.requested in TRAIN_BYTES:
            st = training_state_bytes(self.graph.params, 0, 1, self.precision.requested)
            fit = replace(fit, gradients_bytes=st.gradients_bytes, optimizer_bytes=st.optimizer_bytes,
                          kv_cache_bytes=0.0,
                          phase="training (saved activations not counted)", max_batch=None, max_context=None,
                          assumptions=fit.assumptions + (st.note,))
        return fit

    @property
    def memory_fit(self) -> dict[str, Any]:
        """The memory fit (``memory``) as analysis.json's ``totals.memory_fit``: the per-device bytes, the verdict
        and its sentence, the largest batch and longest context that fit."""
        m = self.memory
        fmt = self.precision.policy["weights"]
        have = m.capacity_bytes
        w, total = m.weights_bytes, m.total_bytes
        if m.fits:
            text = (f"fits: the weights take {_bytes(w)} at {fmt}; with KV cache, activations in flight and "
                    f"workspace {_bytes(total)} of {_bytes(have)}")
        elif w > have:
            text = (f"does not fit: the weights need {_bytes(w)} at {fmt}, the device has {_bytes(have)} "
                    f"({w / have:.2f}x its memory: shard across devices or store the weights narrower)")
        else:
            text = (f"does not fit: the weights take {_bytes(w)} at {fmt}, with KV cache, activations in flight "
                    f"and workspace {_bytes(total)}; the device has {_bytes(have)} ({total / have:.2f}x: "
                    f"{m.reason.split('; ')[-1]}; shard, store narrower or shorten the batch / context)")
        if m.max_batch is not None:
            capped = any("capped at the model's" in x for x in m.assumptions)
            text += f"; largest batch {m.max_batch}" + (
                f", longest context {m.max_context}" + (" (the model's position limit)" if capped else "")
                if m.max_context is not None else "")
        return {"weights_bytes": m.weights_bytes, "weights_format": fmt, "device_memory_bytes": have,
                "fits": m.fits, "text": text, **m.to_dict()}

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
        run store keeps of them), skipping the per-tensor detail that makes a 70B model's JSON large."""
        total = self.total
        lat = self.predicted_latency_s
        head, head_s = self.headline
        return {
            "schema_version": SCHEMA_VERSION,
            "assumptions": self.assumptions,
            "totals": {
                "params": self.graph.params,
                "param_bytes": self.graph.param_bytes * self.precision.weight_scale,
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
                "memory_fit": self.memory_fit,
            },
            "layer_types": {
                s.layer_type: {"nodes": s.nodes, "flops": s.flops, "matrix_flops": s.matrix_flops,
                               "bytes": s.bytes, "predicted_s": s.predicted_s,
                               "share_of_time": s.predicted_s / lat if lat else 0.0, "bound": s.bound}
                for s in self.layer_types()
            },
            "nodes": [self._node_dict(r) for r in self.results] if nodes else [
                {"id": r.node.id, "op": r.node.op, "module": r.node.module, "layer_type": r.node.layer_type,
                 "flops": r.cost.flops} for r in self.results],
            "kernels": [k.to_dict() for k in self.kernel_results] + (
                [c.to_dict() for c in self.sharded.collectives] if self.sharded is not None else []),
            "fusion": self.plan.to_dict() if self.plan else None,
            "uncounted": self.uncounted,
            "phase": self.phase,
            "memory": self.memory.to_dict(),
        } | self._parallelism_dict()

    def _parallelism_dict(self) -> dict[str, Any]:
        """The ``parallelism`` block and the collective kernel rows, only for a layout over several devices."""
        s = self.sharded
        if s is None:
            return {}
        return {"parallelism": {**s.to_dict(), "kernel_per_device_s": list(s.kernel_s)},
                "collectives": [c.to_dict() for c in s.collectives]}

    @property
    def phase(self) -> dict[str, Any]:
        """analysis.json's ``phase``: set by analyze_phase; otherwise prefill's (time to first token = the
        predicted latency) or, for a training capture, one microstep and one optimizer step."""
        if self.phase_figures is not None:
            return self.phase_figures
        if self.assumptions.get("mode") == "training step":
            from opmap.workloads.phases import PhaseSpec

            return train_figures(self, PhaseSpec("train"), int(self.assumptions.get("batch") or 1),
                                 int(self.assumptions.get("seq") or 1))
        return prefill_figures(self)

    @staticmethod
    def _node_dict(r: NodeResult) -> dict[str, Any]:
        n, c, p = r.node, r.cost, r.pred
        d = n.to_dict()
        d.update(c.to_dict())
        d.update(p.to_dict())
        d["counted"] = c.counted
        return d


def _rate(hw: HardwareSpec, prec: Precision) -> dict[str, Any]:
    """The matrix rate the time model runs at, with its provenance: a measured achievable figure, another
    format's measured fraction of peak, else the peak; on a power-limited card past its power window, the blend
    of boost and sustained rates (``precision.power_limited``)."""
    v = hw.achievable_matrix_flops_per_s.get(prec.matrix)
    own = v is not None and bool(v.value) and prec.rate_basis == f"{v.kind} achievable {prec.matrix} rate"
    out = {"value": prec.matrix_rate_flops_per_s, "kind": v.kind if own else "derived",
           "basis": prec.rate_basis, "source": v.source if own else prec.rate_basis,
           "of_peak": prec.matrix_rate_flops_per_s / prec.matrix_peak_flops_per_s,
           "power_state": "power-limited" if prec.sustained else "boost"}
    if prec.sustained:
        out["kind"] = "derived"
    if prec.rate_basis.startswith("dense peak"):
        out.update(kind="dense peak",
                   source=f"no measured sustained {prec.matrix} rate for {hw.name}: the dense peak stands for it")
    if hw.power_window_s is not None:
        out["power_window_s"] = hw.power_window_s
    return out


def _position_limit(workload: str) -> int | None:
    """A zoo text model's position limit (max_position_embeddings), None for anything else."""
    from opmap.workloads import MODELS

    spec = MODELS.get(workload)
    return int(spec.max_seq) if spec is not None and spec.kind == "text" else None


def _bytes(x: float) -> str:
    """Binary units, as vendors state device memory (an H100's 80 GB of HBM is 80 GiB), four significant digits
    (131.4 GiB against 131 GiB must not read as equal)."""
    for scale, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if x >= scale:
            return f"{x / scale:.4g} {unit}"
    return f"{x:.4g} B"


def time_model_line(hw: HardwareSpec) -> str:
    curves = hw.curves
    if curves.empty:
        return "max(matrix/peak, vector/peak, bytes/bandwidth) + launch overhead, per node (datasheet peaks)"
    fams = sorted({f"{fam} {dt} ({len(t.points)} shapes)" for (fam, dt), t in curves.tables.items()})
    return ("max(matrix/rate at shape, vector/peak + transcendental/rate, bytes/bandwidth at size) + launch "
            f"overhead, per node; measured curves: {', '.join(fams)}, bandwidth over "
            f"{len(curves.bandwidth_points)} sizes" + (f"; views cost {curves.view_overhead_s * 1e6:.2g} us of host "
                                                      "dispatch" if hw.device_type == "cpu" else ""))


FUSION_TEXT = {
    "eager": "eager: one kernel per non-view aten op; SDPA as one fused kernel",
    "compiler": "compiler: pointwise chains, GEMM / conv epilogues and reductions with their pointwise "
                "neighbours fused (legal-only, at most 16 nodes a kernel); SDPA as one fused kernel",
    "engine": "engine: compiler's fusion plus what serving engines ship: sibling GEMMs merged (QKV, gate/up), "
              "fused (residual add +) norm, RoPE and the KV-cache write in the QKV epilogue, gated activation in "
              "the gate/up epilogue, fused attention (paged decode attention)",
}


def build_assumptions(workload: Workload, hw: HardwareSpec, prec: Precision, graph: OpGraph,
                      overrides: Sequence[tuple[str, str]], fusion: str = "eager",
                      evidence: str = "") -> dict[str, Any]:
    mp = hw.matrix_peak_flops_per_s[prec.matrix]
    return {
        "workload": workload.name,
        "hardware": hw.name,
        "hardware_display_name": hw.display_name,
        "dtype": prec.requested,
        "matrix_dtype": prec.matrix,
        "precision_note": prec.note,
        "weights_dtype": prec.policy["weights"], "activations_dtype": prec.policy["activations"],
        "accumulate_dtype": prec.policy["accumulate"],
        "precision_policy": prec.policy,
        "precision_evidence": evidence,
        "batch": workload.batch,
        "seq": workload.seq,
        "capture_device": graph.device,
        "mode": "training step" if any(n.args.get("phase") == "backward" for n in graph.nodes) else "inference",
        "fusion_policy": FUSION_TEXT.get(fusion, fusion),
        "tiling": ("GEMM / conv tile search against shared memory per compute unit, tile and wave quantization"
                   if hw.device_type != "cpu" and hw.sram_per_unit_bytes else
                   "none (CPU: the BLAS library blocks for the caches; measured shape curves stand for it)"
                   if hw.device_type == "cpu" else "none (the device lists no shared memory per compute unit)"),
        "matrix_peak_flops_per_s": {"value": mp.value, "kind": mp.kind, "source": mp.source},
        "matrix_rate_flops_per_s": _rate(hw, prec),
        "vector_peak_flops_per_s": prec.vector_peak_flops_per_s,
        "memory_bandwidth_bytes_per_s": hw.fields["memory_bandwidth_bytes_per_s"].to_dict(),
        "memory_rate_bytes_per_s": {"value": hw.memory_rate_bytes_per_s, "basis": hw.memory_rate_basis},
        # achievable figures the catalog lacks for this device: those run on datasheet figures (empty: like for like)
        "datasheet_only": list(hw.datasheet_only),
        "launch_overhead_s": hw.fields["launch_overhead_s"].to_dict(),
        "transcendental_slots": TRANSCENDENTAL_SLOTS,
        "time_model": time_model_line(hw),
        "layer_type_overrides": [f"{p}={t}" for p, t in overrides],
        "workload_notes": list(workload.assumptions),
        "capture_notes": list(graph.notes),
        "torch_version": torch.__version__,
        "opmap_version": __version__,
        "python_version": platform.python_version(),
    }


def stored_weights(costs: Sequence[OpCost], prec: Precision) -> list[OpCost]:
    """The costs with parameter reads at the stored weight format (int8, int4, fp8 store weights narrower than
    the graph was captured in): one rescaling, so node rows, kernels, totals and times all count the same
    bytes."""
    if prec.weight_scale == 1.0:
        return list(costs)
    return [replace(c, param_bytes_read=c.param_bytes_read * prec.weight_scale) if c.param_bytes_read else c
            for c in costs]


def analyze_graph(graph: OpGraph, workload: Workload, hw: HardwareSpec, dtype: str,
                  overrides: Sequence[tuple[str, str]] = (), fusion: str = "eager", plan_file=None,
                  evidence: str = "", repeats: int = 1) -> Analysis:
    """Cost, map and predict a captured graph. ``repeats``: how many times the step runs back to back (a
    benchmark loop, a serving run). On a power-limited card with sustained rates in the catalog, a run busy past
    its power window drops from its boost to its sustained matrix rate (``precision.power_limited``)."""
    prec = resolve_precision(hw, dtype)
    costs = stored_weights(cost_graph(graph), prec)
    curves = hw.curves
    plan = plan_fusion(graph, costs, fusion, plan_file)

    def predict(prec: Precision):
        preds = [predict_cost(c, hw, prec, curves) for c in costs]
        return preds, tuple(map_kernels(plan, graph.nodes, costs, preds, hw, prec, curves))

    preds, kernels = predict(prec)
    limited = power_limited(prec, hw, repeats * sum(k.predicted_s for k in kernels))
    if limited is not prec:
        prec = limited
        preds, kernels = predict(prec)
    results = tuple(NodeResult(n, c, p) for n, c, p in zip(graph.nodes, costs, preds))
    return Analysis(workload.name, graph, results, hw, prec,
                    build_assumptions(workload, hw, prec, graph, overrides, plan.policy, evidence or (
                        "reference precision" if dtype in ("fp32", "tf32") else "unverified: no quality evidence")),
                    plan, kernels)


def check_analysis_inputs(hw: HardwareSpec, dtype: str, fusion: str, plan_file=None) -> None:
    """What an analysis refuses before any capture runs: a dtype the hardware lacks, an unknown fusion policy,
    a plan file that does not exist."""
    resolve_precision(hw, dtype)
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


# -- phases: prefill, decode, train ------------------------------------------------------------------------

MFU_DEFINITION = (
    "MFU (PaLM, Chowdhery et al. 2022, appendix B): model FLOPs per second per device / dense matrix peak; model "
    "FLOPs = 3 x the forward's matrix FLOPs with attention counted dense (= 6N + 12LHQT per token: N the weights "
    "of the matrix products, L layers, H heads, Q head dim, T sequence), recomputation excluded. HFU: the FLOPs "
    "the plan executes (forward and backward as captured, causal attention's computed half, the flash backward's "
    "score recomputation, plus --recompute's extra forward) per second / the same peak")


def _dominant_bound(kernels: Sequence[tuple[str, float]]) -> str:
    by: dict[str, float] = defaultdict(float)
    for b, t in kernels:
        if b not in ("view", "alloc"):
            by[str(b)] += t
    return max(by, key=by.get) if by else "view"


def _kernel_times(a: Analysis) -> list[tuple[int, str, float]]:
    """(anchor node id, bound, predicted s) of every kernel, or of every kernel node without a plan."""
    if a.kernel_results:
        return [(k.kernel.anchor, str(k.bound), k.predicted_s) for k in a.kernel_results]
    return [(r.node.id, str(r.pred.bound), r.pred.predicted_s) for r in a.results if r.cost.kernel]


def with_runtime(a: Analysis, runtime) -> Analysis:
    """``a`` with the runtime it ran under (an opmap.phases.runtime.Runtime, applied to the device before the
    analysis: ``Runtime.apply``) in its assumptions: the prefill and decode figures add its per-step time once
    per step, and the report's header names it."""
    return replace(a, assumptions=dict(a.assumptions, runtime=runtime.to_dict(), runtime_line=runtime.line()))


def _runtime_text(a: Analysis) -> str:
    step = a.runtime_per_step_s
    if not step:
        return ""
    rt = a.assumptions["runtime"]
    return f", {a.kernels} kernels + {step * 1e6:.3g} us per step ({rt['name']})"


def prefill_figures(a: Analysis) -> dict[str, Any]:
    """The prefill pass: time to first token = its kernels (``predicted_latency_s``) + the runtime's per-step
    time."""
    step = a.runtime_per_step_s
    lat = a.predicted_latency_s + step
    bound = _dominant_bound([(b, t) for _, b, t in _kernel_times(a)])
    return {"name": "prefill", "ttft_s": lat, "bound": bound, "kernel_time_s": a.predicted_latency_s,
            "runtime_per_step_s": step, "kernels": a.kernels,
            "text": f"prefill: time to first token {lat * 1e3:.4g} ms ({bound}-bound{_runtime_text(a)})"}


def decode_figures(a: Analysis, kv_len: int) -> dict[str, Any]:
    """One decode step: time per output token (the kernels plus the runtime's per-step time), tokens per second
    over the batch, the memory lower bound (the weights the step reads, each once: the embedding rows gathered,
    not the table; the experts the batch runs, not all of them; and the whole KV cache, at the device's achievable
    memory rate, the rate the time model streams at) and how far above it the step is."""
    step = a.runtime_per_step_s
    tpot = a.predicted_latency_s + step
    batch = int(a.assumptions.get("batch") or 1)
    bound = _dominant_bound([(b, t) for _, b, t in _kernel_times(a)])
    weights = sum(r.cost.param_bytes_read for r in a.results if r.cost.counted)
    kv = decode_kv_read_bytes(a.graph)
    bw = a.hardware.memory_rate_bytes_per_s
    floor = (weights + kv) / bw
    return {"name": "decode", "kv_len": kv_len, "tpot_s": tpot, "tokens_per_s": batch / tpot if tpot else 0.0,
            "bound": bound, "weights_bytes": weights, "kv_cache_read_bytes": kv, "lower_bound_s": floor,
            "lower_bound_basis": "the weights the step reads (gathered embedding rows, the experts it runs) and "
                                 f"its KV cache, each once, at {a.hardware.memory_rate_basis}",
            "kernel_time_s": a.predicted_latency_s, "runtime_per_step_s": step, "kernels": a.kernels,
            "text": f"decode: time per output token {tpot * 1e3:.4g} ms, {batch / tpot if tpot else 0:.4g} tok/s at "
                    f"batch {batch}, KV cache {kv_len} tokens ({bound}-bound; {tpot / floor if floor else 0:.2f}x the "
                    f"weights + KV read floor {floor * 1e3:.4g} ms{_runtime_text(a)})"}


def decode_kv_read_bytes(graph: OpGraph) -> float:
    """Bytes of K and V the decode step's attention calls read (the KV cache: GQA's KV heads, the window)."""
    total = 0.0
    for n in graph.nodes:
        if n.op == "aten.scaled_dot_product_attention.default":
            total += n.input("key").nbytes + n.input("value").nbytes
    return total


def block_of(module: str, prefix: str) -> str | None:
    """The repeated block (``prefix.N``) the module path lies in, or None."""
    if prefix and module.startswith(prefix + "."):
        rest = module[len(prefix) + 1:].split(".", 1)[0]
        return f"{prefix}.{rest}" if rest.isdigit() else None
    return None


def block_prefix(graph: OpGraph) -> str:
    """The module path of the repeated blocks (``layers``, ``h``, ``model.layers``): the prefix before the first
    numeric path component with the most distinct indices; "" when the model has none."""
    seen: dict[str, set[str]] = defaultdict(set)
    for m in {n.module for n in graph.nodes}:
        parts = m.split(".")
        for i, p in enumerate(parts):
            if p.isdigit():
                seen[".".join(parts[:i])].add(p)
                break
    return max(seen, key=lambda k: len(seen[k])) if seen else ""


def _forward(n: Node) -> bool:
    return n.args.get("phase") not in ("backward", "optimizer")


_BMM = ("aten.bmm.default", "aten.baddbmm.default", "aten.matmul.default")


def recomputed_nodes(graph: OpGraph, recompute: str) -> tuple[set[int], str]:
    """The forward nodes the backward runs again, with what that means here.

    full: every forward node inside a repeated block (each block keeps only its input). selective (Megatron,
    Korthikanti et al. 2022 sec. 5): the attention core of explicit attention math, from the Q K^T batched matmul
    of two activations through scale, mask, softmax and dropout to the product with V; a fused SDPA's backward
    recomputes its scores already (the flash backward, counted in its cost), so there it adds nothing."""
    nodes = graph.nodes
    if recompute == "none":
        return set(), "none: every activation the backward needs is kept"
    if recompute == "full":
        prefix = block_prefix(graph)
        if not prefix:
            raise OpmapError("--recompute full checkpoints each repeated block, and the model has no numbered "
                             "blocks; accepted for it: none, selective")
        ids = {n.id for n in nodes if _forward(n) and not n.is_view and block_of(n.module, prefix)}
        return ids, f"full: each block of {prefix}.N runs its forward again in the backward, keeping its input"
    marked: set[int] = set()
    core: set[int] = set()
    for n in nodes:
        if not _forward(n):
            continue
        hit = any(t.producer in marked for t in n.inputs if t.producer is not None)
        if n.op in _BMM:
            acts = [t for t in n.inputs if t.param is None]
            if hit:
                core.add(n.id)  # probabilities x V: ends the core
                continue
            if len(acts) >= 2:
                marked.add(n.id)
                core.add(n.id)
            continue
        if hit:
            marked.add(n.id)
            core.add(n.id)
    sdpa = sum(1 for n in nodes if _forward(n) and n.op == "aten.scaled_dot_product_attention.default")
    text = "selective (Megatron): the attention core (Q K^T, softmax, dropout, x V) runs again in the backward"
    if sdpa:
        text += (f"; {sdpa} fused SDPA calls: their flash backward recomputes the scores already (counted in "
                 "its cost), so selective adds nothing for them")
    return core, text


def sharded_phase_figures(fig: dict[str, Any], sh, a: Analysis) -> dict[str, Any]:
    """A phase's figures under a layout over several devices (``opmap.mapping.sharding.Sharded``): the
    iteration (train) or step (decode, prefill) time is the sharded one, collectives and pipeline bubble
    included; model FLOPs stay the model's, spread over every device for MFU and HFU."""
    p = sh.parallelism
    out = dict(fig, devices=p.devices, layout=p.label())
    peak = a.precision.matrix_peak_flops_per_s
    if fig.get("name") == "train":
        it = sh.step_s
        # the captured step is one microbatch on one replica: the whole iteration runs global_batch sequences
        per_micro = fig["model_flops"] / max(1, fig["microsteps"])
        model = per_micro * (p.global_batch or p.microbatch * p.dp) / fig["microbatch"]
        hw_flops = fig["hardware_flops"] / max(1, fig["microsteps"]) * (p.global_batch or p.microbatch * p.dp) \
            / fig["microbatch"]
        mf = model / (it * p.devices) if it else 0.0
        hf = hw_flops / (it * p.devices) if it else 0.0
        tokens = sh.tokens
        out.update(iteration_s=it, tokens_per_s=tokens / it if it else 0.0, model_flops=model,
                   hardware_flops=hw_flops, model_flops_per_s_per_device=mf, hardware_flops_per_s_per_device=hf,
                   mfu=mf / peak, hfu=hf / peak, global_batch=p.global_batch, dp=p.dp,
                   microsteps=p.microbatches, bubble_fraction=sh.bubble_fraction)
        out["text"] = (f"train on {p.devices} devices ({p.label()}): iteration {it * 1e3:.4g} ms, "
                       f"{out['tokens_per_s']:.4g} tok/s, MFU {mf / peak:.1%}, HFU {hf / peak:.1%}, pipeline bubble "
                       f"{sh.bubble_fraction:.1%}")
    elif fig.get("name") == "decode":
        seqs = int(a.assumptions.get("batch") or 1) * p.dp
        lat = sh.latency_s + a.runtime_per_step_s
        out.update(tpot_s=lat, tokens_per_s=seqs / lat if lat else 0.0, kernel_time_s=sh.latency_s)
        out["text"] = (f"decode on {p.devices} devices ({p.label()}): {lat * 1e3:.4g} ms per output token, "
                       f"{out['tokens_per_s']:.4g} tok/s{_runtime_text(a)}")
    else:
        lat = sh.latency_s + a.runtime_per_step_s
        out.update(ttft_s=lat, kernel_time_s=sh.latency_s)
        out["text"] = (f"prefill on {p.devices} devices ({p.label()}): time to first token {lat * 1e3:.4g} ms"
                       f"{_runtime_text(a)}")
    return out


def train_figures(a: Analysis, spec, microbatch: int, seq: int) -> dict[str, Any]:
    """An iteration: microsteps x (forward + backward + recomputation) + one optimizer step; model and hardware
    FLOPs, MFU and HFU (``MFU_DEFINITION``)."""
    n_micro = spec.microsteps(microbatch)
    gb = spec.global_batch or microbatch * spec.dp
    times = _kernel_times(a)
    phase_of = {r.node.id: r.node.args.get("phase", "forward") for r in a.results}
    opt_s = sum(t for i, _, t in times if phase_of[i] == "optimizer")
    step_s = a.predicted_latency_s - opt_s
    rec_ids, rec_text = recomputed_nodes(a.graph, spec.recompute)
    rec_s = sum(t for i, _, t in times if i in rec_ids)
    # a fused kernel anchored outside the recomputed set but holding recomputed nodes: their share of its time
    rec_flops = sum(r.cost.matrix_flops for r in a.results if r.node.id in rec_ids and r.cost.counted)
    fwd = [r for r in a.results if _forward(r.node) and r.cost.counted]
    fwd_matrix = sum(r.cost.matrix_flops for r in fwd)
    fwd_dense = fwd_matrix + sum(r.cost.skipped_flops for r in fwd)
    executed = sum(r.cost.matrix_flops for r in a.results if r.cost.counted)
    iteration_s = n_micro * (step_s + rec_s) + opt_s
    model_flops = 3.0 * fwd_dense * n_micro
    hardware_flops = (executed + rec_flops) * n_micro
    peak = a.precision.matrix_peak_flops_per_s
    mf_per_s = model_flops / iteration_s if iteration_s else 0.0
    hf_per_s = hardware_flops / iteration_s if iteration_s else 0.0
    bounds = [(b, t * (1 if phase_of[i] == "optimizer" else n_micro)) for i, b, t in times]
    bounds += [(b, t * n_micro) for i, b, t in times if i in rec_ids]
    bound = _dominant_bound(bounds)
    tokens = gb * seq
    palm = palm_flops_per_token(a.graph, seq)
    mfu_v, hfu_v = mf_per_s / peak, hf_per_s / peak
    return {
        "name": "train", "recompute": spec.recompute, "recompute_note": rec_text, "optimizer": spec.optimizer,
        "microbatch": microbatch, "global_batch": gb, "dp": spec.dp, "zero": spec.zero, "microsteps": n_micro,
        "microstep_s": step_s, "recompute_s": rec_s, "optimizer_s": opt_s, "iteration_s": iteration_s,
        "tokens_per_s": tokens / iteration_s if iteration_s else 0.0,
        "model_flops": model_flops, "hardware_flops": hardware_flops,
        "recompute_flops": rec_flops * n_micro,
        "model_flops_per_s_per_device": mf_per_s, "hardware_flops_per_s_per_device": hf_per_s,
        "mfu": mfu_v, "hfu": hfu_v, "dense_peak_flops_per_s": peak,
        "palm_flops_per_token": palm, "model_flops_per_token": 3.0 * fwd_dense / (microbatch * seq),
        "mfu_definition": MFU_DEFINITION, "bound": bound,
        "text": f"train: iteration {iteration_s * 1e3:.4g} ms ({n_micro} microsteps of {microbatch} x {seq} tokens "
                f"+ {spec.optimizer} step {opt_s * 1e3:.3g} ms), {tokens / iteration_s if iteration_s else 0:.4g} "
                f"tok/s, MFU {mfu_v:.1%}, HFU {hfu_v:.1%} (recompute {spec.recompute}; {bound}-bound)",
    }


def palm_flops_per_token(graph: OpGraph, seq: int) -> dict[str, Any]:
    """PaLM appendix B's closed form, 6N + 12 L H Q T, read off the graph: N the parameters less the embedding
    tables that are only looked up (an embedding tied to the LM head is a matrix product and stays in N), L H Q
    from the forward's attention calls (the queries' heads and head dim), T the sequence."""
    emb: dict[str, int] = {}
    matmul_params: set[str] = set()
    attn = []
    for n in graph.nodes:
        if not _forward(n):
            continue
        for t in n.inputs:
            if t.param is None:
                continue
            if n.packet in ("embedding",):
                emb[t.param] = math.prod(t.shape)
            elif not n.is_view:
                matmul_params.add(t.param)
        if n.op == "aten.scaled_dot_product_attention.default":
            q = n.input("query")
            attn.append((q.shape[-3], q.shape[-1]))
    n_params = graph.params - sum(v for k, v in emb.items() if k not in matmul_params)
    attention = sum(12 * h * d * seq for h, d in attn)
    return {"value": 6.0 * n_params + attention, "n_params": n_params, "layers": len(attn),
            "attention_flops_per_token": float(attention)}


@dataclass(frozen=True)
class PhaseAnalysis:
    """A phase's result: the analysis of the captured step (the prefill pass, the decode step, one training
    microstep with its optimizer step) with the phase figures and the memory fit set on it."""

    spec: Any  # opmap.workloads.phases.PhaseSpec
    analysis: Analysis

    @property
    def figures(self) -> dict[str, Any]:
        return self.analysis.phase

    @property
    def memory(self) -> MemoryFit:
        return self.analysis.memory


def analyze_phase(graph: OpGraph, workload: Workload, hw: HardwareSpec, dtype: str, spec,
                  overrides: Sequence[tuple[str, str]] = (), fusion: str = "eager", plan_file=None,
                  evidence: str = "", saved: SavedActivations | None = None,
                  activations: Callable[[int, int], float] | None = None, runtime=None) -> PhaseAnalysis:
    """Cost, map and predict the captured step of ``spec`` (``capture_phase``) and add the phase's figures and
    memory fit. Train: ``activations(microbatch, seq)``, the bytes kept for backward (``train_activations``: the
    measured saved tensors of the module under the recompute policy); ``saved`` the measurement at the captured
    shape (for its notes). ``runtime``: an opmap.phases.runtime.Runtime for ``hw`` (the catalog device, not yet
    applied): its per-kernel overhead replaces the device's and its per-step time is added once per step (None:
    the catalog's eager launch, nothing per step); the fusion policy stays the caller's ``fusion``."""
    if runtime is not None and spec.train and runtime.name != "eager":
        raise OpmapError(f"runtime {runtime.name} prices serving steps (prefill, decode); a training step runs "
                         "eager here: use runtime eager")
    if runtime is not None:
        hw = runtime.apply(hw)
    a = analyze_graph(graph, workload, hw, dtype, overrides, fusion, plan_file, evidence)
    if runtime is not None:
        a = with_runtime(a, runtime)
    assumptions = dict(a.assumptions, phase=spec.to_dict())
    a = replace(a, assumptions=assumptions)
    if spec.decode:
        figures = decode_figures(a, spec.kv_len)
        weights = graph.param_bytes * a.precision.weight_scale
        per_seq = decode_kv_read_bytes(graph) / max(workload.batch, 1)
        cached = max((n.input("key").shape[-2] for n in graph.nodes
                      if n.op == "aten.scaled_dot_product_attention.default"), default=spec.kv_len)
        window = cached if cached < spec.kv_len else None
        inflight = inflight_activation_bytes(graph)
        fit = fit_inference(weights, per_seq / cached, hw.memory_bytes, workload.batch, spec.kv_len,
                            activations=lambda b, s: inflight * b / workload.batch, window=window,
                            max_context=1 << 24)
        # the KV pool as serve computes it (opmap.mapping.memory.ServingMemory), here at utilization 1, eager
        serving = ServingMemory(hw.memory_bytes, 1.0, weights,
                                runtime_reserve(fit.activations_bytes, False,
                                                basis=f"this step ({workload.batch} sequences)"), per_seq / cached)
        fit = replace(fit, phase="decode", assumptions=fit.assumptions + (
            serving.line() + "; opmap serve takes --gpu-memory-utilization and its runtime's reserve",))
    elif spec.train:
        if a.precision.requested not in TRAIN_BYTES:
            raise OpmapError(f"training in {a.precision.requested} is not modelled; accepted: "
                             f"{', '.join(TRAIN_BYTES)}")
        mb, seq = workload.batch, workload.seq or 1
        figures = train_figures(a, spec, mb, seq)
        st = training_state_bytes(graph.params, spec.zero, spec.dp, a.precision.requested)
        act = activations or (lambda b, s: 0.0)
        fit = fit_training(st, hw.memory_bytes, mb, seq, act, max_context=1 << 20)
        notes = (f"activations kept for backward measured on meta under recompute {spec.recompute}",)
        notes += tuple(saved.notes) if saved is not None else ()
        fit = replace(fit, phase=f"training (recompute {spec.recompute}, ZeRO {spec.zero} over {spec.dp})",
                      assumptions=fit.assumptions + notes)
    else:
        figures = prefill_figures(a)
        fit = None
    a = replace(a, assumptions=assumptions, phase_figures=figures, fit=fit)
    return PhaseAnalysis(spec, a)


def capture_phase(workload: Workload, spec, overrides: Sequence[tuple[str, str]] = ()) -> OpGraph:
    """Capture the step ``spec`` names: a training step (forward, loss, backward, optimizer) for train, the
    forward otherwise (the decode workload carries its KV cache as inputs)."""
    if spec.train:
        return capture(workload.module, workload.inputs, overrides=overrides, train=True, optimizer=spec.optimizer)
    return capture(workload.module, workload.inputs, overrides=overrides)


def train_activations(workload: Workload, recompute: str) -> tuple[SavedActivations, Callable[[int, int], float]]:
    """The activations a training step keeps for backward (opmap.mapping.memory.saved_activation_bytes), measured
    on meta at the captured shape under ``recompute`` and scaled linearly in batch x sequence for the largest-batch
    and longest-context search: linear is exact for fused attention (SDPA saves no S x S tensor), the zoo's and
    Hugging Face's attention; unfused attention's S^2 term is counted at the captured shape only."""
    b, s = workload.batch, workload.seq or 1
    saved = saved_activation_bytes(workload.module, workload.inputs, recompute=recompute)
    m1 = saved.total_bytes
    return saved, lambda bb, ss: m1 * bb * ss / (b * s)
