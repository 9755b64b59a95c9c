"""``opmap plan``: every legal (tp, cp, pp, dp, ep, sp, vp, microbatch, recompute, zero) layout of a model on N
devices, ranked by predicted throughput or latency, with memory fit as a hard constraint.

The model is captured once per microbatch size (on meta), and only two of its blocks when its blocks are proven
identical (opmap.explore.depth: the last captured block stands for the rest; else the whole model); every layout
is then arithmetic on that capture (``opmap.mapping.sharding.Sharder``: kernels summed per block once per
(tp, sp, ep, cp), stages from prefix sums over the layers).

Searched: tp up to a node; cp (context parallelism) every divisor of the devices the sequence splits over (2 cp
chunks for causal attention); pp, dp; ep inside dp for MoE (prefill: DP attention, with the default expert load
imbalance; also ep inside tp); sp with tp; vp every divisor of the layers per stage;
the microbatches; the recomputation policies and ZeRO stages (training).

Memory per device (training): the model state (``training_state_bytes`` of the parameters one device holds,
ZeRO over dp), the activations saved for backward, read off the training graph (the storages of forward outputs
that backward nodes read, views followed to their base, as PyTorch's saved-tensor hooks count them; per block:
the tensor-parallel ones / tp, the rest / tp only with SP), times the blocks of one stage and the microbatches in
flight on the first stage (1F1B: pp; interleaved: pp (1 + (pp - 1) / (pp vp)), Korthikanti et al. 2022 sec.
4.2.3), with what is saved outside the blocks (opmap.mapping.sharded_memory.training_activations); full
recomputation keeps only each block's input; selective drops the saved tensors of S x S shape (attention
scores, softmax, dropout mask); plus the workspace. Inference: the weights, the KV cache of every sequence of the
step (its heads / min(tp, kv heads), its layers / pp), the activations in flight / tp and the workspace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from opmap.analyze import analyze_graph
from opmap.capture import capture
from opmap.errors import OpmapError
from opmap.explore.depth import captured_blocks_match, shallow
from opmap.hardware.spec import HardwareSpec
from opmap.hardware.trust import Confidence, confidence
from opmap.mapping import context
from opmap.mapping.expert_parallel import imbalance_for
from opmap.mapping.sharding import Parallelism, SavedPerBlock, Sharder, saved_per_block, sharded_memory
from opmap.record import key

MICROBATCHES = (1, 2, 4, 8)
RECOMPUTES = ("none", "selective", "full")
OBJECTIVES = ("throughput", "latency")
PHASES = ("train", "prefill")


@dataclass(frozen=True)
class Candidate:
    """One layout priced. Its record is plan.json's row: the layout's parallelism fields in place, its label, the
    verdict and the figures (``RECORD``)."""

    RECORD: ClassVar[tuple[Any, ...]] = ("parallelism", "layout", "ok", "reason", ...)
    parallelism: Parallelism = field(metadata=key(flatten=True))
    memory_bytes: float
    capacity_bytes: float
    reason: str = ""  # empty: legal and fits
    step_s: float = 0.0
    tokens_per_s: float = 0.0
    latency_s: float = 0.0
    bubble_fraction: float = 0.0
    mfu: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.reason

    @property
    def layout(self) -> str:
        return self.parallelism.label()



@dataclass(frozen=True)
class Plan:
    """Every layout priced: the legal and fitting ones ranked by the objective, the others by memory. Its record is
    plan.json (``RECORD``: the counts after the inputs, the candidates last)."""

    RECORD: ClassVar[tuple[Any, ...]] = (
        "schema_version", "hardware", "devices", "phase", "objective", "global_batch", "seq", "dtype", "layouts",
        "legal_fitting", ...)
    schema_version: ClassVar[int] = 1  # plan.json's
    hardware: str
    devices: int
    phase: str
    objective: str
    global_batch: int
    seq: int  # tokens per sequence
    dtype: str
    cp_searched: tuple[int, ...]  # the context-parallel sizes searched
    capture: str  # how the model was captured (whole, or a short capture standing for the rest)
    assumptions: tuple[str, ...]
    # how far to trust the figures (opmap.hardware.trust): the weakest input over every device's links
    confidence: Confidence
    ranked: tuple[Candidate, ...]  # legal and fitting, best first
    rejected: tuple[Candidate, ...]  # illegal or not fitting, smallest memory first

    @property
    def layouts(self) -> int:
        return len(self.ranked) + len(self.rejected)

    @property
    def legal_fitting(self) -> int:
        return len(self.ranked)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def vp_candidates(layers: int, pp: int) -> list[int]:
    """Virtual stages per device: every divisor of the layers one stage holds (ceil(layers / pp)); 1 without a
    pipeline."""
    return divisors(-(-max(1, layers) // pp)) if pp > 1 else [1]


def cp_candidates(devices: int, seq: int, causal: bool | None) -> list[int]:
    """Context-parallel sizes: the divisors of the devices the sequence splits over (``context.check_sequence``);
    only 1 without fused attention (``causal`` None)."""
    if causal is None:
        return [1]
    return [c for c in divisors(devices) if not context.check_sequence(seq, c, causal)]


def layouts(devices: int, per_node: int, geo, global_batch: int, training: bool, microbatches=MICROBATCHES,
            cps=(1,)):
    """Every candidate layout (legality against the model is checked when priced)."""
    for tp in divisors(devices):
        if tp > per_node:
            continue
        for cp in (c for c in cps if (devices // tp) % c == 0):
            yield from _rest(devices, tp, cp, geo, global_batch, training, microbatches)


def _rest(devices, tp, cp, geo, global_batch, training, microbatches):
    for pp in divisors(devices // (tp * cp)):
        dp = devices // (tp * cp * pp)
        for ep in _ep_candidates(geo, tp, dp, training):
            imb = imbalance_for(ep, None) if not training else 1.0
            dpa = not training and ep > 1 and dp % ep == 0  # inference EP over dp ranks: DP attention
            for sp in ((False, True) if tp > 1 else (False,)):
                for vp in vp_candidates(geo.layers, pp):
                    for mb in microbatches:
                        if global_batch % (dp * mb):
                            continue
                        for rc in (RECOMPUTES if training else ("none",)):
                            for zero in ((0, 1, 2, 3) if training and dp > 1 else (0,)):
                                yield Parallelism(tp=tp, pp=pp, dp=dp, ep=ep, sp=sp, vp=vp, microbatch=mb,
                                                  global_batch=global_batch, recompute=rc, zero=zero,
                                                  devices=devices, cp=cp, ep_imbalance=imb, dp_attention=dpa)


def _ep_candidates(geo, tp: int, dp: int, training: bool) -> list[int]:
    """Expert-parallel sizes of a MoE model: every divisor of dp (training's EP, inference's DP attention), and
    for inference every divisor of tp that does not divide dp (experts over the attention's tp group)."""
    if not geo.experts:
        return [1]
    over_dp = divisors(dp)
    return over_dp + ([] if training else [e for e in divisors(tp) if e > 1 and e not in over_dp])


def memory_bytes(p: Parallelism, sharder: Sharder, saved: SavedPerBlock, fmt: str, training: bool,
                 seq: int) -> float:
    return sharded_memory(p, sharder, saved, fmt, training, seq).total_bytes


def plan(build: Callable[[int], Any], hw: HardwareSpec, devices: int, phase: str = "train", dtype: str = "bf16",
         global_batch: int | None = None, objective: str = "throughput", microbatches=MICROBATCHES,
         progress: Callable[[str, int, int], None] | None = None, cp: int | None = None) -> Plan:
    """Rank every legal layout. ``build(microbatch)`` returns the workload at that batch (meta device); ``cp``: only
    that context-parallel size (None: every one the sequence splits over)."""
    if phase not in PHASES:
        raise OpmapError(f"unknown phase {phase!r}; accepted: {', '.join(PHASES)}")
    if objective not in OBJECTIVES:
        raise OpmapError(f"unknown objective {objective!r}; accepted: {', '.join(OBJECTIVES)}")
    if devices < 1:
        raise OpmapError(f"--devices must be at least 1, got {devices}")
    if cp is not None and (cp < 1 or devices % cp):
        raise OpmapError(f"--cp {cp} does not divide the {devices} devices (tp x cp x pp x dp = devices)")
    training = phase == "train"
    gb = global_batch or 2 * devices
    per_node = hw.interconnect.fabric_size or 1  # TP inside one scale-up fabric (an NVL72 rack, a Trn2 UltraServer)
    cap = hw.memory_bytes
    sharders: dict[int, tuple[Sharder, SavedPerBlock, int]] = {}
    mbs = [m for m in microbatches if gb % m == 0]
    depth_note = ""
    for i, mb in enumerate(mbs):
        if progress:
            progress(f"capturing at microbatch {mb}", i, len(mbs))
        s, g, seq_mb, depth_note = _sharder(build, mb, hw, dtype, training, depth_note)
        saved = (saved_per_block(g, s.roles, seq_mb, fp8=s.a.assumptions.fp8_training is not None) if training
                 else SavedPerBlock(0, 0, 0, 0))
        sharders[mb] = (s, saved, seq_mb)
    first = next(iter(sharders.values()))
    geo, seq = first[0].geo, first[2]
    kv = first[0].kv
    cps = cp_candidates(devices, seq, kv.causal if kv is not None else None)
    if cp is not None:
        if cp not in cps:
            raise OpmapError(f"--cp {cp} is not one of the context-parallel sizes this model and sequence allow on "
                             f"{devices} devices: {', '.join(map(str, cps))} (cp divides the devices; the sequence "
                             f"{seq} splits into 2 cp chunks; cp above 1 needs fused attention)")
        cps = [cp]
    cands = list(layouts(devices, per_node, geo, gb, training, mbs, cps))
    out: list[Candidate] = []
    peak = next(iter(sharders.values()))[0].a.precision.matrix_peak_flops_per_s  # MFU: the dense peak
    for i, p in enumerate(cands):
        if progress and i % 50 == 0:
            progress("pricing layouts", i, len(cands))
        s, saved, seq = sharders[p.microbatch]
        try:
            p.check(geo)
        except OpmapError as e:
            out.append(Candidate(p, 0.0, cap, f"illegal: {e}"))
            continue
        mem = memory_bytes(p, s, saved, dtype, training, seq)
        if mem > cap:
            out.append(Candidate(p, mem, cap, f"needs {mem / 2**30:.4g} GiB per device of {cap / 2**30:.4g} GiB"))
            continue
        r = s.shard(p, per_kernel=False)
        flops = s.model_matrix_flops * p.global_batch / p.microbatch
        mfu = flops / (r.step_s * devices * peak) if r.step_s and peak else 0.0
        out.append(Candidate(p, mem, cap, "", r.step_s, r.tokens_per_s, r.latency_s, r.bubble_fraction, mfu))
    if progress:
        progress("pricing layouts", len(cands), len(cands))
    ok = [c for c in out if c.ok]
    key = (lambda c: -c.tokens_per_s) if objective == "throughput" else (lambda c: c.latency_s)
    ok.sort(key=key)
    bad = sorted((c for c in out if not c.ok), key=lambda c: c.memory_bytes)
    return Plan(hw.name, devices, phase, objective, gb, seq, dtype, tuple(cps), depth_note,
                (f"global batch {gb}" + (" (default: 2 x devices)" if global_batch is None else ""),
                 f"sequence {seq} tokens; {gb * seq} tokens per step",
                 f"context parallelism searched over cp in {cps} (the sequence splits into 2 cp chunks "
                 "for causal attention)" if kv is not None else "no fused attention: cp 1 only",
                 "virtual pipeline stages: every divisor of the layers per stage",
                 depth_note,
                 "microbatches per step m = global batch / (dp x microbatch)",
                 "memory: model state (AdamW, ZeRO), saved activations of the first stage's in-flight "
                 "microbatches, 1 GiB workspace" if training else
                 "memory: weights, KV cache, activations in flight, 1 GiB workspace",
                 *next(iter(sharders.values()))[0].shard(Parallelism()).assumptions),
                confidence(hw, dtype, "eager", devices), tuple(ok), tuple(bad))


def _sharder(build, mb: int, hw: HardwareSpec, dtype: str, training: bool, note: str):
    """The Sharder at microbatch ``mb``: from a capture of two blocks standing for the rest when the model's blocks
    are one block (opmap.explore.depth), else from the whole model; with the graph, sequence and a line saying
    which."""
    w = build(mb)
    if not note.startswith("whole"):
        short, depth = shallow(w)  # depth: what the short capture stands for, or why there is none
        if short is not None:
            try:
                g = capture(short.module, short.inputs, train=training)
            except Exception as e:  # noqa: BLE001 (a forward that counts its blocks: capture it whole instead)
                g, why = None, f"the model does not run with {depth.layers} blocks cut short: {type(e).__name__}"
            if g is not None:
                a = analyze_graph(g, replace(short, module=None, inputs=None), hw, dtype)
                s = Sharder(a, depth)
                why = captured_blocks_match(s)
            if g is not None and not why:
                return s, g, short.seq or 1, (f"captured {s.L} of {depth.layers} identical blocks, the last standing "
                                              "for the rest (opmap.explore.depth)")
            w = build(mb)
        note = f"whole model captured ({why if short is not None else depth})"
    g = capture(w.module, w.inputs, train=training)
    a = analyze_graph(g, replace(w, module=None, inputs=None), hw, dtype)
    return Sharder(a), g, w.seq or 1, note
