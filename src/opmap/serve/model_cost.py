"""A TableCost for a zoo model on a catalog device, priced by opmap's phase analyses (a handful of captures on
meta, so it takes seconds):

- prefill: one sequence of S tokens for S in ``prefill_seqs`` (capped at the model's context); a step with
  several prompts is priced at its total tokens (attention's quadratic part is then counted as one long
  prompt's: an upper bound for many short prompts);
- decode: batch b against a KV cache of k tokens per sequence for b in ``decode_batches`` and k in
  ``decode_kv``; time is linear in the KV read, so each batch's two points give a line in total KV tokens,
  laid on a common grid;
- with --tp N: each point's time is its tensor-parallel layout's (opmap.mapping.sharding.shard: Megatron
  splits and their all-reduces on the device's interconnect);
- KV capacity: (device memory - weights - workspace - activations in flight, per device) / KV bytes per
  token per device (the KV heads split over tp), from the decode analysis's memory fit and the graph's KV
  geometry (opmap.mapping.memory.kv_geometry).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from opmap.errors import OpmapError
from opmap.serve.cost import TableCost

PREFILL_SEQS = (128, 512, 2048)
DECODE_BATCHES = (1, 16, 64)
DECODE_KV = (256, 1024)
KV_GRID = (0, 1 << 14, 1 << 17, 1 << 20, 1 << 23)


def model_table_cost(model: str, hardware: str, dtype: str = "bf16", tp: int = 1,
                     prefill_seqs: Sequence[int] = PREFILL_SEQS, decode_batches: Sequence[int] = DECODE_BATCHES,
                     decode_kv: Sequence[int] = DECODE_KV,
                     progress: Callable[[str], None] | None = None) -> TableCost:
    from opmap.analyze import analyze_phase, capture_phase
    from opmap.hardware import get_hardware
    from opmap.mapping.memory import kv_geometry
    from opmap.workloads import MODELS
    from opmap.workloads.phases import PhaseSpec, phase_workload

    spec = MODELS.get(model)
    if spec is None or spec.kind != "text":
        raise OpmapError(f"opmap serve needs a zoo text decoder, got {model!r}: see `opmap models`")
    if tp < 1:
        raise OpmapError(f"--tp must be >= 1 (got {tp})")
    hw = get_hardware(hardware)
    say = progress or (lambda s: None)
    max_seq = int(spec.max_seq)

    def price(phase: PhaseSpec, batch: int, seq: int | None):
        w = phase_workload(model, phase, batch, seq, dtype, "meta")
        g = capture_phase(w, phase)
        a = analyze_phase(g, w, hw, dtype, phase).analysis
        t = a.predicted_latency_s
        if tp > 1:
            from opmap.mapping.sharding import Parallelism, shard

            t = shard(a, Parallelism(tp=tp, devices=tp)).latency_s
        return t, a, g

    seqs = sorted({min(s, max_seq) for s in prefill_seqs})
    pre_t = []
    pre_graph = None
    for s in seqs:
        say(f"pricing prefill of {s} tokens")
        t, _, pre_graph = price(PhaseSpec("prefill"), 1, s)
        pre_t.append(t)
    kvs = sorted({min(k, max_seq) for k in decode_kv})
    if len(kvs) < 2:
        raise OpmapError("decode pricing needs two KV lengths")
    rows = []
    last = None
    for b in sorted(set(decode_batches)):
        pts = []
        for k in kvs[:2]:
            say(f"pricing decode of {b} sequences at {k} KV tokens each")
            t, a, g = price(PhaseSpec("decode", kv_len=k), b, None)
            pts.append((b * k, t))
            last = (a, g)
        (x0, y0), (x1, y1) = pts
        slope = max(0.0, (y1 - y0) / (x1 - x0))
        rows.append([max(1e-9, y0 + slope * (kv - x0)) for kv in KV_GRID])
    fit = last[0].memory
    per_tok = kv_geometry(pre_graph).bytes_per_token / tp  # the prefill graph's causal attention calls
    free = fit.capacity_bytes - fit.weights_bytes / tp - fit.workspace_bytes - fit.activations_bytes / tp
    if per_tok <= 0:
        raise OpmapError(f"{model} has no KV cache in its graph (no causal attention): serve needs a decoder")
    cap = int(free // per_tok)
    if cap < 1:
        raise OpmapError(f"{model} does not fit on {hw.name} at tp {tp}: the weights need "
                         f"{fit.weights_bytes / tp / 1e9:.1f} GB per device of {fit.capacity_bytes / 1e9:.1f} GB; "
                         "raise --tp")
    return TableCost(seqs, pre_t, sorted(set(decode_batches)), KV_GRID, rows, kv_capacity_tokens=cap,
                     source=f"opmap phase analyses of {model} on {hw.name} ({dtype}, tp {tp})",
                     kv_bytes_per_token=per_tok)
