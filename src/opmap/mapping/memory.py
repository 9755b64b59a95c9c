"""Memory fit: what one device holds for a training step or an inference phase, and whether it fits.

Per device: weights, gradients, optimizer state (by ZeRO stage), activations, KV cache, workspace.

- Activations kept for backward are *measured* (opmap.mapping.activations.saved_activation_bytes).
- Weights / gradients / optimizer state follow the ZeRO paper's accounting (Rajbhandari et al. 2020, sec. 3.1
  and Fig. 1): mixed-precision AdamW keeps 2 B weights, 2 B gradients and K = 12 B of fp32 optimizer state
  (master weights, momentum, variance) per parameter; stage 1 shards the optimizer state over data
  parallelism, stage 2 the gradients too, stage 3 the weights too. ``training_state_bytes``.
- KV cache: 2 (K and V) x layers x KV heads x head dim x tokens x bytes (vLLM, Kwon et al. 2023, sec. 3;
  ``cache_engine.py``), read off the graph's causal attention calls so GQA is what the model does.
- Workspace: an assumed constant (``WORKSPACE``), named with what it stands for.

``fit_inference`` and ``fit_training`` put the terms together against the device's ``memory_bytes`` and find
the largest batch and the longest context that fit (an out-of-memory plan is a result with a reason).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from opmap.errors import OpmapError
from opmap.geometry import ModelGeometry, attention_calls, forward_calls, layer_specs
from opmap.record import key

if TYPE_CHECKING:
    from opmap.graph import OpGraph

ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class Assumed:
    """A value the model assumes rather than measures or reads off a datasheet, with what it stands for."""

    value: float
    kind: str
    source: str


WORKSPACE = Assumed(
    float(1 << 30), "assumed",
    "CUDA context and library handles (cuBLAS, cuDNN: about 0.5 GiB of device memory for a PyTorch process, as "
    "nvidia-smi shows it), cuBLAS workspace (32 MiB per handle on Hopper, PyTorch's default) and caching-allocator "
    "slack; 1 GiB in all, not measured")


# -- weights, gradients, optimizer state --------------------------------------------------------------------

BF16_BYTES = 2.0


def held_weight_bytes(graph: OpGraph, weight_scale: float, kept_gemms: frozenset[int] = frozenset()) -> float:
    """The weights one device holds for inference at their stored formats: every parameter at the run's format
    (``weight_scale``: stored over captured bytes) except those a quantized checkpoint keeps in bf16, where the run's
    format is narrower than bf16: the embedding tables (ModelOpt, AWQ and GPTQ quantize nn.Linear weights only:
    NVIDIA/TensorRT-Model-Optimizer modelopt/torch/quantization/config.py's default configs quantize ``*weight_
    quantizer`` of Linear modules; the embedding is no Linear) and the weights of ``kept_gemms`` (the LM head, the
    MoE routers and the checkpoint's modules_to_not_convert: opmap.mapping.fp8.inference_bf16_nodes). A parameter
    is counted once (a tied embedding and LM head)."""
    return graph.param_bytes * weight_scale + sum(bf16_extra_bytes(graph, weight_scale, kept_gemms).values())


def bf16_extra_bytes(graph: OpGraph, weight_scale: float, kept_gemms: frozenset[int] = frozenset()
                     ) -> dict[str, float]:
    """Per parameter a quantized run keeps in bf16 (held_weight_bytes), the bytes it holds over its size at the run's
    format; empty where the format is not narrower than bf16."""
    itemsize = graph.param_bytes / graph.params if graph.params else 0.0
    stored = itemsize * weight_scale
    if stored >= BF16_BYTES or not graph.param_sizes:
        return {}
    kept = {t.param for n in graph.nodes if n.packet == "embedding" or n.id in kept_gemms
            for t in n.inputs if t.param is not None}
    sizes = dict(graph.param_sizes)
    return {p: sizes[p] * (BF16_BYTES - stored) for p in sorted(kept) if p in sizes}


@dataclass(frozen=True)
class TrainingState:
    """Per-device bytes of the model state under mixed-precision AdamW and a ZeRO stage."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    zero: int
    dp: int
    note: str = ""

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes


# Bytes per parameter by training format: (weights, gradients, optimizer state), the format registry's ``train``
# values (opmap.formats, formats.toml).
# bf16 / fp16: the ZeRO paper's mixed-precision Adam (Rajbhandari et al. 2020, sec. 3.1): 2 + 2 + K, K = 12
# (fp32 master weights, momentum, variance). Megatron-LM keeps fp32 main gradients instead (4 B: its
# docs/source/distrib_optimizer.md lists 18 B per parameter for bf16 params with fp32 grads): pass
# grad_bytes=4 for that. fp32 training: no master copy, K = 8 (two fp32 moments).
# fp8 (Transformer Engine): bf16 weights (2 B) plus the fp8 copy and its transpose TE caches for the iteration
# (1 + 1 B), bf16 gradients, fp32 master weights and AdamW moments (12 B), as bf16 mixed precision.
def train_formats() -> tuple[str, ...]:
    """The formats a training step's state is modelled in."""
    from opmap.formats import registry

    return registry().names(train=True)


FP8_STATE_NOTE = ("; fp8 weights: 2 B bf16 + 1 B fp8 e4m3 copy + 1 B its transpose (Transformer Engine caches both for "
                  "the iteration), counted on every parameter (the embedding, LM head and norms keep none: an "
                  "overstatement of 2 B on those)")


def training_state_bytes(params: float, zero: int = 0, dp: int = 1, fmt: str = "bf16",
                         grad_bytes: float | None = None) -> TrainingState:
    """Weights, gradients and AdamW state per device for ``params`` parameters trained in ``fmt`` with ZeRO
    stage ``zero`` over ``dp`` data-parallel ranks (Rajbhandari et al. 2020, Fig. 1: stage 0
    (2 + 2 + K) P; 1: 2P + 2P + K P / N; 2: 2P + (2 + K) P / N; 3: (2 + 2 + K) P / N)."""
    if zero not in ZERO_STAGES:
        raise OpmapError(f"unknown ZeRO stage {zero!r}; accepted: 0, 1, 2, 3")
    if dp < 1:
        raise OpmapError(f"data-parallel size must be at least 1, got {dp}")
    from opmap.formats import registry

    f = registry().get(fmt)
    if f is None or f.train is None:
        raise OpmapError(f"training in {fmt!r} is not modelled; accepted: {', '.join(train_formats())}")
    w, g, k = f.train
    g = g if grad_bytes is None else grad_bytes
    return TrainingState(params * w / (dp if zero >= 3 else 1), params * g / (dp if zero >= 2 else 1),
                         params * k / (dp if zero >= 1 else 1), zero, dp,
                         f"AdamW, {fmt} weights {w:g} B, gradients {g:g} B, optimizer state {k:g} B per parameter; "
                         f"ZeRO stage {zero} over {dp} ranks" + (FP8_STATE_NOTE if f.train_scaled_gemms else ""))


# -- KV cache ---------------------------------------------------------------------------------------------

def kv_cache_bytes(layers: int, kv_heads: int, head_dim: int, tokens: int, dtype_bytes: float = 2.0,
                   batch: int = 1, window: int | None = None) -> float:
    """2 (K and V) x layers x KV heads x head dim x tokens x bytes x batch; a sliding window caps the tokens
    kept at the window (vLLM, Kwon et al. 2023, sec. 3)."""
    kept = min(tokens, window) if window else tokens
    return 2.0 * layers * kv_heads * head_dim * kept * dtype_bytes * batch


@dataclass(frozen=True)
class KVGeometry:
    """The KV cache one token adds, read off the graph: one entry per causal attention call."""

    layers: int
    bytes_per_token: float  # K and V of every layer, one sequence
    heads: tuple[int, ...] = ()  # KV heads per layer
    head_dim: int = 0
    window: int | None = None  # the sliding window every layer has (None: none, or not every layer)
    geometry: ModelGeometry | None = None  # the cached layers, each with its own window (None: no KV cache)
    itemsize: float = 0.0  # bytes per cached element

    def sequence_bytes(self, tokens: int) -> float:
        """K and V bytes of one sequence of ``tokens`` tokens: each layer holds min(tokens, its window)."""
        if self.geometry is None:
            return self.bytes_per_token * (min(tokens, self.window) if self.window else tokens)
        return self.geometry.kv_bytes(tokens, self.itemsize)

    @property
    def text(self) -> str:
        """What one token caches, in words (MLA's latent, the sliding layers' window), for the memory line."""
        return self.geometry.kv_text() if self.geometry is not None else ""


def kv_geometry(graph: OpGraph) -> KVGeometry:
    """K and V bytes per token of the graph's causal attention layers (opmap.geometry.attention_calls: its fused
    SDPA calls, K (B, H_kv, S, D) at its dtype, or its ``kv_cache`` marks where attention runs eager,
    opmap.capture.functions.kv_cache; each layer as the geometry the graph carries says, opmap.geometry.layer_specs):
    ModelGeometry.kv_bytes_per_token at the capture's element size. No causal attention (an encoder, a CNN): no KV
    cache."""
    calls = attention_calls(graph)
    pairs = [(c, s) for c, s in zip(calls, layer_specs(graph, calls)) if s.causal]
    if not pairs:
        return KVGeometry(0, 0.0, (), 0)
    geo = ModelGeometry(len(pairs), 0, 0, tuple(s for _, s in pairs), source="graph")
    size = pairs[0][0].itemsize
    return KVGeometry(geo.layers, geo.kv_bytes_per_token(size), tuple(a.n_kv_heads for a in geo.attention),
                      geo.attention[-1].head_dim, geo.window, geo, size)


def kv_cache_held_bytes(graph: OpGraph) -> float:
    """Bytes of the KV cache the captured step holds, every sequence and every layer: the key and value tensors of
    each attention call that keeps a cache, a causal one (a prefill writes its prompt's K and V) or one with fewer
    queries than keys (a decode step reads its cache; a sliding window's layer keeps the window): 2 x KV heads x
    head dim x tokens x bytes x batch per layer (vLLM, Kwon et al. 2023, sec. 3). An encoder's attention keeps
    none."""
    calls = forward_calls(graph)
    total = 0.0
    for c, s in zip(calls, layer_specs(graph, calls)):
        if c.fused and (s.causal or c.q_tokens < c.kv_tokens):
            total += c.held_bytes(s)
    return total


# -- the fit ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MemoryFit:
    """Per-device bytes by kind, the device's capacity, the verdict (with its reason when it does not fit),
    and the largest batch and longest context that fit (None: not searched; 0: not even one). Its record
    (analysis.json's ``memory``) is the bytes by kind with their total, then the verdict (``RECORD``)."""

    RECORD: ClassVar[tuple[str, ...]] = ("per_device", "capacity_bytes", "fits", "reason", "max_batch", "max_context",
                                         "phase", "assumptions")
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    kv_cache_bytes: float
    workspace_bytes: float
    capacity_bytes: float
    phase: str
    max_batch: int | None = None
    max_context: int | None = None
    assumptions: tuple[str, ...] = field(default_factory=tuple)

    @property
    def total_bytes(self) -> float:
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes
                + self.kv_cache_bytes + self.workspace_bytes)

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    @property
    def per_device(self) -> dict[str, float]:
        return {"weights_bytes": self.weights_bytes, "gradients_bytes": self.gradients_bytes,
                "optimizer_bytes": self.optimizer_bytes, "activations_bytes": self.activations_bytes,
                "kv_cache_bytes": self.kv_cache_bytes, "workspace_bytes": self.workspace_bytes,
                "total_bytes": self.total_bytes}

    @property
    def reason(self) -> str:
        """Empty when it fits; else what is needed against what the device has, and the largest term."""
        if self.fits:
            return ""
        terms = {k[:-6]: v for k, v in self.per_device.items() if k != "total_bytes"}
        big = max(terms, key=terms.get)
        return (f"needs {_gb(self.total_bytes)} per device, the device has {_gb(self.capacity_bytes)} "
                f"({self.total_bytes / self.capacity_bytes:.2f}x); the largest term is {big.replace('_', ' ')} "
                f"at {_gb(terms[big])}")

    @property
    def text(self) -> str:
        parts = ", ".join(f"{k[:-6].replace('_', ' ')} {_gb(v)}" for k, v in self.per_device.items()
                          if v and k != "total_bytes")
        head = "fits" if self.fits else "does not fit"
        return f"{head}: {parts}; total {_gb(self.total_bytes)} of {_gb(self.capacity_bytes)}" + (
            "" if self.fits else f" ({self.reason})")


