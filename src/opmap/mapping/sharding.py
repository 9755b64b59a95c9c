"""Sharding a captured graph over tensor, context, pipeline, data and expert parallelism (Megatron-LM's splits).

Input: an ``Analysis`` (a forward graph, or a training graph whose backward nodes carry
``args["phase"] == "backward"``) and a ``Parallelism``. Output: a ``Sharded`` per-device result: every kernel's
time on one device, the collectives the layout implies as kernels of their own (class ``collective``, bound
``interconnect``), the pipeline schedule and its bubble, the per-device memory.

Roles (which GEMM is column- or row-parallel, vocabulary-parallel, an expert's, replicated) are read off the
graph by opmap.mapping.roles; the layout's collectives are built by opmap.mapping.layout_collectives and its
per-device memory by opmap.mapping.sharded_memory (both re-exported here).

Per device, a split kernel's terms (matrix, vector, memory) are divided by its split; the launch overhead is
not. Tiles are not searched again at the sharded shape (the terms scale linearly: stated in the assumptions).

Device placement (Megatron-LM's default order tp-cp-ep-dp-pp): TP innermost, then CP, then DP (with EP taken
from inside DP, as Megatron-core and DeepSpeed-MoE do: ep divides dp; for inference this is DP attention, or, where ep
divides tp instead, the experts sit over the tp group: opmap.mapping.expert_parallel), then PP outermost:
rank = tp_rank + tp (cp_rank + cp (dp_rank + dp pp_rank)). Context parallelism (the sequence over cp ranks,
attention as a K / V ring): opmap.mapping.context. A group whose span of consecutive ranks fits one domain of the
innermost tier (an HGX board's 8 GPUs, an NVL72 rack's 72) runs over that link (NVLS where its switch reduces); one
that spans more crosses the tiers its members do (opmap.mapping.layout_collectives.placement: a Trn2 instance's
torus, then the UltraServer's links, then the scale-out network), each hop of a group with one member a domain
through the NIC.

Collectives (per microbatch unless said): TP all-reduce of the activation (b s h bytes) after each row-parallel
group in forward and for each column-parallel group's input gradient in backward (Shoeybi et al. 2019: two
per layer each way); with SP each becomes a reduce-scatter plus an all-gather of the same bytes (Korthikanti
2022); EP all-to-all before and after the experts (dispatch and combine), again in backward; PP send / recv of
the activation between stages (b s h / tp bytes: Narayanan et al. 2021's scatter / gather), and of its gradient
in backward, vp times per microbatch with interleaving; DP gradient reduction once per iteration: all-reduce
of the gradient bytes at ZeRO 0 / 1, reduce-scatter of the gradients plus all-gather of the updated parameters
at ZeRO 2, and at ZeRO 3 a further all-gather of the parameters in forward and in backward (Rajbhandari et al.
2020, sec. 7).

Pipeline (Narayanan et al. 2021, sec. 2.2): m = global_batch / (dp x microbatch) microbatches; 1F1B bubble
fraction (pp - 1) / m; interleaved (pp - 1) / (m vp); iteration = (m + (pp - 1) / vp) x the slowest stage's
time per microbatch + the exposed DP reduction + the optimizer step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from opmap.hardware.spec import HardwareSpec
from opmap.mapping import context
from opmap.mapping.collectives import Collective, collective_time
from opmap.mapping.device_time import EXPERT_ROLES, KernelRow, device_time, tp_split
from opmap.mapping.expert_parallel import ep_note
from opmap.mapping.layout_collectives import CollectiveKernel, layout_collectives, link_for  # noqa: F401 (re-exported)
from opmap.mapping.roles import SPLIT_ROLES, block_of, infer_roles, phase_of
from opmap.mapping.shard_types import (  # noqa: F401 (re-exported: the layout's types live below this module)
    DP_OVERLAP,
    RECOMPUTE,
    Depth,
    Parallelism,
)
from opmap.mapping.shard_types import check as _check
from opmap.mapping.sharded_memory import SavedPerBlock, saved_per_block, sharded_memory  # noqa: F401 (re-exported)
from opmap.record import key, record
from opmap.roofline import Bound

# The backward that can hide it is the LAST microbatch's only: with gradient accumulation the first m - 1
# microbatches run inside the DDP wrapper's no_sync (gradients accumulate locally) and the reduction is launched
# only by the last one's backward (NVIDIA/Megatron-LM megatron/core/pipeline_parallel/schedules.py,
# forward_backward_no_pipelining: "Run computation for last microbatch out of context handler (want to
# synchronize gradients)"; the 1F1B schedules enable grad sync for the last microbatch's backward; PyTorch
# DistributedDataParallel.no_sync for gradient accumulation). So the window does not grow with the microbatches.
DP_WINDOW = ("the last microbatch's backward (no_sync over the first m - 1: Megatron-LM schedules.py, PyTorch DDP); "
             "with a sharded optimizer (ZeRO >= 1: Megatron's distributed optimizer, NeMo's distributed_fused_adam) "
             "the gradients are reduce-scattered there and the updated parameters all-gathered behind the next "
             "iteration's first forward (Megatron --overlap-param-gather, NeMo overlap_param_sync)")
PARAM_GATHER = "DP all-gather of updated parameters"  # the purpose layout_collectives gives it
# TP, SP, EP and PP collectives sit on the critical path of each layer: not overlapped.
TP_OVERLAP = 0.0

ASSUMPTIONS = (
    "placement: TP innermost, then CP, then DP (EP inside DP: ep divides dp), then PP outermost (Megatron-LM "
    "order tp-cp-ep-dp-pp)",
    "a group whose consecutive-rank span fits one node runs on the scale-up link, else priced as scale-out",
    f"TP / SP / EP / PP collectives not overlapped with compute (overlap {TP_OVERLAP:.0%})",
    "sharded kernels: matrix, vector and memory terms divided by the split, launch overhead kept; tiles not "
    "searched again at the sharded shape",
    "K / V projections replicated over tp / kv_heads ranks when tp exceeds the KV heads (Megatron-LM GQA)",
    "experts: E / ep per device, each tensor-parallel over tp; balanced load (each device's expert FLOPs equal "
    "the unsharded per-token work)",
    "PP send / recv carries b s h / tp bytes (Narayanan et al. 2021 scatter / gather optimisation)",
)


@dataclass(frozen=True)
class Sharded:
    """The per-device result of a layout: the kernels' per-device times (``kernel_s``, in the analysis's kernel
    order), the collectives, the pipeline and the iteration (or batch) time. Its record (analysis.json's
    ``parallelism`` block) is the layout's fields in place, then the pipeline's figures (``RECORD``)."""

    RECORD: ClassVar[tuple[str, ...]] = (
        "parallelism", "stage_compute_s", "microbatch_s", "microbatches", "bubble_fraction", "schedule", "step_s",
        "latency_s", "tokens_per_s", "cp_exchange_s", "cp_exposed_s", "matrix_flops_per_device", "recompute_s",
        "bubble_s", "exposed_comm_s", "optimizer_s", "assumptions")
    parallelism: Parallelism = field(metadata=key(flatten=True))
    kernel_s: tuple[float, ...]
    stage_compute_s: tuple[float, ...]  # per stage, per microbatch (forward + backward + recompute)
    collectives: tuple[CollectiveKernel, ...]
    microbatch_s: float  # the slowest stage's time per microbatch, collectives included
    bubble_fraction: float
    step_s: float  # iteration (training) or the global batch (inference)
    latency_s: float  # one microbatch through every stage
    training: bool
    tokens: int  # tokens per step, all replicas
    matrix_flops_per_device: float
    notes: tuple[str, ...]
    cp_exchange_s: float = 0.0  # per microbatch on the slowest stage: the CP ring's send time, all of it
    cp_exposed_s: float = 0.0  # ... and the part not hidden behind the attention compute
    # the step's parts on the slowest stage's device: step_s = microbatches x stage_compute_s[slowest] + bubble_s +
    # exposed_comm_s + optimizer_s (training); recompute_s is the recomputation inside stage_compute_s
    recompute_s: float = 0.0  # per microbatch
    bubble_s: float = 0.0  # (pp - 1) / vp microbatch slots the slowest stage idles per iteration
    exposed_comm_s: float = 0.0  # per iteration: the per-microbatch collectives and the DP reduction not hidden
    optimizer_s: float = 0.0  # the optimizer step over the parameters (and ZeRO shard) one device holds

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_s if self.step_s else 0.0

    @property
    def microbatches(self) -> int:
        return self.parallelism.microbatches

    @property
    def schedule(self) -> str:
        return "interleaved 1F1B" if self.parallelism.vp > 1 else "1F1B"

    @property
    def assumptions(self) -> tuple[str, ...]:
        """What the layout's figures assume: the module's, the DP overlap, the layout's own notes."""
        return (*ASSUMPTIONS, f"DP gradient reduction overlapped with backward: up to {self.parallelism.dp_overlap:.0%}"
                f" of {DP_WINDOW} hides it", *self.notes)



