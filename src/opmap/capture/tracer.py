"""Capture a PyTorch module's forward pass as an OpGraph, at the aten level.

Mechanism:

- a ``TorchDispatchMode`` sees every aten call after autograd and decomposition of composite ops, with
  real shapes, dtypes and strides; on the meta device nothing is allocated, so a 70B model is analysed
  on a laptop;
- forward pre/post hooks on every submodule keep the module stack, giving each op its module path and
  layer type;
- a ``TorchFunctionMode`` records ``scaled_dot_product_attention`` whole, as the fused kernel it is on
  CPU and CUDA (opmap.capture.functions). (Without this, the meta device, which has no fused kernel, would
  decompose it into the math path and the S x S scores would look as if they went through memory.) The aten op
  that actually ran underneath is kept in the node's ``args["backend_op"]``;
- edges come from tensor identity: each result tensor maps to the node that made it. Views map to the
  view node; an in-place op (or an ``out=`` write) becomes the latest writer of its storage, so later
  readers of that storage, through any view, depend on it (the graph under construction:
  opmap.capture.tracker).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from opmap.capture.functions import FunctionRecorder
from opmap.capture.repeat import replaying
from opmap.capture.tracker import NoMemo, Tracker, bind_args, dtype_name, freeze, split_args
from opmap.capture.training import OPTIMIZERS, AdamW, sgd_step, training_loss
from opmap.errors import OpmapError
from opmap.graph import OpGraph
from opmap.ops import EXTRA_VIEW_OPS


def _is_view_op(func) -> bool:
    """An op whose result aliases an input without writing it (``OpOverload.is_view`` where torch has it)."""
    flag = getattr(func, "is_view", None)
    if flag is not None:
        return bool(flag)
    return any(a.alias_info is not None and not a.alias_info.is_write for a in func._schema.arguments)


def _storage_ids(xs) -> list[int]:
    return [x.untyped_storage()._cdata for x in xs if isinstance(x, torch.Tensor)]


# The memo of functional meta calls (_DispatchRecorder), shared by the captures of a process: the same signature gives
# the same output layout in any capture (a serve pricing's decode steps at two KV lengths repeat every call outside
# attention). One per default dtype (a factory call without a dtype takes it); emptied past MEMO_KEPT entries.
_MEMOS: dict[Any, dict[Any, Any]] = {}
MEMO_KEPT = 20_000  # a serve pricing of DeepSeek-R1 keeps about 1,300


def _shared_memo() -> dict[Any, Any]:
    memo = _MEMOS.setdefault(torch.get_default_dtype(), {})
    if len(memo) > MEMO_KEPT:
        memo.clear()
    return memo


class _DispatchRecorder(TorchDispatchMode):
    """Records every aten call. On the meta device, a functional op called again with the same signature (80
    identical layers repeat every call) gets fresh outputs of the recorded shapes, strides and dtypes instead
    of running torch's Python meta kernel again: the output metadata of a functional op is a function of its
    inputs' metadata and its other arguments (the memo is the process's, ``_MEMOS``). Views, in-place ops,
    outputs that alias an input or carry a storage offset, and training captures always run the op."""

    def __init__(self, tracker: Tracker, memoize: bool = True):
        super().__init__()
        self.t = tracker
        self.memoize = memoize and not tracker.train
        # signature -> (output leaves' metadata, output tree spec)
        self.memo: dict[Any, Any] = _shared_memo() if self.memoize else {}
        self.ops: dict[Any, tuple[str, str, bool, bool]] = {}  # func -> (name, packet, is_view, is_inplace)

    def _op(self, func) -> tuple[str, str, bool, bool]:
        info = self.ops.get(func)
        if info is None:
            packet = func.overloadpacket.__name__
            info = (str(func), packet, _is_view_op(func) or packet in EXTRA_VIEW_OPS, bool(func._schema.is_mutable))
            self.ops[func] = info
        return info

    def _run(self, func, args, kwargs, functional: bool):
        key = None
        if self.memoize and functional:
            try:
                key = (func, freeze(args), freeze(tuple(sorted(kwargs.items()))))
            except NoMemo:
                key = None
            if key is not None:
                entry = self.memo.get(key)
                if entry is not None:
                    metas, spec = entry
                    leaves = [torch.empty_strided(m[0], m[1], dtype=m[2], device="meta") if m is not None else v
                              for m, v in metas]
                    return tree_unflatten(leaves, spec)
        out = self._call(func, args, kwargs)
        if key is not None and key not in self.memo:
            leaves, spec = tree_flatten(out)
            outs = [x for x in leaves if isinstance(x, torch.Tensor)]
            out_ids = _storage_ids(outs)
            # a factory call (torch.zeros((), device=...): no tensor argument) on a real device is no meta call: its
            # replay would hand a meta tensor to a capture on real tensors (eager attention's mask on --device cpu)
            fresh = (all(type(x) is torch.Tensor and x.storage_offset() == 0 and x.layout == torch.strided
                         and x.device.type == "meta" for x in outs)
                     and len(set(out_ids)) == len(out_ids)
                     and not set(out_ids) & set(_storage_ids(tree_flatten((args, kwargs))[0])))
            if fresh:
                self.memo[key] = ([((tuple(x.shape), x.stride(), x.dtype), None) if isinstance(x, torch.Tensor)
                                   else (None, x) for x in leaves], spec)
        return out

    def _call(self, func, args, kwargs):
        try:
            return func(*args, **kwargs)
        except (NotImplementedError, RuntimeError) as e:
            if isinstance(e, torch.OutOfMemoryError) or "can't allocate memory" in str(e):
                raise  # the allocator's refusal: the size asked for, not the model's error (opmap.measure.oom)
            t = self.t
            flat, _ = tree_flatten((args, kwargs))
            path, cls = t.stack[-1] if t.stack else ("", "")
            where = f"module {path!r} ({cls})" if path else f"the top-level module ({cls or 'none'})"
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            on_meta = any(isinstance(x, torch.Tensor) and x.device.type == "meta" for x in flat)
            if on_meta and meta_limitation(e):
                raise MetaCaptureError(
                    f"op {func} in {where} cannot run on the meta device ({first[:120]}); "
                    "capture with real tensors instead: --device cpu (or build the model and inputs on the CPU)"
                ) from None
            ins = ", ".join(f"{'x'.join(map(str, x.shape)) or 'scalar'} {dtype_name(x.dtype)}"
                            for x in flat if isinstance(x, torch.Tensor))
            if not on_meta and (isinstance(e, NotImplementedError) or "not implemented for" in first):
                dev = next((x.device for x in flat if isinstance(x, torch.Tensor)), "this device")
                raise OpmapError(f"op {func} in {where} has no kernel on {dev} for its inputs ({ins}): "
                                 f"{first[:300]}; try another --dtype or --device") from None
            raise ModelForwardError(
                f"the model's forward fails: op {func} in {where} rejects its inputs ({ins or 'no tensors'}): "
                f"{first[:300].rstrip('.')}. This is an error in the model or its example inputs"
                + (", not a limit of the meta device (the same call fails with real tensors)" if on_meta else "")
                + "; fix the model file or the inputs it returns") from None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        t = self.t
        name, packet, is_view, is_inplace = self._op(func)
        out = self._run(func, args, kwargs, functional=not is_view and not is_inplace)
        if t.suppress:
            t.suppressed_ops.append(name)
            return out
        tensors, scalars = split_args(bind_args(func._schema.arguments, args, kwargs))
        outs = [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]
        t.add_node(name, packet, tensors, scalars, outs, is_view, is_inplace)
        return out


class _ShapesOnly(_DispatchRecorder):
    """``_DispatchRecorder``'s memo without its graph (``shapes_only``): it sees every op but records none."""

    records_ops = False


