"""Calls a capture records whole instead of by their decomposition (a ``TorchFunctionMode``): fused scaled dot
product attention, recorded as the one fused kernel it is on CPU and CUDA (on meta, which has no fused kernel,
the math path's S x S scores would otherwise look as if they went through memory), with the aten op that ran
underneath kept in ``args["backend_op"]``; training dropout as CUDA's one fused kernel; in training captures on meta,
a flash-attention backward node standing in for the fused kernel's backward; ``kv_cache`` marks, the K and V an
attention that is not one SDPA call (transformers' eager path) holds in its cache; and ``sink_attention``, attention
with a learned sink logit per head (gpt-oss), recorded as the one fused kernel serving engines run for it; and
``chunked_attention``, chunked local attention (Llama 4's chunked layers), recorded as the chunked kernel engines
run."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from opmap.capture.tracker import NoMemo, Tracker, freeze, split_args
from opmap.geometry import KV_CACHE_OP

SDPA_NAME = "scaled_dot_product_attention"


def kv_cache(key: torch.Tensor, value: torch.Tensor, is_causal: bool = True) -> None:
    """Mark ``key`` and ``value`` (B, H_kv, S, D) as what an attention layer holds in its KV cache, where the
    attention is not one SDPA call (transformers' eager path: its own matmuls and softmax). A capture records it
    as a node of op KV_CACHE_OP that is a view (no kernel, no cost), which opmap.mapping.memory.kv_geometry reads as
    it reads a causal SDPA call's K and V; outside a capture it does nothing."""
    if torch.overrides.has_torch_function_variadic(key, value):
        torch.overrides.handle_torch_function(kv_cache, (key, value), key, value, is_causal=is_causal)


def sink_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, sinks: torch.Tensor,
                   attn_mask: torch.Tensor | None = None, scale: float | None = None, window: int | None = None,
                   dropout_p: float = 0.0) -> torch.Tensor:
    """Attention whose softmax denominator holds one more term per head, exp(sinks[h]) (gpt-oss's attention sinks:
    transformers' ``GptOssAttention`` eager path, softmax over [scores, sink] with the sink's column dropped), for
    queries (B, H, Sq, D), keys and values (B, H_kv, Sk, D) and ``sinks`` (H,). Causal, aligned to the last key, at
    most ``window`` keys per query where one is given; ``attn_mask`` (transformers' boolean or additive mask, which
    says the same for the unpadded inputs opmap builds) overrides that where given. Returns (B, H, Sq, Dv).

    Computed as one ``scaled_dot_product_attention`` call, exactly: one key column more, its K and V zero and its
    additive mask entry the head's sink logit, so exp(sink) joins the denominator and adds nothing to the output;
    the causal / window mask folded into the same additive mask. A capture records the call as the one kernel
    FlashInfer, TensorRT-LLM and vLLM (FlashAttention-3 ``s_aux``) run for it: Q, K, V and the H sink logits read,
    no mask (the causal alignment and the window are kernel parameters), no extra column
    (opmap.costs.attention)."""
    if torch.overrides.has_torch_function_variadic(query, key, value, sinks):
        return torch.overrides.handle_torch_function(
            sink_attention, (query, key, value, sinks), query, key, value, sinks, attn_mask=attn_mask, scale=scale,
            window=window, dropout_p=dropout_p)
    return _sink_column_sdpa(query, key, value, sinks, attn_mask, scale, window, dropout_p)


def chunked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, chunk: int, q_offset: int,
                      attn_mask: torch.Tensor | None = None, scale: float | None = None,
                      dropout_p: float = 0.0) -> torch.Tensor:
    """Chunked local attention (Llama 4's chunked layers, transformers' ``create_chunked_causal_mask``): query i of
    (B, H, Sq, D) at absolute position q_offset + i attends causally to the keys of its own ``chunk``-token chunk
    (chunks from position 0), the keys (B, H_kv, Sk, D) ending with the last query. ``attn_mask`` (transformers'
    boolean chunked mask, which says the same for the unpadded inputs opmap builds) overrides that where given.
    Returns (B, H, Sq, Dv), computed as one ``scaled_dot_product_attention`` with the chunked mask. A capture
    records the call as the kernel TensorRT-LLM (``attention_chunk_size``) and vLLM (chunked local attention) run:
    Q, K and V read, no mask, the chunk and the query's position kernel parameters, so only the in-chunk causal
    pairs and the in-chunk keys are counted (opmap.costs.attention)."""
    if torch.overrides.has_torch_function_variadic(query, key, value):
        return torch.overrides.handle_torch_function(
            chunked_attention, (query, key, value), query, key, value, chunk, q_offset, attn_mask=attn_mask,
            scale=scale, dropout_p=dropout_p)
    return _chunked_sdpa(query, key, value, chunk, q_offset, attn_mask, scale, dropout_p)