def dp_exposed_s(comm_s: float, window_s: float, overlap: float) -> float:
    """Seconds of a DP collective (``comm_s`` per iteration) left on the critical path: what ``overlap`` x the
    compute it runs behind (``window_s``) cannot hide. The gradient reduction's window is one microbatch's backward
    on the stage, whatever the number of microbatches: gradients accumulate under no_sync and only the last
    backward launches the bucketed reduction; the updated parameters' all-gather, the next iteration's first
    forward (``DP_WINDOW``)."""
    return max(0.0, comm_s - overlap * window_s)


# per position (before the blocks, each captured block, after them): the sums one layout's table keeps
_TOTAL, _FWD, _SDPA_FWD, _ATTN_BWD, _BWD, _MFLOPS = range(6)


class Sharder:
    """Prices layouts of one analysis: the roles and per-kernel terms are computed once; each layout is then
    arithmetic (``shard``). Kernels are summed per position (before the blocks, each block, after them) once per
    (tp, sp, ep, cp) and kept; a stage is then a sum over its layers (prefix sums), so a layout costs a few
    dozen operations whatever the graph's size.

    ``depth``: the analysis holds a few identical blocks standing for ``depth.layers`` (opmap.explore.depth): the
    first captured block is layer 0, the last one every layer past the captured ones; parameters, optimizer
    and expert weights scale to the whole model."""

    def __init__(self, analysis, depth: Depth | None = None):
        self.a = analysis
        g = analysis.graph
        self.roles = infer_roles(g)
        rate = analysis.precision.matrix_rate_flops_per_s
        geo = self.roles.geometry
        self.training = any(phase_of(n) == "backward" for n in g.nodes)
        blocks = {b: i for i, b in enumerate(self.roles.blocks)}
        L = max(1, len(blocks))
        first_id: dict[str, int] = {}
        for n in g.nodes:
            if self.roles.block[n.id] is not None:
                first_id.setdefault(phase_of(n), n.id)
        rows = []
        opt_block: list[int | None] = []  # per optimizer kernel: the block whose parameters it updates (-1 none)
        for k in analysis.kernel_results:
            anchor = g.nodes[k.kernel.anchor]
            role = self.roles.role.get(anchor.id, "replicated")
            b = self.roles.block[anchor.id]
            # position: -1 before the blocks, L after them, else the block index
            if b in blocks:
                pos = blocks[b]
            elif phase_of(anchor) == "backward":  # backward runs the head's gradient first, the embedding's last
                pos = L if anchor.id < first_id.get("backward", 0) else -1
            else:
                pos = -1 if anchor.id < first_id.get("forward", 0) else L
            t = k.time
            busy = max(t.matrix_s, t.vector_s, t.memory_s)
            extra = max(0.0, t.predicted_s - busy - t.overhead_s)
            params = sum(analysis.results[m].cost.param_bytes_read for m in k.kernel.nodes)
            wfrac = min(1.0, params / k.traffic_bytes) if k.traffic_bytes else 0.0
            kv_narrow = self._kv_narrow(role, anchor)
            mflops = sum(analysis.results[m].cost.matrix_flops for m in k.kernel.nodes)
            if role == "optimizer" and depth is not None:
                owners = {block_of(t.param) for m in k.kernel.nodes for t in g.nodes[m].inputs if t.param}
                one = next(iter(owners)) if len(owners) == 1 else "<several>"
                opt_block.append(-1 if one is None else blocks.get(one))
            rows.append(KernelRow(role, pos, phase_of(anchor), t.matrix_s, t.vector_s, t.memory_s, t.overhead_s, extra,
                                  wfrac, kv_narrow, anchor.op == "aten.scaled_dot_product_attention.default",
                                  mflops, "scaled_dot_product" in anchor.op and phase_of(anchor) == "backward",
                                  busy, mflops / rate if rate else 0.0, k.moe))
        self.rows: list[KernelRow] = rows  # one per kernel, in the analysis's kernel order
        self.L = L  # captured blocks
        self.depth = depth
        if depth is not None:
            _check(depth.layers >= L, f"a shallow capture of {L} blocks cannot stand for {depth.layers}")
            geo = replace(geo, layers=depth.layers)
        self.geo = geo
        self.layers = geo.layers if depth is not None else L
        self.layer_block = list(range(L)) + [L - 1] * (self.layers - L)
        self.params = float(depth.params if depth is not None else g.params)
        self.itemsize = (depth.param_bytes / max(1, depth.params)) if depth is not None else \
            g.param_bytes / max(1, g.params)
        self._opt = self._optimizer_sums(rows, opt_block, g.params)
        self.kv = context.kv_shape(g)
        self.cache_kv_heads = _cache_kv_heads(g, geo.kv_heads)
        moe_blocks = set(self.roles.expert_blocks)
        self.moe_layers = sum(1 for i in self.layer_block if i < len(self.roles.blocks)
                              and self.roles.blocks[i] in moe_blocks)
        self._tables: dict[tuple, tuple[list[list[float]], list[list[float]]]] = {}
        self._ctimes: dict[tuple, tuple[Collective, float, str]] = {}
        extra = self.layers - L
        rep = sum(r.matrix_flops for r in rows if r.pos == L - 1 and r.role != "optimizer") if extra else 0.0
        self._model_mflops = analysis.total.matrix_flops + extra * rep

    def _optimizer_sums(self, rows: list[KernelRow], opt_block: list[int | None],
                        captured_params: int) -> tuple[float, float]:
        """The optimizer kernels' (work, launch) sums for the whole model. A shallow capture: each kernel that
        updates one block's parameters counts once per layer that block stands for; when a kernel spans blocks
        (a multi-tensor kernel), the work scales with the parameters and the launches stay as captured."""
        opt = [r for r in rows if r.role == "optimizer"]
        work = [r.busy_s + r.extra_s for r in opt]
        launch = [r.overhead_s for r in opt]
        if self.depth is None:
            return sum(work), sum(launch)
        if any(b is None for b in opt_block):
            return sum(work) * self.params / max(1, captured_params), sum(launch)
        weight = [1.0] * len(opt)
        per_block = [self.layer_block.count(i) for i in range(self.L)]
        for j, b in enumerate(opt_block):
            if b is not None and b >= 0:
                weight[j] = per_block[b]
        return sum(w * x for w, x in zip(weight, work)), sum(w * x for w, x in zip(weight, launch))

    @property
    def expert_params(self) -> float:
        e = self.roles.expert_params
        return e * self.layers / self.L if self.depth is not None else e

    @property
    def model_matrix_flops(self) -> float:
        """Matrix FLOPs of the whole captured step at the model's depth (a shallow capture's last block repeated)."""
        return self._model_mflops

    def kv_bytes_per_token(self) -> float:
        """K and V bytes one token adds over every layer (inference), at the model's depth."""
        from opmap.mapping.memory import kv_geometry

        kv = kv_geometry(self.a.graph)
        return kv.bytes_per_token * (self.layers / self.L if self.depth is not None and kv.layers else 1.0)

    def kv_cache_bytes(self) -> float:
        """The KV cache the captured step holds (opmap.mapping.memory.kv_cache_held_bytes: its batch, its prompt or
        KV length), over every layer at the model's depth: one replica's, before any split."""
        from opmap.mapping.memory import kv_cache_held_bytes

        return kv_cache_held_bytes(self.a.graph) * (self.layers / self.L if self.depth is not None else 1.0)

    def weight_bytes_by_position(self, p: Parallelism) -> tuple[list[float], list[float]]:
        """Weight bytes the step reads on one device, per position of the capture ([outside the blocks, block 0,
        block 1, ...]), dense and expert apart: each kernel's parameter reads (a decode step's gathered embedding
        rows, not the table; the experts it runs) over its split: tp for a split GEMM, min(tp, KV heads) for a K /
        V projection narrower than tp, also ep for an expert's (a lower bound: the batch's experts spread
        evenly). Serve's decode floor and analyze's read the same shares."""
        index = {b: i for i, b in enumerate(self.roles.blocks)}
        dense, expert = [0.0] * (self.L + 1), [0.0] * (self.L + 1)
        kvh = self.geo.kv_heads
        for r in self.a.results:
            read = r.cost.param_bytes_read
            if not read:
                continue
            role = self.roles.role.get(r.node.id, "replicated")
            moe = role in EXPERT_ROLES
            d = 1
            if role in SPLIT_ROLES:
                d = tp_split(role, self._kv_narrow(role, r.node), p.tp, kvh) * (
                    p.ep if moe and not p.ep_over_tp else 1)
            (expert if moe else dense)[index.get(self.roles.block.get(r.node.id), -1) + 1] += read / d
        return dense, expert

    def weight_bytes_read(self, p: Parallelism) -> float:
        """Weight bytes the step reads on one device of each pipeline stage, summed over the stages a token passes
        (``weight_bytes_by_position``), at the model's depth."""
        dense, expert = self.weight_bytes_by_position(p)
        pos = [a + b for a, b in zip(dense, expert)]
        return pos[0] + sum(pos[i + 1] for i in self.layer_block)

    def _kv_narrow(self, role: str, node) -> bool:
        """A column-parallel K / V projection: its output as wide as the KV heads (split over them, not tp)."""
        return bool(role == "column" and self.roles.kv_width and node.outputs
                    and node.outputs[0].shape[-1] == self.roles.kv_width)

    def _table(self, p: Parallelism) -> tuple[list[list[float]], list[list[float]]]:
        """Per position (index 0 before the blocks, 1 + i block i, L + 1 after them) the sums ``_TOTAL`` ..
        ``_MFLOPS`` under (tp, sp, ep, cp), and their prefix sums over the model's layers (kept per key)."""
        key = (p.tp, p.sp, p.ep, p.cp, p.ep_over_tp, p.ep_imbalance)
        hit = self._tables.get(key)
        if hit is not None:
            return hit
        q = Parallelism(tp=p.tp, sp=p.sp, ep=p.ep, cp=p.cp, dp=1 if p.ep_over_tp else p.ep,
                        ep_imbalance=p.ep_imbalance)
        L = self.L
        pos_sums = [[0.0] * 6 for _ in range(L + 2)]
        kvh = self.cache_kv_heads  # MLA: every rank reads the whole latent
        for r in self.rows:
            if r.role == "optimizer":
                continue
            t = device_time(r, q, kvh)
            pos = r.pos
            slot = pos_sums[0 if pos < 0 else L + 1 if pos >= L else pos + 1]
            slot[_TOTAL] += t
            inside = 0 <= pos < L
            if r.phase == "forward" and inside:
                slot[_FWD] += t
                if r.sdpa:
                    slot[_SDPA_FWD] += t
            if r.attention_backward and inside:
                slot[_ATTN_BWD] += t
            if r.phase == "backward":
                slot[_BWD] += t
            slot[_MFLOPS] += r.matrix_flops / (p.tp if r.role in SPLIT_ROLES else 1) / p.cp
        prefix = [[0.0] * 6]
        for i in self.layer_block:
            prefix.append([a + b for a, b in zip(prefix[-1], pos_sums[i + 1])])
        self._tables[key] = (pos_sums, prefix)
        return pos_sums, prefix

    def shard(self, p: Parallelism, hw: HardwareSpec | None = None, per_kernel: bool = True) -> Sharded:
        """One layout's per-device result. ``per_kernel`` False: ``kernel_s`` is left empty (a layout search needs
        only the totals)."""
        hw = hw or self.a.hardware
        seq = self._check_layout(p)
        pos_sums, prefix = self._table(p)
        L, pp, vp = self.layers, p.pp, p.vp
        per, stage, fwd_block, sdpa_fwd, mflops = self._stages(p, pos_sums, prefix)
        opt_base, opt_o = self._opt
        d_opt = p.tp * p.pp * (p.dp if p.zero >= 1 else 1)
        opt_s = opt_base / d_opt + opt_o
        total = prefix[-1]
        attn = (total[_SDPA_FWD] / L, total[_ATTN_BWD] / L) if L else (0.0, 0.0)
        colls = layout_collectives(self, p, hw, per, attn)
        per_mb_coll = sum(c.exposed * c.count for c in colls if c.stage != "iteration")
        slow = max(range(pp), key=lambda i: stage[i])
        mb_s = stage[slow] + per_mb_coll * (1 - TP_OVERLAP)
        m = p.microbatches
        bubble = (pp - 1) / (m * vp)
        bwd_s = (total[_BWD] + pos_sums[0][_BWD] + pos_sums[-1][_BWD]) / pp
        fwd_s = (total[_TOTAL] + pos_sums[0][_TOTAL] + pos_sums[-1][_TOTAL]) / pp - bwd_s
        exposed_dp = _exposed_dp_s(colls, p, fwd_s, bwd_s) if self.training else 0.0
        step = (m + (pp - 1) / vp) * mb_s + exposed_dp + opt_s
        p2p = sum(c.predicted_s for c in colls if c.purpose.startswith("PP") and c.stage == "forward")
        latency = sum(stage) + per_mb_coll * pp - p2p * (1 if pp > 1 else 0)
        tokens = p.global_batch * (seq if self.a.assumptions.seq else 1)
        ring = [c for c in colls if c.purpose.startswith("CP")]  # the ring's sends or the all-gathers
        kvh = self.cache_kv_heads
        per_k = tuple(device_time(r, p, kvh) for r in self.rows) if per_kernel else ()
        rec_s = (fwd_block[slow] if p.recompute == "full" else sdpa_fwd[slow] if p.recompute == "selective"
                 else 0.0) if self.training else 0.0
        return Sharded(p, per_k, tuple(stage), tuple(colls), mb_s, bubble, step, latency, self.training,
                       tokens, mflops[slow], self._notes(p), cp_exchange_s=sum(c.predicted_s * c.count for c in ring),
                       cp_exposed_s=sum(c.exposed * c.count for c in ring), recompute_s=rec_s,
                       bubble_s=(pp - 1) / vp * mb_s, exposed_comm_s=m * per_mb_coll * (1 - TP_OVERLAP) + exposed_dp,
                       optimizer_s=opt_s)

    def _check_layout(self, p: Parallelism) -> int:
        """The layout checked against the model (its sequence for cp, training for ep); the sequence."""
        if p.trivial is False or p.devices > 1:
            p.check(self.geo)
        seq = int(self.a.assumptions.seq or 1)
        p.check_phase(self.training)
        if p.cp > 1:
            _check(self.kv is not None, f"--cp {p.cp} splits attention as a ring of fused attention calls "
                                        "(scaled_dot_product_attention), and this model has none")
            why = context.check_sequence(seq, p.cp, self.kv.causal)
            _check(not why, why)
        return seq

    def _stages(self, p: Parallelism, pos_sums: list[list[float]], prefix: list[list[float]]):
        """(layers a stage, and per stage: its time a microbatch, recomputation included, its blocks' forward, their
        SDPA forward, its matrix FLOPs): the layers split over pp stages, the first stage holding what comes before
        the layers (embeddings) and the last what comes after them (the head, the loss)."""
        L, pp = self.layers, p.pp
        per = L // pp if L % pp == 0 else math.ceil(L / pp)
        stage, fwd_block, sdpa_fwd, mflops = [0.0] * pp, [0.0] * pp, [0.0] * pp, [0.0] * pp
        for s in range(pp):
            lo, hi = min(L, s * per), min(L, (s + 1) * per) if s < pp - 1 else L
            part = [a - b for a, b in zip(prefix[hi], prefix[lo])]
            if s == 0:
                part = [a + b for a, b in zip(part, pos_sums[0])]
            if s == pp - 1:
                part = [a + b for a, b in zip(part, pos_sums[-1])]
            stage[s], fwd_block[s], sdpa_fwd[s], mflops[s] = part[_TOTAL], part[_FWD], part[_SDPA_FWD], \
                part[_MFLOPS]
        if self.training and p.recompute == "full":
            stage = [a + b for a, b in zip(stage, fwd_block)]
        elif self.training and p.recompute == "selective":
            stage = [a + b for a, b in zip(stage, sdpa_fwd)]
        return per, stage, fwd_block, sdpa_fwd, mflops

    def _notes(self, p: Parallelism) -> tuple[str, ...]:
        """What a layout assumes beyond the module docstring: KV heads replicated, recomputation, CP, EP."""
        notes = []
        if self.geo.kv_heads and p.tp > self.geo.kv_heads:
            notes.append(f"tp {p.tp} > {self.geo.kv_heads} KV heads: each KV head replicated on "
                         f"{p.tp // self.geo.kv_heads} ranks")
        if self.training and p.recompute != "none":
            notes.append(f"recompute {p.recompute}: " + ("each block's forward runs again in backward"
                                                         if p.recompute == "full" else
                                                         "the attention core (SDPA) runs again in backward"))
        if p.cp > 1 and p.cp_comm == "p2p":
            notes.append(f"cp {p.cp}: {context.CP_SOURCE}; each ring step's send overlapped with the attention "
                         "of the chunk in hand, only the excess exposed; weights read whole on every cp rank")
        elif p.cp > 1:
            notes.append(f"cp {p.cp}: {context.CP_ALL_GATHER_SOURCE}; not overlapped; weights read whole on every "
                         "cp rank")
        if p.ep > 1:
            notes.append(ep_note(p))
        return tuple(notes)

    def collective(self, hw: HardwareSpec, kind: str, msg: float, group: int, link: str,
                   per_node: int | None = None, stride: int | None = None) -> tuple[Collective, float, str]:
        """The collective, its time and algorithm (opmap.mapping.collectives.collective_time), kept: a layout
        search asks for the same ones again."""
        key = (hw.name, kind, msg, group, link, per_node, stride)
        hit = self._ctimes.get(key)
        if hit is None:
            c = Collective(kind, float(msg), group, link, per_node, stride)
            t = collective_time(hw, c)
            hit = self._ctimes[key] = (c, t.seconds, t.algorithm)
        return hit

    def params_per_device(self, p: Parallelism) -> float:
        """Parameters one device holds: dense / (tp pp), experts / (tp pp ep) (ep over the tp group: E / ep experts
        each over tp / ep, experts / (tp pp)) (ZeRO shards come on top; cp ranks hold the same parameters)."""
        experts = self.expert_params
        return (self.params - experts) / (p.tp * p.pp) + experts / (p.expert_split * p.pp)


