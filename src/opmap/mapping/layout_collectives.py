"""The collectives a layout implies, as kernels of their own (class ``collective``, bound ``interconnect``): TP
all-reduces (reduce-scatter + all-gather with SP), the context-parallel K / V exchange (opmap.mapping.context),
EP all-to-alls, PP send / recv, and the DP gradient reduction over dp x cp (opmap.mapping.sharding's docstring
gives the counts and sources); and the link a group runs on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from opmap.hardware.spec import HardwareSpec
from opmap.mapping import context
from opmap.mapping.collectives import KERNEL_CLASS, Collective
from opmap.mapping.shard_types import Parallelism, SharderView
from opmap.record import key
from opmap.roofline import roofline


@dataclass(frozen=True)
class CollectiveKernel:
    """A collective as a kernel row: class ``collective``, bound ``interconnect``. Its record (a row of
    analysis.json's ``kernels`` and the ``parallelism`` block's ``collectives``) is a kernel row's: the collective's
    kind and sizes, its one roofline term (``interconnect_s``, the others 0), then what it is for, how often, and the
    totals and exposed times derived (``RECORD``)."""

    RECORD: ClassVar[tuple[Any, ...]] = (
        "id", "kernel_class", ("kind", key("collective")), "message_bytes", "group_size", "link", "predicted_s",
        "interconnect_s", "matrix_s", "vector_s", "memory_s", "overhead_s", "bound", "algorithm", "purpose", "stage",
        "count", "total_s", ("exposed", key("exposed_s")), "exposed_total_s")
    kernel_class: ClassVar[str] = KERNEL_CLASS
    # the roofline terms a collective kernel does not have: it only moves bytes over a link
    matrix_s: ClassVar[float] = 0.0
    vector_s: ClassVar[float] = 0.0
    memory_s: ClassVar[float] = 0.0
    overhead_s: ClassVar[float] = 0.0
    id: str
    collective: Collective
    purpose: str
    stage: str = field(metadata=key("phase"))  # forward | backward | iteration
    count: int  # how many per microbatch (per iteration for the DP reduction) on the slowest stage
    predicted_s: float  # one call
    algorithm: str
    link: str
    exposed_s: float | None = None  # one call's time not hidden behind compute (None: all of it)

    @property
    def exposed(self) -> float:
        return self.predicted_s if self.exposed_s is None else self.exposed_s

    @property
    def kind(self) -> str:
        return self.collective.kind

    @property
    def message_bytes(self) -> float:
        return self.collective.message_bytes

    @property
    def group_size(self) -> int:
        return self.collective.group_size

    @property
    def interconnect_s(self) -> float:
        """One call's only roofline term."""
        return self.predicted_s

    @property
    def bound(self) -> str:
        return str(roofline(interconnect_s=self.predicted_s).bound)

    @property
    def total_s(self) -> float:
        return self.predicted_s * self.count

    @property
    def exposed_total_s(self) -> float:
        return self.exposed * self.count



def link_for(hw: HardwareSpec, span: int, group: int | None = None) -> str:
    """The link of a group of ``group`` members (default ``span``: consecutive ranks) spread evenly over ``span``
    consecutive ranks, walking the catalog's tiers: ``scale_up`` when the span fits one domain of the innermost
    tier (an HGX board's 8, an NVL72 rack's 72), ``scale_out`` when no bounded tier holds two of its members (each
    hop crosses the scale-out network), else ``auto`` (``placement``'s stride: the group crosses the tiers its
    members do, e.g. a Trn2 instance's torus, then the UltraServer's links)."""
    return placement(hw, span, group)[0]


