"""Per-device memory of a layout: the saved activations per block, read off the training graph, and the memory
fit of one layout (opmap.mapping.sharding prices its time)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from opmap.graph import OpGraph
from opmap.mapping import context
from opmap.mapping.memory import MemoryFit, inflight_activation_bytes
from opmap.mapping.roles import SPLIT_ROLES, Roles, is_weight_gemm, phase_of
from opmap.mapping.shard_types import Parallelism, SharderView


@dataclass(frozen=True)
class SavedPerBlock:
    """The activations one forward keeps for the backward, read off the training graph: per block (the first
    one's, every block alike), the bytes split over tp and the replicated ones, of the split the S x S ones, and
    the block's input; outside the blocks, what is saved before them (the embedding's output: the first stage's,
    replicated) and after them (the final norm, the head's input, the loss's log-softmax: the last stage's; the
    vocabulary-wide ones split over tp, as Megatron's vocabulary-parallel head and cross-entropy keep them)."""

    split_bytes: float
    replicated_bytes: float
    scores_bytes: float  # of the split ones, those of S x S shape (selective recomputation drops them)
    input_bytes: float  # the block's input (full recomputation keeps only this)
    before_bytes: float = 0.0
    after_split_bytes: float = 0.0
    after_replicated_bytes: float = 0.0

    @property
    def block_bytes(self) -> float:
        return self.split_bytes + self.replicated_bytes

    @property
    def outside_bytes(self) -> float:
        return self.before_bytes + self.after_split_bytes + self.after_replicated_bytes


def _base(graph: OpGraph, t) -> tuple[int | None, Any]:
    """The node whose output storage ``t`` lies in, and that output: views and in-place ops alias their first
    input, so a saved transpose or reshape keeps its base's storage alive (as autograd keeps it)."""
    p = t.producer
    while p is not None and (graph.nodes[p].is_view or graph.nodes[p].is_inplace) and graph.nodes[p].inputs:
        t = graph.nodes[p].inputs[0]
        p = t.producer
    return p, t


def _key(t) -> tuple:
    return (tuple(t.shape), t.dtype, tuple(t.stride))


def _fp8_saved(graph: OpGraph, roles: Roles) -> tuple[dict[tuple, int], frozenset[int]]:
    """Under TE's fp8 training: the storages the fp8 Linear layers read as input (keyed as ``saved_per_block``
    keys them), each with the elements of the input, and the backward GEMMs of those layers. TE's Linear,
    LayerNormLinear and LayerNormMLP save the input's fp8 (e4m3) copy for the weight gradient, not the bf16 input
    (NVIDIA/TransformerEngine transformer_engine/pytorch/module/linear.py, v1.x, commit 0004dbd0231c:
    ``_Linear.forward`` saves ``inputmat_t`` / ``inputmat`` from ``fp8_cast_transpose_fused`` / ``cast_to_fp8``
    when fp8 is on and wgrad is not overridden to high precision, ``inputmat_no_fp8`` only otherwise;
    layernorm_linear.py and layernorm_mlp.py likewise save ``ln_out`` and the activation's output cast to fp8)."""
    from opmap.mapping.fp8 import fp8_linears
    from opmap.ops import GEMM_OPS

    linear = fp8_linears(graph, roles)
    modules = {n.module for n in linear}
    inputs: dict[tuple, int] = {}
    for f in linear:
        for t in f.inputs:
            if t.param is None and len(t.shape) >= 2:
                p, base = _base(graph, t)
                inputs[(-1 if p is None else p, _key(base))] = t.numel
    gemms = frozenset(n.id for n in graph.nodes if phase_of(n) == "backward" and n.packet in GEMM_OPS
                      and n.module in modules)
    return inputs, gemms


def saved_per_block(graph: OpGraph, roles: Roles, seq: int, fp8: bool = False) -> SavedPerBlock:
    """The storages of forward outputs that backward nodes read, each once at its full size (a view read keeps
    its base's storage), as ``saved_tensors_hooks`` counts them (opmap.mapping.activations.saved_activation_bytes),
    plus the fp32 log-sum-exp each fused attention saves (B x H x S_q x 4 bytes): per block by role (the first
    block's; a tensor is the block's that produced it) and outside the blocks by position (a graph input, such as
    the token ids an embedding keeps, before them). Parameters never count.
    A node with several outputs of one shape (LayerNorm's mean and 1 / std) counts as many as one backward node
    reads. ``fp8``: TE's fp8 training (opmap.mapping.fp8): a Linear layer's input counts 1 byte an element, its
    fp8 copy (``_fp8_saved``), in place of its bf16 storage when only those layers' GEMMs read that in backward,
    beside it when another backward node reads it too (the per-tensor scale, a few fp32 values a layer, left out)."""
    if not roles.blocks:
        return SavedPerBlock(0.0, 0.0, 0.0, 0.0)
    b0 = roles.blocks[0]
    first = min(i for i, b in roles.block.items() if b is not None)
    reads: dict[tuple[int, tuple], int] = {}
    metas: dict[tuple[int, tuple], Any] = {}
    sdpa_bwd = False
    fp8_in, fp8_gemms = _fp8_saved(graph, roles) if fp8 else ({}, frozenset())
    other_reader: set[tuple] = set()  # fp8 Linear inputs another backward node reads as well
    for n in graph.nodes:
        if phase_of(n) != "backward":
            continue
        sdpa_bwd = sdpa_bwd or "scaled_dot_product" in n.op
        here: dict[tuple[int, tuple], int] = {}
        for t in n.inputs:
            if t.param is not None:
                continue
            p, base = _base(graph, t)
            if base.param is not None or (p is not None and phase_of(graph.nodes[p]) != "forward"):
                continue
            k = (-1 if p is None else p, _key(base))  # -1: a graph input (the token ids an embedding saves)
            here[k] = here.get(k, 0) + 1
            metas[k] = base
        for k, c in here.items():
            reads[k] = max(reads.get(k, 0), c)
            if k in fp8_in and n.id not in fp8_gemms:
                other_reader.add(k)
    split = rep = ss = before = after_split = after_rep = 0.0
    for (p, key), c in reads.items():
        t = metas[(p, key)]
        outs = sum(1 for o in graph.nodes[p].outputs if _key(o) == key) if p >= 0 else 1
        nbytes = t.nbytes * min(c, max(1, outs))
        if (p, key) in fp8_in:  # the fp8 copy TE saves, instead of the bf16 storage or beside it
            nbytes = fp8_in[(p, key)] + (nbytes if (p, key) in other_reader else 0.0)
        blk, role = roles.block.get(p), roles.role.get(p)
        if blk is None and p < first:
            before += nbytes
        elif blk is None:
            if role in SPLIT_ROLES:
                after_split += nbytes
            else:
                after_rep += nbytes
        elif blk == b0 and role in SPLIT_ROLES:
            split += nbytes
            if len(t.shape) >= 3 and t.shape[-1] == seq == t.shape[-2] and not is_weight_gemm(graph.nodes[p]):
                ss += nbytes  # scores, probabilities, their dropout mask (not a projection S wide)
        elif blk == b0:
            rep += nbytes
    if sdpa_bwd:  # the fused kernel's log-sum-exp: an output the capture does not record
        for n in graph.nodes:
            if n.op == "aten.scaled_dot_product_attention.default" and phase_of(n) == "forward" \
                    and roles.block.get(n.id) == b0:
                split += 4.0 * math.prod(n.input("query").shape[:-1])
    return SavedPerBlock(split, rep, ss, roles.geometry.act_bytes, before, after_split, after_rep)


def training_activations(p: Parallelism, saved: SavedPerBlock, layers: int) -> tuple[float, str]:
    """Activation bytes saved for backward on the layout's fullest device, and how: per block, the split ones / tp
    and the replicated ones / tp with SP (Korthikanti et al. 2022 eq. 2-4: s b h (10 + 24 / t) per layer with
    tensor parallelism, 34 s b h / t with SP too; data parallelism changes nothing); full recomputation keeps each
    block's input, selective drops the S x S ones. The first stage holds its blocks for min(m, pp) microbatches in
    flight (1F1B; more with interleaving, Korthikanti sec. 4.2.3) and what is saved before the blocks; the last
    stage its blocks for one microbatch and what is saved after them (the vocabulary-wide ones / tp). Without a
    pipeline one device holds both."""
    rep_div = p.tp if p.sp else 1
    if p.recompute == "full":
        per_block = saved.input_bytes / rep_div
    else:
        split = saved.split_bytes - (saved.scores_bytes if p.recompute == "selective" else 0.0)
        per_block = split / p.tp + saved.replicated_bytes / rep_div
    per = -(-max(1, layers) // p.pp)
    inflight = min(p.microbatches, p.pp) * (1 + (p.pp - 1) / (p.pp * p.vp) if p.vp > 1 else 1)
    before = saved.before_bytes / rep_div
    after = saved.after_split_bytes / p.tp + saved.after_replicated_bytes / rep_div
    if p.pp == 1:
        return per_block * per + before + after, f"activations: {per} blocks, 1 microbatch in flight"
    first = (per_block * per + before) * inflight
    last = per_block * (max(1, layers) - (p.pp - 1) * per) + after
    how = (f"activations: the first stage's {per} blocks x {inflight:.3g} microbatches in flight" if first >= last
           else "activations: the last stage's blocks and head for 1 microbatch")
    return max(first, last), how


def sharded_memory(p: Parallelism, sharder: SharderView, saved: SavedPerBlock, fmt: str, training: bool,
                   seq: int | None = None, capacity_bytes: float | None = None) -> MemoryFit:
    """Per-device memory of a layout: the model state of the parameters this device holds (dense / (tp x pp),
    experts also / ep) under mixed-precision AdamW and the ZeRO stage over dp (training), the activations saved
    for backward (``training_activations``), over cp too (each rank keeps its s / cp tokens' activations, plus the
    ring's K / V and dK / dV buffers, ``context.CP_BUFFER_CHUNKS`` chunks); inference: the weights, the KV cache of
    every sequence the replica holds in the step (``Sharder.kv_cache_bytes`` x the microbatches) on this device
    (opmap.mapping.memory.kv_bytes_per_token_per_device: its layers / pp, its KV heads / min(tp, KV heads); / cp),
    the largest op's working set / tp in flight (as serve's reserve counts it); and the assumed workspace. ``seq``
    is not read: the captured graph holds the sequence, the KV length and the batch (kept in its place so callers'
    positional ``capacity_bytes`` stays where it was)."""
    from opmap.mapping.memory import WORKSPACE, kv_bytes_per_token_per_device, train_formats, training_state_bytes

    geo = sharder.geo
    cap = sharder.a.hardware.memory_bytes if capacity_bytes is None else capacity_bytes
    params = sharder.params_per_device(p)
    notes = (f"per device under {p.label()}: {params:.4g} parameters held",)
    if training:
        st = training_state_bytes(params, p.zero, p.dp, fmt if fmt in train_formats() else "bf16")
        act, how = training_activations(p, saved, geo.layers)
        cp_note: tuple[str, ...] = ()
        if p.cp > 1 and sharder.kv is not None:
            chunks = context.CP_BUFFER_CHUNKS if p.cp_comm == "p2p" else 2 * p.cp  # gathered K / V and dK / dV
            buffers = chunks * context.chunk_bytes(sharder.kv, p.tp, p.cp)
            act = act / p.cp + buffers
            cp_note = (f"cp {p.cp}: activations of s / {p.cp} tokens per rank, plus {buffers / 2**20:.4g} MiB of "
                       "ring buffers (K / V double-buffered, dK / dV in backward)",)
        return MemoryFit(st.weights_bytes, st.gradients_bytes, st.optimizer_bytes, act,
                         0.0, WORKSPACE.value, cap, "training", assumptions=notes + (how, st.note) + cp_note)
    weights = params * sharder.itemsize * sharder.a.precision.weight_scale
    kv_all = sharder.kv_cache_bytes() * p.microbatches
    kv_bytes = kv_bytes_per_token_per_device(kv_all, geo.layers, sharder.cache_kv_heads, p.tp, p.pp) / p.cp
    act = inflight_activation_bytes(sharder.a.graph) / p.tp
    kv_note = (f"KV cache: {kv_all / 2**30:.4g} GiB for the replica's {p.global_batch // p.dp} sequences, "
               f"{kv_bytes / 2**30:.4g} GiB on this device",)
    return MemoryFit(weights, 0.0, 0.0, act, kv_bytes, WORKSPACE.value, cap, "inference",
                     assumptions=notes + kv_note)
