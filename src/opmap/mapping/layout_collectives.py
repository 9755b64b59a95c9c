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


class _Layout:
    """The collectives of one layout, as ``layout_collectives`` adds them: each placed on its link and priced by the
    sharder, in the order added (the ids ``c0``, ``c1``, ...)."""

    def __init__(self, sharder: SharderView, hw: HardwareSpec) -> None:
        self.sharder, self.hw = sharder, hw
        self.out: list[CollectiveKernel] = []

    def add(self, kind: str, msg: float, group: int, span: int, purpose: str, stage: str, count: int,
            hide: float | None = None, link: tuple[str, int] | None = None) -> None:
        """One collective of ``group`` members spread over ``span`` ranks, ``count`` times; ``hide``: the compute
        its time hides behind (None: all exposed); ``link``: dp_link's (link, members a node), else the group's
        placement over the tiers. Nothing for a group of one, no calls or no bytes."""
        if group <= 1 or count <= 0 or msg <= 0:
            return
        if link:
            (name, per_node), stride = link, None
        else:
            (name, stride), per_node = placement(self.hw, span, group), None
        c, t, alg = self.sharder.collective(self.hw, kind, msg, group, name, per_node, stride)
        ex = None if hide is None else context.exposed(t, hide)
        self.out.append(CollectiveKernel(f"c{len(self.out)}", c, purpose, stage, count, t, alg, name, ex))


def layout_collectives(sharder: SharderView, p: Parallelism, hw: HardwareSpec, blocks_per_stage: int,
                       attn: tuple[float, float] = (0.0, 0.0)) -> list[CollectiveKernel]:
    """The layout's collectives; ``attn``: one layer's attention forward and backward time on one device (the
    compute a CP ring step hides its send behind)."""
    lay = _Layout(sharder, hw)
    # the activation the captured graph ran at is one microbatch already; with cp each rank holds s / cp
    act = sharder.geo.act_bytes / p.cp
    if p.tp > 1 and act:
        _tp_collectives(lay, p, act, blocks_per_stage)
    if p.cp > 1 and sharder.kv is not None and p.cp_comm == "all_gather":
        _cp_all_gather(lay, p, blocks_per_stage)
    elif p.cp > 1 and sharder.kv is not None:
        _cp_ring(lay, p, blocks_per_stage, attn)
    if p.ep > 1 and sharder.roles.routed_bytes and not p.ep_over_tp:
        _ep_all_to_all(lay, p, blocks_per_stage)
    if p.pp > 1 and act:
        span = 2 * p.tp * p.cp * p.dp
        lay.add("send_recv", act / p.tp, 2, span, "PP activation to the next stage", "forward", p.vp)
        lay.add("send_recv", act / p.tp, 2, span, "PP gradient to the previous stage", "backward",
                p.vp if sharder.training else 0)
    if sharder.training and p.dp * p.cp > 1:
        _dp_reduction(lay, p)
    return lay.out


def _tp_collectives(lay: _Layout, p: Parallelism, act: float, n_blocks: int) -> None:
    """TP's all-reduces after the row-parallel GEMMs (forward) and of the column-parallel input gradients
    (backward), or with SP each as a reduce-scatter and an all-gather."""
    r = lay.sharder.roles
    fwd_n = r.row_groups * n_blocks
    bwd_n = r.column_groups * n_blocks if lay.sharder.training else 0
    if p.sp:
        lay.add("reduce_scatter", act, p.tp, p.tp, "SP reduce-scatter after row-parallel", "forward", fwd_n)
        lay.add("all_gather", act, p.tp, p.tp, "SP all-gather before column-parallel", "forward", fwd_n)
        lay.add("reduce_scatter", act, p.tp, p.tp, "SP reduce-scatter of column-parallel input gradients",
                "backward", bwd_n)
        lay.add("all_gather", act, p.tp, p.tp, "SP all-gather of row-parallel output gradients", "backward",
                bwd_n)
    else:
        lay.add("all_reduce", act, p.tp, p.tp, "TP all-reduce after row-parallel", "forward", fwd_n)
        lay.add("all_reduce", act, p.tp, p.tp, "TP all-reduce of column-parallel input gradients",
                "backward", bwd_n)


def _cp_all_gather(lay: _Layout, p: Parallelism, n_blocks: int) -> None:
    """Llama 3 (paper sec. 3.3.2): K / V all-gathered before the local queries' attention, exposed; the backward
    gathers them again and reduce-scatters dK / dV (message: the gathered K / V per rank)."""
    whole = context.chunk_bytes(lay.sharder.kv, p.tp, p.cp) * p.cp
    span = p.tp * p.cp
    lay.add("all_gather", whole, p.cp, span, "CP K/V all-gather", "forward", n_blocks)
    if lay.sharder.training:
        times = 2 if p.recompute != "none" else 1
        lay.add("all_gather", whole, p.cp, span, "CP K/V all-gather (backward)", "backward", times * n_blocks)
        lay.add("reduce_scatter", whole, p.cp, span, "CP dK/dV reduce-scatter", "backward", n_blocks)


