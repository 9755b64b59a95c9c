"""``opmap plan``: every legal (tp, pp, dp, ep, sp, vp, microbatch, recompute, zero) layout of a model on N devices,
ranked by predicted throughput or latency, with memory fit as a hard constraint.

The model is captured once per microbatch size (on meta); every layout is then arithmetic on that capture
(``opmap.mapping.sharding.Sharder``): identical blocks are priced once per kernel and summed per stage.

Memory per device (training): the model state (``training_state_bytes`` of the parameters one device holds,
ZeRO over dp), the activations saved for backward, read off the training graph (forward outputs that backward
nodes read, per block: the tensor-parallel ones / tp, the rest / tp only with SP), times the blocks of one stage
and the microbatches in flight on the first stage (1F1B: pp; interleaved: pp (1 + (pp - 1) / (pp vp)),
Korthikanti et al. 2022 sec. 4.2.3); full recomputation keeps only each block's input; selective drops the
saved tensors of S x S shape (attention scores, softmax, dropout mask); plus the workspace. Inference: the
weights, the KV cache (its heads / min(tp, kv heads), its layers / pp) and the workspace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from opmap.analyze import analyze_graph
from opmap.capture import capture
from opmap.errors import OpmapError
from opmap.hardware.spec import HardwareSpec
from opmap.mapping.sharding import Parallelism, SavedPerBlock, Sharder, saved_per_block, sharded_memory

MICROBATCHES = (1, 2, 4, 8)
RECOMPUTES = ("none", "selective", "full")
OBJECTIVES = ("throughput", "latency")
PHASES = ("train", "prefill")


@dataclass(frozen=True)
class Candidate:
    parallelism: Parallelism
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

    def to_dict(self) -> dict[str, Any]:
        return {**self.parallelism.to_dict(), "layout": self.parallelism.label(), "ok": self.ok,
                "reason": self.reason, "memory_bytes": self.memory_bytes, "capacity_bytes": self.capacity_bytes,
                "step_s": self.step_s, "tokens_per_s": self.tokens_per_s, "latency_s": self.latency_s,
                "bubble_fraction": self.bubble_fraction, "mfu": self.mfu}


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layouts(devices: int, per_node: int, geo, global_batch: int, training: bool, microbatches=MICROBATCHES):
    """Every candidate layout (legality against the model is checked when priced)."""
    for tp in divisors(devices):
        if tp > per_node:
            continue
        for pp in divisors(devices // tp):
            dp = devices // (tp * pp)
            for ep in (divisors(dp) if geo.experts else [1]):
                for sp in ((False, True) if tp > 1 else (False,)):
                    for vp in ((1, 2) if pp > 1 else (1,)):
                        for mb in microbatches:
                            if global_batch % (dp * mb):
                                continue
                            for rc in (RECOMPUTES if training else ("none",)):
                                for zero in ((0, 1, 2, 3) if training and dp > 1 else (0,)):
                                    yield Parallelism(tp=tp, pp=pp, dp=dp, ep=ep, sp=sp, vp=vp, microbatch=mb,
                                                      global_batch=global_batch, recompute=rc, zero=zero,
                                                      devices=devices)


def memory_bytes(p: Parallelism, sharder: Sharder, saved: SavedPerBlock, fmt: str, training: bool,
                 seq: int) -> float:
    return sharded_memory(p, sharder, saved, fmt, training, seq).total_bytes


def plan(build: Callable[[int], Any], hw: HardwareSpec, devices: int, phase: str = "train", dtype: str = "bf16",
         global_batch: int | None = None, objective: str = "throughput", microbatches=MICROBATCHES,
         progress: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """Rank every legal layout. ``build(microbatch)`` returns the workload at that batch (meta device)."""
    if phase not in PHASES:
        raise OpmapError(f"unknown phase {phase!r}; accepted: {', '.join(PHASES)}")
    if objective not in OBJECTIVES:
        raise OpmapError(f"unknown objective {objective!r}; accepted: {', '.join(OBJECTIVES)}")
    if devices < 1:
        raise OpmapError(f"--devices must be at least 1, got {devices}")
    training = phase == "train"
    gb = global_batch or 2 * devices
    per_node = hw.devices_per_node or 1
    cap = hw.memory_bytes
    sharders: dict[int, tuple[Sharder, SavedPerBlock, int]] = {}
    mbs = [m for m in microbatches if gb % m == 0]
    for i, mb in enumerate(mbs):
        if progress:
            progress(f"capturing at microbatch {mb}", i, len(mbs))
        w = build(mb)
        g = capture(w.module, w.inputs, train=training)
        a = analyze_graph(g, replace(w, module=None, inputs=None), hw, dtype)
        s = Sharder(a)
        seq = w.seq or 1
        sharders[mb] = (s, saved_per_block(g, s.roles, seq) if training else SavedPerBlock(0, 0, 0, 0), seq)
    geo = next(iter(sharders.values()))[0].geo
    cands = list(layouts(devices, per_node, geo, gb, training, mbs))
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
            out.append(Candidate(p, mem, cap, f"needs {mem / 1e9:.1f} GB per device of {cap / 1e9:.1f} GB"))
            continue
        r = s.shard(p)
        flops = s.a.total.matrix_flops * p.global_batch / p.microbatch
        mfu = flops / (r.step_s * devices * peak) if r.step_s and peak else 0.0
        out.append(Candidate(p, mem, cap, "", r.step_s, r.tokens_per_s, r.latency_s, r.bubble_fraction, mfu))
    if progress:
        progress("pricing layouts", len(cands), len(cands))
    ok = [c for c in out if c.ok]
    key = (lambda c: -c.tokens_per_s) if objective == "throughput" else (lambda c: c.latency_s)
    ok.sort(key=key)
    bad = sorted((c for c in out if not c.ok), key=lambda c: c.memory_bytes)
    return {"schema_version": 1, "hardware": hw.name, "devices": devices, "phase": phase, "objective": objective,
            "global_batch": gb, "dtype": dtype, "layouts": len(out), "legal_fitting": len(ok),
            "assumptions": [f"global batch {gb}" + (" (default: 2 x devices)" if global_batch is None else ""),
                            "microbatches per step m = global batch / (dp x microbatch)",
                            "memory: model state (AdamW, ZeRO), saved activations of the first stage's in-flight "
                            "microbatches, 1 GiB workspace" if training else
                            "memory: weights, KV cache, 1 GiB workspace",
                            *next(iter(sharders.values()))[0].shard(Parallelism()).to_dict()["assumptions"]],
            "ranked": [c.to_dict() for c in ok], "rejected": [c.to_dict() for c in bad]}
