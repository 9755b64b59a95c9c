"""The sizing rules of each engine preset: the device, the layout, the model and the run in, the scheduler sizes
and the memory fraction the engine would pick out, each value with where it came from. The constants are the
presets' data (opmap/engines/*.toml); the code here is only the rules (which bucket, which formula).

- memory (``memory_rule``, before the model is priced): the fraction and what it is of (vLLM: of the whole device;
  SGLang: mem_fraction_static of the whole device for weights + KV, set from the device's memory bucket;
  TensorRT-LLM: of the memory free after the weights and buffers);
- scheduler (``engine_setting``, once the KV capacity is known): max sequences, the step's token budget, chunked
  prefill, KV block, admission (preemption or GUARANTEED_NO_EVICT) and the CUDA graph capture sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from opmap.engines.presets import EnginePreset
from opmap.engines.tables import (
    BatchDefaults,
    BenchHeuristic,
    BenchUntuned,
    BytesPerElement,
    MaxRunning,
    MemFraction,
    MemoryBuckets,
    SglangGraphs,
    TrtllmGraphs,
    VllmGraphs,
)
from opmap.errors import OpmapError
from opmap.record import key

GiB, MiB = 2 ** 30, 2 ** 20


@dataclass(frozen=True)
class MemoryRule:
    """The engine's memory knob: ``fraction`` of ``of`` (ServingMemory.fraction_of), and why."""

    fraction: float
    of: str
    why: str


@dataclass(frozen=True)
class SizingInputs:
    """What the engines' sizing reads of a priced replica and its run: the device (name, bytes), the layout, the
    priced memory per device (KV capacity in tokens, weights and KV bytes per token), the model (parameters,
    context length), the run's mean prompt and output lengths, whether it is offline (a throughput run: vLLM's
    LLM class), and the weight format (trtllm-bench's bytes per element)."""

    device: str
    device_bytes: float
    tp: int
    pp: int
    kv_capacity_tokens: int
    weights_bytes: float  # per device
    kv_bytes_per_token: float  # per device
    params: float
    context_len: int
    input_len: float
    output_len: float
    offline: bool
    dtype: str


@dataclass(frozen=True)
class EngineSetting:
    """An engine preset applied to one replica: the scheduler's sizes, the memory rule, the CUDA graph capture
    sizes, why each value is what it is (``why``, each naming its source) and the explicit flags that overrode the
    preset (``overrides``). Its record (serve.json's ``engine_preset``, fit's cells) is the preset's in place, then
    the sizes, the memory rule and the reasons."""

    preset: EnginePreset = field(metadata=key(flatten=True))
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_block: int
    chunked_prefill: bool
    no_evict: bool
    memory: MemoryRule
    cuda_graph_sizes: tuple[int, ...]
    why: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()

    def policy(self):
        from opmap.serve.policies import Engine

        return Engine(self.max_num_seqs, self.max_num_batched_tokens, self.kv_block, self.chunked_prefill,
                      self.no_evict)


# --- memory -------------------------------------------------------------------------------------------------


def memory_rule(preset: EnginePreset, device: str, device_bytes: float, tp: int, pp: int,
                fraction: float | None = None) -> MemoryRule:
    """The preset's memory fraction on this device and layout (``fraction``: an explicit value, in the engine's own
    sense, which wins)."""
    if fraction is not None:
        return MemoryRule(float(fraction), preset.memory_of, f"given ({preset.display}'s sense: of "
                                                             f"{preset.memory_of})")
    if preset.engine == "sglang":
        f, why = sglang_mem_fraction(preset, device_bytes, tp, pp)
        return MemoryRule(f, "static", why)
    return MemoryRule(float(preset.value("memory_fraction")), preset.memory_of, preset.source("memory_fraction"))