def _gb(x: float) -> str:
    """Binary GiB, the unit vendors state device memory in (an H100's 80 GB of HBM is 80 GiB)."""
    return f"{x / 2**30:.4g} GiB"


def largest(fits: Callable[[int], bool], hi: int) -> int:
    """The largest n in [1, hi] with ``fits(n)`` (``fits`` monotone: true then false), 0 if none."""
    if hi < 1 or not fits(1):
        return 0
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def fit_inference(weights_bytes: float, kv_bytes_per_token: float, capacity_bytes: float, batch: int,
                  context: int, activations: Callable[[int, int], float] | None = None,
                  workspace: Assumed = WORKSPACE, window: int | None = None, max_context: int = 1 << 20,
                  max_batch: int = 1 << 20, kv_bytes: Callable[[int], float] | None = None,
                  kv_text: str = "") -> MemoryFit:
    """Inference (prefill or decode) on one device: weights at their stored format, the KV cache of
    ``batch`` sequences of ``context`` tokens (capped at ``window``), activations in flight
    (``activations(batch, context)`` bytes; 0 if not given) and the workspace.

    max_batch: the largest batch at ``context`` that fits; max_context: the longest context at ``batch``
    (searched up to ``max_context``), with the weights and workspace fixed. ``kv_bytes(tokens)``: one sequence's
    KV cache where layers keep different windows (gpt-oss: sliding and full layers alternate); ``kv_text`` says
    what a token caches, in words."""
    act = activations or (lambda b, s: 0.0)
    seq_kv = kv_bytes or (lambda s: kv_bytes_per_token * (min(s, window) if window else s))

    def make(b: int, s: int, **kw) -> MemoryFit:
        return MemoryFit(weights_bytes, 0.0, 0.0, act(b, s), seq_kv(s) * b, workspace.value,
                         capacity_bytes, "inference", **kw)

    mb = largest(lambda b: make(b, context).fits, max_batch)
    mc = largest(lambda s: make(batch, s).fits, max_context)
    notes = (f"workspace {workspace.value / 2**30:g} GiB ({workspace.kind}): {workspace.source}",
             f"KV cache {kv_bytes_per_token:g} B per token" + (f", capped at a {window}-token window" if window
                                                                   else "") + (f" ({kv_text})" if kv_text else ""))
    return make(batch, context, max_batch=mb, max_context=mc, assumptions=notes)


