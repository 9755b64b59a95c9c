"""A phase's figures under a layout over several devices (opmap.mapping.sharding)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from opmap.mapping.memory import MemoryFit, kv_bytes_per_token_per_device
from opmap.mapping.sharding import Parallelism, SavedPerBlock, Sharder, saved_per_block, sharded_memory
from opmap.phases.result import DecodeFloor, PhaseResult, TrainStep
from opmap.phases.runtime import runtime_text
from opmap.phases.train import step_text

if TYPE_CHECKING:
    from opmap.analyze import Analysis


def shard_analysis(a: Analysis, par: Parallelism) -> Analysis:
    """``a`` laid out over the devices of ``par``: the sharded result, the phase's figures under it and the memory
    fit per device (one Sharder for all three)."""
    s = Sharder(a)
    sh = s.shard(par)
    return replace(a, sharded=sh, phase_figures=sharded_phase_figures(a.phase_figures, sh, a, s),
                   fit=sharded_fit(a, par, s))


def sharded_fit(a: Analysis, par: Parallelism, s: Sharder | None = None) -> MemoryFit:
    """The memory fit per device under the layout (opmap.mapping.sharding.sharded_memory): a training step's
    activations read off its graph, an inference step's KV cache and activations in flight; the largest batch
    and longest context are not searched under sharding (plan does that, layout by layout)."""
    s = s or Sharder(a)
    training = a.assumptions.training
    seq = int(a.assumptions.seq or 1)
    saved = (saved_per_block(a.graph, s.roles, seq, fp8=a.assumptions.fp8_training is not None) if training
             else SavedPerBlock(0.0, 0.0, 0.0, 0.0))
    return sharded_memory(par, s, saved, a.precision.requested, training)


def decode_floor(a: Analysis, s: Sharder, p: Parallelism) -> tuple[float, float]:
    """(weight bytes, KV bytes) a decode step reads on one device of each stage, summed over the stages a token
    passes (the floor of the time per output token, which passes them all): the weights' shares
    (``Sharder.weight_bytes_read``) and the KV cache's (opmap.mapping.memory.kv_bytes_per_token_per_device, as
    serve sizes it: KV heads / min(tp, KV heads))."""
    kv = kv_bytes_per_token_per_device(s.kv_cache_bytes(), s.geo.layers, s.cache_kv_heads, p.tp)
    return s.weight_bytes_read(p), kv


def sharded_phase_figures(fig: PhaseResult | TrainStep, sh, a: Analysis,
                          sharder: Sharder | None = None) -> PhaseResult | TrainStep:
    """A phase's figures under a layout over several devices (``opmap.mapping.sharding.Sharded``): the
    iteration (train) or step (decode, prefill) time is the sharded one, collectives and pipeline bubble
    included; model FLOPs stay the model's, spread over every device for MFU and HFU. Train: every time is the
    slowest stage's device's, and step_s is the sum of its parts (opmap.phases.result.STEP_PARTS). Decode: the
    weights + KV read floor is one device's per stage (``decode_floor``; ``sharder``: the one that made ``sh``)."""
    if isinstance(fig, TrainStep):
        return _sharded_train(fig, sh, a)
    p = sh.parallelism
    lat = sh.latency_s + a.runtime_per_step_s
    if fig.name == "decode":
        assert fig.floor is not None
        seqs = int(a.assumptions.batch or 1) * p.dp
        tok_s = seqs / lat if lat else 0.0
        weights, kv = decode_floor(a, sharder or Sharder(a), p)
        bw = a.hardware.memory_rate_bytes_per_s
        floor = (weights + kv) / bw
        basis = (f"the weights and KV cache one device of each of the {p.pp} stages reads (its "
                 f"shares under {p.label()}), each once, at {a.hardware.memory_rate_basis}")
        text = (f"decode on {p.devices} devices ({p.label()}): {lat * 1e3:.4g} ms per output token, "
                f"{tok_s:.4g} tok/s ({lat / floor if floor else 0:.2f}x the per-device weights + "
                f"KV read floor {floor * 1e3:.4g} ms){runtime_text(a)}")
        return replace(fig, step_s=lat, kernel_time_s=sh.latency_s, tokens=seqs, text=text, devices=p.devices,
                       layout=p.label(), floor=DecodeFloor(fig.floor.kv_len, weights, kv, floor, basis))
    text = f"prefill on {p.devices} devices ({p.label()}): time to first token {lat * 1e3:.4g} ms{runtime_text(a)}"
    return replace(fig, step_s=lat, kernel_time_s=sh.latency_s, text=text, devices=p.devices, layout=p.label())


def _sharded_train(fig: TrainStep, sh, a: Analysis) -> TrainStep:
    """A training iteration under the layout ``sh``: the slowest stage's device's parts and the model's FLOPs
    spread over every device."""
    p = sh.parallelism
    peak = a.precision.matrix_peak_flops_per_s
    it = sh.step_s
    # the captured step is one microbatch on one replica: the whole iteration runs global_batch sequences
    scale = (p.global_batch or p.microbatch * p.dp) / fig.microbatch / max(1, fig.microsteps)
    model, hw_flops = fig.model_flops * scale, fig.hardware_flops * scale
    mf = model / (it * p.devices) if it else 0.0
    hf = hw_flops / (it * p.devices) if it else 0.0
    tokens = sh.tokens
    slow = max(range(len(sh.stage_compute_s)), key=lambda i: sh.stage_compute_s[i])
    out = replace(fig, devices=p.devices, layout=p.label(), step_s=it, microsteps=p.microbatches,
                  microstep_s=sh.stage_compute_s[slow] - sh.recompute_s, recompute_s=sh.recompute_s,
                  bubble_s=sh.bubble_s, exposed_comm_s=sh.exposed_comm_s, optimizer_s=sh.optimizer_s,
                  tokens_per_s=tokens / it if it else 0.0,
                  tokens_per_s_per_device=tokens / it / p.devices if it else 0.0, model_flops=model,
                  hardware_flops=hw_flops, recompute_flops=fig.recompute_flops * scale,
                  attention_recompute_flops=fig.attention_recompute_flops * scale,
                  executed_matrix_flops=fig.executed_matrix_flops * scale,
                  model_flops_per_s_per_device=mf, hardware_flops_per_s_per_device=hf,
                  mfu=mf / peak, hfu=hf / peak, global_batch=p.global_batch, dp=p.dp,
                  bubble_fraction=sh.bubble_fraction)
    text = step_text(f"train on {p.devices} devices ({p.label()})", out)
    if p.cp > 1:  # per microbatch on the slowest stage: the K/V ring's sends and the part not overlapped
        return replace(out, cp_exchange_s=sh.cp_exchange_s, cp_exposed_s=sh.cp_exposed_s,
                       text=text + (f", CP ring {sh.cp_exchange_s * 1e3:.3g} ms per microbatch "
                                    f"({sh.cp_exposed_s * 1e3:.3g} ms exposed)"))
    return replace(out, text=text)
