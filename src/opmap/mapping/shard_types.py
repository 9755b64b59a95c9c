"""The types a parallel layout is described by, below every module that prices one: ``Parallelism`` (the layout,
checked on construction and against the model), ``Depth`` (the whole model a shallow capture stands for) and
``SharderView`` (what the collectives and the per-device memory read from the sharder that prices the layout).

opmap.mapping.sharding prices a layout; opmap.mapping.layout_collectives (its collectives) and
opmap.mapping.sharded_memory (its memory) are split out of it. All three import these types from here, so
imports among them run one way only: sharding -> layout_collectives, sharded_memory -> shard_types.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from opmap.errors import OpmapError
from opmap.mapping import context
from opmap.mapping.roles import Geometry
from opmap.record import key

if TYPE_CHECKING:
    from opmap.hardware.spec import HardwareSpec
    from opmap.mapping.collectives import Collective
    from opmap.mapping.roles import Roles

RECOMPUTE = ("none", "selective", "full")
# Fraction of the DP gradient reduction hidden behind backward: bucketed reduction starts when a bucket's
# gradients are ready (Megatron --overlap-grad-reduce, PyTorch DDP buckets); the last bucket cannot overlap.
DP_OVERLAP = 0.8


def check(cond: bool, msg: str) -> None:
    """Refuse a layout: ``msg`` as the one-line error when ``cond`` does not hold."""
    if not cond:
        raise OpmapError(msg)


@dataclass(frozen=True)
class Parallelism:
    """A layout. ``devices`` = tp x cp x pp x dp (checked); ep is drawn from inside dp (each EP rank its own
    tokens: training's data parallelism, inference's DP attention) or, for inference only, from inside the tp
    group (``ep_over_tp``: the attention tensor-parallel, every rank holding the same tokens, as vLLM's
    --enable-expert-parallel with dp 1); ``cp`` splits each sequence over cp ranks (opmap.mapping.context);
    ``global_batch`` defaults to dp x microbatch (one microbatch per data-parallel rank). ``ep_imbalance``: the
    busiest EP rank's routed tokens over the mean (opmap.mapping.expert_parallel), 1 without ep;
    ``dp_attention``: the dp ranks are the EP ranks' attention data parallelism (a label: the split is dp's). Its
    record (analysis.json's ``parallelism``) is its fields, the two EP ones only with ep (``expert_parallel``), so
    the files of layouts without it stay as they were."""

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
    cp: int = 1
    cp_comm: str = "p2p"  # context.CP_COMMS: the K/V ring (Megatron-Core's default) or one all-gather (Llama 3)
    ep_imbalance: float = field(default=1.0, metadata=key(when="expert_parallel"))
    dp_attention: bool = field(default=False, metadata=key(when="expert_parallel"))

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "ep", "vp", "microbatch", "cp"):
            v = getattr(self, name)
            check(isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                   f"--{name} must be a positive integer, got {v!r}")
        n = self.tp * self.cp * self.pp * self.dp
        if self.devices is None:
            object.__setattr__(self, "devices", n)
        if self.cp == 1:
            check(self.devices == n, f"--devices {self.devices} is not tp x pp x dp = {self.tp} x {self.pp} x "
                                      f"{self.dp} = {n}")
        check(self.devices == n, f"--devices {self.devices} is not tp x cp x pp x dp = {self.tp} x {self.cp} x "
                                  f"{self.pp} x {self.dp} = {n}")
        check(not self.sp or self.tp > 1, "--sp (sequence parallelism) needs --tp above 1")
        check(self.cp_comm in context.CP_COMMS, f"unknown --cp-comm {self.cp_comm!r}; accepted: "
                                                 f"{', '.join(context.CP_COMMS)}")
        check(self.dp % self.ep == 0 or self.tp % self.ep == 0,
              f"--ep {self.ep} must divide --dp {self.dp} (experts spread over data-parallel ranks, as Megatron-core "
              f"and DeepSpeed-MoE do; DP attention for inference) or --tp {self.tp} (inference: experts spread over "
              "the tensor-parallel group)")
        imb = self.ep_imbalance
        check(isinstance(imb, (int, float)) and not isinstance(imb, bool) and math.isfinite(imb) and 1.0 <= imb
              and (self.ep == 1 or imb <= self.ep),
              f"--ep-imbalance must be a number from 1 (every EP rank as busy) to --ep {self.ep} (one rank takes "
              f"every routed token), got {imb!r}")
        check(not self.dp_attention or (self.ep > 1 and self.dp % self.ep == 0),
              f"--dp-attention needs --ep above 1 and the attention data-parallel over the EP ranks (--dp {self.dp} a "
              f"multiple of --ep {self.ep})")
        check(self.vp == 1 or self.pp > 1, f"--vp {self.vp} (interleaved stages) needs --pp above 1")
        check(self.recompute in RECOMPUTE, f"unknown recompute {self.recompute!r}; accepted: "
                                            f"{', '.join(RECOMPUTE)}")
        check(self.zero in (0, 1, 2, 3), f"unknown ZeRO stage {self.zero!r}; accepted: 0, 1, 2, 3")
        check(0.0 <= self.dp_overlap <= 1.0, f"dp overlap must be within 0 and 1, got {self.dp_overlap!r}")
        if self.global_batch is None:
            object.__setattr__(self, "global_batch", self.dp * self.microbatch)
        gb = self.global_batch
        check(gb % (self.dp * self.microbatch) == 0,
               f"global batch {gb} is not a multiple of dp x microbatch = {self.dp} x {self.microbatch}")

    @property
    def microbatches(self) -> int:
        return self.global_batch // (self.dp * self.microbatch)

    @property
    def expert_parallel(self) -> bool:
        """The experts spread over more than one rank (ep above 1)."""
        return self.ep > 1

    @property
    def ep_over_tp(self) -> bool:
        """Experts spread over the tensor-parallel group (inference only): ep does not divide dp."""
        return self.ep > 1 and self.dp % self.ep != 0

    def check_phase(self, training: bool) -> None:
        """A training step refuses experts over the tensor-parallel group (``ep_over_tp``): its ep must divide dp.
        Known from the options alone, so the command line asks before it captures (opmap.api.Layout.parallelism)."""
        check(not (training and self.ep_over_tp), f"--ep {self.ep} must divide --dp {self.dp} for training (experts "
                                                   "spread over data-parallel ranks, as Megatron-core does)")

    @property
    def expert_split(self) -> int:
        """The devices an expert's weights (and, balanced, its routed work) divide over: E / ep experts a device,
        each tensor-parallel over tp (ep inside dp: tp x ep); over the tp group, E / ep experts a device, each over
        tp / ep (tp)."""
        return self.tp if self.ep_over_tp else self.tp * self.ep

    @property
    def trivial(self) -> bool:
        return self.devices == 1 and self.ep == 1

    def check(self, geo: Geometry) -> None:
        """The layout against the model: tp divides the heads (KV heads: tp divides them, or they divide tp and
        are replicated), pp divides the layers, vp divides layers / pp, ep divides the experts."""
        if geo.heads:
            check(geo.heads % self.tp == 0, f"--tp {self.tp} does not divide the {geo.heads} attention heads")
            kv = geo.kv_heads
            check(kv % self.tp == 0 or self.tp % kv == 0,
                   f"--tp {self.tp} and the {kv} KV heads: one must divide the other (tp > kv heads replicates "
                   "each KV head over tp / kv ranks)")
        # stages need not hold equal layer counts: Llama 3 405B's 126 layers ran on 16 stages, the first and last
        # one layer short (Llama 3 paper, section 3.3.2); each stage holds ceil(layers / pp) or fewer here, and
        # the slowest stage sets the pace
        check(geo.layers >= self.pp, f"--pp {self.pp} exceeds the {geo.layers} layers")
        per = -(-geo.layers // self.pp)
        check(per % self.vp == 0, f"--vp {self.vp} does not divide the {per} layers per pipeline stage")
        if self.ep > 1:
            check(geo.experts > 0, f"--ep {self.ep} needs a mixture-of-experts model (this one has no experts)")
            check(geo.experts % self.ep == 0, f"--ep {self.ep} does not divide the {geo.experts} experts")


    def label(self) -> str:
        cp = f" cp{self.cp}" + (" ag" if self.cp_comm == "all_gather" else "") if self.cp > 1 else ""
        s = f"tp{self.tp}{cp} pp{self.pp} dp{self.dp}"
        s += f" ep{self.ep}" if self.ep > 1 else ""
        s += " dpa" if self.dp_attention else ""
        s += f" imb{self.ep_imbalance:g}" if self.ep > 1 and self.ep_imbalance != 1.0 else ""
        s += " sp" if self.sp else ""
        s += f" vp{self.vp}" if self.vp > 1 else ""
        return s + f" mb{self.microbatch}" + (f" rc-{self.recompute}" if self.recompute != "none" else "") + (
            f" z{self.zero}" if self.zero else "")


@dataclass(frozen=True)
class Depth:
    """The model a shallow capture stands for: ``layers`` blocks (the capture holds fewer, identical ones),
    ``params`` parameters of ``param_bytes`` in all (opmap.explore.depth)."""

    layers: int
    params: int
    param_bytes: float


class SharderView(Protocol):
    """What layout_collectives and sharded_memory read from the sharder (opmap.mapping.sharding.Sharder)."""

    a: Any  # the Analysis being sharded: its graph, hardware and precision
    roles: Roles
    geo: Geometry
    training: bool
    kv: Any  # context.kv_shape of the graph: None without a KV cache
    itemsize: float
    moe_layers: int  # the model's MoE layers (blocks with routed experts) at its depth
    cache_kv_heads: int  # the heads a layer's KV cache splits over tp (1 for MLA's latent)

    def params_per_device(self, p: Parallelism) -> float: ...

    def kv_cache_bytes(self) -> float: ...

    def collective(self, hw: HardwareSpec, kind: str, msg: float, group: int, link: str,
                   per_node: int | None = None, stride: int | None = None) -> tuple[Collective, float, str]: ...