def fit_training(state: TrainingState, capacity_bytes: float, batch: int, seq: int,
                 activations: Callable[[int, int], float], workspace: Assumed = WORKSPACE,
                 max_context: int = 1 << 20, max_batch: int = 1 << 20) -> MemoryFit:
    """A training step on one device: the model state (``training_state_bytes``), the activations kept for
    backward at (``batch``, ``seq``) (``activations(batch, seq)``, e.g. ``activation_model``) and the workspace;
    the largest micro-batch and longest sequence that fit."""
    def make(b: int, s: int, **kw) -> MemoryFit:
        return MemoryFit(state.weights_bytes, state.gradients_bytes, state.optimizer_bytes, act_cache(b, s), 0.0,
                         workspace.value, capacity_bytes, "training", **kw)

    cache: dict[tuple[int, int], float] = {}

    def act_cache(b: int, s: int) -> float:
        if (b, s) not in cache:
            cache[(b, s)] = activations(b, s)
        return cache[(b, s)]

    mb = largest(lambda b: make(b, seq).fits, max_batch)
    mc = largest(lambda s: make(batch, s).fits, max_context)
    notes = (state.note, f"workspace {workspace.value / 2**30:g} GiB ({workspace.kind}): {workspace.source}")
    return make(batch, seq, max_batch=mb, max_context=mc, assumptions=notes)


