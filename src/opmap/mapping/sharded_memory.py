"""Per-device memory of a layout: the saved activations per block, read off the training graph, and the memory
fit of one layout (opmap.mapping.sharding prices its time)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from opmap.graph import OpGraph
from opmap.mapping import context
from opmap.mapping.memory import MemoryFit
from opmap.mapping.roles import SPLIT_ROLES, Roles

if TYPE_CHECKING:
    from opmap.mapping.sharding import Parallelism, Sharder


@dataclass(frozen=True)
class SavedPerBlock:
    split_bytes: float
    replicated_bytes: float
    scores_bytes: float  # of the split ones, those of S x S shape (selective recomputation drops them)
    input_bytes: float  # the block's input (full recomputation keeps only this)


def saved_per_block(graph: OpGraph, roles: Roles, seq: int) -> SavedPerBlock:
    """Forward outputs of the first block that backward nodes read (each tensor once), by role."""
    if not roles.blocks:
        return SavedPerBlock(0.0, 0.0, 0.0, 0.0)
    b0 = roles.blocks[0]
    seen: set[tuple[int, tuple[int, ...]]] = set()
    split = rep = ss = 0.0
    for n in graph.nodes:
        if (n.args.get("phase") or "forward") != "backward":
            continue
        for t in n.inputs:
            p = t.producer
            if p is None or t.param is not None or roles.block.get(p) != b0:
                continue
            src = graph.nodes[p]
            if (src.args.get("phase") or "forward") != "forward" or src.is_view:
                continue
            key = (p, tuple(t.shape))
            if key in seen:
                continue
            seen.add(key)
            if roles.role.get(p) in SPLIT_ROLES:
                split += t.nbytes
                if len(t.shape) >= 2 and t.shape[-1] == seq and t.shape[-2] == seq:
                    ss += t.nbytes
            else:
                rep += t.nbytes
    return SavedPerBlock(split, rep, ss, roles.geometry.act_bytes)


def sharded_memory(p: Parallelism, sharder: Sharder, saved: SavedPerBlock, fmt: str, training: bool,
                   seq: int, capacity_bytes: float | None = None) -> MemoryFit:
    """Per-device memory of a layout: the model state of the parameters this device holds (dense / (tp x pp),
    experts also / ep) under mixed-precision AdamW and the ZeRO stage over dp (training), the activations saved
    for backward by the blocks of one stage for the microbatches in flight on the first stage (min(m, pp), more
    with interleaving), split over tp where the layer splits them (all of them with SP) and over cp (each rank keeps
    its s / cp tokens' activations, plus the ring's K / V and dK / dV buffers, ``context.CP_BUFFER_CHUNKS``
    chunks), the KV cache over tp (KV heads), pp and cp (inference), and the assumed workspace."""
    from opmap.mapping.memory import TRAIN_BYTES, WORKSPACE, training_state_bytes

    geo = sharder.geo
    cap = sharder.a.hardware.memory_bytes if capacity_bytes is None else capacity_bytes
    params = sharder.params_per_device(p)
    blocks = -(-max(1, geo.layers) // p.pp)
    notes = (f"per device under {p.label()}: {params:.4g} parameters held",)
    if training:
        st = training_state_bytes(params, p.zero, p.dp, fmt if fmt in TRAIN_BYTES else "bf16")
        rep_div = p.tp if p.sp else 1
        if p.recompute == "full":
            per_block = saved.input_bytes / rep_div
        else:
            split = saved.split_bytes - (saved.scores_bytes if p.recompute == "selective" else 0.0)
            per_block = split / p.tp + saved.replicated_bytes / rep_div
        inflight = min(p.microbatches, p.pp) * (1 + (p.pp - 1) / (p.pp * p.vp) if p.vp > 1 else 1)
        act = per_block * blocks * inflight
        cp_note: tuple[str, ...] = ()
        if p.cp > 1 and sharder.kv is not None:
            chunks = context.CP_BUFFER_CHUNKS if p.cp_comm == "p2p" else 2 * p.cp  # gathered K / V and dK / dV
            buffers = chunks * context.chunk_bytes(sharder.kv, p.tp, p.cp)
            act = act / p.cp + buffers
            cp_note = (f"cp {p.cp}: activations of s / {p.cp} tokens per rank, plus {buffers / 2**20:.4g} MiB of "
                       "ring buffers (K / V double-buffered, dK / dV in backward)",)
        return MemoryFit(st.weights_bytes, st.gradients_bytes, st.optimizer_bytes, act,
                         0.0, WORKSPACE.value, cap, "training",
                         assumptions=notes + (f"activations: {blocks} blocks x {inflight:.3g} microbatches in flight "
                                              "on the first stage", st.note) + cp_note)
    weights = params * sharder.itemsize * sharder.a.precision.weight_scale
    kv_div = min(p.tp, geo.kv_heads) if geo.kv_heads else p.tp
    kv_bytes = sharder.kv_bytes_per_token() * seq * p.microbatch / kv_div / p.pp / p.cp
    return MemoryFit(weights, 0.0, 0.0, 0.0, kv_bytes, WORKSPACE.value, cap, "inference", assumptions=notes)