def placement(hw: HardwareSpec, span: int, group: int | None = None) -> tuple[str, int | None]:
    """(link, stride) of ``link_for``'s group: the stride (ranks between consecutive members, ``Collective.stride``)
    under link auto, else None."""
    ic = hw.interconnect
    group = group or span
    inner = ic.domain_size or 1
    if span <= inner:
        return "scale_up", None
    stride = max(1, span // group)
    if (ic.fabric_size or 1) // stride <= 1:  # no domain holds two members
        return "scale_out", None
    return "auto", stride


def dp_link(hw: HardwareSpec, tp: int, group: int) -> tuple[str, int] | None:
    """The link of the DP (x CP) group, whose ranks stride by tp (placement tp innermost): past one node with tp
    below a node's devices, ``("auto", devices_per_node / tp)``: each node holds that many members, each with its
    own NIC, and NCCL runs a ring per member, each crossing nodes through its own NIC (opmap.mapping.collectives:
    ring bandwidth min(scale-up, members a node x NIC rate)). Else None (``link_for``: inside a node, or one member
    a node when tp fills it). NVLink + NDR InfiniBand H100 nodes reach 400-450 GB/s all-reduce busbw at 8 GB
    (https://saturncloud.io/blog/crusoe-nccl-cluster-validation, nccl-tests expected figures), not one NIC's 50."""
    per = hw.devices_per_node or 1
    if per <= 1 or tp >= per or per % tp or group * tp <= per or group % (per // tp):
        return None
    return "auto", per // tp


def layout_collectives(sharder: SharderView, p: Parallelism, hw: HardwareSpec, blocks_per_stage: int,
                       attn: tuple[float, float] = (0.0, 0.0)) -> list[CollectiveKernel]:
    """The layout's collectives; ``attn``: one layer's attention forward and backward time on one device (the
    compute a CP ring step hides its send behind)."""
    out: list[CollectiveKernel] = []
    r, geo = sharder.roles, sharder.geo
    # the activation the captured graph ran at is one microbatch already; with cp each rank holds s / cp
    act = geo.act_bytes / p.cp
    bwd = sharder.training

    def add(kind, msg, group, span, purpose, stage, count, hide=None, link=None):
        if group <= 1 or count <= 0 or msg <= 0:
            return
        # a given link is dp_link's (link, members a node); else the group's placement over the tiers
        if link:
            (link, per_node), stride = link, None
        else:
            (link, stride), per_node = placement(hw, span, group), None
        c, t, alg = sharder.collective(hw, kind, msg, group, link, per_node, stride)
        ex = None if hide is None else context.exposed(t, hide)
        out.append(CollectiveKernel(f"c{len(out)}", c, purpose, stage, count, t, alg, link, ex))

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
    if p.cp > 1 and sharder.kv is not None and p.cp_comm == "all_gather":
        # Llama 3 (paper sec. 3.3.2): K / V all-gathered before the local queries' attention, exposed; the
        # backward gathers them again and reduce-scatters dK / dV (message: the gathered K / V per rank)
        whole = context.chunk_bytes(sharder.kv, p.tp, p.cp) * p.cp
        span = p.tp * p.cp
        add("all_gather", whole, p.cp, span, "CP K/V all-gather", "forward", n_blocks)
        if bwd:
            times = 2 if p.recompute != "none" else 1
            add("all_gather", whole, p.cp, span, "CP K/V all-gather (backward)", "backward", times * n_blocks)
            add("reduce_scatter", whole, p.cp, span, "CP dK/dV reduce-scatter", "backward", n_blocks)
    elif p.cp > 1 and sharder.kv is not None:
        chunk = context.chunk_bytes(sharder.kv, p.tp, p.cp)
        steps = (p.cp - 1) * n_blocks
        span = p.tp * p.cp
        f_step, b_step = attn[0] / p.cp, attn[1] / p.cp
        add("send_recv", chunk, 2, span, "CP K/V ring step (forward)", "forward", steps, f_step)
        if bwd:
            add("send_recv", 2 * chunk, 2, span, "CP K/V and dK/dV ring step (backward)", "backward", steps,
                b_step)
            if p.recompute != "none":
                add("send_recv", chunk, 2, span, "CP K/V ring step (recomputed forward)", "backward", steps,
                    f_step)
    if p.ep > 1 and r.routed_bytes and not p.ep_over_tp:
        # each rank's routed tokens (tokens x top_k x hidden bytes); the busiest receives ep_imbalance x the mean.
        # ep over the tp group has no all-to-all: every rank holds the tokens, the TP all-reduce combines
        msg = r.routed_bytes / (p.tp if p.sp else 1) / p.cp * p.ep_imbalance
        moe = min(n_blocks, sharder.moe_layers)
        add("all_to_all", msg, p.ep, p.tp * p.cp * p.ep, "EP dispatch and combine", "forward", 2 * moe)
        add("all_to_all", msg, p.ep, p.tp * p.cp * p.ep, "EP dispatch and combine (gradients)", "backward",
            2 * moe if bwd else 0)
    if p.pp > 1 and act:
        span = 2 * p.tp * p.cp * p.dp
        add("send_recv", act / p.tp, 2, span, "PP activation to the next stage", "forward", p.vp)
        add("send_recv", act / p.tp, 2, span, "PP gradient to the previous stage", "backward",
            p.vp if bwd else 0)
    group = p.dp * p.cp
    if bwd and group > 1:
        grad = sharder.params_per_device(p) * sharder.itemsize
        span = p.tp * p.cp * p.dp
        over = f" (over dp x cp = {p.dp} x {p.cp})" if p.cp > 1 else ""
        link = dp_link(hw, p.tp, group)
        # ZeRO >= 1 shards the optimizer state: each rank updates its shard, so the gradients are reduce-scattered
        # and the updated parameters all-gathered (Megatron's distributed optimizer, NeMo's distributed_fused_adam):
        # the all-reduce's bytes in two halves, each overlapped on its own (opmap.mapping.sharding.DP_WINDOW)
        if p.zero == 0:
            add("all_reduce", grad, group, span, "DP gradient all-reduce" + over, "iteration", 1, link=link)
        else:
            add("reduce_scatter", grad, group, span, "DP gradient reduce-scatter" + over, "iteration", 1, link=link)
            add("all_gather", grad, group, span, "DP all-gather of updated parameters" + over, "iteration", 1,
                link=link)
            if p.zero == 3:
                add("all_gather", grad, group, span, "ZeRO-3 parameter all-gather (forward and backward)",
                    "iteration", 2 * p.microbatches, link=link)
    return out