def activation_model(measure: Callable[[int, int], float], batch: int, seq: int) -> Callable[[int, int], float]:
    """Activations at any (batch, seq) from three measurements: linear in batch; in seq a s + c s^2 fitted
    through (seq, 2 seq) at ``batch`` (the S^2 term is the unfused attention's; 0 with fused attention), so a
    sweep does not rerun the forward. ``measure(b, s)`` -> bytes."""
    m1, m2 = measure(batch, seq), measure(batch, 2 * seq)
    # m(s) = a s + c s^2: m2 - 2 m1 = 2 c s^2
    c = (m2 - 2 * m1) / (2 * seq * seq)
    a = (m1 - c * seq * seq) / seq
    return lambda b, s: max(0.0, (a * s + c * s * s) * b / batch)


def inflight_activation_bytes(graph: OpGraph) -> float:
    """Activations in flight for inference, read off the graph: the largest single op's activation inputs and
    outputs (parameters and views left out). A lower bound on what is live at once (one layer's working set
    in an eager run frees each intermediate after its last use)."""
    best = 0.0
    for n in graph.nodes:
        if n.is_view:
            continue
        need = sum(t.storage_bytes for t in n.inputs if t.param is None) + sum(t.nbytes for t in n.outputs)
        best = max(best, need)
    return best