def _chunked_sdpa(query, key, value, chunk, q_offset, attn_mask, scale, dropout_p) -> torch.Tensor:
    """``chunked_attention`` as one SDPA call under the chunked mask (its docstring)."""
    sq, sk = query.shape[-2], key.shape[-2]
    if attn_mask is None:
        pos = torch.arange(q_offset, q_offset + sq, device=query.device).unsqueeze(-1)
        keys = torch.arange(q_offset + sq - sk, q_offset + sq, device=query.device)
        attn_mask = (keys <= pos) & (keys // chunk == pos // chunk)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale,
                                          enable_gqa=query.shape[-3] != key.shape[-3])


def _sink_column_sdpa(query, key, value, sinks, attn_mask, scale, window, dropout_p) -> torch.Tensor:
    """``sink_attention`` as one SDPA call over the keys and a zero sink column (its docstring)."""
    b, h, sq, _ = query.shape
    sk = key.shape[-2]
    if attn_mask is None:  # causal, aligned to the last key: query i at position Sk - Sq + i
        pos = torch.arange(sk - sq, sk, device=query.device).unsqueeze(-1)
        keys = torch.arange(sk, device=query.device)
        attn_mask = (keys <= pos) & ((keys > pos - window) if window else True)
    if attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~attn_mask, float("-inf"))
    attn_mask = attn_mask.to(query.dtype).expand(b, h, sq, sk)
    sink = sinks.to(query.dtype).reshape(1, h, 1, 1).expand(b, h, sq, 1)
    k = torch.cat((key, key.new_zeros(*key.shape[:-2], 1, key.shape[-1])), dim=-2)
    v = torch.cat((value, value.new_zeros(*value.shape[:-2], 1, value.shape[-1])), dim=-2)
    return F.scaled_dot_product_attention(query, k, v, attn_mask=torch.cat((attn_mask, sink), dim=-1),
                                          dropout_p=dropout_p, scale=scale, enable_gqa=h != key.shape[-3])


