"""Sharding a captured graph over tensor, pipeline, data and expert parallelism (Megatron-LM's splits).

Input: an ``Analysis`` (a forward graph, or a training graph whose backward nodes carry
``args["phase"] == "backward"``) and a ``Parallelism``. Output: a ``Sharded`` per-device result: every kernel's
time on one device, the collectives the layout implies as kernels of their own (class ``collective``, bound
``interconnect``), the pipeline schedule and its bubble, the per-device memory.

Roles (which GEMM is column- or row-parallel, vocabulary-parallel, an expert's, replicated) are read off the
graph by opmap.mapping.roles.

Per device, a split kernel's terms (matrix, vector, memory) are divided by its split; the launch overhead is
not. Tiles are not searched again at the sharded shape (the terms scale linearly: stated in the assumptions).

Device placement (Megatron-LM's default order): TP innermost, then DP (with EP taken from inside DP, as
Megatron-core and DeepSpeed-MoE do: ep divides dp), then PP outermost: rank = tp_rank + tp (dp_rank + dp
pp_rank). A group whose span of consecutive ranks fits in one node (devices_per_node) runs over the scale-up
link; otherwise it is priced as scale-out (each hop through the NIC: conservative for a group that has
several members in a node).

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
from dataclasses import dataclass
from typing import Any

from opmap.errors import OpmapError
from opmap.graph import OpGraph
from opmap.hardware.spec import HardwareSpec
from opmap.mapping.collectives import KERNEL_CLASS, Collective, collective_time
from opmap.mapping.memory import MemoryFit
from opmap.mapping.roles import SPLIT_ROLES, Geometry, Roles, infer_roles, phase_of
from opmap.roofline import Bound, roofline

RECOMPUTE = ("none", "selective", "full")
# Fraction of the DP gradient reduction hidden behind backward: bucketed reduction starts when a bucket's
# gradients are ready (Megatron --overlap-grad-reduce, PyTorch DDP buckets); the last bucket cannot overlap.
DP_OVERLAP = 0.8
# TP, SP, EP and PP collectives sit on the critical path of each layer: not overlapped.
TP_OVERLAP = 0.0

ASSUMPTIONS = (
    "placement: TP innermost, then DP (EP inside DP: ep divides dp), then PP outermost (Megatron-LM order)",
    "a group whose consecutive-rank span fits one node runs on the scale-up link, else priced as scale-out",
    f"TP / SP / EP / PP collectives not overlapped with compute (overlap {TP_OVERLAP:.0%})",
    "sharded kernels: matrix, vector and memory terms divided by the split, launch overhead kept; tiles not "
    "searched again at the sharded shape",
    "K / V projections replicated over tp / kv_heads ranks when tp exceeds the KV heads (Megatron-LM GQA)",
    "experts: E / ep per device, each tensor-parallel over tp; balanced load (each device's expert FLOPs equal "
    "the unsharded per-token work)",
    "PP send / recv carries b s h / tp bytes (Narayanan et al. 2021 scatter / gather optimisation)",
)


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise OpmapError(msg)


@dataclass(frozen=True)
class Parallelism:
    """A layout. ``devices`` = tp x pp x dp (checked); ep is drawn from inside dp; ``global_batch`` defaults to
    dp x microbatch (one microbatch per data-parallel rank)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    sp: bool = False
    vp: int = 1
    microbatch: int = 1
    global_batch: int | None = None
    recompute: str = "none"
    zero: int = 0
    devices: int | None = None
    # share of the backward time that hides the DP gradient reduction (0: reduced after backward, as Megatron-LM
    # did before --overlap-grad-reduce; DP_OVERLAP: bucketed reduction)
    dp_overlap: float = DP_OVERLAP

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "ep", "vp", "microbatch"):
            v = getattr(self, name)
            _check(isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                   f"--{name} must be a positive integer, got {v!r}")
        n = self.tp * self.pp * self.dp
        if self.devices is None:
            object.__setattr__(self, "devices", n)
        _check(self.devices == n, f"--devices {self.devices} is not tp x pp x dp = {self.tp} x {self.pp} x "
                                  f"{self.dp} = {n}")
        _check(not self.sp or self.tp > 1, "--sp (sequence parallelism) needs --tp above 1")
        _check(self.dp % self.ep == 0, f"--ep {self.ep} must divide --dp {self.dp} (experts are spread over "
                                       "data-parallel ranks, as Megatron-core and DeepSpeed-MoE do)")
        _check(self.vp == 1 or self.pp > 1, f"--vp {self.vp} (interleaved stages) needs --pp above 1")
        _check(self.recompute in RECOMPUTE, f"unknown recompute {self.recompute!r}; accepted: "
                                            f"{', '.join(RECOMPUTE)}")
        _check(self.zero in (0, 1, 2, 3), f"unknown ZeRO stage {self.zero!r}; accepted: 0, 1, 2, 3")
        _check(0.0 <= self.dp_overlap <= 1.0, f"dp overlap must be within 0 and 1, got {self.dp_overlap!r}")
        if self.global_batch is None:
            object.__setattr__(self, "global_batch", self.dp * self.microbatch)
        gb = self.global_batch
        _check(gb % (self.dp * self.microbatch) == 0,
               f"global batch {gb} is not a multiple of dp x microbatch = {self.dp} x {self.microbatch}")

    @property
    def microbatches(self) -> int:
        return self.global_batch // (self.dp * self.microbatch)

    @property
    def trivial(self) -> bool:
        return self.devices == 1 and self.ep == 1

    def check(self, geo: Geometry) -> None:
        """The layout against the model: tp divides the heads (KV heads: tp divides them, or they divide tp and
        are replicated), pp divides the layers, vp divides layers / pp, ep divides the experts."""
        if geo.heads:
            _check(geo.heads % self.tp == 0, f"--tp {self.tp} does not divide the {geo.heads} attention heads")
            kv = geo.kv_heads
            _check(kv % self.tp == 0 or self.tp % kv == 0,
                   f"--tp {self.tp} and the {kv} KV heads: one must divide the other (tp > kv heads replicates "
                   "each KV head over tp / kv ranks)")
        # stages need not hold equal layer counts: Llama 3 405B's 126 layers ran on 16 stages, the first and last
        # one layer short (Llama 3 paper, section 3.3.2); each stage holds ceil(layers / pp) or fewer here, and
        # the slowest stage sets the pace
        _check(geo.layers >= self.pp, f"--pp {self.pp} exceeds the {geo.layers} layers")
        per = -(-geo.layers // self.pp)
        _check(per % self.vp == 0, f"--vp {self.vp} does not divide the {per} layers per pipeline stage")
        if self.ep > 1:
            _check(geo.experts > 0, f"--ep {self.ep} needs a mixture-of-experts model (this one has no experts)")
            _check(geo.experts % self.ep == 0, f"--ep {self.ep} does not divide the {geo.experts} experts")

    def to_dict(self) -> dict[str, Any]:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "ep": self.ep, "sp": self.sp, "vp": self.vp,
                "microbatch": self.microbatch, "global_batch": self.global_batch, "recompute": self.recompute,
                "zero": self.zero, "devices": self.devices, "dp_overlap": self.dp_overlap}

    def label(self) -> str:
        s = f"tp{self.tp} pp{self.pp} dp{self.dp}"
        s += f" ep{self.ep}" if self.ep > 1 else ""
        s += " sp" if self.sp else ""
        s += f" vp{self.vp}" if self.vp > 1 else ""
        return s + f" mb{self.microbatch}" + (f" rc-{self.recompute}" if self.recompute != "none" else "") + (
            f" z{self.zero}" if self.zero else "")


