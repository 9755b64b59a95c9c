"""One kernel's time on one device under a layout: the row the sharder keeps per kernel (``KernelRow``) and the
rules that divide its terms over the layout (``device_time``, ``tp_split``). opmap.mapping.sharding's Sharder
prices every layout with them, its weight reads per device use the same split, and serve's Pricer
(opmap.serve.model_cost) reads the per-kernel times and rows they give.

Rules (Megatron-LM's splits; the assumptions are listed in opmap.mapping.sharding.ASSUMPTIONS): a tensor-parallel
kernel's matrix, vector and memory terms, and the time past them (``extra_s``), are divided by its split, the
launch overhead is not; a K / V projection narrower than tp splits over the KV heads only; attention past the KV
heads reads each (replicated) KV head whole; a replicated kernel splits over tp under sequence parallelism; with
cp each rank runs s / cp tokens and reads the weights whole; an expert's weights split over ep (its token work
x the EP load imbalance); the optimizer's
update splits over tp x pp (x dp from ZeRO 1). A MoE layer's kernels priced off the device's measured MoE grid
(opmap.mapping.moe_measured) read the measured layer time at the layout's tokens, tp and ep instead (without cp).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opmap.mapping.roles import SPLIT_ROLES
from opmap.mapping.shard_types import Parallelism

EXPERT_ROLES = ("expert_column", "expert_row")


@dataclass(frozen=True, slots=True)
class KernelRow:
    """One kernel of an analysis as the sharder prices it: its role and place, its unsharded time terms (s) and
    what the split rules read."""

    role: str  # opmap.mapping.roles: column, row, vocab, expert_column, expert_row, replicated, optimizer, ...
    pos: int  # -1 before the blocks, the captured block's index, or L (the captured blocks) after them
    phase: str  # forward, backward or optimizer (opmap.mapping.roles.phase_of of its anchor)
    matrix_s: float
    vector_s: float
    memory_s: float
    overhead_s: float  # the launch: not divided by any split
    extra_s: float  # predicted - the busiest term - overhead (stalls, waves), divided with the terms
    weight_fraction: float  # of its memory traffic, the share that is parameter reads
    kv_narrow: bool  # a column-parallel K / V projection (output as wide as the KV heads)
    sdpa: bool  # the fused attention call (scaled_dot_product_attention) itself
    matrix_flops: float
    attention_backward: bool  # a fused attention's backward
    busy_s: float  # max(matrix_s, vector_s, memory_s): kept, the hot path reads it
    # matrix_flops at the analysis's matrix rate: the token-proportional floor of matrix_s (a skinny GEMM's
    # matrix_s is its padded tiles', flat in the tokens up to a tile); 0: not known (matrix_s is taken as linear)
    matrix_linear_s: float = 0.0
    # opmap.mapping.moe_measured.MeasuredMoe: a MoE layer's kernel priced off the device's measured MoE grid
    moe: Any = None


def tp_split(role: str, kv_narrow: bool, tp: int, kv_heads: int) -> int:
    """The devices a tensor-parallel kernel's work (and its weight reads) divides over: tp, or min(tp, KV heads)
    for a K / V projection narrower than tp (each KV head replicated on tp / kv_heads ranks); 1 for a kernel that
    is not split (``SPLIT_ROLES``)."""
    if role not in SPLIT_ROLES:
        return 1
    return min(tp, kv_heads) if kv_narrow and kv_heads else tp


def device_time(row: KernelRow, p: Parallelism, kv_heads: int) -> float:
    """``row``'s time on one device under ``p`` (module docstring); ``kv_heads``: the model's KV heads (0: none
    known). Called per kernel per layout (a layout search, serve's pricing): the common case reads four fields."""
    role = row.role
    if row.moe is not None and p.cp == 1:
        t = row.moe.device_s(p.tp, p.ep, p.ep_over_tp, p.ep_imbalance if p.ep > 1 else 1.0)
        if t is not None:
            return t + row.overhead_s  # one launch a kernel on every device
    if role == "optimizer":
        d = p.tp * p.pp * (p.dp if p.zero >= 1 else 1)
        return row.busy_s / d + row.extra_s / d + row.overhead_s
    expert = p.ep > 1 and role in EXPERT_ROLES
    if p.cp > 1 or expert:
        return _spread_time(row, p, kv_heads, expert)
    if role in SPLIT_ROLES:
        if row.sdpa and kv_heads and p.tp > kv_heads:
            return _past_kv_heads(row.matrix_s, row.vector_s, row.memory_s, row.extra_s, row.overhead_s, p.tp,
                                  kv_heads)
        d = min(p.tp, kv_heads) if row.kv_narrow and kv_heads else p.tp
    elif p.sp and role == "replicated":
        d = p.tp
    else:
        d = 1.0
    return row.busy_s / d + row.extra_s / d + row.overhead_s


def _past_kv_heads(m: float, v: float, mem: float, extra: float, o: float, tp: int, kv_heads: int) -> float:
    """Attention past the KV heads: each rank reads its (replicated) KV head whole, so the memory term splits over
    the KV heads only; the query heads' work over tp."""
    return max(m / tp, v / tp, mem / kv_heads) + extra / tp + o


def _spread_time(row: KernelRow, p: Parallelism, kv_heads: int, expert: bool) -> float:
    """Under cp, or an expert under ep: each rank runs s / cp tokens (the token work splits, the weights are read
    whole on every cp rank); E / ep experts on ep times the tokens (matrix and activation traffic unchanged,
    weights / ep), or, ep over the tp group, E / ep experts on the tokens every rank holds (each expert over tp /
    ep: all of it / tp); an expert's token work (matrix, vector, activation traffic and the time past them) x the
    busiest EP rank's load over the mean (``ep_imbalance``); then the tensor-parallel split."""
    wfrac = row.weight_fraction
    imb = p.ep_imbalance if expert else 1.0
    m, v, extra = row.matrix_s * imb / p.cp, row.vector_s * imb / p.cp, row.extra_s * imb / p.cp
    if expert:
        # the busiest rank's E / ep experts at ep x imb x the captured tokens each (ep over the tp group: the
        # captured tokens x imb, each expert over tp / ep): a GEMM's matrix time is its padded tiles' (flat in the
        # tokens, matrix_s per kernel run) or its FLOPs' (linear), whichever is more
        lin = (row.matrix_linear_s or row.matrix_s) * imb / p.cp
        m = max(row.matrix_s / (1 if p.ep_over_tp else p.ep), lin)
    mem = row.memory_s * ((1 - wfrac) * imb / p.cp + wfrac / (p.ep if expert and not p.ep_over_tp else 1))
    o = row.overhead_s / p.ep if expert else row.overhead_s
    role = row.role
    if role in SPLIT_ROLES and row.sdpa and kv_heads and p.tp > kv_heads:
        return _past_kv_heads(m, v, mem, extra, o, p.tp, kv_heads)
    d = 1.0
    if role in SPLIT_ROLES:
        d = tp_split(role, row.kv_narrow, p.tp, kv_heads)
    elif role == "replicated" and p.sp:
        d = p.tp
    return max(m, v, mem) / d + extra / d + o
