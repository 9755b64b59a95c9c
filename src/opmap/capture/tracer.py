"""Capture a PyTorch module's forward pass as an OpGraph, at the aten level.

Mechanism:

- a ``TorchDispatchMode`` sees every aten call after autograd and decomposition of composite ops, with
  real shapes, dtypes and strides; on the meta device nothing is allocated, so a 70B model is analysed
  on a laptop;
- forward pre/post hooks on every submodule keep the module stack, giving each op its module path and
  layer type;
- a ``TorchFunctionMode`` records ``scaled_dot_product_attention`` whole, as the fused kernel it is on
  CPU and CUDA. (Without this, the meta device, which has no fused kernel, would decompose it into the
  math path and the S x S scores would look as if they went through memory.) The aten op that actually ran
  underneath is kept in the node's ``args["backend_op"]``;
- edges come from tensor identity: each result tensor maps to the node that made it. Views map to the
  view node; an in-place op (or an ``out=`` write) becomes the latest writer of its storage, so later
  readers of that storage, through any view, depend on it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.weak import WeakIdKeyDictionary

from opmap.capture.layer_types import classify
from opmap.capture.training import OPTIMIZERS, AdamW, sgd_step, training_loss
from opmap.errors import OpmapError
from opmap.graph import Node, OpGraph, TensorMeta
from opmap.ops import DATA_MOVEMENT_OPS, EXTRA_VIEW_OPS, is_pointwise

SDPA_NAME = "scaled_dot_product_attention"


_DTYPE_NAMES: dict[torch.dtype, str] = {}


def _dtype_name(dt: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        name = _DTYPE_NAMES[dt] = str(dt).removeprefix("torch.")
    return name


def _jsonable(v: Any) -> Any:
    """Non-tensor arguments as JSON values (dtypes, devices, layouts as strings)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, torch.dtype):
        return _dtype_name(v)
    if isinstance(v, (torch.device, torch.layout, torch.memory_format)):
        return str(v)
    if isinstance(v, torch.SymInt):
        return int(v)
    return repr(v)


class _Tracker:
    """State shared by the dispatch and function modes during one capture."""

    def __init__(self, overrides: Sequence[tuple[str, str]]):
        self.nodes: list[Node] = []
        self.producer = WeakIdKeyDictionary()  # tensor -> node id that produced it
        self.param_of = WeakIdKeyDictionary()  # tensor -> parameter / buffer name (views included)
        self.storage_writer: dict[int, int] = {}  # storage id -> last node that wrote it
        self.stack: list[tuple[str, str]] = []  # (module path, class name), outermost first
        self.overrides = overrides
        self.suppress = 0  # >0 while a whole-recorded call runs its own aten ops
        self.suppressed_ops: list[str] = []
        self.train = False
        self.phase = "forward"  # forward | backward | optimizer (training captures)
        self.grad_fn_stack: dict[Any, list[tuple[str, str]]] = {}  # autograd node -> forward module stack
        self.layer_types: dict[tuple, str] = {}  # (module stack, op kind) -> layer type, classified once

    def remember_grad_fns(self, out: Any) -> None:
        """Forward, training: the autograd node of each result remembers the module that made it, so the
        backward ops it runs get that module's path and layer type."""
        todo = [x.grad_fn for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor) and x.grad_fn is not None]
        # the result's own node and the nodes behind it that no earlier op claimed (a composite op such as
        # linear on 3-D input leaves AddmmBackward behind a ViewBackward): all belong to this module
        while todo:
            fn = todo.pop()
            if fn is None or fn in self.grad_fn_stack or type(fn).__name__ == "AccumulateGrad":
                continue
            self.grad_fn_stack[fn] = list(self.stack)
            todo.extend(nxt for nxt, _ in fn.next_functions)

    # -- tensors -------------------------------------------------------------------------------------
    def register_params(self, module: torch.nn.Module) -> None:
        for name, p in module.named_parameters(remove_duplicate=True):
            self.param_of[p] = name
        for name, b in module.named_buffers(remove_duplicate=True):
            self.param_of[b] = name

    @staticmethod
    def _storage_id(t: torch.Tensor) -> int | None:
        try:
            return t.untyped_storage()._cdata
        except Exception:  # tensors without storage (some subclasses)
            return None

    def meta(self, t: torch.Tensor) -> TensorMeta:
        prod = self.producer.get(t)
        sid = self._storage_id(t)
        w = self.storage_writer.get(sid) if sid is not None else None
        if w is not None and (prod is None or w > prod):
            prod = w
        try:
            stride = tuple(map(int, t.stride()))
        except RuntimeError:  # sparse or nested layouts
            stride = ()
        return TensorMeta(tuple(map(int, t.shape)), _dtype_name(t.dtype), stride, prod, self.param_of.get(t))

    # -- nodes ---------------------------------------------------------------------------------------
    def add_node(self, op: str, packet: str, inputs: list[tuple[str, torch.Tensor]], args: dict[str, Any],
                 outputs: list[torch.Tensor], is_view: bool, is_inplace: bool) -> Node:
        nid = len(self.nodes)
        in_meta = tuple(self.meta(t) for _, t in inputs)
        if is_view:
            kind = "data_movement"
        elif packet in DATA_MOVEMENT_OPS:
            kind = "data_movement"
        elif is_pointwise(op):
            kind = "elementwise"
        else:
            kind = "other"
        param_in = next((m.param for m in in_meta if m.param), None) if is_view else None
        out_meta = []
        for t in outputs:
            if is_view and param_in is not None:
                self.param_of[t] = param_in
            if not is_inplace:
                self.producer[t] = nid
            sid = self._storage_id(t)
            if sid is not None and (is_inplace or not is_view):
                self.storage_writer[sid] = nid
            stride = tuple(map(int, t.stride())) if t.layout == torch.strided else ()
            out_meta.append(TensorMeta(tuple(map(int, t.shape)), _dtype_name(t.dtype), stride,
                                       None, self.param_of.get(t)))
        stack = self.stack
        if self.phase == "backward":
            current = getattr(torch._C, "_current_autograd_node", None)  # private; absent in old releases
            cur = current() if current is not None else None
            stack = self.grad_fn_stack.get(cur, []) if cur is not None else []
            args = {**args, "phase": "backward"}
        elif self.phase == "optimizer":
            args = {**args, "phase": "optimizer"}
        module, cls = stack[-1] if stack else ("", "")
        where = (tuple(stack), kind)
        layer_type = self.layer_types.get(where)
        if layer_type is None:
            layer_type = self.layer_types[where] = classify(stack, kind, self.overrides)
        node = Node(
            id=nid, op=op, module=module, module_class=cls, layer_type=layer_type,
            inputs=in_meta, outputs=tuple(out_meta), input_names=tuple(n for n, _ in inputs), args=args,
            is_view=is_view, is_inplace=is_inplace,
        )
        self.nodes.append(node)
        return node


