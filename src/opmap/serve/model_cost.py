"""A TableCost for a model on a catalog device: what one step of a serving replica (tp x pp devices) costs under a
runtime, priced by opmap's phase analyses, and the KV cache its devices hold.

- the model: anything ``opmap analyze`` takes (a zoo text decoder, a Hugging Face config, ``hf:NAME``, a model file
  whose factory returns a zoo-style decoder or a transformers causal LM), built once by analyze's resolver
  (opmap.serve.resolve); a zoo model's summary and its 2-layer graphs are kept in the capture cache, so a
  second pricing builds and captures nothing;
- layers: a homogeneous stack (every block the same parameters and the same attention kind) is captured with 1
  and 2 layers and each priced point extrapolated linearly in the layer count, t(L) = t(1) + (L - 1)(t(2) - t(1)):
  exact, since each layer adds the same kernels, all-reduces and fusion boundary. One 2-layer capture per point
  gives both terms: the kernels of the second block (its TP all-reduces and view dispatch included) are one
  layer, the rest is t(1) - layer, where the first block prices the same; where a kernel straddles the blocks'
  boundary (they differ), a 1-layer capture gives the layer as t(2) - t(1).
  An uneven stack repeats with a period (opmap.serve.layer_period: a prefix of p layers, then a period of q; R1's 3
  dense layers then one MoE layer, gpt-oss's sliding and full layers in turn, Llama 4's four with a NoPE global
  last): with L = p + m q + r, the same holds with the ``long`` capture of p + 2q + r layers in place of 2 and the
  ``short`` one of p + q + r in place of 1, t(L) = t(short) + (m - 1)(t(long) - t(short)), the homogeneous stack
  being p 0 q 1. Each layer of the model is priced as the block of the long capture with its signature (a prefix
  or tail layer as itself, a period layer as the second period's), so a pipeline stage sums its own layers, the
  EP all-to-alls in the MoE blocks only; the expert weights and KV bytes per token are summed the same way (R1's
  dense layers hold no experts). Where no period leaves fewer layers to capture than the model has, it is
  captured whole (``Resolved.stack`` says why). Every step is priced under steady load (a serving run keeps the
  device busy for minutes): a power-limited card at its sustained matrix rate (opmap.precision.power_limited),
  the same in every step whatever its length, so the extrapolation holds there too;
- prefill: one sequence of S tokens for S in ``PREFILL_SEQS`` and, for a run with longer prompts, up to its
  longest (``prefill_lengths``), capped at the model's context; a step of several
  prompts is priced at its total tokens (attention's quadratic part counted as one long prompt's: an upper bound);
- decode: batch b against k KV tokens per sequence for b in ``DECODE_BATCHES`` (more for a MoE, whose expert reads
  are concave in b) and k in ``DECODE_KV`` (to the run's longest context past 4096 tokens: ``decode_lengths``);
  time is taken linear in the KV read, so each batch's two points give a line
  in total KV tokens, laid on a common grid, its slope scaled to the KV format (``--kv-dtype``);
- runtime (opmap.phases.runtime): every point priced on ``rt.apply(hw)`` with the fusion ``rt.fusion``, plus
  ``rt.per_step_s`` once per step;
- layout: each point's time is its tensor-parallel layout's (opmap.mapping.sharding: Megatron splits and their
  all-reduces); pp stages split the layers (ceil(L / pp) per stage, the embedding on the first, the head on the
  last); one microbatch passes every stage plus pp - 1 activation sends (latency), and a step of n sequences runs
  as min(pp, n) microbatches in flight, steady state (TableCost._piped);
- memory: per device, usable = capacity x utilization - weights - runtime reserve; KV tokens = usable / KV bytes per
  token per device (opmap.mapping.memory.ServingMemory);
- floor: the weight and KV bytes one device reads per decode step over its achievable memory rate (DecodeFloor);
- DP attention (``dp_attention``, with ep = tp = N): the replica is N attention ranks of one device each, as SGLang
  --enable-dp-attention and TensorRT-LLM enable_attention_dp run a MoE: every point is one rank's step at its own
  batch, priced by the sharder under Parallelism(tp 1, dp N, ep N, dp_attention) (the layout ``analyze --ep N
  --dp-attention`` prices: the attention and dense weights whole on every rank, E / N whole experts a device at
  the N ranks' tokens, a dispatch and a combine all-to-all per MoE layer), every rank assumed to carry the same
  batch; each rank holds its own KV pool (one device's free memory over the whole KV bytes per token: no split by
  TP, MLA's latent whole). The simulator runs the ranks in lockstep (opmap.serve.lockstep, ``attention_ranks``).
  With pp stages (TensorRT-LLM's DEP2 PP2: 2 ranks x 2 stages) each rank is a pipeline of pp devices, its layers
  split as above, each stage's layers priced under the DP-attention layout (its MoE layers' all-to-alls among the
  stage's N devices), a rank's microbatches piped as above; a device holds its stage's dense weights whole, E / N
  of its MoE layers' experts and its layers' KV (weights and KV per device / pp).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from opmap.errors import OpmapError
from opmap.record import record
from opmap.serve.cost import DecodeFloor, TableCost
from opmap.serve.pricer import Point, Pricer
from opmap.serve.resolve import Resolved

PREFILL_SEQS = (128, 512, 2048)
# Engines run decode batches of hundreds to thousands (trtllm-bench sizes max_batch_size up to 4096, vLLM 256-1024):
# a step turns from weight-read-bound to compute-bound near the device's ridge (an H100 at fp8: about 1.4e15 FLOP/s
# over 3e12 B/s = 470 FLOP per weight byte, batch ~235 at 1 byte a weight), so a line drawn through batches <= 64
# and extrapolated misses the compute-bound regime (it priced a 600-sequence step of Llama-3-70B on two H200s at
# about half of what the same step analyses at). The last segment's slope is what every larger batch pays per
# sequence, so it must lie past the ridge of every kernel: at 1024 a MoE's experts (M = b k / E = 256 rows each for
# Mixtral) sit at the ridge still, and a 256-1024 slope, half weight-read-bound, priced Mixtral's marginal sequence
# at 8.9 us on an H100 against the 18.4 us its FLOPs take (2 x 12.9e9 / 1.4e15); points to 4096, the largest
# batch trtllm-bench sizes, put the last segment past it
DECODE_BATCHES = (1, 16, 64, 256, 1024, 4096)
MOE_DECODE_BATCHES = (1, 2, 4, 8, 16, 64, 256, 1024, 4096)  # distinct experts grow as E (1 - (1 - k/E)^b): concave
DECODE_KV = (256, 1024)
LONG_DECODE_KV = 4096  # past this longest context the second decode point is the context itself (decode_lengths)
KV_GRID = (0, 1 << 14, 1 << 17, 1 << 20, 1 << 23)


def prefill_lengths(limit: int | None, longest_prompt: int | None) -> list[int]:
    """The prompt lengths the prefill points are priced at: ``PREFILL_SEQS``, then, for a run whose prompts are
    longer (``longest_prompt``), x4 steps on while at most half that length, and the longest prompt itself, all
    capped at the model's position ``limit``. The table is linear between points and past the last, so a
    prompt's causal attention, quadratic in its length, is only counted up to the longest point: a 32,768-token
    prompt priced off points to 2048 paid per token what a 2048-token prompt pays, and a chunk's attention to its
    prompt's earlier chunks (``opmap.serve.cost.prefix_s``: P(d + n) - P(d) - P(n) + P(0)) came out the same
    constant at every depth d (gpt-oss-20b on a B200, 32768/1024: 120 ms a prompt against the 203 ms ``opmap
    analyze --seq 32768`` prices). With a point at the longest context, a lone prompt's chunks add up to that
    point's price plus one fixed cost per extra step (prefix_s), the whole causal attention counted."""
    cap = limit or max(max(PREFILL_SEQS), longest_prompt or 0)  # no position limit: the run's prompts
    seqs = {min(s, cap) for s in PREFILL_SEQS}
    top = min(longest_prompt or 0, cap)
    if top > max(PREFILL_SEQS):
        s = 4 * max(PREFILL_SEQS)
        while 2 * s <= top:  # a grid point well below the top one (not two captures of about one length)
            seqs.add(s)
            s *= 4
        seqs.add(top)
    return sorted(seqs)