@contextlib.contextmanager
def shapes_only() -> Iterator[None]:
    """A forward run on meta for its shapes alone, no graph kept (a decode step's cache layout probe,
    opmap.workloads.hf_cache): a functional op called again with the same signature gets fresh outputs of the
    recorded layout instead of running torch's Python meta kernel again, as a capture does (``_DispatchRecorder``;
    DeepSeek-R1's 58 identical MoE layers). An expert loop inside still runs only its first call of each input
    layout (opmap.capture.repeat)."""
    t = Tracker(())
    t.suppress = 1  # nothing recorded: each op's name only, dropped after
    try:
        with _ShapesOnly(t):
            yield
    finally:
        t.suppressed_ops.clear()


class MetaCaptureError(OpmapError):
    """An op has no meta implementation (data-dependent shapes, .item(), nonzero)."""


class ModelForwardError(OpmapError):
    """An op of the model's forward rejects its inputs (a shape or dtype mismatch): the model's own error, on
    any device."""


# Words in the errors torch raises where the meta device, not the model, is the limit: no meta kernel, no
# data to read (.item(), .tolist(), a copy to the CPU), an output shape that depends on the data.
_META_WORDS = ("meta", "data-dependent", "data dependent", "no data", "unimplemented", "not implemented",
               "symbolic", "guard")


def meta_limitation(e: BaseException) -> bool:
    """Whether an op's error on meta tensors is the meta device's limit rather than the model's own error: a
    NotImplementedError, or a RuntimeError naming a missing meta kernel or data. A meta kernel that checks
    shapes raises the same RuntimeError the real kernel would (a shape message): that is the model's error."""
    if isinstance(e, NotImplementedError):
        return True
    text = str(e).lower()
    return any(w in text for w in _META_WORDS)


@contextlib.contextmanager
def _module_hooks(model: torch.nn.Module, tracker: Tracker):
    handles = []
    for path, mod in model.named_modules(remove_duplicate=False):
        cls = type(mod).__name__

        def pre(m, a, path=path, cls=cls):
            tracker.stack.append((path, cls))

        def post(m, a, o, path=path):
            # pop back to this module (robust to a child that raised and left its frame behind)
            while tracker.stack and tracker.stack[-1][0] != path:
                tracker.stack.pop()
            if tracker.stack:
                tracker.stack.pop()

        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _param_count(model: torch.nn.Module) -> tuple[int, float, int]:
    n = 0
    nbytes = 0.0
    seen = set()
    for p in model.parameters():  # parameters() de-duplicates shared (tied) parameters
        if id(p) in seen:
            continue
        seen.add(id(p))
        n += p.numel()
        nbytes += p.numel() * p.element_size()
    buffers = sum(b.numel() for b in model.buffers())
    return n, nbytes, buffers