# -- roles --------------------------------------------------------------------------------------------------



# -- per-device kernels -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CollectiveKernel:
    """A collective as a kernel row: class ``collective``, bound ``interconnect``."""

    id: str
    collective: Collective
    purpose: str
    stage: str  # forward | backward | iteration
    count: int  # how many per microbatch (per iteration for the DP reduction) on the slowest stage
    predicted_s: float  # one call
    algorithm: str
    link: str

    def to_dict(self) -> dict[str, Any]:
        c = self.collective
        r = roofline(interconnect_s=self.predicted_s)
        return {"id": self.id, "kernel_class": KERNEL_CLASS, "collective": c.kind, "message_bytes": c.message_bytes,
                "group_size": c.group_size, "link": self.link, "predicted_s": self.predicted_s,
                "interconnect_s": self.predicted_s, "matrix_s": 0.0, "vector_s": 0.0, "memory_s": 0.0,
                "overhead_s": 0.0, "bound": str(r.bound), "algorithm": self.algorithm, "purpose": self.purpose,
                "phase": self.stage, "count": self.count, "total_s": self.predicted_s * self.count}


@dataclass(frozen=True)
class Sharded:
    """The per-device result of a layout: the kernels' per-device times (``kernel_s``, in the analysis's kernel
    order), the collectives, the pipeline and the iteration (or batch) time."""

    parallelism: Parallelism
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
    # the step's parts on the slowest stage's device: step_s = microbatches x stage_compute_s[slowest] + bubble_s +
    # exposed_comm_s + optimizer_s (training); recompute_s is the recomputation inside stage_compute_s
    recompute_s: float = 0.0  # per microbatch
    bubble_s: float = 0.0  # (pp - 1) / vp microbatch slots the slowest stage idles per iteration
    exposed_comm_s: float = 0.0  # per iteration: the per-microbatch collectives and the DP reduction not hidden
    optimizer_s: float = 0.0  # the optimizer step over the parameters (and ZeRO shard) one device holds

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_s if self.step_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**self.parallelism.to_dict(), "stage_compute_s": list(self.stage_compute_s),
                "microbatch_s": self.microbatch_s, "microbatches": self.parallelism.microbatches,
                "bubble_fraction": self.bubble_fraction,
                "schedule": "interleaved 1F1B" if self.parallelism.vp > 1 else "1F1B",
                "step_s": self.step_s, "latency_s": self.latency_s, "tokens_per_s": self.tokens_per_s,
                "matrix_flops_per_device": self.matrix_flops_per_device, "recompute_s": self.recompute_s,
                "bubble_s": self.bubble_s, "exposed_comm_s": self.exposed_comm_s, "optimizer_s": self.optimizer_s,
                "assumptions": list(ASSUMPTIONS) + [
                    f"DP gradient reduction overlapped with backward: up to {self.parallelism.dp_overlap:.0%} of "
                    "the backward time hides it"] + list(self.notes)}