class FunctionRecorder(TorchFunctionMode):
    """Records calls that opmap costs whole (fused SDPA) instead of by their decomposition. On meta, a repeat
    of an SDPA signature reuses the first call's output layout and backend instead of running the decomposed
    math path again (outside training captures)."""

    def __init__(self, tracker: Tracker, memoize: bool = True):
        super().__init__()
        self.t = tracker
        self.memoize = memoize and not tracker.train
        self.memo: dict[Any, tuple[tuple, str]] = {}  # signature -> ((shape, stride, dtype), backend_op)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is kv_cache:
            self._kv_cache(args, kwargs)
            return None
        if func is sink_attention and not self.t.suppress:
            return self._sink_attention(*args, **kwargs)
        if func is chunked_attention and not self.t.suppress:
            return self._chunked_attention(*args, **kwargs)
        if func is F.dropout and not self.t.suppress:
            out = self._fused_dropout(args, kwargs)
            if out is not None:
                return out
        if getattr(func, "__name__", "") != SDPA_NAME or self.t.suppress:
            out = func(*args, **kwargs)
            if self.t.train and self.t.stack:
                self.t.remember_grad_fns(out)
            return out
        return self._sdpa(func, args, kwargs)

    def _kv_cache(self, args, kwargs) -> None:
        """``kv_cache``'s K and V recorded as a view node (its docstring), unless recording is suppressed."""
        if not self.t.suppress:
            key, value = args
            self.t.add_node(KV_CACHE_OP, "kv_cache", [("key", key), ("value", value)],
                            {"is_causal": bool(kwargs.get("is_causal", True))}, [], is_view=True, is_inplace=False)

    def _fused_dropout(self, args, kwargs):
        """CUDA runs training dropout as one fused kernel (aten.native_dropout: the output and a bool mask); meta and
        CPU take the composite path (bernoulli_, div_, mul: three kernels and a mask the input's size). Record what
        the GPU runs: its output on meta; None where the call is not that (eval, p 0, in place, not meta: dropout
        runs as it is)."""
        x = args[0] if args else kwargs.get("input")
        p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
        training = args[2] if len(args) > 2 else kwargs.get("training", True)
        inplace = args[3] if len(args) > 3 else kwargs.get("inplace", False)
        if isinstance(x, torch.Tensor) and x.device.type == "meta" and training and 0 < p < 1 and not inplace:
            out = torch.native_dropout(x, p, True)[0]
            if self.t.train and self.t.stack:
                self.t.remember_grad_fns(out)
            return out
        return None

    def _sdpa(self, func, args, kwargs):
        """An SDPA call recorded as one node, with the aten op that ran underneath as its backend; on meta a repeat
        of a signature takes the first call's output layout and backend (``memo``)."""
        t = self.t
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        bound = list(zip(names, args)) + [(k, v) for k, v in kwargs.items()]
        tensors, scalars = split_args(bound)
        key = None
        if self.memoize:
            try:
                key = (freeze(args), freeze(tuple(sorted(kwargs.items()))))
            except NoMemo:
                key = None
        if key is not None and key in self.memo:
            (shape, stride, dtype), backend = self.memo[key]
            start = len(t.suppressed_ops)
            t.suppress += 1
            try:
                out = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
            finally:
                t.suppress -= 1
            del t.suppressed_ops[start:]
            return self._record(tensors, scalars, backend, out)
        t.suppress += 1
        start = len(t.suppressed_ops)
        try:
            out = func(*args, **kwargs)
        finally:
            t.suppress -= 1
        ran = t.suppressed_ops[start:]
        del t.suppressed_ops[start:]
        fused = [o for o in ran if "attention" in o]
        if not fused and isinstance(out, torch.Tensor) and out.device.type == "meta" and out.dim() == 4:
            out = self._fused_layout(out, args, kwargs, names, start)
        backend = fused[0] if fused else "math (decomposed: no fused kernel on this device)"
        if key is not None and isinstance(out, torch.Tensor) and out.device.type == "meta":
            self.memo[key] = ((tuple(out.shape), out.stride(), out.dtype), backend)
        return self._record(tensors, scalars, backend, out)

    def _fused_layout(self, out, args, kwargs, names, start: int):
        """The meta result of a decomposed SDPA in the fused kernel's layout: the fused CPU kernel lays its output
        out like the query (the CUDA ones as (B, S, H, D)), so the usual transpose(1, 2).reshape after attention is
        a view there; give the meta result the query's layout too instead of the math path's contiguous one. In a
        training capture it gets the fused kernel's backward (the fresh output has no autograd history)."""
        t = self.t
        q = args[0] if args else kwargs.get("query")
        t.suppress += 1
        try:
            if isinstance(q, torch.Tensor) and q.shape == out.shape:
                out = torch.empty_like(q)
            else:
                b, h, s, d = out.shape
                out = torch.empty((b, s, h, d), dtype=out.dtype, device=out.device).transpose(1, 2)
        finally:
            t.suppress -= 1
        del t.suppressed_ops[start:]
        if t.train and torch.is_grad_enabled():
            b = dict(zip(names, args), **kwargs)
            out = MetaFlashAttention.apply(out, t, b["query"], b["key"], b["value"], b.get("attn_mask"),
                                            bool(b.get("is_causal", False)), b.get("scale"),
                                            float(b.get("dropout_p", 0.0) or 0.0))
        return out

    def _sink_attention(self, query, key, value, sinks, attn_mask=None, scale=None, window=None, dropout_p=0.0):
        """``sink_attention`` recorded as one SDPA node (its docstring; ``_engine_attention``)."""
        return self._engine_attention(
            query, key, value, scale, dropout_p,
            lambda: _sink_column_sdpa(query, key, value, sinks, attn_mask, scale, window, dropout_p),
            {"window": int(window) if window else None}, [("sinks", sinks)],
            "attention with sinks (FlashInfer / TensorRT-LLM sink kernels; computed exactly as SDPA over a zero sink "
            "column)")

    def _chunked_attention(self, query, key, value, chunk, q_offset, attn_mask=None, scale=None, dropout_p=0.0):
        """``chunked_attention`` recorded as one SDPA node (its docstring; ``_engine_attention``)."""
        return self._engine_attention(
            query, key, value, scale, dropout_p,
            lambda: _chunked_sdpa(query, key, value, chunk, q_offset, attn_mask, scale, dropout_p),
            {"chunk": int(chunk), "q_offset": int(q_offset)}, [],
            "chunked local attention (TensorRT-LLM attention_chunk_size, vLLM chunked local attention; computed "
            "exactly as SDPA under the chunked mask)")

    def _engine_attention(self, query, key, value, scale, dropout_p, exact, extra: dict, inputs: list, why: str):
        """An engine's causal attention kernel recorded as one SDPA node with ``extra`` scalars (a window, a chunk)
        and ``inputs`` beside Q, K and V: on meta nothing run, the output laid out (B, Sq, H, Dv) as the engines'
        kernels write it (tokens, heads, head dim: the transpose back to the hidden states is a view); on a real
        device ``exact()``, the exact computation, its ops not recorded."""
        t = self.t
        start = len(t.suppressed_ops)
        t.suppress += 1
        try:
            if query.device.type == "meta":
                b, h, sq, _ = query.shape
                out = torch.empty((b, sq, h, value.shape[-1]), dtype=query.dtype, device="meta").transpose(1, 2)
            else:
                out = exact()
        finally:
            t.suppress -= 1
        del t.suppressed_ops[start:]
        if t.train and torch.is_grad_enabled() and query.device.type == "meta":
            out = MetaFlashAttention.apply(out, t, query, key, value, None, True, scale, float(dropout_p or 0.0))
        scalars = {"dropout_p": float(dropout_p or 0.0), "is_causal": True, "scale": scale,
                   "enable_gqa": query.shape[-3] != key.shape[-3], "causal_align": "bottom-right", **extra}
        return self._record([("query", query), ("key", key), ("value", value), *inputs], scalars, why, out)

    def _record(self, tensors, scalars, backend: str, out):
        t = self.t
        scalars["backend_op"] = backend
        scalars.setdefault("is_causal", False)
        scalars.setdefault("dropout_p", 0.0)
        t.add_node("aten.scaled_dot_product_attention.default", SDPA_NAME, tensors, scalars,
                   [out], is_view=False, is_inplace=False)
        if t.train:
            t.remember_grad_fns(out)
        return out


