"""One model's geometry: its attention (per layer: heads, KV heads, head widths, MLA's low-rank cache, the sliding
window, sinks, causality) and its size (layers, width, vocabulary, experts), with the KV cache it implies.

Built once per workload: from a Hugging Face config.json by the family's adapter (opmap.workloads.hf_geometry), from
a zoo model's spec, or, for a model known only by its graph (a user's module, an ONNX file), read off the graph by
``infer_geometry``. ``attention_calls`` is the one reader of the graph's attention nodes (fused
``scaled_dot_product_attention`` calls and ``opmap.kv_cache`` marks) for what they show: the model facts and the
capture's K and V (batch, tokens held, bytes). Everything downstream reads these, not the nodes.

KV cache per token (one sequence, every layer): multi-head, grouped- and multi-query attention hold K and V of each
KV head, 2 x n_kv_heads x head_dim x bytes per layer (K and V of width head_dim and v_head_dim); multi-head latent
attention (MLA) holds one compressed latent and the decoupled RoPE key, (kv_lora_rank + qk_rope_head_dim) x bytes per
layer (DeepSeek-V2, arXiv 2405.04434 sec. 2.1.2-2.1.3: "(d_c + d_h^R) l" elements per token). A sliding-window layer
holds at most its window's tokens (vLLM, Kwon et al. 2023, sec. 3). An encoder's (non-causal) attention holds none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opmap.graph import Node, OpGraph

SDPA_OP = "aten.scaled_dot_product_attention.default"
KV_CACHE_OP = "opmap.kv_cache"
KV_OPS = (SDPA_OP, KV_CACHE_OP)  # the nodes whose K and V are a layer's cache
ATTENTION_KINDS = ("mha", "gqa", "mqa", "mla")


def attention_kind(n_heads: int, n_kv_heads: int) -> str:
    """mha (a KV head per query head), mqa (one KV head), else gqa (query heads grouped over the KV heads)."""
    return "mha" if n_kv_heads == n_heads else "mqa" if n_kv_heads == 1 else "gqa"


@dataclass(frozen=True)
class AttentionSpec:
    """One attention layer. ``v_head_dim`` 0: head_dim. MLA (``kind`` "mla"): the cache holds ``kv_lora_rank`` +
    ``qk_rope_head_dim`` elements per token, whatever the heads. ``window``: None, or the tokens a sliding-window
    layer attends to (and caches); ``sinks``: attention-sink tokens kept past the window."""

    kind: str
    n_heads: int
    n_kv_heads: int
    head_dim: int
    v_head_dim: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    window: int | None = None
    sinks: int = 0
    causal: bool = True

    @property
    def v_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def kv_elements_per_token(self) -> int:
        """Elements of the cache one token adds to this layer: MLA's latent and RoPE key, else K and V of every KV
        head; 0 for an encoder's attention (no cache)."""
        return self.kv_elements if self.causal else 0

    @property
    def kv_elements(self) -> int:
        """Elements of K and V (MLA: of its latent and RoPE key) one token has in this layer, causal or not."""
        if self.kind == "mla":
            return self.kv_lora_rank + self.qk_rope_head_dim
        return self.n_kv_heads * (self.head_dim + self.v_dim)

    def tokens_held(self, tokens: int) -> int:
        """Tokens this layer caches of a ``tokens``-long sequence: the window (and its sinks) caps them."""
        return min(tokens, self.window + self.sinks) if self.window else tokens


@dataclass(frozen=True)
class ModelGeometry:
    """A model's size and its attention, one AttentionSpec per attention layer (``attention``; a pattern such as
    Gemma 2's alternating local / global layers is spelt out). MoE: ``n_experts`` routed experts of width
    ``expert_ffn``, ``top_k`` of them per token, ``shared_experts`` always run; 0 experts: dense. 0 for a size the
    source did not show (a graph has no vocabulary to read)."""

    layers: int
    hidden: int
    vocab: int
    attention: tuple[AttentionSpec, ...] = ()
    ffn: int = 0
    n_experts: int = 0
    shared_experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    source: str = field(default="", compare=False)
    # the published checkpoint's quantization (a config's quantization_config): the opmap format its quantized
    # weights are in ("" where the config names none) and the modules it leaves unquantized (bf16), as patterns
    checkpoint_format: str = ""
    unquantized: tuple[str, ...] = ()

    def kv_bytes_per_token(self, dtype_bytes: float) -> float:
        """K and V (or MLA's latent) bytes one token adds over every layer, one sequence (module docstring)."""
        total = 0.0
        for a in self.attention:
            total += a.kv_elements_per_token * dtype_bytes
        return total

    def kv_bytes(self, tokens: int, dtype_bytes: float, batch: int = 1) -> float:
        """The KV cache of ``batch`` sequences of ``tokens`` tokens: each layer holds min(tokens, window)."""
        return float(sum(a.kv_elements_per_token * a.tokens_held(tokens) for a in self.attention)) * dtype_bytes * batch

    def kv_text(self) -> str:
        """What one token caches, in words: MLA's latent and RoPE key per layer, and the layers a window caps."""
        cached = self.cached_layers
        parts = []
        mla = [a for a in cached if a.kind == "mla"]
        if mla:
            a = mla[0]
            parts.append(f"MLA: {len(mla)} layers x (latent {a.kv_lora_rank} + RoPE key {a.qk_rope_head_dim}) "
                         "elements, the latent cache engines serve from")
        windows = sorted({a.window for a in cached if a.window})
        if windows and len(windows) + (None in {a.window for a in cached}) > 1:
            slide = sum(1 for a in cached if a.window)
            parts.append(f"{slide} of {len(cached)} layers slide over a {'/'.join(map(str, windows))}-token "
                         "window and hold at most that many tokens")
        return "; ".join(parts)

    @property
    def cached_layers(self) -> tuple[AttentionSpec, ...]:
        """The attention layers that keep a KV cache (causal ones)."""
        return tuple(a for a in self.attention if a.causal)

    @property
    def window(self) -> int | None:
        """The sliding window where every cached layer has the same one, else None (some layer holds everything)."""
        ws = {a.window for a in self.cached_layers}
        return ws.pop() if len(ws) == 1 else None


    def first(self, n: int) -> ModelGeometry:
        """The first ``n`` layers (a shallow capture of the model's first blocks, opmap.explore.depth)."""
        return replace(self, layers=min(n, self.layers), attention=self.attention[:n])


