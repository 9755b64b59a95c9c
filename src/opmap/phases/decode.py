"""Decode: one new token per sequence against a KV cache, priced as time per output token with its memory floor
(the weights and KV cache read once), and its memory fit (the KV pool as serve computes it)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from opmap.analyze import cap_at_positions
from opmap.geometry import attention_calls, layer_specs
from opmap.graph import OpGraph
from opmap.mapping.memory import (
    MemoryFit,
    ServingMemory,
    fit_inference,
    inflight_activation_bytes,
    kv_geometry,
    runtime_reserve,
)
from opmap.ops import chunked_keys_read
from opmap.phases.common import dominant_bound, kernel_times
from opmap.phases.result import Decode, DecodeFloor
from opmap.phases.runtime import runtime_text

if TYPE_CHECKING:
    from opmap.analyze import Analysis
    from opmap.workloads.zoo import Workload


def decode_figures(a: Analysis, kv_len: int) -> Decode:
    """One decode step: time per output token (the kernels plus the runtime's per-step time), tokens per second
    over the batch, the memory lower bound (the weights the step reads, each once: the embedding rows gathered,
    not the table; the experts the batch runs, not all of them; and the whole KV cache, at the device's achievable
    memory rate, the rate the time model streams at) and how far above it the step is."""
    step = a.runtime_per_step_s
    tpot = a.predicted_latency_s + step
    batch = int(a.assumptions.batch or 1)
    bound = dominant_bound([(b, t) for _, b, t in kernel_times(a)])
    weights = sum(r.cost.param_bytes_read for r in a.results if r.cost.counted)
    kv = decode_kv_read_bytes(a.graph)
    bw = a.hardware.memory_rate_bytes_per_s
    floor = (weights + kv) / bw
    basis = ("the weights the step reads (gathered embedding rows, the experts it runs) and "
             f"its KV cache, each once, at {a.hardware.memory_rate_basis}")
    text = (f"decode: time per output token {tpot * 1e3:.4g} ms, {batch / tpot if tpot else 0:.4g} tok/s at "
            f"batch {batch}, KV cache {kv_len} tokens ({bound}-bound; {tpot / floor if floor else 0:.2f}x the "
            f"weights + KV read floor {floor * 1e3:.4g} ms{runtime_text(a)})")
    # tokens per second = batch / tpot: one new token per sequence per step
    return Decode(tpot, a.predicted_latency_s, step, bound, a.kernels, batch, text,
                  floor=DecodeFloor(kv_len, weights, kv, floor, basis))


def decode_kv_read_bytes(graph: OpGraph, read: bool = True) -> float:
    """Bytes of K and V the decode step's attention calls read (the KV cache: GQA's KV heads, the window), from
    its SDPA calls or, where attention runs eager, its kv_cache marks (opmap.geometry.attention_calls). A chunked
    layer's call (Llama 4: opmap.capture.functions.chunked_attention) reads only its query's chunk of what it holds
    (opmap.ops.chunked_keys_read); ``read`` False: the bytes held instead (the memory a sequence takes)."""
    calls = attention_calls(graph)
    nodes = {n.id: n for n in graph.nodes} if read else {}
    total = 0.0
    for c, s in zip(calls, layer_specs(graph, calls)):
        held = c.held_bytes(s)
        n = nodes.get(c.node_id)
        chunk = n.args.get("chunk") if n is not None else None
        if isinstance(chunk, int) and chunk > 0 and c.kv_tokens:
            held *= chunked_keys_read(c.q_tokens, c.kv_tokens, chunk, n.args.get("q_offset")) / c.kv_tokens
        total += held
    return total


def decode_fit(a: Analysis, workload: Workload, kv_len: int) -> MemoryFit:
    """The decode step's memory on one device: the weights at their stored format, the KV cache of ``kv_len``
    tokens per sequence (a sliding window caps what is cached), the activations in flight; with the KV pool serve
    would size (opmap.mapping.memory.ServingMemory at utilization 1, eager) stated beside it."""
    graph, hw = a.graph, a.hardware
    weights = a.weights_held_bytes
    per_seq = decode_kv_read_bytes(graph, read=False) / max(workload.batch, 1)
    calls = attention_calls(graph)
    cached = max((s.tokens_held(c.kv_tokens) for c, s in zip(calls, layer_specs(graph, calls))), default=kv_len)
    window = cached if cached < kv_len else None
    inflight = inflight_activation_bytes(graph)
    geo = kv_geometry(graph)
    # the workload's own geometry, each layer with its window (gpt-oss's sliding and full layers), where it has one
    per_layer = geo.geometry is not None and getattr(graph, "geometry", None) is not None
    fit = fit_inference(weights, geo.bytes_per_token if per_layer else per_seq / cached, hw.memory_bytes,
                        workload.batch, kv_len, activations=lambda b, s: inflight * b / workload.batch,
                        window=geo.window if per_layer else window, max_context=1 << 24,
                        kv_bytes=geo.sequence_bytes if per_layer else None, kv_text=geo.text if per_layer else "")
    fit = cap_at_positions(fit, a.assumptions, kv_len)
    # the KV pool as serve computes it (opmap.mapping.memory.ServingMemory), here at utilization 1, eager
    serving = ServingMemory(hw.memory_bytes, 1.0, weights,
                            runtime_reserve(fit.activations_bytes, False,
                                            basis=f"this step ({workload.batch} sequences)"), per_seq / cached)
    return replace(fit, phase="decode", assumptions=fit.assumptions + (
        serving.line() + "; opmap serve takes --gpu-memory-utilization and its runtime's reserve",))
