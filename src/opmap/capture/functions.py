"""Calls a capture records whole instead of by their decomposition (a ``TorchFunctionMode``): fused scaled dot
product attention, recorded as the one fused kernel it is on CPU and CUDA (on meta, which has no fused kernel,
the math path's S x S scores would otherwise look as if they went through memory), with the aten op that ran
underneath kept in ``args["backend_op"]``; training dropout as CUDA's one fused kernel; in training captures on meta,
a flash-attention backward node standing in for the fused kernel's backward; and ``kv_cache`` marks, the K and V an
attention that is not one SDPA call (transformers' eager path) holds in its cache."""

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
            if not self.t.suppress:
                key, value = args
                self.t.add_node(KV_CACHE_OP, "kv_cache", [("key", key), ("value", value)],
                                {"is_causal": bool(kwargs.get("is_causal", True))}, [], is_view=True, is_inplace=False)
            return None
        if func is F.dropout and not self.t.suppress:
            # CUDA runs training dropout as one fused kernel (aten.native_dropout: the output and a bool mask);
            # meta and CPU take the composite path (bernoulli_, div_, mul: three kernels and a mask the input's
            # size). Record what the GPU runs; in eval (or p 0) dropout is the identity either way.
            x = args[0] if args else kwargs.get("input")
            p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
            training = args[2] if len(args) > 2 else kwargs.get("training", True)
            inplace = args[3] if len(args) > 3 else kwargs.get("inplace", False)
            if isinstance(x, torch.Tensor) and x.device.type == "meta" and training and 0 < p < 1 and not inplace:
                out = torch.native_dropout(x, p, True)[0]
                if self.t.train and self.t.stack:
                    self.t.remember_grad_fns(out)
                return out
        if getattr(func, "__name__", "") != SDPA_NAME or self.t.suppress:
            out = func(*args, **kwargs)
            if self.t.train and self.t.stack:
                self.t.remember_grad_fns(out)
            return out
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
            # The fused CPU kernel lays its output out like the query (the CUDA ones as (B, S, H, D)), so
            # the usual transpose(1, 2).reshape after attention is a view there; give the meta result the
            # query's layout too instead of the math path's contiguous one.
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
                # the fresh output has no autograd history: give it the fused kernel's backward
                b = dict(zip(names, args), **kwargs)
                out = MetaFlashAttention.apply(out, t, b["query"], b["key"], b["value"], b.get("attn_mask"),
                                                bool(b.get("is_causal", False)), b.get("scale"),
                                                float(b.get("dropout_p", 0.0) or 0.0))
        backend = fused[0] if fused else "math (decomposed: no fused kernel on this device)"
        if key is not None and isinstance(out, torch.Tensor) and out.device.type == "meta":
            self.memo[key] = ((tuple(out.shape), out.stride(), out.dtype), backend)
        return self._record(tensors, scalars, backend, out)

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
