"""Train: an iteration of microsteps (forward, backward, recomputation) and one optimizer step; model and hardware
FLOPs, MFU and HFU (PaLM's definition), the recomputation policies, and the training memory fit."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from opmap.errors import OpmapError
from opmap.graph import Node, OpGraph
from opmap.mapping.memory import (
    TRAIN_BYTES,
    MemoryFit,
    SavedActivations,
    fit_training,
    saved_activation_bytes,
    training_state_bytes,
)
from opmap.phases.common import dominant_bound, kernel_times

if TYPE_CHECKING:
    from opmap.analyze import Analysis
    from opmap.workloads.zoo import Workload

MFU_DEFINITION = (
    "MFU (PaLM, Chowdhery et al. 2022, appendix B): model FLOPs per second per device / dense matrix peak; model "
    "FLOPs = 3 x the forward's matrix FLOPs with attention counted dense (= 6N + 12LHQT per token: N the weights "
    "of the matrix products, L layers, H heads, Q head dim, T sequence), recomputation excluded. HFU: the FLOPs "
    "the plan executes (forward and backward as captured, causal attention's computed half, the flash backward's "
    "score recomputation, plus --recompute's extra forward) per second / the same peak")


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


def train_figures(a: Analysis, spec, microbatch: int, seq: int) -> dict[str, Any]:
    """An iteration: microsteps x (forward + backward + recomputation) + one optimizer step; model and hardware
    FLOPs, MFU and HFU (``MFU_DEFINITION``)."""
    n_micro = spec.microsteps(microbatch)
    gb = spec.global_batch or microbatch * spec.dp
    times = kernel_times(a)
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
    bound = dominant_bound(bounds)
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


def train_activations(workload: Workload, recompute: str) -> tuple[SavedActivations, Callable[[int, int], float]]:
    """The activations a training step keeps for backward (opmap.mapping.memory.saved_activation_bytes), measured
    on meta at the captured shape under ``recompute`` and scaled linearly in batch x sequence for the largest-batch
    and longest-context search: linear is exact for fused attention (SDPA saves no S x S tensor), the zoo's and
    Hugging Face's attention; unfused attention's S^2 term is counted at the captured shape only."""
    b, s = workload.batch, workload.seq or 1
    saved = saved_activation_bytes(workload.module, workload.inputs, recompute=recompute)
    m1 = saved.total_bytes
    return saved, lambda bb, ss: m1 * bb * ss / (b * s)


def train_fit(a: Analysis, spec, microbatch: int, seq: int, saved: SavedActivations | None = None,
              activations: Callable[[int, int], float] | None = None) -> MemoryFit:
    """The training step's memory on one device: the model state (weights, gradients, optimizer state) under
    ZeRO ``spec.zero`` over ``spec.dp`` ranks, and ``activations(microbatch, seq)``, the bytes kept for backward
    (``train_activations``; None: not counted); ``saved``: the measurement at the captured shape (its notes)."""
    if a.precision.requested not in TRAIN_BYTES:
        raise OpmapError(f"training in {a.precision.requested} is not modelled; accepted: "
                         f"{', '.join(TRAIN_BYTES)}")
    st = training_state_bytes(a.graph.params, spec.zero, spec.dp, a.precision.requested)
    act = activations or (lambda b, s: 0.0)
    fit = fit_training(st, a.hardware.memory_bytes, microbatch, seq, act, max_context=1 << 20)
    notes = (f"activations kept for backward measured on meta under recompute {spec.recompute}",)
    notes += tuple(saved.notes) if saved is not None else ()
    return replace(fit, phase=f"training (recompute {spec.recompute}, ZeRO {spec.zero} over {spec.dp})",
                   assumptions=fit.assumptions + notes)