def link_for(hw: HardwareSpec, span: int) -> str:
    """scale_up when ``span`` consecutive ranks fit one node, else scale_out (module docstring)."""
    per = hw.devices_per_node or 1
    return "scale_up" if span <= per else "scale_out"


class Sharder:
    """Prices layouts of one analysis: the roles and per-kernel terms are computed once; each layout is then
    arithmetic (``shard``). Identical blocks are priced once: a block's kernels sum to its time, and a stage
    is the sum of its blocks."""

    def __init__(self, analysis):
        self.a = analysis
        g = analysis.graph
        self.roles = infer_roles(g)
        self.geo = self.roles.geometry
        self.training = any(phase_of(n) == "backward" for n in g.nodes)
        blocks = {b: i for i, b in enumerate(self.roles.blocks)}
        L = max(1, len(blocks))
        first_id: dict[str, int] = {}
        for n in g.nodes:
            if self.roles.block[n.id] is not None:
                first_id.setdefault(phase_of(n), n.id)
        rows = []
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
            kv_narrow = (role == "column" and self.roles.kv_width and anchor.outputs
                         and anchor.outputs[0].shape[-1] == self.roles.kv_width)
            mflops = sum(analysis.results[m].cost.matrix_flops for m in k.kernel.nodes)
            rows.append((role, pos, phase_of(anchor), t.matrix_s, t.vector_s, t.memory_s, t.overhead_s, extra,
                         wfrac, bool(kv_narrow), anchor.op == "aten.scaled_dot_product_attention.default", mflops))
        self.rows = rows
        self.L = L

    def _kernel_time(self, row, p: Parallelism) -> float:
        role, _pos, _ph, m, v, mem, o, extra, wfrac, kv_narrow, sdpa, _f = row
        d = 1.0
        kv = self.geo.kv_heads
        if role in SPLIT_ROLES and sdpa and kv and p.tp > kv:
            # attention past the KV heads: each rank reads its (replicated) KV head whole, so the memory term
            # splits over the KV heads only; the query heads' work over tp
            return max(m / p.tp, v / p.tp, mem / kv) + extra / p.tp + o
        if role in SPLIT_ROLES:
            d = min(p.tp, kv) if kv_narrow else p.tp
        elif role == "replicated" and p.sp:
            d = p.tp
        elif role == "optimizer":
            d = p.tp * p.pp * (p.dp if p.zero >= 1 else 1)
        if role in ("expert_column", "expert_row") and p.ep > 1:
            # E / ep experts on ep times the tokens: matrix and activation traffic unchanged, weights / ep
            mem = mem * ((1 - wfrac) + wfrac / p.ep)
            o = o / p.ep
        return max(m, v, mem) / d + extra / d + o

    def shard(self, p: Parallelism, hw: HardwareSpec | None = None) -> Sharded:
        hw = hw or self.a.hardware
        if p.trivial is False or p.devices > 1:
            p.check(self.geo)
        per_k = [self._kernel_time(r, p) for r in self.rows]
        L, pp, vp = self.L, p.pp, p.vp
        per_stage_blocks = L // pp if L % pp == 0 else math.ceil(L / pp)
        stage = [0.0] * pp
        fwd_block = [0.0] * pp
        sdpa_fwd = [0.0] * pp
        mflops = [0.0] * pp
        for r, t in zip(self.rows, per_k):
            pos = r[1]
            s = 0 if pos < 0 else pp - 1 if pos >= L else min(pp - 1, pos // per_stage_blocks)
            if r[0] == "optimizer":
                continue
            stage[s] += t
            if r[2] == "forward" and 0 <= pos < L:
                fwd_block[s] += t
                if r[10]:
                    sdpa_fwd[s] += t
            d = p.tp if r[0] in SPLIT_ROLES else 1
            mflops[s] += r[11] / d
        if self.training and p.recompute == "full":
            stage = [a + b for a, b in zip(stage, fwd_block)]
        elif self.training and p.recompute == "selective":
            stage = [a + b for a, b in zip(stage, sdpa_fwd)]
        opt_s = sum(t for r, t in zip(self.rows, per_k) if r[0] == "optimizer")
        colls = self._collectives(p, hw, per_stage_blocks)
        per_mb_coll = sum(c.predicted_s * c.count for c in colls if c.stage != "iteration")
        slow = max(range(pp), key=lambda i: stage[i])
        mb_s = stage[slow] + per_mb_coll * (1 - TP_OVERLAP)
        m = p.microbatches
        bubble = (pp - 1) / (m * vp)
        dp_s = sum(c.predicted_s * c.count for c in colls if c.stage == "iteration")
        bwd_s = sum(t for r, t in zip(self.rows, per_k) if r[2] == "backward") / pp
        exposed_dp = max(0.0, dp_s - p.dp_overlap * bwd_s * m) if self.training else 0.0
        step = (m + (pp - 1) / vp) * mb_s + exposed_dp + opt_s
        p2p = sum(c.predicted_s for c in colls if c.collective.kind == "send_recv" and c.stage == "forward")
        latency = sum(stage) + per_mb_coll * pp - p2p * (1 if pp > 1 else 0)
        tokens = p.global_batch * (self.a.assumptions.get("seq") or 1)
        notes = []
        if self.geo.kv_heads and p.tp > self.geo.kv_heads:
            notes.append(f"tp {p.tp} > {self.geo.kv_heads} KV heads: each KV head replicated on "
                         f"{p.tp // self.geo.kv_heads} ranks")
        if self.training and p.recompute != "none":
            notes.append(f"recompute {p.recompute}: " + ("each block's forward runs again in backward"
                                                         if p.recompute == "full" else
                                                         "the attention core (SDPA) runs again in backward"))
        rec_s = (fwd_block[slow] if p.recompute == "full" else sdpa_fwd[slow] if p.recompute == "selective"
                 else 0.0) if self.training else 0.0
        return Sharded(p, tuple(per_k), tuple(stage), tuple(colls), mb_s, bubble, step, latency, self.training,
                       tokens, mflops[slow], tuple(notes), rec_s, (pp - 1) / vp * mb_s,
                       m * per_mb_coll * (1 - TP_OVERLAP) + exposed_dp, opt_s)

    def _collectives(self, p: Parallelism, hw: HardwareSpec, blocks_per_stage: int) -> list[CollectiveKernel]:
        out: list[CollectiveKernel] = []
        r, geo = self.roles, self.geo
        act = geo.act_bytes
        # the activation the captured graph ran at is one microbatch already
        bwd = self.training

        def add(kind, msg, group, span, purpose, stage, count):
            if group <= 1 or count <= 0 or msg <= 0:
                return
            link = link_for(hw, span)
            c = Collective(kind, float(msg), group, link)
            t = collective_time(hw, c)
            out.append(CollectiveKernel(f"c{len(out)}", c, purpose, stage, count, t.seconds, t.algorithm, link))

        n_blocks = blocks_per_stage
        if p.tp > 1 and act:
            fwd_n = r.row_groups * n_blocks
            bwd_n = r.column_groups * n_blocks if bwd else 0
            if p.sp:
                add("reduce_scatter", act, p.tp, p.tp, "SP reduce-scatter after row-parallel", "forward", fwd_n)
                add("all_gather", act, p.tp, p.tp, "SP all-gather before column-parallel", "forward", fwd_n)
                add("reduce_scatter", act, p.tp, p.tp, "SP reduce-scatter of column-parallel input gradients",
                    "backward", bwd_n)
                add("all_gather", act, p.tp, p.tp, "SP all-gather of row-parallel output gradients", "backward",
                    bwd_n)
            else:
                add("all_reduce", act, p.tp, p.tp, "TP all-reduce after row-parallel", "forward", fwd_n)
                add("all_reduce", act, p.tp, p.tp, "TP all-reduce of column-parallel input gradients",
                    "backward", bwd_n)
        if p.ep > 1 and r.routed_bytes:
            msg = r.routed_bytes / (p.tp if p.sp else 1)
            add("all_to_all", msg, p.ep, p.tp * p.ep, "EP dispatch and combine", "forward", 2 * n_blocks)
            add("all_to_all", msg, p.ep, p.tp * p.ep, "EP dispatch and combine (gradients)", "backward",
                2 * n_blocks if bwd else 0)
        if p.pp > 1 and act:
            span = 2 * p.tp * p.dp
            add("send_recv", act / p.tp, 2, span, "PP activation to the next stage", "forward", p.vp)
            add("send_recv", act / p.tp, 2, span, "PP gradient to the previous stage", "backward",
                p.vp if bwd else 0)
        if bwd and p.dp > 1:
            params = self.params_per_device(p)
            itemsize = self.a.graph.param_bytes / max(1, self.a.graph.params)
            grad = params * itemsize
            span = p.tp * p.dp
            if p.zero <= 1:
                add("all_reduce", grad, p.dp, span, "DP gradient all-reduce", "iteration", 1)
            else:
                add("reduce_scatter", grad, p.dp, span, "DP gradient reduce-scatter", "iteration", 1)
                add("all_gather", grad, p.dp, span, "DP all-gather of updated parameters", "iteration", 1)
                if p.zero == 3:
                    add("all_gather", grad, p.dp, span, "ZeRO-3 parameter all-gather (forward and backward)",
                        "iteration", 2 * p.microbatches)
        return out

    def params_per_device(self, p: Parallelism) -> float:
        """Parameters one device holds: dense / (tp pp), experts / (tp pp ep) (ZeRO shards come on top)."""
        total = float(self.a.graph.params)
        experts = self.roles.expert_params
        return (total - experts) / (p.tp * p.pp) + experts / (p.tp * p.pp * p.ep)


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
    with interleaving), split over tp where the layer splits them (all of them with SP), the KV cache over tp
    (KV heads) and pp (inference), and the assumed workspace."""
    from opmap.mapping.memory import TRAIN_BYTES, WORKSPACE, kv_geometry, training_state_bytes

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
        return MemoryFit(st.weights_bytes, st.gradients_bytes, st.optimizer_bytes, per_block * blocks * inflight,
                         0.0, WORKSPACE.value, cap, "training",
                         assumptions=notes + (f"activations: {blocks} blocks x {inflight:.3g} microbatches in flight "
                                              "on the first stage", st.note))
    itemsize = sharder.a.graph.param_bytes / max(1, sharder.a.graph.params)
    weights = params * itemsize * sharder.a.precision.weight_scale
    kv = kv_geometry(sharder.a.graph)
    kv_div = min(p.tp, geo.kv_heads) if geo.kv_heads else p.tp
    kv_bytes = kv.bytes_per_token * seq * p.microbatch / kv_div / p.pp
    return MemoryFit(weights, 0.0, 0.0, 0.0, kv_bytes, WORKSPACE.value, cap, "inference", assumptions=notes)


def shard(analysis, p: Parallelism, hw: HardwareSpec | None = None) -> Sharded:
    """One layout of one analysis (``Sharder`` prices many)."""
    return Sharder(analysis).shard(p, hw)


def bubble_fraction(pp: int, microbatches: int, vp: int = 1) -> float:
    """Narayanan et al. 2021: 1F1B (pp - 1) / m; interleaved (pp - 1) / (m vp)."""
    return (pp - 1) / (microbatches * vp)


def collective_rows(s: Sharded) -> list[dict[str, Any]]:
    return [c.to_dict() for c in s.collectives]


def bound_of_collective() -> Bound:
    return Bound.INTERCONNECT