# -- serving: what a replica's device holds beside its KV cache -----------------------------------------------

CUDA_GRAPH_POOL = Assumed(
    float(1 << 29), "estimate",
    "the memory pool the captured CUDA graphs of the decode batch sizes keep (graphs / engine runtimes): vLLM "
    "logs 0.21 GiB for Llama-3.2-1B (vllm-project/vllm#11349), 0.36 GiB (gpustack/runner#251) and 1.40 GiB for "
    "Llama-4 Maverick (sgl-project/sglang#8538); 0.5 GiB taken")
ACTIVATION_TOKENS = 8192  # the tokens of the largest step the engine profiles (its token budget per step)


def kv_bytes_per_token_per_device(bytes_per_token: float, layers: int, kv_heads: int, tp: int = 1,
                                  pp: int = 1) -> float:
    """KV bytes one token costs on one device of a tp x pp replica, given ``bytes_per_token`` for the whole
    model (2 x layers x KV heads x head dim x KV bytes): the device's stage holds ceil(layers / pp) layers and
    max(1, kv_heads / tp) of each layer's KV heads (a KV head is replicated on tp / kv_heads ranks when tp
    exceeds the KV heads, as Megatron-LM and vLLM do), so the share is ceil(layers / pp) / layers / min(tp,
    kv_heads)."""
    layers = max(1, layers)
    return bytes_per_token * math.ceil(layers / pp) / layers / max(1, min(tp, kv_heads or tp))


FRACTION_OF = ("total", "static", "free")  # what an engine's memory fraction is of (ServingMemory.fraction_of)