FAST_PATH_MODULES = (torch.nn.TransformerEncoderLayer, torch.nn.TransformerEncoder, torch.nn.MultiheadAttention)


def fast_path_notes(model: torch.nn.Module, train: bool) -> tuple[str, ...]:
    """The modules eager PyTorch may run through its fused inference fast path on CPU and CUDA (in eval, under
    no_grad, with the fast path enabled), which a capture cannot take: an active dispatch or function mode
    turns it off, and meta has no fused kernel. Named, with what to do, since their captured ops are the
    unfused path's."""
    if train or not torch.backends.mha.get_fastpath_enabled():
        return ()
    found = [(path, type(m).__name__) for path, m in model.named_modules()
             if isinstance(m, FAST_PATH_MODULES) and not m.training]
    if not found:
        return ()
    top = [f for f in found if not any(f[0].startswith(o[0] + ".") for o in found if o[0] and o is not f)]
    names = ", ".join(f"{p or '(top)'} ({c})" for p, c in top[:4])
    names += f" and {len(top) - 4} more" if len(top) > 4 else ""
    return (f"fast path: {names} may run PyTorch's fused inference kernels on CPU and CUDA "
            "(aten._transformer_encoder_layer_fwd / _native_multi_head_attention); the capture recorded the "
            "unfused ops, so the prediction is of the unfused path. To measure what is predicted, run with "
            "torch.backends.mha.set_fastpath_enabled(False) (opmap profile does so for these modules).",)


def capture(model: torch.nn.Module, inputs: Any = (), kwargs: dict | None = None, *,
            overrides: Sequence[tuple[str, str]] = (), forward: Callable | None = None,
            train: bool = False, memoize: bool = True, optimizer: str = "sgd") -> OpGraph:
    """Run ``model`` once on ``inputs`` (a tensor, a tuple of positional args, or a dict of kwargs) and
    return the graph of aten ops it executed. Runs under ``torch.no_grad()``; the device is whatever the
    model and inputs are on (meta by default in the zoo and the CLI).

    ``train``: one training step instead, in train mode: forward, the loss (``training_loss``), backward
    and the ``optimizer``'s update (``sgd``: plain SGD; ``adamw``: AdamW with fp32 master weights and moments,
    opmap.capture.training.AdamW, its state made before the capture). Backward ops carry
    ``args["phase"] = "backward"`` and the module path and layer type
    of the forward op whose autograd node ran them; the update's ops carry ``"optimizer"``.

    ``memoize``: on meta, replay repeated functional calls from their signature (the same graph, faster;
    see _DispatchRecorder), and the repeated calls of an expert loop from their first two
    (opmap.capture.repeat). Off: every call runs torch's meta kernel."""
    if isinstance(inputs, dict):
        args, kwargs = (), {**inputs, **(kwargs or {})}
    elif isinstance(inputs, (tuple, list)):
        args, kwargs = tuple(inputs), dict(kwargs or {})
    else:
        args, kwargs = (inputs,), dict(kwargs or {})
    if optimizer not in OPTIMIZERS:
        raise OpmapError(f"unknown optimizer {optimizer!r}; accepted: {', '.join(OPTIMIZERS)}")
    tracker = Tracker(overrides)
    tracker.register_params(model)
    flat_in = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
    in_meta = tuple(tracker.meta(x) for x in flat_in)
    params, pbytes, buffers = _param_count(model)
    dev = next((str(x.device) for x in flat_in), None) or next(
        (str(p.device) for p in model.parameters()), "cpu")
    was_training = model.training
    model.train(train)
    fn = forward or model
    tracker.train = train
    try:
        if train:
            trainable = [p for p in model.parameters() if p.is_floating_point()]
            for p in trainable:
                p.requires_grad_(True)
                p.grad = None
            opt = AdamW(trainable, fused=optimizer == "adamw-fused") if optimizer.startswith("adamw") else None
            with torch.enable_grad(), _module_hooks(model, tracker), FunctionRecorder(tracker), \
                    _DispatchRecorder(tracker):
                loss = training_loss(fn(*args, **kwargs))
                tracker.phase = "backward"
                loss.backward()
                tracker.phase = "optimizer"
                if opt is not None:
                    opt.step()
                else:
                    sgd_step(trainable)
        else:
            with torch.no_grad(), _module_hooks(model, tracker), FunctionRecorder(tracker, memoize), \
                    _DispatchRecorder(tracker, memoize), replaying(tracker, memoize):
                fn(*args, **kwargs)
    finally:
        model.train(was_training)
    return OpGraph(nodes=tuple(tracker.nodes), params=params, param_bytes=pbytes, buffers=buffers,
                   inputs=in_meta, device=dev, notes=fast_path_notes(model, train),
                   param_sizes=tuple((name, p.numel()) for name, p in model.named_parameters()))
