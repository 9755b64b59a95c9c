"""The KV cache a Hugging Face model's decode step reads, in the layout the model's own attention writes it.

Families cache different things: K and V per KV head (llama, qwen3, gpt-oss), or one latent and a RoPE key per
token (DeepSeek's MLA in transformers 5: keys (B, 1, S, kv_lora_rank), values (B, 1, S, qk_rope_head_dim); before,
the decompressed K and V of every head), or, under opmap's absorbed MLA decode (opmap.workloads.hf_mla), one
(B, 1, S, kv_lora_rank + qk_rope_head_dim) entry. Rather than guessing each family's layout from its config,
``cache_layout`` asks the model: one step of one token runs on the meta device against an empty cache, and every
layer's ``cache.update(key, value, layer)`` shapes are recorded; the cache of ``past`` tokens is then those shapes
with ``past`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from opmap.errors import OpmapError


@dataclass(frozen=True)
class LayerCache:
    """One layer's cache entry per token: the key and value shapes (batch, heads, 1, width) it writes."""

    key: tuple[int, ...]
    value: tuple[int, ...]

    @property
    def elements_per_token(self) -> int:
        """Elements one token adds to this layer, one sequence."""
        return self.key[-3] * self.key[-1] + self.value[-3] * self.value[-1]

    def describe(self) -> str:
        k = f"K {self.key[-3]} x {self.key[-1]}"
        return k + (f", V {self.value[-3]} x {self.value[-1]}" if self.value[-1] else " (V its first columns)")


def new_cache(tf, cfg):
    try:
        return tf.DynamicCache(config=cfg)
    except TypeError:  # an older transformers: a cache without per-layer types
        return tf.DynamicCache()


# the batch a memoised probe runs at: above 1, so that a layout whose every entry leads with it is known batch-first
PROBE_BATCH = 2


def cache_layout(tf, module: torch.nn.Module, batch: int, key: str, name: str,
                 memo: dict | None = None) -> tuple[LayerCache, ...]:
    """Per layer, the shapes its attention passes to ``cache.update`` for one new token (module docstring).
    ``memo``: the layouts already probed on this module, by (layer count, cache argument): each entry is per
    sequence, its first dimension the batch, so one probe at PROBE_BATCH serves every batch (its batch swapped in),
    kept only where every entry of it leads with PROBE_BATCH (else each batch is probed)."""
    if memo is None:
        return _probe(tf, module, batch, key, name)
    at = (module.config.num_hidden_layers, key)
    if at not in memo:
        probed = _probe(tf, module, PROBE_BATCH, key, name)
        lead = all(lc.key[0] == lc.value[0] == PROBE_BATCH for lc in probed)
        memo[at] = probed if lead else None
    if memo[at] is None:
        return _probe(tf, module, batch, key, name)
    return tuple(LayerCache((batch, *lc.key[1:]), (batch, *lc.value[1:])) for lc in memo[at])


def _probe(tf, module: torch.nn.Module, batch: int, key: str, name: str) -> tuple[LayerCache, ...]:
    """One step of one token on meta against an empty cache, every layer's ``cache.update`` shapes recorded."""
    cfg = module.config
    cache = new_cache(tf, cfg)
    seen: dict[int, LayerCache] = {}
    update = cache.update

    def record(key_states, value_states, layer_idx, *args, **kwargs):
        seen.setdefault(int(layer_idx), LayerCache(tuple(key_states.shape), tuple(value_states.shape)))
        return update(key_states, value_states, layer_idx, *args, **kwargs)

    cache.update = record
    from opmap.capture.tracer import shapes_only

    with torch.device("meta"), torch.no_grad(), shapes_only():
        ids = torch.zeros(batch, 1, dtype=torch.long)
        module(input_ids=ids, **{key: cache}, position_ids=torch.zeros(batch, 1, dtype=torch.long), use_cache=True)
    layers = cfg.num_hidden_layers
    if sorted(seen) != list(range(layers)):
        raise OpmapError(f"{name}: {len(seen)} of its {layers} layers write a KV cache in transformers "
                         f"{tf.__version__}; opmap builds a decode step for models whose every layer caches")
    return tuple(seen[i] for i in range(layers))


def filled_cache(tf, cfg, layout: tuple[LayerCache, ...], past: int, dtype: torch.dtype, device: str):
    """A cache holding ``past`` tokens per layer in ``layout`` (sliding-window layers keep what transformers'
    cache keeps of them)."""
    cache = new_cache(tf, cfg)
    with torch.device(device):
        for i, lc in enumerate(layout):
            k = torch.zeros(*lc.key[:-2], past, lc.key[-1], dtype=dtype)
            v = torch.zeros(*lc.value[:-2], past, lc.value[-1], dtype=dtype)
            cache.update(k, v, i)
    return cache


def write_in_place(cache, layers: int, new: int = 1) -> None:
    """``cache.update`` as an engine runs it: each layer's K and V held whole, ``new`` slots past what the cache
    holds now (its window, for a sliding-window layer), the step's new tokens written into the last slots in place
    (opmap.workloads.llama.write_cache, as the zoo decoders; a zero-width V, MLA's, written by nothing); what
    the cache reports to the mask builder (its length, its window) is left as it was."""
    held = getattr(cache, "layers", None)  # transformers >= 4.56: per-layer objects; before: key_cache lists
    whole = []
    for i in range(layers):
        k = held[i].keys if held is not None else cache.key_cache[i]
        v = held[i].values if held is not None else cache.value_cache[i]
        whole.append((torch.zeros((*k.shape[:-2], k.shape[-2] + new, k.shape[-1]), dtype=k.dtype),
                      torch.zeros((*v.shape[:-2], v.shape[-2] + new, v.shape[-1]), dtype=v.dtype)))

    def update(key_states, value_states, layer_idx, *args, **kwargs):
        kc, vc = whole[layer_idx]
        t = key_states.shape[-2]
        kc[..., -t:, :].copy_(key_states)
        if value_states.shape[-1]:
            vc[..., -t:, :].copy_(value_states)
        return kc, vc

    cache.update = update