def decode_lengths(longest_context: int | None) -> tuple[int, int]:
    """The two KV lengths per sequence each decode batch is priced at: ``DECODE_KV``, or for a run whose sequences
    grow past LONG_DECODE_KV tokens (``longest_context``: prompt + output) the first of them and the longest
    context itself. Decode attention's time is concave in the KV length where it is measured (opmap.hardware.
    attention_grid: per-sequence costs make the short-KV slope steeper, an H100 at batch 16 2.25 ns a token below
    1k against 1.39 at 16k), so a line drawn through 256 and 1024 tokens and carried 32x past its last point prices a
    32k context's read above what it costs; the chord to the longest context is exact at both ends."""
    if longest_context is None or longest_context <= LONG_DECODE_KV:
        return DECODE_KV
    return DECODE_KV[0], int(longest_context)


def kv_dtypes() -> tuple[str, ...]:
    """The formats --kv-dtype accepts: the registry's KV formats (opmap.formats, ``kv = true``)."""
    from opmap.formats import registry

    return registry().names(kv=True)


def kv_dtype_bytes(kv_dtype: str) -> float:
    """Bytes per element of the KV cache at ``kv_dtype`` (a KV format, or fp32: an fp32 model's default)."""
    from opmap.precision import format_bytes

    return float(format_bytes(kv_dtype))


