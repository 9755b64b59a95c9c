"""Activations saved for backward, measured: the forward runs on the meta device under
``torch.autograd.graph.saved_tensors_hooks`` and the bytes of the storages autograd saves are summed, each storage
once; parameters and buffers (module state, not per-batch activations) are left out by storage identity
(``saved_activation_bytes``). ``korthikanti_bytes``: the closed form of Korthikanti et al. 2022 it is checked
against. opmap.mapping.memory puts these bytes into a training step's memory fit.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from opmap.errors import OpmapError

RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("fused", "math")


# -- activations saved for backward (measured) -------------------------------------------------------------

@dataclass(frozen=True)
class SavedActivations:
    """Bytes autograd keeps from one forward for the backward, each storage once.

    ``by_block``: bytes by repeated block (the children of the model's largest ``nn.ModuleList`` of one
    class: the transformer layers), ``""`` for what is saved outside every block (embeddings, final norm,
    head). ``per_block_bytes``: the mean over blocks."""

    total_bytes: float
    by_block: dict[str, float]
    recompute: str
    attention: str
    tensors: int  # distinct storages counted
    notes: tuple[str, ...] = ()

    @property
    def blocks(self) -> list[str]:
        return [k for k in self.by_block if k]

    @property
    def per_block_bytes(self) -> float:
        b = self.blocks
        return sum(self.by_block[k] for k in b) / len(b) if b else 0.0


def _sid(t: torch.Tensor) -> int:
    """The identity of a tensor's storage (its StorageImpl; on meta every data pointer is 0)."""
    return t.untyped_storage()._cdata


def find_blocks(module: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The repeated blocks: the children of the largest ``nn.ModuleList`` whose children share one class (the
    transformer layers), with their paths; [] when the model has none."""
    best: list[tuple[str, torch.nn.Module]] = []
    for path, m in module.named_modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) > len(best) and len({type(c) for c in m}) == 1:
            best = [(f"{path}.{i}" if path else str(i), c) for i, c in enumerate(m)]
    return best


_MATMULS = {torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default}


class _ScoreTaint(TorchDispatchMode):
    """Marks the attention core's tensors (Megatron's selective recomputation, Korthikanti et al. 2022 sec. 5):
    a batched matmul of two activations neither of which is marked makes the scores (Q K^T) and starts the
    core; whatever is computed from a marked tensor is marked (scale, mask, softmax, dropout), until a matmul
    that takes a marked tensor (the probabilities times V) ends it."""

    def __init__(self, state: set[int], keep: list):
        super().__init__()
        self.marked = state
        self.keep = keep  # holds the marked storages alive so no identity is reused

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        ins = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        hit = any(_sid(x) in self.marked for x in ins)
        if func in _MATMULS:
            mats = ins[-2:]
            mark = not hit and len(mats) == 2 and not any(getattr(x, "_opmap_state", False) for x in mats)
        else:
            mark = hit
        if mark:
            for o in tree_flatten(out)[0]:
                if isinstance(o, torch.Tensor):
                    self.marked.add(_sid(o))
                    self.keep.append(o)
        return out


class _Attention(TorchFunctionMode):
    """SDPA as a fused (flash) kernel saves only q, k, v, the output and the fp32 log-sum-exp (B, H, S_q): the
    tensors its math path saves on meta are dropped and those five stand for them. ``math``: SDPA is
    decomposed here, in the input dtype (scores, softmax, dropout with a 1-byte mask, times V), as the
    unfused attention the Korthikanti formula assumes. Dropout takes CUDA's fused path (native_dropout: a
    1-byte mask) instead of CPU's (a mask in the input's dtype)."""

    def __init__(self, rec: _Recorder, attention: str):
        super().__init__()
        self.rec, self.attention = rec, attention

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "dropout" and func in (torch.nn.functional.dropout, torch.dropout):
            bound = dict(zip(("input", "p", "training", "inplace"), args), **kwargs)
            x, p, train = bound["input"], float(bound.get("p", 0.5)), bound.get("training", True)
            if train and 0.0 < p < 1.0 and torch.is_grad_enabled():
                return torch.native_dropout(x, p, True)[0]
            return func(*args, **kwargs)
        if name not in ("scaled_dot_product_attention", "sink_attention"):
            return func(*args, **kwargs)
        # attention with sinks (opmap.capture.functions.sink_attention) keeps what fused SDPA keeps (its sinks are
        # a parameter); under math, its exact construction's decomposition
        names = ("query", "key", "value", "sinks" if name == "sink_attention" else "attn_mask", "dropout_p",
                 "is_causal", "scale", "enable_gqa")
        b = dict(zip(names, args), **kwargs)
        if self.attention == "math":
            return func(*args, **kwargs) if name == "sink_attention" else _math_sdpa(**b)
        self.rec.paused += 1
        try:
            out = _fused_layout(func(*args, **kwargs), b["query"])
        finally:
            self.rec.paused -= 1
        if torch.is_grad_enabled() and out.requires_grad:
            q = b["query"]
            for t in (q, b["key"], b["value"], b.get("attn_mask"), out):
                if isinstance(t, torch.Tensor):
                    self.rec.pack(t)
            lse = q.shape[:-1]  # (B, H, S_q) in fp32
            self.rec.add_synthetic(4.0 * math.prod(lse))
        return out


def _fused_layout(out: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The attention output laid out as the fused kernels lay it: like the query (PyTorch's CPU flash kernel; the
    CUDA ones as (B, S, H, D)), so the usual transpose(1, 2).reshape after attention is a view of it, not a copy
    (meta runs the math path, whose output is contiguous (B, H, S, D)); opmap.capture.functions does the same."""
    if out.dim() != 4 or not isinstance(q, torch.Tensor):
        return out
    if q.shape == out.shape:
        lay = torch.empty_like(q)
    else:
        b, h, s, d = out.shape
        lay = torch.empty((b, s, h, d), dtype=out.dtype, device=out.device).transpose(1, 2)
    return lay.copy_(out)  # keeps the autograd history; a copy saves nothing


