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
from typing import Any, Callable, Iterable, Sequence

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from opmap.capture.layer_types import classify
from opmap.capture.training import sgd_step, training_loss
from opmap.errors import OpmapError
from opmap.graph import Node, OpGraph, TensorMeta
from opmap.ops import DATA_MOVEMENT_OPS, EXTRA_VIEW_OPS, is_pointwise

SDPA_NAME = "scaled_dot_product_attention"


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


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
            stride = tuple(int(s) for s in t.stride())
        except RuntimeError:  # sparse or nested layouts
            stride = ()
        return TensorMeta(tuple(int(s) for s in t.shape), _dtype_name(t.dtype), stride, prod,
                          self.param_of.get(t))

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
            stride = tuple(int(s) for s in t.stride()) if t.layout == torch.strided else ()
            out_meta.append(TensorMeta(tuple(int(s) for s in t.shape), _dtype_name(t.dtype), stride,
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
        node = Node(
            id=nid, op=op, module=module, module_class=cls,
            layer_type=classify(stack, kind, self.overrides),
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


class _DispatchRecorder(TorchDispatchMode):
    def __init__(self, tracker: _Tracker):
        super().__init__()
        self.t = tracker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        t = self.t
        try:
            out = func(*args, **kwargs)
        except (NotImplementedError, RuntimeError) as e:
            flat, _ = tree_flatten((args, kwargs))
            if any(isinstance(x, torch.Tensor) and x.device.type == "meta" for x in flat):
                path, cls = t.stack[-1] if t.stack else ("", "")
                where = f"module {path!r} ({cls})" if path else f"the top-level module ({cls or 'none'})"
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise MetaCaptureError(
                    f"op {func} in {where} cannot run on the meta device ({first[:120]}); "
                    "capture with real tensors instead: --device cpu (or build the model and inputs on the CPU)") from None
            raise
        if t.suppress:
            t.suppressed_ops.append(str(func))
            return out
        schema = func._schema
        tensors, scalars = _split(_bind(schema.arguments, args, kwargs))
        outs = [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]
        packet = func.overloadpacket.__name__
        is_view = _is_view_op(func) or packet in EXTRA_VIEW_OPS
        is_inplace = bool(schema.is_mutable)
        t.add_node(str(func), packet, tensors, scalars, outs, is_view, is_inplace)
        return out


class MetaCaptureError(OpmapError):
    """An op has no meta implementation (data-dependent shapes, .item(), nonzero)."""


class _FunctionRecorder(TorchFunctionMode):
    """Records calls that opmap costs whole (fused SDPA) instead of by their decomposition."""

    def __init__(self, tracker: _Tracker):
        super().__init__()
        self.t = tracker

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") != SDPA_NAME or self.t.suppress:
            out = func(*args, **kwargs)
            if self.t.train and self.t.stack:
                self.t.remember_grad_fns(out)
            return out
        t = self.t
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        bound = list(zip(names, args)) + [(k, v) for k, v in kwargs.items()]
        tensors, scalars = _split(bound)
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
        scalars["backend_op"] = fused[0] if fused else "math (decomposed: no fused kernel on this device)"
        scalars.setdefault("is_causal", False)
        scalars.setdefault("dropout_p", 0.0)
        t.add_node("aten.scaled_dot_product_attention.default", SDPA_NAME, tensors, scalars,
                   [out], is_view=False, is_inplace=False)
        if t.train:
            t.remember_grad_fns(out)
        return out


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


def capture(model: torch.nn.Module, inputs: Any = (), kwargs: dict | None = None, *,
            overrides: Sequence[tuple[str, str]] = (), forward: Callable | None = None,
            train: bool = False) -> OpGraph:
    """Run ``model`` once on ``inputs`` (a tensor, a tuple of positional args, or a dict of kwargs) and
    return the graph of aten ops it executed. Runs under ``torch.no_grad()``; the device is whatever the
    model and inputs are on (meta by default in the zoo and the CLI).

    ``train``: one training step instead, in train mode: forward, the loss (``training_loss``), backward
    and an SGD update. Backward ops carry ``args["phase"] = "backward"`` and the module path and layer type
    of the forward op whose autograd node ran them; the update's ops carry ``"optimizer"``."""
    if isinstance(inputs, dict):
        args, kwargs = (), {**inputs, **(kwargs or {})}
    elif isinstance(inputs, (tuple, list)):
        args, kwargs = tuple(inputs), dict(kwargs or {})
    else:
        args, kwargs = (inputs,), dict(kwargs or {})
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
            with torch.enable_grad(), _module_hooks(model, tracker), _FunctionRecorder(tracker), \
                    _DispatchRecorder(tracker):
                loss = training_loss(fn(*args, **kwargs))
                tracker.phase = "backward"
                loss.backward()
                tracker.phase = "optimizer"
                sgd_step(trainable)
        else:
            with torch.no_grad(), _module_hooks(model, tracker), _FunctionRecorder(tracker), \
                    _DispatchRecorder(tracker):
                fn(*args, **kwargs)
    finally:
        model.train(was_training)
    return OpGraph(nodes=tuple(tracker.nodes), params=params, param_bytes=pbytes, buffers=buffers,
                   inputs=in_meta, device=dev)
