"""Phases of a language model's life: prefill, decode with a KV cache, a training step.

``PhaseSpec`` names the phase and its knobs; ``phase_workload`` turns (target, phase, batch, seq) into the
Workload to capture:

- prefill: today's workload, ``batch`` sequences of ``seq`` tokens, causal attention, no cache;
- decode: one new token for each of ``batch`` sequences against a KV cache of ``kv_len`` tokens, the cache
  built on meta as inputs, one (K, V) pair of (batch, KV heads, cached tokens, head dim) per layer. The new
  token's K and V are written into the cache's last slot in place and attention reads all of it: a sliding
  window caps the cached tokens at the window, GQA caches the KV heads only, a mixture of experts routes the
  ``batch`` tokens top-k with balanced load (an expert with no token launches nothing). A Hugging Face model's
  cache is the one its runtime runs (``PhaseSpec.kv_write``): written in place as engines and the zoo do, or
  transformers' ``DynamicCache``, which appends by ``torch.cat`` (eager transformers);
- train: ``microbatch`` sequences of ``seq`` tokens, captured as forward, loss, backward and the optimizer
  step (``opmap.capture.capture(train=True, optimizer=...)``). An iteration is global_batch / (microbatch x dp)
  such microsteps and one optimizer step.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace

import torch

from opmap.capture.training import OPTIMIZERS
from opmap.errors import OpmapError
from opmap.precision import torch_dtype
from opmap.workloads.zoo import MODELS, Workload

PHASES = ("prefill", "decode", "train")
RECOMPUTE = ("none", "selective", "full")  # as opmap.mapping.activations.RECOMPUTE
ZERO_STAGES = (0, 1, 2, 3)
DECODE_MODELS = ("gpt2", "llama")  # zoo families with a KV-cache decode path
# How a decode step stores its new token's K and V: "in-place", one token written into its slot of a cache held
# whole (vLLM's and TensorRT-LLM's paged blocks, transformers' StaticCache under CUDA graphs, the zoo decoders);
# "append", transformers' DynamicCache as eager transformers runs it (torch.cat: a new copy of each layer's K and V).
KV_WRITES = ("in-place", "append")
TRAIN_NOTE = "no KV cache (a training step): use_cache=False"  # an HF config's prefill note, in a training step


@dataclass(frozen=True)
class PhaseSpec:
    """The phase and its knobs. ``kv_len``: decode, tokens in each sequence's KV cache (the new one included).
    ``microbatch``: train, sequences per captured step (default: the batch); ``global_batch``: sequences per
    iteration (default: microbatch x dp); ``dp``: data-parallel ranks (1 here; sharding passes its own).
    ``kv_write``: decode, how a Hugging Face model's step stores its new K and V (KV_WRITES; the runtime's:
    opmap.phases.runtime.Runtime.kv_write); the zoo decoders always write in place."""

    name: str = "prefill"
    kv_len: int | None = None
    recompute: str = "none"
    microbatch: int | None = None
    global_batch: int | None = None
    zero: int = 0
    dp: int = 1
    optimizer: str = "adamw"  # AdamW: what large models train with; fp32 master weights under mixed precision
    kv_write: str = "in-place"

    @property
    def train(self) -> bool:
        return self.name == "train"

    @property
    def decode(self) -> bool:
        return self.name == "decode"

    def microsteps(self, batch: int) -> int:
        """Forward + backward microsteps per iteration per data-parallel rank."""
        mb = self.microbatch or batch
        gb = self.global_batch or mb * self.dp
        return gb // (mb * self.dp)

    def to_dict(self) -> dict:
        return {"name": self.name, "kv_len": self.kv_len, "recompute": self.recompute,
                "microbatch": self.microbatch, "global_batch": self.global_batch, "zero": self.zero, "dp": self.dp,
                "optimizer": self.optimizer, "kv_write": self.kv_write if self.decode else None}


def check_phase(spec: PhaseSpec, target: str, batch: int = 1, kv_len_given: bool | None = None,
                allow_long_context: bool = False) -> PhaseSpec:
    """Refuse a bad combination with one line (before anything is built); the spec with its defaults filled."""
    if spec.name not in PHASES:
        raise OpmapError(f"unknown phase {spec.name!r}; accepted: {', '.join(PHASES)}")
    if spec.recompute not in RECOMPUTE:
        raise OpmapError(f"unknown recompute {spec.recompute!r}; accepted: {', '.join(RECOMPUTE)}")
    if spec.zero not in ZERO_STAGES:
        raise OpmapError(f"unknown ZeRO stage {spec.zero!r}; accepted: 0, 1, 2, 3")
    if spec.optimizer not in OPTIMIZERS:
        raise OpmapError(f"unknown optimizer {spec.optimizer!r}; accepted: {', '.join(OPTIMIZERS)}")
    if spec.dp < 1:
        raise OpmapError(f"data-parallel size must be at least 1, got {spec.dp}")
    check_kv_write(spec.kv_write)
    if spec.name != "decode" and spec.kv_len is not None:
        raise OpmapError(f"--kv-len is for --phase decode, not {spec.name} (prefill attends over --seq tokens)")
    if spec.name != "train":
        if spec.recompute != "none":
            raise OpmapError(f"--recompute is for --phase train, not {spec.name} (inference keeps no activations "
                             "for a backward)")
        if spec.microbatch is not None or spec.global_batch is not None:
            raise OpmapError(f"--microbatch and --global-batch are for --phase train, not {spec.name} "
                             "(use --batch)")
        if spec.zero:
            raise OpmapError(f"--zero is for --phase train, not {spec.name}")
        if spec.optimizer != "adamw":
            raise OpmapError(f"--optimizer is for --phase train, not {spec.name}")
    spec_model = MODELS.get(target)
    if spec.name == "decode":
        if spec_model is not None and spec_model.kind == "vision":
            raise OpmapError(f"{target} is a vision model: it has no decode phase; accepted phases: prefill, train")
        if spec_model is not None and spec_model.name == "bert-base":
            raise OpmapError(f"{target} is an encoder: it has no decode phase; accepted phases: prefill, train")
        from opmap.workloads.hf import is_hf_target

        if spec_model is None and not is_hf_target(target):
            raise OpmapError(f"--phase decode needs a zoo decoder ({', '.join(_decoders())}) or a Hugging Face "
                             f"config (path/to/config.json, hf:NAME); {target} is neither")
        if spec_model is None:  # a Hugging Face config: its own position limit, checked when built
            kv = spec.kv_len if spec.kv_len is not None else 2048
            if kv < 1:
                raise OpmapError(f"--kv-len must be at least 1, got {kv}")
        else:
            kv = spec.kv_len if spec.kv_len is not None else spec_model.default_seq
            if kv < 1:
                raise OpmapError(f"{target} takes --kv-len from 1 to {spec_model.max_seq}, got {kv}")
            if kv > spec_model.max_seq and not (allow_long_context and spec_model.rope):
                from opmap.workloads.zoo import positions_limit

                raise positions_limit(target, "--kv-len", spec_model.max_seq, kv, spec_model.rope)
        spec = replace(spec, kv_len=kv)
    if spec.name == "train":
        mb = spec.microbatch if spec.microbatch is not None else batch
        if mb < 1:
            raise OpmapError(f"--microbatch must be at least 1, got {mb}")
        gb = spec.global_batch if spec.global_batch is not None else mb * spec.dp
        if gb < 1 or gb % (mb * spec.dp):
            raise OpmapError(f"--global-batch {gb} is not a multiple of microbatch x data-parallel ranks "
                             f"({mb} x {spec.dp} = {mb * spec.dp})")
        spec = replace(spec, microbatch=mb, global_batch=gb)
    return spec


def check_kv_write(kv_write: str) -> None:
    if kv_write not in KV_WRITES:
        raise OpmapError(f"unknown KV-cache write {kv_write!r}; accepted: {', '.join(KV_WRITES)}")


def _decoders() -> list[str]:
    return [n for n, m in MODELS.items() if m.kind == "text" and n != "bert-base"]


def window_of(module: torch.nn.Module) -> int | None:
    """The sliding attention window, where the model's config names one (Mistral-style); None: full causal."""
    cfg = getattr(module, "config", None)
    w = getattr(cfg, "sliding_window", None)
    return w if isinstance(w, int) and w > 0 else None


