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

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace

from opmap.errors import OpmapError
from opmap.record import record
from opmap.serve.cost import DecodeFloor, TableCost
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


# The analyses of this process, by (capture key, device as priced, dtype, fusion): a layout search prices one model
# on one device under up to ten layouts, and every layout's points are the same analyses (the graph does not
# depend on tp or pp; Pricer._terms shards each under its tp, _point splits the layers over pp). Oldest dropped
# first past ANALYSES_KEPT (a 2-layer analysis of a 70B model holds a few MB).
ANALYSES_KEPT = 96
_ANALYSES: dict[tuple, tuple] = {}


@dataclass(frozen=True)
class Point:
    """One priced step on the replica: ``latency_s`` one microbatch through every stage, ``stage_s`` the
    slowest stage with its send; per device, the weight bytes read (``dense_bytes``, ``expert_bytes``)."""

    latency_s: float
    stage_s: float
    dense_bytes: float = 0.0
    expert_bytes: float = 0.0


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


# -- pricing points ----------------------------------------------------------------------------------------------

def _bf16_extra(a, where: tuple[int, ...]) -> float:
    """What the whole model holds in bf16 beyond its run's format (opmap.mapping.memory.held_weight_bytes: the
    embedding, the LM head, the checkpoint's unquantized modules), from a capture whose block ``where[i]`` prices
    layer i: a parameter of block j (its path's first index, ``model.layers.j.``) counted once per layer it prices,
    one outside the blocks once."""
    import re

    from opmap.mapping.memory import bf16_extra_bytes

    total = 0.0
    for name, extra in bf16_extra_bytes(a.graph, a.precision.weight_scale, a.kept_gemms).items():
        hit = re.search(r"\.(\d+)\.", "." + name)
        total += extra * (where.count(int(hit.group(1))) if hit else 1)
    return total


