"""Train: an iteration of microsteps (forward, backward, recomputation) and one optimizer step; model and hardware
FLOPs, MFU and HFU (PaLM's definition), the recomputation policies, and the training memory fit."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from opmap.analyze import cap_at_positions
from opmap.capture.training import training_loss
from opmap.costs.backward import SDPA_BACKWARD
from opmap.errors import OpmapError
from opmap.geometry import forward_calls, layer_specs
from opmap.graph import Node, OpGraph
from opmap.mapping.activations import SavedActivations, saved_activation_bytes
from opmap.mapping.memory import MemoryFit, fit_training, train_formats, training_state_bytes
from opmap.phases.common import dominant_bound, kernel_times
from opmap.phases.result import PalmFlops, TrainStep

if TYPE_CHECKING:
    from opmap.analyze import Analysis
    from opmap.workloads.zoo import Workload

MFU_DEFINITION = (
    "MFU (PaLM, Chowdhery et al. 2022, appendix B): model FLOPs per second per device / dense matrix peak; model "
    "FLOPs = 3 x the forward's matrix FLOPs with attention counted dense (= 6N + 12LHQT per token: N the weights "
    "of the matrix products, L layers, H heads, Q head dim, T sequence), recomputation excluded. HFU (Korthikanti "
    "et al. 2022's hardware FLOPs): the model FLOPs plus the FLOPs recomputed (--recompute's extra forward and the "
    "fused attention backward's recomputed scores, Q K^T), counted the same way (attention dense), per second / "
    "the same peak: HFU >= MFU, equal when nothing is recomputed. executed_matrix_flops: what the kernels run "
    "(causal attention's computed half)")


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
    of two activations through scale, mask, softmax and dropout to the product with V; a fused SDPA call's forward
    (Megatron-Core checkpoints core_attention whether or not it is fused, keeping Q, K, V and not its output)."""
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
    sdpa = {n.id for n in nodes if _forward(n) and n.op == "aten.scaled_dot_product_attention.default"}
    text = "selective (Megatron): the attention core (Q K^T, softmax, dropout, x V) runs again in the backward"
    if sdpa:
        # Megatron-Core checkpoints core_attention whether or not it is fused (megatron/core/transformer/
        # attention.py, Attention.forward: checkpoint_core_attention): the fused kernel's forward runs again
        text += (f"; {len(sdpa)} fused SDPA calls: each fused attention forward runs again in the backward (as "
                 "Megatron-Core checkpoints core_attention, fused or not), saving its output")
    return core | sdpa, text


def attention_recompute_flops(a: Analysis) -> float:
    """Matrix FLOPs of the scores (S = Q K^T) a fused attention backward recomputes, over the captured step,
    counted dense like the model FLOPs: 2 x batch x heads x Sq x Sk x head dim per backward call."""
    total = 0.0
    for r in a.results:
        if r.node.args.get("phase") != "backward" or r.node.packet not in SDPA_BACKWARD or not r.cost.counted:
            continue
        q, k = r.node.input("query"), r.node.input("key")
        if r.node.packet in ("_flash_attention_backward", "_efficient_attention_backward"):  # (B, S, H, D)
            b, sq, h, d = q.shape
            sk = k.shape[1]
        else:
            *lead, h, sq, d = q.shape
            b, sk = math.prod(lead), k.shape[-2]
        total += 2.0 * b * h * sq * sk * d
    return total


def step_text(name: str, f: TrainStep) -> str:
    """The phase line of a training step: the iteration (``step_s``, the headline the Totals box and
    ``totals.predicted_latency_s`` print) and its parts per device, throughput, MFU and HFU."""
    n = f"{f.microsteps} microstep{'s' if f.microsteps != 1 else ''}"
    parts = f"{n} x {f.microstep_s * 1e3:.4g} ms"
    if f.recompute_s:
        parts = f"{n} x ({f.microstep_s * 1e3:.4g} ms + recompute {f.recompute_s * 1e3:.3g} ms)"
    if f.bubble_s:
        parts += f" + pipeline bubble {f.bubble_s * 1e3:.3g} ms"
    if f.exposed_comm_s:
        parts += f" + exposed communication {f.exposed_comm_s * 1e3:.3g} ms"
    parts += f" + {f.optimizer} step {f.optimizer_s * 1e3:.3g} ms"
    return (f"{name}: iteration {f.step_s * 1e3:.4g} ms per device = {parts}; {f.tokens_per_s:.4g} tok/s "
            f"({f.tokens_per_s_per_device:.4g} per device), MFU {f.mfu:.1%}, HFU {f.hfu:.1%} (recompute "
            f"{f.recompute}; {f.bound}-bound)")