@dataclass(frozen=True)
class ServingMemory:
    """One device of a serving replica: ``capacity_bytes`` (as the catalog states it), the ``utilization``
    fraction the engine may take (vLLM's --gpu-memory-utilization), the weights it holds, the runtime reserve
    (workspace, activations of the largest step in flight, the CUDA graph pool), and the KV cache that fits in
    the rest: usable = capacity x utilization - weights - reserve; KV tokens = usable / KV bytes per token. Its
    record (serve.json's ``cost.memory``) states the derived bytes beside the inputs (``RECORD``).
    ``fraction_of`` says what ``utilization`` is a fraction of, as engines define their memory knob
    (opmap.engines): "total" (vLLM's gpu_memory_utilization, the default: the whole device holds weights, reserve
    and KV), "static" (SGLang's mem_fraction_static: of the whole device for weights + KV only, the activations and
    graphs outside it: usable = capacity x utilization - weights) or "free" (TensorRT-LLM's
    free_gpu_memory_fraction: of what is free after the weights and the runtime's buffers: usable = utilization x
    (capacity - weights - reserve)); written as ``utilization_of`` where it is not "total"."""

    RECORD: ClassVar[tuple[str, ...]] = ("capacity_bytes", "utilization", "usable_bytes", "weights_bytes",
                                         "reserve_bytes", "kv_bytes", "kv_bytes_per_token", "kv_capacity_tokens",
                                         "reserve", "units", "fraction_of")
    units: ClassVar[str] = "bytes per device; capacity as the catalog states it (GiB of HBM)"
    capacity_bytes: float
    utilization: float
    weights_bytes: float
    reserve: dict[str, Assumed]
    kv_bytes_per_token: float
    fraction_of: str = field(default="total", metadata=key("utilization_of", omit="default"))

    def __post_init__(self) -> None:
        if self.fraction_of not in FRACTION_OF:
            raise ValueError(f"fraction_of {self.fraction_of!r}: accepted {', '.join(FRACTION_OF)}")

    @property
    def reserve_bytes(self) -> float:
        return sum(v.value for v in self.reserve.values())

    @property
    def usable_bytes(self) -> float:
        if self.fraction_of == "static":
            return self.capacity_bytes * self.utilization - self.weights_bytes
        if self.fraction_of == "free":
            return self.utilization * (self.capacity_bytes - self.weights_bytes - self.reserve_bytes)
        return self.capacity_bytes * self.utilization - self.weights_bytes - self.reserve_bytes

    @property
    def kv_capacity_tokens(self) -> int:
        if self.kv_bytes_per_token <= 0:
            return 0
        return max(0, int(self.usable_bytes // self.kv_bytes_per_token))

    @property
    def kv_bytes(self) -> float:
        """The KV cache allocated: whole tokens of the usable bytes."""
        return self.kv_capacity_tokens * self.kv_bytes_per_token

    def line(self) -> str:
        g = 2 ** 30
        if self.fraction_of == "static":
            return (f"memory per device: {self.capacity_bytes / g:.4g} GiB x {self.utilization:g} (weights + KV) - "
                    f"weights {self.weights_bytes / g:.4g} GiB = KV {max(0.0, self.usable_bytes) / g:.4g} GiB "
                    f"({self.kv_capacity_tokens:,} tokens); reserve {self.reserve_bytes / g:.3g} GiB outside it")
        if self.fraction_of == "free":
            return (f"memory per device: {self.utilization:g} x ({self.capacity_bytes / g:.4g} GiB - weights "
                    f"{self.weights_bytes / g:.4g} GiB - reserve {self.reserve_bytes / g:.3g} GiB) = KV "
                    f"{max(0.0, self.usable_bytes) / g:.4g} GiB ({self.kv_capacity_tokens:,} tokens)")
        return (f"memory per device: {self.capacity_bytes / g:.4g} GiB x {self.utilization:g} - weights "
                f"{self.weights_bytes / g:.4g} GiB - reserve {self.reserve_bytes / g:.3g} GiB = KV "
                f"{max(0.0, self.usable_bytes) / g:.4g} GiB ({self.kv_capacity_tokens:,} tokens)")


def runtime_reserve(activations_bytes: float, graphs: bool, workspace: Assumed = WORKSPACE,
                    basis: str = f"a {ACTIVATION_TOKENS}-token step") -> dict[str, Assumed]:
    """What the runtime keeps beside weights and KV: the workspace, the activations of the largest step in flight
    (``activations_bytes``, derived from the graph at ``basis``), and the CUDA graph pool when steps replay as
    graphs."""
    out = {"workspace": workspace,
           "activations": Assumed(float(activations_bytes), "derived",
                                  f"the largest op's working set at {basis}, read off the graph "
                                  "(opmap.mapping.memory.inflight_activation_bytes)")}
    if graphs:
        out["cuda_graph_pool"] = CUDA_GRAPH_POOL
    return out
