"""The model a serving replica runs, resolved once for pricing (opmap.serve.model_cost).

``Resolved.build`` takes anything ``opmap analyze`` takes (a zoo text decoder, a Hugging Face config, ``hf:NAME``, a
model file) through analyze's resolver (``opmap.workloads.load.load_workload``) at batch 1 on meta, and keeps what
pricing needs of it: its stack of layers (the largest ``nn.ModuleList`` of one block class), the layer count, the
position limit and whether positions are rotary, the KV dtype's size, the weights the whole model holds, top-k,
whether every layer is the same (``uneven``: how they differ) and, where not, the prefix and period the stack repeats
with (opmap.serve.layer_period: DeepSeek-R1's 3 dense layers then a MoE layer repeated, gpt-oss's sliding and full
layers in turn). ``set_layers`` shortens the stack in place (the config's layer count and its per-layer lists, such
as ``layer_types``, and the workload's geometry follow) for the shallow captures (``stack``: one and two periods).

A zoo model on meta is a pure function of its name, its build dtype and opmap's source: its summary is kept in the
capture cache (opmap.capture.cache, beside the captured graphs), so a second pricing builds nothing and captures
nothing when the graphs are cached too (``capture_key``); the module is built on the first capture that misses.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Any

from opmap.errors import OpmapError
from opmap.serve.layer_period import Stack, describe, find_period, layer_signatures

SUMMARY = ("name", "hf", "layers", "max_positions", "kv_itemsize", "rope", "top_k", "held_bytes", "uneven", "prefix",
           "period")


@dataclass
class Resolved:
    target: str
    dtype: str
    name: str
    hf: bool
    layers: int
    max_positions: int | None
    kv_itemsize: float
    rope: bool  # rotary positions: rope scaling can go past max_positions
    top_k: int
    held_bytes: float  # every parameter of the whole model at its build dtype, each once
    uneven: str  # empty when every layer is the same; else how they differ
    prefix: int = 0  # layer i >= prefix has the signature of layer prefix + (i - prefix) mod period (layer_period)
    period: int = 1
    _built: tuple | None = field(default=None, repr=False)  # (workload, parent, attribute, blocks)
    _per_layer: dict | None = field(default=None, repr=False)  # the config's per-layer lists, whole (set_layers)
    _geometry: tuple | None = field(default=None, repr=False)  # (the workload's geometry, whole,) (set_layers)
    _layouts: dict = field(default_factory=dict, repr=False)  # the module's decode-cache layouts, probed once

    @classmethod
    def build(cls, target: str, dtype: str) -> Resolved:
        from opmap.capture import cache
        from opmap.workloads import MODELS

        spec = MODELS.get(target)
        if spec is not None and (spec.kind != "text" or spec.name == "bert-base"):
            raise OpmapError(f"opmap serve needs a text decoder, and {target} is "
                             f"{'an encoder' if spec.kind == 'text' else 'a vision model'}; accepted: a zoo decoder "
                             "(opmap models list), a Hugging Face decoder config, hf:NAME or a model file")
        key = _summary_key(target, dtype)
        hit = cache.load_fields(key, functools.partial(cls, target, dtype), SUMMARY) if key else None
        if hit is not None:
            return hit
        built = _build(target, dtype)
        r = _summary(target, dtype, built)
        if key:
            cache.store_fields(key, {k: getattr(r, k) for k in SUMMARY})
        return r

    # -- the module, built on demand ---------------------------------------------------------------------------
    def _module_parts(self) -> tuple:
        if self._built is None:
            self._built = _build(self.target, self.dtype)
        return self._built

    @property
    def workload(self):
        return self._module_parts()[0]

    @property
    def config(self):
        return self.workload.module.config

    def set_layers(self, n: int) -> None:
        """Keep the first ``n`` layers (the config's layer count and per-layer lists follow, cut from the whole, and
        so does the workload's geometry: ModelGeometry.first, one AttentionSpec per layer captured)."""
        import torch

        w, parent, attr, blocks = self._module_parts()
        setattr(parent, attr, torch.nn.ModuleList(blocks[:n]))
        if self._geometry is None:  # the whole model's, kept before the first cut
            self._geometry = (w.geometry,)
        if self._geometry[0] is not None:
            w = replace(w, geometry=self._geometry[0].first(n))
            self._built = (w, parent, attr, blocks)
        c = w.module.config
        if self.hf:
            if self._per_layer is None:  # the whole model's per-layer lists, kept before the first cut
                self._per_layer = per_layer_lists(c, len(blocks))
            c.num_hidden_layers = n
            for k, v in self._per_layer.items():
                setattr(c, k, type(v)(v[:n]))
        else:
            w.module.config = replace(c, n_layer=n)

    def stack(self) -> tuple[Stack | None, str]:
        """How the ``layers`` layers are priced: a Stack (captured at its ``short`` and ``long`` layer counts and
        extrapolated), or None and why the model is captured whole (no period leaves fewer layers to capture)."""
        st = Stack(self.layers, self.prefix, self.period)
        if st.long < self.layers:
            return st, ""
        if not self.uneven:
            return None, f"{self.layers} layers"
        return None, (f"{self.uneven}, and no repeating period leaves fewer than its {self.layers} layers to "
                      f"capture (from layer {self.prefix} every {self.period}: {st.long})")

    def prefill(self, seq: int):
        """A prompt of ``seq`` tokens, the LM head over its last token only where the model takes transformers'
        ``logits_to_keep`` (every Hugging Face causal LM and opmap's zoo decoders): a serving engine computes the
        logits it samples, one per prompt (vLLM v1 gpu_model_runner.py: ``logits_indices = query_start_loc[1:] - 1``;
        TensorRT-LLM's gather_context_logits is off by default), not a vocabulary-wide row per prompt token."""
        import inspect

        import torch

        w = self.workload
        with torch.device("meta"):
            ids = torch.zeros(1, seq, dtype=torch.long)
        try:
            last = "logits_to_keep" in inspect.signature(w.module.forward).parameters
        except (TypeError, ValueError):  # a forward without a signature to read: every position, as it runs
            last = False
        if self.hf:
            inputs = {"input_ids": ids, "use_cache": False, **({"logits_to_keep": 1} if last else {})}
        else:
            inputs = (ids, None, 1) if last else (ids,)
        return replace(w, inputs=inputs, batch=1, seq=seq)

    def decode(self, batch: int, kv: int, kv_write: str = "in-place", queries: int = 1):
        """The decode step of ``batch`` sequences at ``kv`` tokens, ``queries`` new tokens each (a speculative
        verify: K + 1); a Hugging Face model's new K and V stored as ``kv_write`` says
        (opmap.workloads.phases.KV_WRITES: the runtime's)."""
        from opmap.workloads.phases import decode_workload, hf_decode_workload

        w = replace(self.workload, batch=batch)
        if self.hf:
            return hf_decode_workload(w, kv, kv_write=kv_write, queries=queries, layouts=self._layouts)
        return decode_workload(w, kv, queries=queries)

    def capture_key(self, layers: int, phase: str, batch: int, length: int) -> str | None:
        """The capture-cache key of this model's graph at ``layers`` layers (None: not cacheable: a model
        file or a config, whose content the name does not pin)."""
        return _summary_key(self.target, self.dtype, {"purpose": "serve pricing", "layers": layers, "phase": phase,
                                                      "batch": batch, "length": length})


def per_layer_lists(config, layers: int) -> dict[str, list | tuple]:
    """The config's per-layer lists (one entry per layer: layer_types, mlp_layer_types, no_rope_layers,
    layers_block_type, ...), by attribute: every list or tuple attribute of ``layers`` entries. transformers reads
    them by layer index (``config.layer_types[i]``), so a stack cut to n layers needs each cut to its first n."""
    return {k: v for k, v in vars(config).items()
            if not k.startswith("_") and isinstance(v, (list, tuple)) and len(v) == layers}


def _summary_key(target: str, dtype: str, more: dict[str, Any] | None = None) -> str | None:
    """The capture-cache key (opmap.api.capture_key) of the model's summary, or with ``more`` of a graph of it."""
    from opmap.api import capture_key

    return capture_key(target, dtype, {"device": "meta", "what": "serve model summary", **(more or {})})


def _build(target: str, dtype: str) -> tuple:
    """(workload, parent module, attribute, layers) of ``target`` built at batch 1 on meta."""
    from opmap.workloads import MODELS
    from opmap.workloads.hf import is_hf_target
    from opmap.workloads.load import load_workload

    spec = MODELS.get(target)
    w = load_workload(target, 1, 1 if spec is not None or is_hf_target(target) else None, dtype, "meta")
    cfg = getattr(w.module, "config", None)
    if not (is_hf_target(target) or hasattr(cfg, "num_hidden_layers") or hasattr(cfg, "n_layer")):
        raise OpmapError(f"{target}: serve prices decode against a KV cache and needs a decoder it can give one: "
                         "a zoo text decoder, a Hugging Face decoder config (or a model file returning a "
                         "transformers causal LM or a zoo Llama / GPT-2)")
    return (w, *_layer_list(w.module))


def _summary(target: str, dtype: str, built: tuple) -> Resolved:
    """``target`` resolved from its module ``built`` (_build): what pricing keeps of it (SUMMARY), the module kept."""
    import torch

    from opmap.workloads import MODELS
    from opmap.workloads.hf import has_rope, is_hf_target, max_positions

    w, _parent, _attr, blocks = built
    spec = MODELS.get(target)
    cfg = w.module.config
    hf = is_hf_target(target) or hasattr(cfg, "num_hidden_layers")
    limit = spec.max_seq if spec is not None else (max_positions(cfg) if hf else getattr(cfg, "max_seq", None))
    rope = spec.rope if spec is not None else (has_rope(cfg) if hf else hasattr(cfg, "rope_theta"))
    dt = next((p.dtype for p in w.module.parameters() if p.is_floating_point()), torch.float32)
    seen = {id(p): p for p in w.module.parameters()}
    for b in blocks:
        seen.update({id(p): p for p in b.parameters()})
    held = float(sum(p.numel() * p.element_size() for p in seen.values()))
    top_k = int(getattr(cfg, "top_k", 0) or getattr(cfg, "num_experts_per_tok", 0) or 0)
    sigs = layer_signatures(cfg, blocks, w.geometry)
    prefix, period = find_period(sigs)
    return Resolved(target, dtype, w.name, bool(hf), len(blocks), limit, float(torch.empty((), dtype=dt).itemsize),
                    bool(rope), top_k, held, describe(sigs), prefix, period, _built=built)


def _layer_list(module) -> tuple:
    """(parent, attribute, layers) of the model's largest nn.ModuleList of one block class (the decoder layers)."""
    import torch

    best = None
    for path, m in module.named_modules():
        if isinstance(m, torch.nn.ModuleList) and len({type(c) for c in m}) == 1 and (
                best is None or len(m) > len(best[2])):
            parent, _, attr = path.rpartition(".")
            best = (module.get_submodule(parent) if parent else module, attr, list(m))
    if best is None:
        raise OpmapError(f"{type(module).__name__} has no stack of layers (an nn.ModuleList of one block class): "
                         "serve needs a decoder")
    return best