def _math_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Unfused attention in the inputs' dtype: softmax(Q K^T * scale + mask) (dropout) V."""
    hq, hk = query.shape[-3], key.shape[-3]
    if enable_gqa and hq != hk:
        key = key.repeat_interleave(hq // hk, dim=-3)
        value = value.repeat_interleave(hq // hk, dim=-3)
    s = (scale if scale is not None else 1.0 / math.sqrt(query.shape[-1]))
    scores = torch.matmul(query, key.transpose(-2, -1)) * s
    sq, sk = scores.shape[-2:]
    if is_causal:
        with torch.no_grad():
            bias = torch.full((sq, sk), float("-inf"), dtype=scores.dtype, device=scores.device).triu(1)
        scores = scores + bias  # an additive bias not requiring grad: nothing saved (a fused mask in Megatron)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool \
            else scores + attn_mask
    p = torch.softmax(scores, dim=-1)
    if dropout_p > 0.0:
        p = torch.native_dropout(p, dropout_p, True)[0]
    return torch.matmul(p, value)


class _Recorder:
    """The pack hook's state: storages counted, by block; what selective and full recomputation drop."""

    def __init__(self, exclude: set[int], recompute: str, marked: set[int]):
        self.exclude, self.recompute, self.marked = exclude, recompute, marked
        self.seen: set[int] = set()
        self.keep: list[torch.Tensor] = []
        self.by_block: dict[str, float] = {}
        self.block = ""  # the block the forward is in ("" outside every block)
        self.paused = 0
        self.notes: list[str] = []

    def add_bytes(self, n: float) -> None:
        self.by_block[self.block] = self.by_block.get(self.block, 0.0) + n

    def add_synthetic(self, n: float) -> None:
        """Bytes a fused kernel saves that the meta run does not make (flash attention's log-sum-exp)."""
        if not (self.recompute == "full" and self.block):
            self.add_bytes(n)

    def pack(self, t: torch.Tensor, force: bool = False) -> None:
        sid = _sid(t)
        if sid in self.seen or sid in self.exclude:
            return
        if not force:
            if self.recompute == "full" and self.block:
                return  # inside a checkpointed layer: recomputed, only the layer's input is kept
            if self.recompute == "selective" and sid in self.marked:
                return  # the attention core: recomputed
        self.seen.add(sid)
        self.keep.append(t)
        self.add_bytes(float(t.untyped_storage().nbytes()))

    def hook(self, t: torch.Tensor) -> torch.Tensor:
        if not self.paused:
            self.pack(t)
        return t


def _to_meta(module: torch.nn.Module, inputs: Any) -> tuple[torch.nn.Module, Any]:
    if any(p.device.type != "meta" for p in module.parameters()):
        module = copy.deepcopy(module).to("meta")
    return module, tree_map(lambda x: x.to("meta") if isinstance(x, torch.Tensor) else x, inputs)


def saved_activation_bytes(module: torch.nn.Module, inputs: Any, recompute: str = "none",
                           attention: str = "fused", forward: Callable | None = None,
                           loss: Callable | None = None) -> SavedActivations:
    """Bytes of the activations one forward in training mode keeps for the backward, measured on meta.

    ``inputs``: a tensor, a tuple of positional args or a dict of keyword args (moved to meta; a model not on
    meta is copied there). Every storage autograd saves counts once, at its full size (a view keeps its whole
    storage alive); parameters and buffers never count.

    ``recompute``: ``none``; ``selective`` (Megatron, Korthikanti et al. 2022): the attention core between Q K^T
    and the probabilities times V is recomputed, so the S x S scores, probabilities and dropout mask are not
    kept (with fused SDPA there is nothing S x S to drop: selective equals none); ``full``: each block (see
    ``find_blocks``) keeps only its input, everything saved inside it is recomputed.

    ``attention``: ``fused`` (SDPA as a flash kernel runs it: q, k, v, output, fp32 log-sum-exp) or ``math``
    (SDPA decomposed: the S x S probabilities and dropout mask kept). Explicit matmul / softmax attention is
    measured as written either way.

    ``loss``: applied to the output inside the measurement (the training step's loss, whose saved tensors, such as
    the log-softmax over the vocabulary, count outside the blocks)."""
    if recompute not in RECOMPUTE:
        raise OpmapError(f"unknown recompute {recompute!r}; accepted: {', '.join(RECOMPUTE)}")
    if attention not in ATTENTION:
        raise OpmapError(f"unknown attention {attention!r}; accepted: {', '.join(ATTENTION)}")
    module, inputs = _to_meta(module, inputs)
    args, kwargs = _call_args(inputs)
    state = list(module.parameters()) + list(module.buffers())
    exclude = {_sid(p) for p in state}
    marked: set[int] = set()
    rec = _Recorder(exclude, recompute, marked)
    blocks = find_blocks(module)
    if recompute == "full" and not blocks:
        raise OpmapError("recompute 'full' checkpoints each repeated block, and the model has no nn.ModuleList "
                         "of one block class; accepted for it: none, selective")
    handles = _block_hooks(blocks, rec, recompute)
    keep: list = []
    with _training_mode(module, state, handles):
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(rec.hook, lambda t: t), \
                _Attention(rec, attention), _ScoreTaint(marked, keep):
            out = (forward or module)(*args, **kwargs)
            if loss is not None:
                out = loss(out)
        del out
    notes = []
    if attention == "fused" and recompute == "selective":
        notes.append("fused attention (SDPA as flash) saves nothing S x S: selective recomputation drops only "
                     "what explicit attention math saves")
    return SavedActivations(sum(rec.by_block.values()), dict(rec.by_block), recompute, attention,
                            len(rec.seen), tuple(notes))


def _call_args(inputs: Any) -> tuple[tuple, dict]:
    """(positional, keyword) arguments of a forward call: ``inputs`` a dict of keyword args, a tuple or list of
    positional ones, or one tensor."""
    if isinstance(inputs, dict):
        return (), inputs
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def _block_hooks(blocks: list[tuple[str, torch.nn.Module]], rec: _Recorder, recompute: str) -> list:
    """Hooks on each block that tell the recorder which block runs (and under full recomputation keep the block's
    tensor inputs, as its checkpoint does); the handles, to remove them."""
    handles = []
    for path, blk in blocks:
        def pre(m, a, kw, path=path):
            rec.block = path
            if recompute == "full":  # the checkpoint keeps the layer's tensor inputs
                for x in tree_flatten((a, kw))[0]:
                    if isinstance(x, torch.Tensor):
                        rec.pack(x, force=True)

        def post(m, a, kw, o):
            rec.block = ""
        handles.append(blk.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(blk.register_forward_hook(post, with_kwargs=True))
    return handles


@contextlib.contextmanager
def _training_mode(module: torch.nn.Module, state: list, handles: list):
    """The module in training mode with every floating-point parameter requiring grad and its parameters and buffers
    (``state``) marked as module state, for the forward measured inside; afterwards the hooks (``handles``)
    removed and the module as it was."""
    grads = [(p, p.requires_grad) for p in module.parameters()]
    for p in state:
        p._opmap_state = True
    was_training = module.training
    module.train(True)
    try:
        for p, _ in grads:
            if p.is_floating_point():
                p.requires_grad_(True)
        yield
    finally:
        for h in handles:
            h.remove()
        for p, rg in grads:
            p.requires_grad_(rg)
        for p in state:
            del p._opmap_state
        module.train(was_training)


# -- the activation formula (for checking) ---------------------------------------------------------------

def korthikanti_bytes(s: int, b: int, h: int, a: int, recompute: str = "none", t: int = 1) -> float:
    """Activation bytes per transformer layer, Korthikanti et al. 2022 (arXiv 2205.05198) Eq. 1 and sec. 5:
    fp16, FFN 4h, dropout masks of 1 byte, unfused attention; tensor + sequence parallel size ``t``.
    none: s b h (34 + 5 a s / h) / t; selective: 34 s b h / t; full: 2 s b h (the layer input)."""
    if recompute == "none":
        return s * b * h * (34 + 5 * a * s / h) / t
    if recompute == "selective":
        return 34 * s * b * h / t
    if recompute == "full":
        return 2 * s * b * h
    raise OpmapError(f"unknown recompute {recompute!r}; accepted: {', '.join(RECOMPUTE)}")