class MetaFlashAttention(torch.autograd.Function):
    """Training capture on meta, where SDPA has no fused kernel: the attention output (laid out as the fused kernel
    lays it) joined to q, k and v through a flash-attention backward, recorded as one
    ``_scaled_dot_product_flash_attention_backward`` node (its five GEMMs cost by costs.backward), as CUDA runs
    it, instead of a cut in the autograd graph or the math path's S x S backward."""

    @staticmethod
    def forward(ctx, out, tracker, q, k, v, mask, is_causal, scale, dropout_p=0.0):
        ctx.tracker, ctx.is_causal, ctx.scale, ctx.mask = tracker, is_causal, scale, mask
        ctx.dropout_p = dropout_p  # the backward draws the forward's mask again (its aten op takes dropout_p too)
        ctx.save_for_backward(q, k, v)
        start = len(tracker.suppressed_ops)
        tracker.suppress += 1
        try:
            res = out.detach().as_strided(out.shape, out.stride())
        finally:
            tracker.suppress -= 1
        del tracker.suppressed_ops[start:]
        ctx.out = res
        return res

    @staticmethod
    def backward(ctx, grad_out):
        t = ctx.tracker
        q, k, v = ctx.saved_tensors
        start = len(t.suppressed_ops)
        t.suppress += 1
        try:
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        finally:
            t.suppress -= 1
        del t.suppressed_ops[start:]
        ins = [("grad_out", grad_out), ("query", q), ("key", k), ("value", v), ("out", ctx.out)]
        if isinstance(ctx.mask, torch.Tensor):
            ins.append(("attn_mask", ctx.mask))
        t.add_node("aten._scaled_dot_product_flash_attention_backward.default",
                   "_scaled_dot_product_flash_attention_backward", ins,
                   {"is_causal": ctx.is_causal, "scale": ctx.scale, "dropout_p": ctx.dropout_p,
                    "backend_op": "flash (meta stand-in)"},
                   [dq, dk, dv], is_view=False, is_inplace=False)
        return None, None, dq, dk, dv, None, None, None, None