def check_kv_dtype(kv_dtype: str | None, dtype: str) -> str:
    """The KV format: ``kv_dtype`` or, by default, the format the model computes activations in."""
    from opmap.formats import spoken
    from opmap.precision import capture_format

    kvs = kv_dtypes()
    if kv_dtype is None:
        cap = capture_format(dtype)  # an alias (--dtype fp4) too: its formats share one capture
        return cap if cap in kvs else "bf16" if cap != "fp32" else "fp32"
    if kv_dtype not in kvs:
        raise OpmapError(f"unknown --kv-dtype {kv_dtype!r}; accepted: {spoken(kvs)} "
                         "(default: the model dtype's activation format)")
    return kv_dtype


def model_table_cost(model: str, hardware: str, dtype: str = "bf16", tp: int = 1, *, pp: int = 1,
                     runtime: str = "engine", kv_dtype: str | None = None, gpu_memory_utilization: float = 0.9,
                     allow_long_context: bool = False, max_context: int | None = None,
                     progress: Callable[[str], None] | None = None, queries: int = 1,
                     layers: int | None = None, ep: int = 1, ep_imbalance: float | None = None,
                     memory_of: str = "total", dp_attention: bool = False,
                     longest_prompt: int | None = None) -> TableCost:
    """Price ``model`` on ``hardware`` for the serving simulator (module docstring). ``max_context``: the longest
    sequence (prompt + output) the run will hold, refused past the model's position limit unless
    ``allow_long_context`` (rope scaling). Speculative decoding (opmap.serve.spec) prices with the same points:
    ``queries`` new tokens per sequence in each decode step (a verify: K + 1), and ``layers`` to price the model
    cut to its first ``layers`` layers, its embedding and head kept (a one-layer draft head: MTP, EAGLE). ``ep``:
    the experts spread over the replica's tp group (E / ep a device, the attention tensor-parallel;
    opmap.mapping.device_time), its busiest rank ``ep_imbalance`` x the mean (None: opmap.mapping.expert_parallel's
    default). ``memory_of``: what ``gpu_memory_utilization`` is a fraction of (opmap.mapping.memory.ServingMemory.
    fraction_of: an engine preset's memory semantics; default vLLM's). ``dp_attention``: the tp devices are ep = tp
    attention ranks, each its own batch and KV pool (module docstring); the points are one rank's.
    ``longest_prompt``: the run's longest prompt, where the prefill points reach (``prefill_lengths``)."""
    imb, kvd, rt, hw = _check_options(hardware, dtype, tp, pp, ep, ep_imbalance, dp_attention, runtime, kv_dtype,
                                      gpu_memory_utilization)
    say = progress or (lambda s: None)
    m = Resolved.build(model, dtype)
    if layers is not None and layers < m.layers:
        m = replace(m, layers=layers, held_bytes=m.held_bytes * layers / m.layers)
    limit = m.max_positions
    if max_context is not None and limit is not None and max_context > limit and not (allow_long_context and m.rope):
        way = ("shorten the lengths or pass --allow-long-context (rope scaling)" if m.rope else
               "shorten the lengths (learned positions: no rope scaling)")
        raise OpmapError(f"{model} holds at most {limit} positions (max_position_embeddings) and the run needs "
                         f"{max_context} (prompt + output); {way}")
    if pp > m.layers:
        raise OpmapError(f"--pp {pp} exceeds the {m.layers} layers of {model}")
    pricer = Pricer(m, hw, dtype, 1 if dp_attention else tp, pp, rt, queries, ep, imb, dp_attention)
    cap = limit or max(PREFILL_SEQS)
    seqs = prefill_lengths(limit, longest_prompt)
    pre = []
    for s in seqs:
        say(f"pricing prefill of {s} tokens")
        pre.append(pricer.prefill(s))
        if len(pre) == 1:  # the weights held are known from the first point: no room for them, no more points
            _weights_fit(pricer.memory(kvd, gpu_memory_utilization, memory_of), model, hw.name,
                         tp, pp, ep, dp_attention, gpu_memory_utilization)
    if pricer._kv_per_token <= 0:
        raise OpmapError(f"{model} has no KV cache in its graph (no causal attention): serve needs a decoder")
    kvs = sorted({min(k, cap) for k in decode_lengths(max_context)})
    if len(kvs) < 2:
        raise OpmapError(f"{model} holds {cap} positions: decode pricing needs two KV lengths")
    batches = MOE_DECODE_BATCHES if pricer.experts else DECODE_BATCHES
    rows, stage_rows, first = _decode_rows(pricer, batches, kvs[:2], kv_dtype_bytes(kvd) / m.kv_itemsize, say)
    memory = pricer.memory(kvd, gpu_memory_utilization, memory_of)
    if memory.kv_capacity_tokens < 1:
        where = f"tp {tp} pp {pp}" + (f" with DP attention over {ep} ranks" if dp_attention else "")
        raise OpmapError(f"{model} does not fit on {hw.name} at {where}: the weights need "
                         f"{memory.weights_bytes / 2**30:.1f} GiB per device and the runtime reserve "
                         f"{memory.reserve_bytes / 2**30:.2f} GiB, of {memory.capacity_bytes / 2**30:.1f} GiB x "
                         f"{gpu_memory_utilization:g}; raise --tp or --pp")
    floor = DecodeFloor(first.dense_bytes, memory.kv_bytes_per_token, hw.memory_rate_bytes_per_s,
                        pricer.expert_bytes_per_expert, pricer.experts, pricer.top_k, pp, hw.memory_rate_basis,
                        ep if dp_attention else 1)
    where = f"tp {tp}, pp {pp}" if not dp_attention else \
        f"DP attention: {ep} ranks of one device{f' a stage, pp {pp}' if pp > 1 else ''}, each step one rank's at " \
        f"its own batch, ep {ep}"
    dpa = {"dp_attention": True, "attention_ranks": ep} if dp_attention else {}
    return TableCost(seqs, [p.latency_s for p in pre], list(batches), KV_GRID, rows,
                     kv_capacity_tokens=memory.kv_capacity_tokens,
                     source=f"opmap phase analyses of {m.name} on {hw.name} ({dtype}, {where}, runtime "
                            f"{rt.name}; {pricer.how})",
                     kv_bytes_per_token=memory.kv_bytes_per_token, runtime=record(rt), memory=record(memory),
                     layout={"tp": tp, "pp": pp, **({"ep": ep, "ep_imbalance": imb} if ep > 1 else {}), **dpa},
                     kv_dtype=kvd, pp=pp, attention_ranks=ep if dp_attention else 1,
                     stage_prefill_time_s=[p.stage_s for p in pre] if pp > 1 else None,
                     stage_decode_time_s=stage_rows if pp > 1 else None, floor=floor, moe_grid=pricer.moe_grid)