def uniform(spec: AttentionSpec, layers: int) -> tuple[AttentionSpec, ...]:
    return (spec,) * layers


# -- read off a graph -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AttentionCall:
    """One attention node of a capture: the layer it shows (``spec``; a kv_cache mark shows no query: n_heads 0),
    and what the capture held: sequences, query and key tokens, K and V bytes, the cache's element size."""

    node_id: int
    fused: bool  # a scaled_dot_product_attention call (else a kv_cache mark of an eager attention)
    phase: str | None
    spec: AttentionSpec
    batch: int
    q_tokens: int
    kv_tokens: int
    k_bytes: float
    v_bytes: float
    itemsize: float

    @property
    def kv_bytes(self) -> float:
        return self.k_bytes + self.v_bytes

    def held_bytes(self, spec: AttentionSpec, capped: bool = True) -> float:
        """K and V bytes of this call's sequences at the layer ``spec`` says it is: the captured K and V where the
        capture shows the layer as it is (``spec`` is the call's own), else the layer's cache elements x the
        tokens it holds (``capped``: at most its window) x the capture's element size x the sequences."""
        if spec is self.spec:
            return self.kv_bytes
        tokens = spec.tokens_held(self.kv_tokens) if capped else self.kv_tokens
        return spec.kv_elements * tokens * self.itemsize * self.batch


def _call(n: Node) -> AttentionCall:
    named = dict(zip(n.input_names, n.inputs))
    fused = n.op == SDPA_OP
    k, v = named.get("key", n.inputs[1 if fused else 0]), named.get("value", n.inputs[2 if fused else 1])
    q = named.get("query", n.inputs[0]) if fused else None
    kv_heads = k.shape[-3]
    heads = q.shape[-3] if q is not None else 0
    spec = AttentionSpec(attention_kind(heads, kv_heads) if heads else "gqa", heads, kv_heads,
                         q.shape[-1] if q is not None else k.shape[-1], v.shape[-1] if v.shape[-1] != k.shape[-1]
                         else 0, causal=bool(n.args.get("is_causal")))
    return AttentionCall(n.id, fused, n.args.get("phase"), spec, math.prod(k.shape[:-3]),
                         q.shape[-2] if q is not None else k.shape[-2], k.shape[-2], k.nbytes, v.nbytes, k.itemsize)


# the graphs last read and their attention calls, by identity: an analysis, its sharder, the decode figures and the
# memory fit each ask (a pure function of an immutable graph; six scans of every node a serve point)
_CALLS: list[tuple[OpGraph, tuple[AttentionCall, ...]]] = []
_CALLS_KEPT = 4


def attention_calls(graph: OpGraph) -> tuple[AttentionCall, ...]:
    """Every attention node of the graph (fused SDPA calls and kv_cache marks), in order: the one place that reads
    them for the model's attention and the capture's KV cache. Kept for the last few graphs (by identity)."""
    for g, calls in _CALLS:
        if g is graph:
            return calls
    calls = tuple(_call(n) for n in graph.nodes if n.op in KV_OPS)
    _CALLS.append((graph, calls))
    del _CALLS[:-_CALLS_KEPT]
    return calls


def forward_calls(graph: OpGraph) -> tuple[AttentionCall, ...]:
    return tuple(c for c in attention_calls(graph) if c.phase in (None, "forward"))


def layer_specs(graph: OpGraph, calls: tuple[AttentionCall, ...]) -> tuple[AttentionSpec, ...]:
    """Per call, the layer it runs: the geometry the graph carries (``graph.geometry``, from the workload's config
    or spec: opmap.analyze.analyze_graph puts it there), matched to the calls in order, where it has one layer per
    call; else what each call shows. The capture does not always show the layer as it is: transformers gives a
    sliding-window model's SDPA an explicit mask, its K and V repeated to the query heads and no causal flag."""
    g = getattr(graph, "geometry", None)
    if g is None or len(g.attention) != len(calls):
        return tuple(c.spec for c in calls)
    return g.attention


def infer_geometry(graph: OpGraph) -> ModelGeometry:
    """The geometry a graph shows: one AttentionSpec per forward attention node (its heads and head widths from
    the K and V shapes, causal or not). A graph shows no vocabulary, width or window (a sliding window is a mask
    to SDPA): those are 0 / None; a workload built from a config carries its own (opmap.workloads.hf_geometry)."""
    specs = tuple(c.spec for c in forward_calls(graph))
    return ModelGeometry(len(specs), 0, 0, specs, source="graph")