def sglang_bucket(preset: EnginePreset, device_bytes: float, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs) of the device's memory bucket (SGLang's gpu_mem is MiB)."""
    b = preset.rule(MemoryBuckets)
    mib = device_bytes / MiB
    for i, bound in enumerate(b.below_mib):
        if mib < bound:
            graph = b.cuda_graph_max_bs_small_tp[i] if tp < 4 else b.cuda_graph_max_bs_large_tp[i]
            return int(b.chunked_prefill_size[i]), int(graph)
    return int(b.above_chunked_prefill_size), int(b.above_cuda_graph_max_bs)


def sglang_mem_fraction(preset: EnginePreset, device_bytes: float, tp: int, pp: int) -> tuple[float, str]:
    """SGLang's default mem_fraction_static: round((gpu_mem - reserved) / gpu_mem, 3), reserved in MiB."""
    m = preset.rule(MemFraction)
    chunk, graph_bs = sglang_bucket(preset, device_bytes, tp)
    mib = device_bytes / MiB
    reserved = (m.base_mib + max(chunk, m.min_chunk) * m.per_chunk_token_mib
                + graph_bs * m.per_graph_bs_mib + tp * pp * m.per_rank_mib)
    if mib > m.floor_above_mib:
        reserved = max(reserved, m.floor_mib)
    f = round((mib - reserved) / mib, 3)
    return f, (f"mem_fraction_static {f:g} = ({mib:.0f} - {reserved:.0f}) / {mib:.0f} MiB (chunked_prefill_size "
               f"{chunk}, cuda_graph_max_bs {graph_bs}, tp {tp} pp {pp}; {m.source})")


# --- scheduler ----------------------------------------------------------------------------------------------