def _exposed_dp_s(colls: list[CollectiveKernel], p: Parallelism, fwd_s: float, bwd_s: float) -> float:
    """The DP reduction's exposed time: the gradients' reduction behind the backward, the updated parameters'
    gather behind the forward, and ZeRO-3's gathers, which run in every microbatch, behind the m backwards."""
    dp = [c for c in colls if c.stage == "iteration"]
    gather_s = sum(c.predicted_s * c.count for c in dp if c.purpose.startswith(PARAM_GATHER))
    z3_s = sum(c.predicted_s * c.count for c in dp if c.purpose.startswith("ZeRO-3"))
    grad_s = sum(c.predicted_s * c.count for c in dp) - gather_s - z3_s
    return (dp_exposed_s(grad_s, bwd_s, p.dp_overlap) + dp_exposed_s(gather_s, fwd_s, p.dp_overlap)
            + dp_exposed_s(z3_s, p.microbatches * bwd_s, p.dp_overlap))


def _cache_kv_heads(graph, kv_heads: int) -> int:
    """The heads a layer's KV cache splits over tp: the KV heads, or 1 for MLA, whose one latent (kv_lora_rank +
    the RoPE key) every head reads, so each tp rank holds all of it (SGLang's and vLLM's MLA cache; DP attention
    is how engines stop replicating it)."""
    from opmap.mapping.memory import kv_geometry

    geo = kv_geometry(graph).geometry
    if geo is not None and any(a.kind == "mla" for a in geo.attention):
        return 1
    return kv_heads


def shard(analysis, p: Parallelism, hw: HardwareSpec | None = None) -> Sharded:
    """One layout of one analysis (``Sharder`` prices many)."""
    return Sharder(analysis).shard(p, hw)


def bubble_fraction(pp: int, microbatches: int, vp: int = 1) -> float:
    """Narayanan et al. 2021: 1F1B (pp - 1) / m; interleaved (pp - 1) / (m vp)."""
    return (pp - 1) / (microbatches * vp)


def collective_rows(s: Sharded) -> list[dict[str, Any]]:
    return [record(c) for c in s.collectives]


def bound_of_collective() -> Bound:
    return Bound.INTERCONNECT