def _cp_ring(lay: _Layout, p: Parallelism, n_blocks: int, attn: tuple[float, float]) -> None:
    """The CP ring (opmap.mapping.context): cp - 1 K / V sends a layer, each hidden behind the attention of the
    chunk in hand; the backward sends K / V and dK / dV, and the recomputed forward its K / V again."""
    chunk = context.chunk_bytes(lay.sharder.kv, p.tp, p.cp)
    steps = (p.cp - 1) * n_blocks
    span = p.tp * p.cp
    f_step, b_step = attn[0] / p.cp, attn[1] / p.cp
    lay.add("send_recv", chunk, 2, span, "CP K/V ring step (forward)", "forward", steps, f_step)
    if lay.sharder.training:
        lay.add("send_recv", 2 * chunk, 2, span, "CP K/V and dK/dV ring step (backward)", "backward", steps,
                b_step)
        if p.recompute != "none":
            lay.add("send_recv", chunk, 2, span, "CP K/V ring step (recomputed forward)", "backward", steps,
                    f_step)


def _no_nvlink_all_to_all(hw: HardwareSpec, p: Parallelism) -> bool:
    """Whether DP attention's EP group, inside one scale-up domain, has no NVLink path between every pair of ranks
    (PCIe cards; NVLink bridges joining only pairs): the engines' all-to-all kernels need one (TensorRT-LLM's
    CommunicationFactory tries NVLinkOneSided, NVLinkTwoSided, NCCL-EP and DeepEP, then falls back to AllGather +
    ReduceScatter; vLLM's default all2all backend is allgather_reducescatter too)."""
    if not p.dp_attention or p.tp * p.cp * p.ep > (hw.interconnect.domain_size or 1):
        return False
    topo = hw.scale_up_topology
    return topo == "pcie" or (topo == "bridge_pairs" and p.ep > 2)


def _ep_all_gather_reduce_scatter(lay: _Layout, p: Parallelism, moe: int) -> None:
    """DP attention's MoE without an all-to-all path (``_no_nvlink_all_to_all``): each MoE layer all-gathers every
    rank's tokens after quantizing them to the experts' operand format (post-quant dispatch: NVFP4 0.5625 B an
    element with its scales, FP8 1 B), runs its experts on all of them, and reduce-scatters the outputs at the
    activation dtype (TensorRT-LLM tensorrt_llm/_torch/modules/fused_moe/communication/allgather_reducescatter.py
    and communication_factory.py @ 03c36d62). Every rank receives every token: no expert imbalance in the bytes."""
    from opmap.precision import format_bytes

    act = lay.sharder.geo.act_bytes / p.cp  # one rank's tokens x hidden at the activation dtype
    quant = format_bytes(lay.sharder.a.precision.operand_format) / lay.sharder.itemsize
    span = p.tp * p.cp * p.ep
    lay.add("all_gather", p.ep * act * min(1.0, quant), p.ep, span, "EP dispatch: all-gather of every rank's tokens",
            "forward", moe)
    lay.add("reduce_scatter", p.ep * act, p.ep, span, "EP combine: reduce-scatter of the expert outputs", "forward",
            moe)


def _ep_all_to_all(lay: _Layout, p: Parallelism, n_blocks: int) -> None:
    """EP's dispatch and combine all-to-alls of each MoE layer (forward, and their gradients): each rank's routed
    tokens (tokens x top_k x hidden bytes); the busiest receives ep_imbalance x the mean. ep over the tp group has
    none (every rank holds the tokens, the TP all-reduce combines): the caller leaves it out. DP attention on
    devices without an NVLink all-to-all path gathers and scatters instead (``_ep_all_gather_reduce_scatter``)."""
    moe = min(n_blocks, lay.sharder.moe_layers)
    if not lay.sharder.training and _no_nvlink_all_to_all(lay.hw, p):
        _ep_all_gather_reduce_scatter(lay, p, moe)
        return
    msg = lay.sharder.roles.routed_bytes / (p.tp if p.sp else 1) / p.cp * p.ep_imbalance
    lay.add("all_to_all", msg, p.ep, p.tp * p.cp * p.ep, "EP dispatch and combine", "forward", 2 * moe)
    lay.add("all_to_all", msg, p.ep, p.tp * p.cp * p.ep, "EP dispatch and combine (gradients)", "backward",
            2 * moe if lay.sharder.training else 0)


def _dp_reduction(lay: _Layout, p: Parallelism) -> None:
    """The DP (x CP) gradient reduction, once an iteration. ZeRO >= 1 shards the optimizer state: each rank updates
    its shard, so the gradients are reduce-scattered and the updated parameters all-gathered (Megatron's
    distributed optimizer, NeMo's distributed_fused_adam): the all-reduce's bytes in two halves, each overlapped on
    its own (opmap.mapping.sharding.DP_WINDOW); ZeRO-3 gathers the parameters again in every microbatch."""
    group = p.dp * p.cp
    grad = lay.sharder.params_per_device(p) * lay.sharder.itemsize
    span = p.tp * p.cp * p.dp
    over = f" (over dp x cp = {p.dp} x {p.cp})" if p.cp > 1 else ""
    link = dp_link(lay.hw, p.tp, group)
    if p.zero == 0:
        lay.add("all_reduce", grad, group, span, "DP gradient all-reduce" + over, "iteration", 1, link=link)
    else:
        lay.add("reduce_scatter", grad, group, span, "DP gradient reduce-scatter" + over, "iteration", 1, link=link)
        lay.add("all_gather", grad, group, span, "DP all-gather of updated parameters" + over, "iteration", 1,
                link=link)
        if p.zero == 3:
            lay.add("all_gather", grad, group, span, "ZeRO-3 parameter all-gather (forward and backward)",
                    "iteration", 2 * p.microbatches, link=link)