def engine_setting(preset: EnginePreset, x: SizingInputs, memory: MemoryRule) -> EngineSetting:
    """The preset's scheduler sizes for this replica and run (before any explicit override: ``override``)."""
    rule = {"vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm, "trtllm-bench": _trtllm_bench}[preset.engine]
    seqs, tokens, graphs, why = rule(preset, x, memory)
    block, chunked = int(preset.value("kv_block")), bool(preset.value("chunked_prefill"))
    why = (*why, f"KV block {block}: {preset.source('kv_block')}",
           f"{'chunked' if chunked else 'whole'} prompts: {preset.source('chunked_prefill')}", f"memory: {memory.why}")
    if tokens < seqs:  # opmap's engine holds one token of the budget per running sequence (vLLM refuses it)
        why = (*why, f"max sequences {seqs} capped at the token budget {tokens}: a step holds one token per sequence")
        seqs = tokens
    return EngineSetting(preset, int(seqs), int(tokens), block, chunked, preset.scheduler == "noevict", memory,
                         tuple(graphs), why)


def override(s: EngineSetting, max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
             kv_block: int | None = None, chunked_prefill: bool | None = None) -> EngineSetting:
    """``s`` with the values given by explicit flags, each override stated."""
    given = {"max_num_seqs": (max_num_seqs, "--max-num-seqs"),
             "max_num_batched_tokens": (max_num_batched_tokens, "--max-num-batched-tokens"),
             "kv_block": (kv_block, "--kv-block"), "chunked_prefill": (chunked_prefill, "--chunked-prefill")}
    changes, said = {}, []
    for name, (v, flag) in given.items():
        if v is not None and v != getattr(s, name):
            changes[name] = v
            said.append(f"{name} {v} ({flag}; the preset's {getattr(s, name)})")
    if not changes:
        return s
    return replace(s, **changes, overrides=(*s.overrides, *said))


def _vllm(p: EnginePreset, x: SizingInputs, memory: MemoryRule) -> tuple[int, int, list[int], tuple[str, ...]]:
    d = p.rule(BatchDefaults)
    large = x.device_bytes >= d.large_memory_gib * GiB and d.excluded_name not in x.device.lower()
    tokens, seqs = d.sizes(large, x.offline)
    seqs = min(seqs, tokens)
    why = (f"{seqs} sequences, {tokens} tokens: {'LLM class (offline run)' if x.offline else 'OpenAI API server'} "
           f"on a {'>= ' if large else '< '}{d.large_memory_gib} GiB{' non-A100' if large else ' or A100'} "
           f"device ({d.source})",)
    return seqs, tokens, vllm_graph_sizes(p, seqs), why


def vllm_graph_sizes(p: EnginePreset, max_num_seqs: int) -> list[int]:
    """vLLM's default cudagraph_capture_sizes for ``max_num_seqs`` (no speculative tokens)."""
    g = p.rule(VllmGraphs)
    top = min(max_num_seqs * g.per_seq, g.cap)
    sizes = [s for s in g.first if s <= top]
    sizes += list(range(8, min(top + 1, g.step8_below), 8)) if top >= 8 else []
    sizes += list(range(g.step16_from, top + 1, 16)) if top >= g.step16_from else []
    return sorted(set(sizes))


def _sglang(p: EnginePreset, x: SizingInputs, memory: MemoryRule) -> tuple[int, int, list[int], tuple[str, ...]]:
    chunk, graph_bs = sglang_bucket(p, x.device_bytes, x.tp)
    seqs = sglang_max_running(p, x.kv_capacity_tokens, x.context_len)
    tokens = chunk + seqs  # one prefill chunk beside a decode batch of every running request (see why)
    why = (f"{seqs} running requests = min(KV tokens {x.kv_capacity_tokens} // 2, the request pool "
           f"min(max(int(KV tokens / context {x.context_len} x 512), 2048), 4096)) ({p.rule(MaxRunning).source})",
           f"chunked_prefill_size {chunk}, cuda_graph_max_bs {graph_bs} ({p.rule(MemoryBuckets).source})",
           f"a step's budget {tokens} = chunk {chunk} + {seqs} decodes: SGLang runs a prefill batch and a decode "
           "batch as separate steps (mixed chunks off by default); opmap's engine step carries both (approximated)")
    return seqs, tokens, sglang_graph_sizes(p, graph_bs), why


def sglang_max_running(p: EnginePreset, kv_tokens: int, context_len: int) -> int:
    r = p.rule(MaxRunning)
    pool = min(max(int(kv_tokens / max(1, context_len) * r.pool_per_context), r.pool_min), r.pool_max)
    return max(1, min(int(kv_tokens * r.per_token), pool))


def sglang_graph_sizes(p: EnginePreset, max_bs: int) -> list[int]:
    first = list(p.rule(SglangGraphs).first)
    sizes = first + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(range(512, max_bs + 1, 32))
    return [s for s in sizes if s <= max_bs]


def _trtllm(p: EnginePreset, x: SizingInputs, memory: MemoryRule) -> tuple[int, int, list[int], tuple[str, ...]]:
    seqs, tokens = int(p.value("max_num_seqs")), int(p.value("max_num_batched_tokens"))
    why = (f"max_batch_size {seqs}: {p.source('max_num_seqs')}",
           f"max_num_tokens {tokens}: {p.source('max_num_batched_tokens')}")
    return seqs, tokens, trtllm_graph_sizes(p), why


def trtllm_graph_sizes(p: EnginePreset) -> list[int]:
    """TensorRT-LLM's default CUDA graph batch sizes (CudaGraphConfig without padding, max_batch_size 128)."""
    g = p.rule(TrtllmGraphs)
    top = int(g.max_batch_size)
    sizes = list(range(1, 32)) + list(g.first) + [2 ** i for i in range(8, math.ceil(math.log2(top)))]
    return sorted(s for s in set(sizes) if s <= top)


def _trtllm_bench(p: EnginePreset, x: SizingInputs, memory: MemoryRule):
    u = p.rule(BenchUntuned)
    if u.applies(x.dtype):  # build.py: the heuristic only for TUNED_QUANTS, else BuildConfig's defaults
        why = (f"max_batch_size {u.max_batch_size}, max_num_tokens {u.max_num_tokens}: a {x.dtype} checkpoint's "
               f"quant_algo is not among the heuristic's tuned ones ({', '.join(f for f in u.tuned if f)}), so "
               f"trtllm-bench takes BuildConfig's defaults ({u.source})",)
        return u.max_batch_size, u.max_num_tokens, [], why
    b = p.rule(BytesPerElement)
    wb = b.of(x.dtype)  # tuning.py: BYTES_PER_ELEM.get(quant_algo, 2)
    kv_total = x.kv_bytes_per_token * x.tp * x.pp  # = 2 x layers x max(tp, KV heads) x head dim x KV bytes
    h = trtllm_bench_setting(x.params, wb, kv_total, x.device_bytes, x.tp, x.pp, x.input_len, x.output_len,
                             memory.fraction, p.rule(BenchHeuristic))
    why = (f"max_batch_size {h.max_batch_size}, max_num_tokens {h.max_num_tokens} from the data set's "
           f"{x.input_len:g}/{x.output_len:g} tokens: engine {h.engine_gib:.3g} GiB ({x.params / 1e9:.4g}B parameters "
           f"x {wb:g} B), KV cache {h.cache_gib:.4g} GiB = ({x.device_bytes / GiB:.4g} GiB x {x.tp * x.pp} - engine) x "
           f"{memory.fraction:g}, {h.requests:.1f} requests of {x.input_len + x.output_len:g} tokens "
           f"({p.rule(BenchHeuristic).source}; {b.source})",)
    return h.max_batch_size, h.max_num_tokens, [], why


@dataclass(frozen=True)
class BenchSizing:
    """trtllm-bench's engine sizing (tuning.py): the engine and KV cache GiB it assumed, the requests that fit,
    and the max_batch_size / max_num_tokens it picked."""

    engine_gib: float
    cache_gib: float
    requests: float
    max_batch_size: int
    max_num_tokens: int


def trtllm_bench_setting(params: float, weight_bytes: float, kv_bytes_per_token: float, device_bytes: float,
                         tp: int, pp: int, isl: float, osl: float, fraction: float,
                         h: BenchHeuristic | None = None) -> BenchSizing:
    """trtllm-bench's calc_engine_setting + finetune_setting: ``params`` x ``weight_bytes`` is the engine,
    ``kv_bytes_per_token`` the whole replica's (2 x layers x max(tp, KV heads) x head dim x KV bytes), the device's
    memory in GiB x tp x pp less the engine x ``fraction`` the KV cache; ``h``: the heuristic's constants (the
    trtllm-bench preset's ``heuristic`` table)."""
    if h is None:
        from opmap.engines.presets import parse_preset

        h = parse_preset("trtllm-bench").rule(BenchHeuristic)
    if not (isl > 0 and osl > 0 and kv_bytes_per_token > 0):
        raise OpmapError("trtllm-bench sizing needs prompt and output lengths above 0 and a KV cache")
    engine = params * weight_bytes / GiB
    cache = (device_bytes / GiB * tp * pp - engine) * fraction
    requests = cache / (kv_bytes_per_token / GiB * (isl + osl))
    if requests < 1:
        raise OpmapError(f"trtllm-bench sizing: the KV cache ({cache:.3g} GiB) holds no request of {isl + osl:g} "
                         "tokens; raise --tp or --pp")
    raw_bs = min(requests, h.max_requests) / pp
    raw_tok = min(raw_bs * (1 + isl / osl), h.max_tokens)
    return BenchSizing(engine, cache, requests, _round_up(raw_bs, h.bs_steps, h.bs_step_above, h.bs_min),
                       _round_up(raw_tok, h.token_steps, h.token_step_above, h.token_min))


def _round_up(x: float, steps: tuple[tuple[int, int], ...], above: int, floor: int) -> int:
    """finetune_setting's rounding: up to the first step whose bound ``x`` is under (the first step with
    ``floor`` as a minimum), else to ``above``."""
    for i, (bound, step) in enumerate(steps):
        if x < bound:
            v = step * math.ceil(x / step)
            return max(floor, v) if i == 0 else v
    return above * math.ceil(x / above)


# --- CUDA graphs, without a priced replica (sweep) -----------------------------------------------------------


def device_graph_sizes(preset: EnginePreset, device: str, device_bytes: float, tp: int,
                       offline: bool = False) -> tuple[tuple[int, ...], str]:
    """The CUDA graph capture sizes the engine takes on this device and TP degree where they do not depend on the
    KV pool (vLLM: from its device's max_num_seqs; SGLang: from its memory bucket; TensorRT-LLM: fixed), and where
    they come from; () for trtllm-bench (its engine's graphs are not among the values read)."""
    if preset.engine == "vllm":
        x = SizingInputs(device, device_bytes, tp, 1, 0, 0.0, 0.0, 0.0, 0, 1.0, 1.0, offline, "")
        seqs = _vllm(preset, x, MemoryRule(0.9, "total", ""))[0]
        return tuple(vllm_graph_sizes(preset, seqs)), preset.rule(VllmGraphs).source
    if preset.engine == "sglang":
        return (tuple(sglang_graph_sizes(preset, sglang_bucket(preset, device_bytes, tp)[1])),
                preset.rule(SglangGraphs).source)
    if preset.engine == "trtllm":
        return tuple(trtllm_graph_sizes(preset)), preset.rule(TrtllmGraphs).source
    return (), "trtllm-bench's CUDA graph sizes are not among the values read"


def graph_batch(batch: int, sizes: tuple[int, ...]) -> int | None:
    """The captured graph a decode step of ``batch`` sequences replays: the smallest capture size at least
    ``batch`` (the step padded up to it); None past the largest (the step runs without a full graph)."""
    return next((s for s in sorted(sizes) if s >= batch), None)