def train_figures(a: Analysis, spec, microbatch: int, seq: int) -> TrainStep:
    """An iteration on one device: microsteps x (forward + backward + recomputation) + one optimizer step; model
    and hardware FLOPs, MFU and HFU (``MFU_DEFINITION``). ``step_s`` (= ``iteration_s``) is the sum of its parts
    (``STEP_PARTS``; no bubble and no communication on one device)."""
    n_micro = spec.microsteps(microbatch)
    gb = spec.global_batch or microbatch * spec.dp
    times = kernel_times(a)
    phase_of = {r.node.id: r.node.args.get("phase", "forward") for r in a.results}
    opt_s = sum(t for i, _, t in times if phase_of[i] == "optimizer")
    step_s = a.predicted_latency_s - opt_s
    rec_ids, rec_text = recomputed_nodes(a.graph, spec.recompute)
    rec_s = sum(t for i, _, t in times if i in rec_ids)
    # recomputed FLOPs counted like the model FLOPs (attention dense), plus the flash backward's recomputed scores
    rec = [r.cost for r in a.results if r.node.id in rec_ids and r.cost.counted]
    rec_flops = sum(c.matrix_flops + c.skipped_flops for c in rec)
    attn_rec = attention_recompute_flops(a)
    fwd = [r for r in a.results if _forward(r.node) and r.cost.counted]
    fwd_matrix = sum(r.cost.matrix_flops for r in fwd)
    fwd_dense = fwd_matrix + sum(r.cost.skipped_flops for r in fwd)
    executed = sum(r.cost.matrix_flops for r in a.results if r.cost.counted) + sum(c.matrix_flops for c in rec)
    iteration_s = n_micro * (step_s + rec_s) + opt_s
    model_flops = 3.0 * fwd_dense * n_micro
    hardware_flops = model_flops + (rec_flops + attn_rec) * n_micro
    peak = a.precision.matrix_peak_flops_per_s
    mf_per_s = model_flops / iteration_s if iteration_s else 0.0
    hf_per_s = hardware_flops / iteration_s if iteration_s else 0.0
    bounds = [(b, t * (1 if phase_of[i] == "optimizer" else n_micro)) for i, b, t in times]
    bounds += [(b, t * n_micro) for i, b, t in times if i in rec_ids]
    bound = dominant_bound(bounds)
    tokens = gb * seq
    palm = palm_flops_per_token(a.graph, seq)
    mfu_v, hfu_v = mf_per_s / peak, hf_per_s / peak
    tok_s = tokens / iteration_s if iteration_s else 0.0
    f = TrainStep(
        recompute=spec.recompute, recompute_note=rec_text, optimizer=spec.optimizer,
        microbatch=microbatch, global_batch=gb, dp=spec.dp, zero=spec.zero, microsteps=n_micro,
        devices=1, step_s=iteration_s,
        microstep_s=step_s, recompute_s=rec_s, bubble_s=0.0, exposed_comm_s=0.0, optimizer_s=opt_s,
        tokens_per_s=tok_s, tokens_per_s_per_device=tok_s,
        model_flops=model_flops, hardware_flops=hardware_flops,
        recompute_flops=rec_flops * n_micro, attention_recompute_flops=attn_rec * n_micro,
        executed_matrix_flops=executed * n_micro,
        model_flops_per_s_per_device=mf_per_s, hardware_flops_per_s_per_device=hf_per_s,
        mfu=mfu_v, hfu=hfu_v, dense_peak_flops_per_s=peak,
        palm_flops_per_token=palm, model_flops_per_token=3.0 * fwd_dense / (microbatch * seq),
        mfu_definition=MFU_DEFINITION, bound=bound)
    return replace(f, text=step_text("train", f))


def palm_flops_per_token(graph: OpGraph, seq: int) -> PalmFlops:
    """PaLM appendix B's closed form, 6N + 12 L H Q T, read off the graph: N the parameters less the embedding
    tables that are only looked up (an embedding tied to the LM head is a matrix product and stays in N), L H Q
    from the forward's attention layers (opmap.geometry.layer_specs: the queries' heads and head dim), T the
    sequence."""
    emb: dict[str, int] = {}
    matmul_params: set[str] = set()
    calls = forward_calls(graph)
    attn = [(s.n_heads, s.head_dim) for c, s in zip(calls, layer_specs(graph, calls)) if c.fused]
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
    n_params = graph.params - sum(v for k, v in emb.items() if k not in matmul_params)
    attention = sum(12 * h * d * seq for h, d in attn)
    return PalmFlops(6.0 * n_params + attention, n_params, len(attn), float(attention))


def train_activations(workload: Workload, recompute: str) -> tuple[SavedActivations, Callable[[int, int], float]]:
    """The activations a training step keeps for backward (opmap.mapping.activations.saved_activation_bytes), measured
    on meta at the captured shape under ``recompute``, the loss included (opmap.capture.training.training_loss, the
    loss the captured step runs: its fp32 log-softmax over the vocabulary is saved), and scaled linearly in batch x
    sequence for the largest-batch and longest-context search: linear is exact for fused attention (SDPA saves no
    S x S tensor), the zoo's and Hugging Face's attention; unfused attention's S^2 term is counted at the captured
    shape only."""
    b, s = workload.batch, workload.seq or 1
    saved = saved_activation_bytes(workload.module, workload.inputs, recompute=recompute, loss=training_loss)
    m1 = saved.total_bytes
    return saved, lambda bb, ss: m1 * bb * ss / (b * s)


def train_fit(a: Analysis, spec, microbatch: int, seq: int, saved: SavedActivations | None = None,
              activations: Callable[[int, int], float] | None = None) -> MemoryFit:
    """The training step's memory on one device: the model state (weights, gradients, optimizer state) under
    ZeRO ``spec.zero`` over ``spec.dp`` ranks, and ``activations(microbatch, seq)``, the bytes kept for backward
    (``train_activations``; None: not counted); ``saved``: the measurement at the captured shape (its notes)."""
    if a.precision.requested not in train_formats():
        raise OpmapError(f"training in {a.precision.requested} is not modelled; accepted: "
                         f"{', '.join(train_formats())}")
    st = training_state_bytes(a.graph.params, spec.zero, spec.dp, a.precision.requested)
    act = activations or (lambda b, s: 0.0)
    fit = cap_at_positions(fit_training(st, a.hardware.memory_bytes, microbatch, seq, act, max_context=1 << 20),
                           a.assumptions, seq)
    notes = (f"activations kept for backward measured on meta under recompute {spec.recompute}",)
    notes += tuple(saved.notes) if saved is not None else ()
    return replace(fit, phase=f"training (recompute {spec.recompute}, ZeRO {spec.zero} over {spec.dp})",
                   assumptions=fit.assumptions + notes)