def _bind(schema_args: Sequence[Any], args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    """(schema name, value) pairs for the arguments actually passed."""
    bound: list[tuple[str, Any]] = []
    pos = list(args)
    for i, a in enumerate(schema_args):
        if i < len(pos) and not a.kwarg_only:
            bound.append((a.name, pos[i]))
        elif a.name in kwargs:
            bound.append((a.name, kwargs[a.name]))
    return bound


def _split(bound: Iterable[tuple[str, Any]]) -> tuple[list[tuple[str, torch.Tensor]], dict[str, Any]]:
    tensors: list[tuple[str, torch.Tensor]] = []
    scalars: dict[str, Any] = {}
    for name, v in bound:
        if isinstance(v, torch.Tensor):
            tensors.append((name, v))
        elif isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            for j, x in enumerate(v):
                if isinstance(x, torch.Tensor):
                    tensors.append((f"{name}[{j}]", x))
        else:
            scalars[name] = _jsonable(v)
    return tensors, scalars


def _is_view_op(func) -> bool:
    """An op whose result aliases an input without writing it (``OpOverload.is_view`` where torch has it)."""
    flag = getattr(func, "is_view", None)
    if flag is not None:
        return bool(flag)
    return any(a.alias_info is not None and not a.alias_info.is_write for a in func._schema.arguments)


class _NoMemo(Exception):
    """This call's result cannot be replayed from its signature."""


_SCALARS = (bool, int, float, str, torch.dtype, torch.device, torch.layout, torch.memory_format)
# 0-dim tensors of these dtypes may be wrapped Python numbers, which promote differently from real tensors
_WRAPPED_DTYPES = (torch.float64, torch.int64, torch.complex128, torch.bool)


def _freeze(v: Any) -> Any:
    """A hashable signature of one argument: a tensor's metadata, a scalar with its type (1 and 1.0 and True
    promote differently), lists and tuples element by element."""
    if isinstance(v, torch.Tensor):
        if (type(v) is not torch.Tensor and type(v) is not torch.nn.Parameter) or v.device.type != "meta" \
                or v.layout != torch.strided or (v.dim() == 0 and v.dtype in _WRAPPED_DTYPES):
            raise _NoMemo
        return (tuple(v.shape), v.stride(), v.dtype, v.storage_offset(), v.requires_grad)
    if isinstance(v, (list, tuple)):
        return (type(v) is list, tuple(_freeze(x) for x in v))
    if v is None or isinstance(v, _SCALARS):
        return (type(v), v)
    raise _NoMemo


def _storage_ids(xs) -> list[int]:
    return [x.untyped_storage()._cdata for x in xs if isinstance(x, torch.Tensor)]


class _DispatchRecorder(TorchDispatchMode):
    """Records every aten call. On the meta device, a functional op called again with the same signature (80
    identical layers repeat every call) gets fresh outputs of the recorded shapes, strides and dtypes instead
    of running torch's Python meta kernel again: the output metadata of a functional op is a function of its
    inputs' metadata and its other arguments. Views, in-place ops, outputs that alias an input or carry a
    storage offset, and training captures always run the op."""

    def __init__(self, tracker: _Tracker, memoize: bool = True):
        super().__init__()
        self.t = tracker
        self.memoize = memoize and not tracker.train
        self.memo: dict[Any, Any] = {}  # signature -> (output leaves' metadata, output tree spec), or None
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
                key = (func, _freeze(args), _freeze(tuple(sorted(kwargs.items()))))
            except _NoMemo:
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
            fresh = (all(type(x) is torch.Tensor and x.storage_offset() == 0 and x.layout == torch.strided
                         for x in outs)
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
            ins = ", ".join(f"{'x'.join(map(str, x.shape)) or 'scalar'} {_dtype_name(x.dtype)}"
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
        tensors, scalars = _split(_bind(func._schema.arguments, args, kwargs))
        outs = [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]
        t.add_node(name, packet, tensors, scalars, outs, is_view, is_inplace)
        return out


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


class _FunctionRecorder(TorchFunctionMode):
    """Records calls that opmap costs whole (fused SDPA) instead of by their decomposition. On meta, a repeat
    of an SDPA signature reuses the first call's output layout and backend instead of running the decomposed
    math path again (outside training captures)."""

    def __init__(self, tracker: _Tracker, memoize: bool = True):
        super().__init__()
        self.t = tracker
        self.memoize = memoize and not tracker.train
        self.memo: dict[Any, tuple[tuple, str]] = {}  # signature -> ((shape, stride, dtype), backend_op)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
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
        tensors, scalars = _split(bound)
        key = None
        if self.memoize:
            try:
                key = (_freeze(args), _freeze(tuple(sorted(kwargs.items()))))
            except _NoMemo:
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
                out = _MetaFlashAttention.apply(out, t, b["query"], b["key"], b["value"], b.get("attn_mask"),
                                                bool(b.get("is_causal", False)), b.get("scale"))
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


class _MetaFlashAttention(torch.autograd.Function):
    """Training capture on meta, where SDPA has no fused kernel: the attention output (laid out as the fused kernel
    lays it) joined to q, k and v through a flash-attention backward, recorded as one
    ``_scaled_dot_product_flash_attention_backward`` node (its five GEMMs cost by costs.backward), as CUDA runs
    it, instead of a cut in the autograd graph or the math path's S x S backward."""

    @staticmethod
    def forward(ctx, out, tracker, q, k, v, mask, is_causal, scale):
        ctx.tracker, ctx.is_causal, ctx.scale, ctx.mask = tracker, is_causal, scale, mask
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
                   {"is_causal": ctx.is_causal, "scale": ctx.scale, "backend_op": "flash (meta stand-in)"},
                   [dq, dk, dv], is_view=False, is_inplace=False)
        return None, None, dq, dk, dv, None, None, None


@contextlib.contextmanager
def _module_hooks(model: torch.nn.Module, tracker: _Tracker):
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
    see _DispatchRecorder). Off: every call runs torch's meta kernel."""
    if isinstance(inputs, dict):
        args, kwargs = (), {**inputs, **(kwargs or {})}
    elif isinstance(inputs, (tuple, list)):
        args, kwargs = tuple(inputs), dict(kwargs or {})
    else:
        args, kwargs = (inputs,), dict(kwargs or {})
    if optimizer not in OPTIMIZERS:
        raise OpmapError(f"unknown optimizer {optimizer!r}; accepted: {', '.join(OPTIMIZERS)}")
    tracker = _Tracker(overrides)
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
            with torch.enable_grad(), _module_hooks(model, tracker), _FunctionRecorder(tracker), \
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
            with torch.no_grad(), _module_hooks(model, tracker), _FunctionRecorder(tracker, memoize), \
                    _DispatchRecorder(tracker, memoize):
                fn(*args, **kwargs)
    finally:
        model.train(was_training)
    return OpGraph(nodes=tuple(tracker.nodes), params=params, param_bytes=pbytes, buffers=buffers,
                   inputs=in_meta, device=dev, notes=fast_path_notes(model, train),
                   param_sizes=tuple((name, p.numel()) for name, p in model.named_parameters()))