def kv_layout(module: torch.nn.Module) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of a zoo decoder."""
    c = getattr(module, "config", None)
    if hasattr(c, "n_kv_head"):  # Llama / Mixtral
        return c.n_layer, c.n_kv_head, c.dim // c.n_head
    if hasattr(c, "n_embd"):  # GPT-2
        return c.n_layer, c.n_head, c.n_embd // c.n_head
    raise OpmapError(f"{type(module).__name__} has no KV-cache decode path; accepted: {', '.join(_decoders())}")


def hf_decode_workload(w: Workload, kv_len: int, device: str = "meta", allow_long_context: bool = False,
                       kv_write: str = "in-place", queries: int = 1, layouts: dict | None = None) -> Workload:
    """The decode step of a Hugging Face model: one new token per sequence against a ``DynamicCache`` that
    already holds ``kv_len - 1`` tokens per layer (meta tensors; a sliding-window layer keeps only its window, as
    transformers' cache does) in the layout the model's attention writes (opmap.workloads.hf_cache: K and V per KV
    head, or MLA's latent), positions continuing after them. An MLA model decodes with absorbed weights over its
    latent cache, as serving engines do (opmap.workloads.hf_mla). ``kv_write`` (KV_WRITES): "in-place", the
    cache's ``update`` writes the new token's K and V into the last slot of a cache held whole and attention reads
    all of it, as an engine writes its paged blocks (the zoo decoders' ``write_cache``); "append", transformers'
    own ``torch.cat``, so each step copies every layer's K and V once, as eager transformers runs it.
    ``queries`` > 1: a speculative decoding verify step, ``queries`` new tokens per sequence (the last accepted
    and the K drafted) against the cache (``kv_len`` the tokens held after the step), causal among themselves.
    ``layouts``: a memo of the module's cache layouts (opmap.workloads.hf_cache.cache_layout), kept by a caller
    that steps one module at many batches."""
    from opmap.workloads.hf import PREFILL_NOTE, _transformers, check_positions
    from opmap.workloads.hf_cache import cache_layout, filled_cache, write_in_place
    from opmap.workloads.hf_mla import absorb_mla

    check_kv_write(kv_write)
    tf = _transformers()
    cfg = w.module.config
    check_positions(cfg, w.name, "--kv-len", kv_len, allow_long_context)
    cfg.use_cache = True
    mla = absorb_mla(w.module)
    key = "cache" if "cache" in inspect.signature(w.module.forward).parameters else "past_key_values"
    layout = cache_layout(tf, w.module, w.batch, key, w.name, layouts)
    layers = len(layout)
    dt = next((p.dtype for p in w.module.parameters() if p.is_floating_point()), torch.float32)
    past = kv_len - queries
    cache = filled_cache(tf, cfg, layout, past, dt, device)
    with torch.device(device):
        if kv_write == "in-place":
            write_in_place(cache, layers, queries)
        ids = torch.zeros(w.batch, queries, dtype=torch.long)
        pos = torch.arange(past, kv_len, dtype=torch.long).repeat(w.batch, 1)  # contiguous, as the model makes them
    window = window_of(w.module)
    shapes = sorted({lc.describe() for lc in layout})
    note = (f"decode: {_new_tokens(queries)} for each of {w.batch} sequences against a KV cache of {kv_len} tokens "
            f"({layers} layers, per token {'; '.join(shapes)}"
            + (f"; MLA: the latent of kv_lora_rank {cfg.kv_lora_rank} and the RoPE key of {cfg.qk_rope_head_dim}, "
               "decoded with absorbed weights (W_UK into the query, W_UV after attention, attention as MQA over the "
               f"latent) as SGLang, vLLM and TensorRT-LLM serve it, in {mla} layers" if mla else "") + ")"
            + (f", sliding-window layers keeping {window}" if window and window < kv_len else "")
            + ("; the new K and V are written into the cache in place (one token per layer per step, as engines "
               "write their paged blocks), attention reads all of it" if kv_write == "in-place" else
               "; transformers' DynamicCache appends by torch.cat (a copy of K and V per layer per step), as "
               "eager transformers runs it (an engine writes one token in place: --runtime engine)"))
    inputs = {"input_ids": ids, key: cache, "position_ids": pos, "use_cache": True}
    kept = tuple(n for n in w.assumptions if n != PREFILL_NOTE)
    return Workload(w.name, w.module, inputs, w.batch, queries, kept + (note,), geometry=w.geometry)


def _new_tokens(queries: int) -> str:
    """The new tokens of a decode step, in words: one, or a speculative verify's K + 1."""
    if queries == 1:
        return "one new token"
    return f"{queries} new tokens (a speculative decoding verify: the last accepted token and {queries - 1} drafted)"


def decode_workload(w: Workload, kv_len: int, device: str = "meta", queries: int = 1) -> Workload:
    """The decode step of a built zoo decoder ``w``: ``w.batch`` x ``queries`` new tokens (one per sequence; a
    speculative verify: K + 1) against a KV cache of ``kv_len`` tokens (capped at a sliding window), the cache made
    on ``device`` as inputs."""
    layers, kv_heads, head_dim = kv_layout(w.module)
    window = window_of(w.module)
    cached = min(kv_len, window) if window else kv_len
    dt = next((p.dtype for p in w.module.parameters() if p.is_floating_point()), torch.float32)
    with torch.device(device):
        ids = torch.zeros(w.batch, queries, dtype=torch.long)
        cache = tuple((torch.zeros(w.batch, kv_heads, cached, head_dim, dtype=dt),
                       torch.zeros(w.batch, kv_heads, cached, head_dim, dtype=dt)) for _ in range(layers))
    note = (f"decode: {_new_tokens(queries)} for each of {w.batch} sequences against a KV cache of {kv_len} tokens"
            + (f" ({cached} kept: sliding window {window})" if cached != kv_len else "")
            + f" ({layers} layers x {kv_heads} KV heads x head dim {head_dim}); the new K and V are written into "
              "the cache in place, attention reads all of it (flash-decoding)")
    return Workload(w.name, w.module, (ids, cache), w.batch, queries, w.assumptions + (note,), geometry=w.geometry)


def phase_workload(target: str, spec: PhaseSpec, batch: int, seq: int | None, dtype: str,
                   device: str = "meta", allow_long_context: bool = False) -> Workload:
    """Build ``target`` for ``spec`` (checked by ``check_phase``): prefill as today, decode against its KV cache,
    train at the microbatch."""
    from opmap.workloads.load import load_workload

    if spec.decode:
        from opmap.workloads.hf import is_hf_target

        w = load_workload(target, batch, 1, dtype, device)
        if is_hf_target(target):
            return hf_decode_workload(w, spec.kv_len, device, allow_long_context, spec.kv_write)
        return decode_workload(w, spec.kv_len, device)
    if spec.train:
        from opmap.workloads.hf import PREFILL_NOTE

        w = load_workload(target, spec.microbatch or batch, seq, dtype, device, allow_long_context)
        notes = tuple(TRAIN_NOTE if n == PREFILL_NOTE else n for n in w.assumptions)  # a step, not a prefill
        return replace(w, assumptions=notes)
    return load_workload(target, batch, seq, dtype, device, allow_long_context)


def build_dtype(dtype: str) -> torch.dtype:
    return torch_dtype(dtype)