def _weights_fit(memory, model: str, device: str, tp: int, pp: int, ep: int, dp_attention: bool,
                 utilization: float) -> None:
    """Refuse a layout whose weights alone leave no memory for a KV cache (``memory``: ServingMemory after the
    first priced point): no runtime reserve the later points find can make room, so the other points are not
    priced (Llama 4 Scout at bf16 on one B200: 201 GiB of weights; 14 s to the same refusal before)."""
    if replace(memory, reserve={}).usable_bytes > 0:
        return
    where = f"tp {tp} pp {pp}" + (f" with DP attention over {ep} ranks" if dp_attention else "")
    raise OpmapError(f"{model} does not fit on {device} at {where}: the weights need "
                     f"{memory.weights_bytes / 2**30:.1f} GiB per device, of {memory.capacity_bytes / 2**30:.1f} GiB "
                     f"x {utilization:g}; raise --tp or --pp")


def _check_options(hardware: str, dtype: str, tp: int, pp: int, ep: int, ep_imbalance: float | None,
                   dp_attention: bool, runtime: str, kv_dtype: str | None, utilization: float) -> tuple:
    """model_table_cost's options checked, each refused in one line before anything is built: (the busiest EP
    rank's load over the mean, the KV format, the runtime, the device as the runtime runs it)."""
    from opmap.hardware import get_hardware
    from opmap.mapping.expert_parallel import imbalance_for
    from opmap.phases.runtime import get_runtime
    from opmap.precision import resolve_precision

    for name, v in (("--tp", tp), ("--pp", pp), ("--ep", ep)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise OpmapError(f"{name} must be a positive integer, got {v!r}")
    check_dp_attention(tp, pp, ep, dp_attention)
    if tp % ep:
        raise OpmapError(f"--ep {ep} must divide --tp {tp}: serve spreads the experts over each replica's tensor-"
                         "parallel group, or with --dp-attention over its tp attention ranks (--ep equal to --tp)")
    imb = imbalance_for(ep, ep_imbalance)
    if not (isinstance(utilization, (int, float)) and 0 < utilization <= 1):
        raise OpmapError(f"--gpu-memory-utilization must be above 0 and at most 1, got {utilization!r}")
    kvd = check_kv_dtype(kv_dtype, dtype)
    hw0 = get_hardware(hardware)
    resolve_precision(hw0, dtype)  # a dtype the device lacks fails before anything is built
    rt = get_runtime(hw0, runtime)
    return imb, kvd, rt, rt.apply(hw0)


def _decode_rows(pricer: Pricer, batches, kvs: list[int], scale: float, say) -> tuple[list, list, Point]:
    """Per decode batch, the step's time on KV_GRID (one microbatch through every stage, and the slowest stage),
    each a line through the batch's two KV lengths ``kvs`` with its KV read scaled by ``scale`` (the KV format's
    bytes over the captured cache's); and the first batch's first point (the decode floor's dense bytes)."""
    rows, stage_rows, first = [], [], None
    q = pricer.queries
    for b in batches:
        pts = []
        for k in kvs:
            say(f"pricing decode of {b} sequences at {k} KV tokens each" + (f", {q} new tokens each" if q > 1 else ""))
            pts.append((b * k, pricer.decode(b, k)))
        rows.append(_kv_line(pts, lambda p: p.latency_s, scale))
        stage_rows.append(_kv_line(pts, lambda p: p.stage_s, scale))
        first = first or pts[0][1]
    return rows, stage_rows, first


def check_dp_attention(tp: int, pp: int, ep: int, dp_attention: bool) -> None:
    """DP attention's layout against tp and ep, in one line: ep above 1 and equal to tp (one attention rank a
    device of each pipeline stage, the experts over all of them, as TensorRT-LLM's DEP N; any pp, as DEP2 PP2)."""
    if not dp_attention:
        return
    if ep <= 1:
        raise OpmapError("--dp-attention runs the attention data-parallel over the EP ranks: it needs --ep above 1 "
                         "(--ep N --tp N: N attention ranks of one device, E / N experts a device)")
    if ep != tp:
        raise OpmapError(f"--dp-attention runs one attention rank a device and the experts over all of them: --ep "
                         f"must equal --tp (the replica's devices), got --ep {ep} --tp {tp}")


def _kv_line(pts, f, scale: float) -> list[float]:
    """A decode row on KV_GRID from two points (total KV tokens, Point): the intercept as priced, the slope (the
    KV read) times ``scale``."""
    (x0, p0), (x1, p1) = pts
    slope = max(0.0, (f(p1) - f(p0)) / (x1 - x0))
    y0 = f(p0) - slope * x0
    return [max(1e-9, y0 + slope * scale * kv) for kv in KV_GRID]