class Pricer:
    """Prices prefill and decode points of one resolved model on one device under a layout and runtime."""

    def __init__(self, m: Resolved, hw, dtype: str, tp: int, pp: int, rt, queries: int = 1, ep: int = 1,
                 ep_imbalance: float = 1.0, dp_attention: bool = False):
        self.m, self.hw, self.dtype, self.tp, self.pp, self.rt = m, hw, dtype, tp, pp, rt
        self.queries = queries  # new tokens per sequence in a decode step (a speculative verify: K + 1)
        self.ep, self.ep_imbalance = ep, ep_imbalance  # experts over the tp group (opmap.mapping.device_time)
        # DP attention: tp is each rank's (1), the experts over the ep ranks, each rank its own batch
        self.dpa = dp_attention
        self._expert_held = 0.0  # the whole model's expert weight bytes at their stored format
        # the stack as a prefix and a period (opmap.serve.layer_period), or why it is captured whole
        self.stack, self.why_whole = m.stack()
        self.extrapolate = self.stack is not None
        self.experts = self.top_k = 0
        self.moe_grid: str | None = None  # where the MoE layers were priced off a measured grid (the analyses')
        self.expert_bytes_per_expert = 0.0
        self._held: float | None = None  # weight bytes the whole model holds at its stored format
        self._kv_per_token = 0.0  # KV bytes per token of the whole model, as captured
        self._kv_heads = 0
        self._inflight = 0.0
        self._prefill_seq = 0
        self._last_graph = None
        self._hw_key = repr(hw)  # the device as priced (runtime applied): part of the analyses' memo key
        self.rate_basis = ""  # the matrix rate the points ran at (a power-limited card: its sustained rate)

    # one capture at n layers: (analysis, sharder, per-kernel times under tp)
    def _analyze(self, make, spec, n: int, at: tuple[str, int, int]):
        """Capture (or take from the capture cache) the step ``make`` builds at ``n`` layers and analyse it.
        ``at``: (phase, batch, length) for the cache key."""
        from opmap.api import cached, keep
        from opmap.mapping.sharding import Sharder
        from opmap.phases.step import analyze_phase, capture_phase

        k = self.m.capture_key(n, *at)
        memo = (k, self._hw_key, self.dtype, self.rt.fusion) if k else None
        if memo is not None and memo in _ANALYSES:  # another layout of the same model, device and runtime
            g, a, s = _ANALYSES[memo]
            self._last_graph = g
            return a, s
        hit = cached(k)
        if hit is not None:
            g, w = hit[0], hit[1]
        else:
            self.m.set_layers(n)
            w = make()  # built after the layer count is set (a decode cache holds one (K, V) per layer)
            with warnings.catch_warnings():  # transformers' deprecation notes on its cache API: not the user's
                warnings.simplefilter("ignore", FutureWarning)
                g = capture_phase(w, spec)
            keep(k, g, w)
        self._last_graph = g
        # the workload's geometry cut to the n layers captured (Resolved.set_layers; a cache hit keeps it): each
        # layer's KV heads, causality and window as the config says, where the capture shows a windowed layer's SDPA
        # masked, K and V repeated, not causal
        a = analyze_phase(g, w, self.hw, self.dtype, spec, fusion=self.rt.fusion, steady=True).analysis
        s = Sharder(a)
        if memo is not None:
            _ANALYSES[memo] = (g, a, s)
            while len(_ANALYSES) > ANALYSES_KEPT:
                _ANALYSES.pop(next(iter(_ANALYSES)))
        return a, s

    def _terms(self, a, s) -> dict:
        """Per position of the captured graph (before the blocks, each block, after them): time under tp (no pp,
        each block with its TP all-reduces) and weight bytes read per device; the weights held."""

        self.moe_grid = self.moe_grid or a.assumptions.moe_grid
        sh = s.shard(self._layout()) if self.tp > 1 or self.dpa else None
        per_k = sh.kernel_s if sh is not None else [k.predicted_s for k in a.kernel_results]
        n = len(s.roles.blocks)
        index = {b: i for i, b in enumerate(s.roles.blocks)}
        moe = tuple(index[b] for b in s.roles.expert_blocks if b in index)
        blk = [0.0] * n
        for c in sh.collectives if sh is not None else ():  # the EP all-to-alls in the MoE blocks, the rest in each
            on = moe if c.purpose.startswith("EP ") and moe else range(n)
            for i in on:
                blk[i] += c.predicted_s * c.count / len(on)
        pre = post = 0.0
        for r, t in zip(s.rows, per_k):
            if r.pos < 0:
                pre += t
            elif r.pos >= n:
                post += t
            else:
                blk[r.pos] += t
        for r in a.results:
            i = index.get(s.roles.block.get(r.node.id), -1) + 1
            if sh is None and not r.cost.kernel and 0 < i:  # host dispatch of views (Analysis.predicted_latency_s)
                blk[i - 1] += r.pred.predicted_s
            elif sh is None and not r.cost.kernel:
                post += r.pred.predicted_s
        # weight bytes read per device, [outside, block 0, block 1, ...]: the shares analyze's floor reads too
        dense, expert = s.weight_bytes_by_position(self._layout())
        kvh = s.geo.kv_heads
        lat = sh.latency_s if sh is not None else a.predicted_latency_s
        return {"lat": lat, "pre": pre, "post": lat - pre - sum(blk), "blk": blk, "dense": dense,
                "expert": expert, "act": s.geo.act_bytes, "expert_params": s.roles.expert_params,
                "experts": s.geo.experts, "kv_heads": kvh, "blocks": n, "moe_blocks": moe}

    @property
    def how(self) -> str:
        """How the points were priced, for the table's source line."""
        st = self.stack
        if st is None or not self.extrapolate:
            how = f"captured whole ({self.why_whole or 'as asked'})"
        elif st.prefix == 0 and st.period == 1:
            how = "extrapolated in the layer count from 2-layer captures"
        else:
            how = f"extrapolated in the layer count from {st.long}-layer captures: {st.text}"
        return how + f"; steady load, matrix rate: {self.rate_basis}"

    def _layout(self, pp: int = 1):
        """The replica's layout: tp x pp devices, the experts over the tp group when ep > 1; with DP attention ep
        ranks of one device, each its own batch (analyze's Layout(ep=N, dp_attention=True).per_rank)."""
        from opmap.mapping.sharding import Parallelism

        if self.dpa:
            return Parallelism(tp=1, pp=1, dp=self.ep, devices=self.ep, ep=self.ep, ep_imbalance=self.ep_imbalance,
                               dp_attention=True)
        return Parallelism(tp=self.tp, pp=pp, devices=self.tp * pp, ep=self.ep, ep_imbalance=self.ep_imbalance)

    def _point(self, make, spec, at: tuple[str, int, int]) -> Point:
        L, pp, step = self.m.layers, self.pp, self.rt.per_step_s
        if not self.extrapolate:
            from opmap.mapping.sharding import shard

            a, s = self._analyze(make, spec, L, at)
            t = self._terms(a, s)
            self._note(a, t, tuple(range(L)))
            if self.dpa and pp > 1:  # each rank's stages: the capture's blocks are the model's layers
                lat, stage = self._stages(t["pre"], t["blk"], t["post"], t["act"])
            elif pp > 1 or self.tp > 1 or self.dpa:
                sh = shard(a, self._layout(pp))
                lat, stage = sh.latency_s, sh.microbatch_s
            else:
                lat = stage = t["lat"]
            return Point(lat + step, stage + step, sum(t["dense"]) / pp, sum(t["expert"]) / pp)
        st = self.stack
        a, s = self._analyze(make, spec, st.long, at)
        t = self._terms(a, s)
        where = st.blocks()
        self._note(a, t, where)
        lat, stage = self._stages(*self._layer_times(make, spec, at, t), t["act"])
        dense = t["dense"][0] + sum(t["dense"][1 + j] for j in where)
        expert = t["expert"][0] + sum(t["expert"][1 + j] for j in where)
        return Point(lat + step, stage + step, dense / pp, expert / pp)

    def _stages(self, pre: float, layer_s: list[float], post: float, act: float) -> tuple[float, float]:
        """(one microbatch through every stage, the slowest stage with its send): ceil(L / pp) layers a stage, the
        embedding on the first, the head on the last, pp - 1 activation sends."""
        pp = self.pp
        per = math.ceil(len(layer_s) / pp)
        stages = [0.0] * pp
        for i, x in enumerate(layer_s):
            stages[min(pp - 1, i // per)] += x
        stages[0] += pre
        stages[-1] += post
        send = self._send(act) if pp > 1 else 0.0
        return pre + post + sum(layer_s) + (pp - 1) * send, max(stages) + send

    def _layer_times(self, make, spec, at, t: dict) -> tuple[float, list[float], float]:
        """(before the blocks, each of the model's layers, after them) from the ``long`` capture's terms ``t``
        (module docstring): the prefix and tail layers as their own blocks, each period layer as the capture's
        second period. Where a block of the first period prices differently from its twin in the second (a kernel
        straddles a boundary the two periods do not share), the period is t(long) - t(short) from a ``short``
        capture, its layers the second period's blocks plus an equal share of the difference; the total is exact
        either way, a stage boundary inside the stack off by at most that kernel."""
        st = self.stack
        p, q, blk = st.prefix, st.period, t["blk"]
        first, second = blk[p:p + q], blk[p + q:p + 2 * q]
        period = sum(second)
        if any(abs(a - b) > 1e-9 * max(abs(b), 1e-30) for a, b in zip(first, second)):
            period = t["lat"] - self._terms(*self._analyze(make, spec, st.short, at))["lat"]
        d = [x + (period - sum(second)) / q for x in second]
        layer_s = [blk[j] if j < p or j >= p + 2 * q else d[(j - p) % q] for j in st.blocks()]
        pre = t["pre"]
        post = t["lat"] - pre - sum(blk[:p]) - 2 * period - sum(blk[p + 2 * q:])
        return pre, layer_s, post

    def _note(self, a, t, where: tuple[int, ...]) -> None:
        """The whole model's geometry, from a capture whose block ``where[i]`` prices layer i of the model (the
        identity for a whole capture): per-layer figures (experts held, KV bytes per token) summed over the
        model's layers, each as its block says (R1's dense layers hold no experts)."""
        L = len(where)
        n = max(1, t["blocks"])
        self.rate_basis = self.rate_basis or a.precision.rate_basis
        if self._held is None:
            self._held = self.m.held_bytes * a.precision.weight_scale + _bf16_extra(a, where)
        if t["experts"]:
            self.experts = t["experts"]
            self.top_k = self.m.top_k
            moe = set(t["moe_blocks"])
            moe_layers = sum(1 for j in where if j in moe) if moe else L
            per_layer_expert = t["expert_params"] / (len(moe) or n) / self.experts  # one expert in one MoE layer
            itemsize = a.graph.param_bytes / max(1, a.graph.params)
            one = per_layer_expert * itemsize * a.precision.weight_scale
            self.expert_bytes_per_expert = one * moe_layers / self.tp / self.pp
            self._expert_held = one * self.experts * moe_layers
        self._kv_heads = t["kv_heads"] or self._kv_heads
        self._kv_per_token = self._kv_bytes_per_token(a.graph, where, n) or self._kv_per_token

    @staticmethod
    def _kv_bytes_per_token(graph, where: tuple[int, ...], blocks: int) -> float:
        """KV bytes per token of the model, the captured ``graph``'s causal layers summed as ``where`` maps the
        model's layers onto its blocks (one causal attention a block); where the capture has not one a block, its
        mean per layer times the model's layers. 0: no KV cache."""
        from opmap.mapping.memory import kv_geometry

        geo = kv_geometry(graph)
        if not geo.layers:
            return 0.0
        if geo.layers != blocks or geo.geometry is None:
            return geo.bytes_per_token / geo.layers * len(where)
        per = [spec.kv_elements_per_token * geo.itemsize for spec in geo.geometry.attention]
        return float(sum(per[j] for j in where))

    def _send(self, act_bytes: float) -> float:
        """One stage's activation to the next: b s h / tp bytes point to point (opmap.mapping.sharding's PP send);
        under DP attention each rank's own b s h to its next stage's device, ep further on."""
        from opmap.mapping.collectives import Collective, collective_time
        from opmap.mapping.layout_collectives import placement

        if act_bytes <= 0:
            return 0.0
        width = self.ep if self.dpa else self.tp  # the devices of one stage
        link, stride = placement(self.hw, 2 * width, 2)  # the next stage's rank is a stage's width further on
        c = Collective("send_recv", act_bytes / self.tp, 2, link, stride=stride)
        return collective_time(self.hw, c).seconds

    def prefill(self, seq: int) -> Point:
        from opmap.mapping.memory import inflight_activation_bytes
        from opmap.workloads.phases import PhaseSpec

        p = self._point(lambda: self.m.prefill(seq), PhaseSpec("prefill"), ("prefill", 1, seq))
        if seq >= self._prefill_seq:  # the activations in flight, read off the longest prefill graph
            self._prefill_seq = seq
            self._inflight = inflight_activation_bytes(self._last_graph) / seq
        return p

    def decode(self, batch: int, kv: int) -> Point:
        from opmap.workloads.phases import PhaseSpec

        spec = PhaseSpec("decode", kv_len=kv, kv_write=self.rt.kv_write)
        q = self.queries
        phase = "decode" if q == 1 else f"decode q{q}"  # a verify step's graph is cached apart
        return self._point(lambda: self.m.decode(batch, kv, spec.kv_write, q), spec, (phase, batch, kv))

    def memory(self, kv_dtype: str, utilization: float, fraction_of: str = "total"):
        """Per device: capacity x utilization - weights held - runtime reserve (as ``fraction_of`` defines the
        fraction: ServingMemory), over KV bytes per token."""
        from opmap.mapping.memory import (
            ACTIVATION_TOKENS,
            ServingMemory,
            kv_bytes_per_token_per_device,
            runtime_reserve,
        )

        held, kv_captured = self._held or 0.0, self._kv_per_token
        per_tok = kv_captured * kv_dtype_bytes(kv_dtype) / self.m.kv_itemsize
        per_dev = kv_bytes_per_token_per_device(per_tok, self.m.layers, self._kv_heads, self.tp, self.pp)
        act = self._inflight * ACTIVATION_TOKENS / self.tp
        reserve = runtime_reserve(act, self.rt.name != "eager")
        # DP attention: every rank's stage holds its layers' dense weights whole and E / ep of their experts
        weights = (held - self._expert_held * (1 - 1 / self.ep)) / self.pp if self.dpa else held / (self.tp * self.pp)
        return ServingMemory(self.hw.memory_bytes, float(utilization), weights, reserve, per_dev, fraction_of)
