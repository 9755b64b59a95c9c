"""The graph a capture builds as it goes: nodes, edges from tensor identity (each result maps to the node that
made it; an in-place or ``out=`` write makes its node the storage's latest writer), parameter names, the module
stack (each op's module path and layer type) and, in training captures, the forward module of each autograd node
(so backward ops carry their forward module's path). Shared by the dispatch and function recorders
(opmap.capture.tracer, opmap.capture.functions), with the helpers both use: arguments bound to their schema names
and split into tensors and JSON scalars, and a call's signature for replaying it (``freeze``)."""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from opmap.capture.layer_types import classify
from opmap.graph import Node, TensorMeta
from opmap.ops import DATA_MOVEMENT_OPS, is_pointwise

_DTYPE_NAMES: dict[torch.dtype, str] = {}


def dtype_name(dt: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        name = _DTYPE_NAMES[dt] = str(dt).removeprefix("torch.")
    return name


def jsonable(v: Any) -> Any:
    """Non-tensor arguments as JSON values (dtypes, devices, layouts as strings)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, torch.dtype):
        return dtype_name(v)
    if isinstance(v, (torch.device, torch.layout, torch.memory_format)):
        return str(v)
    if isinstance(v, torch.SymInt):
        return int(v)
    return repr(v)


class IdMap:
    """A map keyed by an object's identity that holds the object weakly, as torch.utils.weak.WeakIdKeyDictionary
    does for ``get`` and item assignment, at the cost of a dict look-up: each entry keeps a weak reference to its
    key beside the value, and a look-up answers only while that reference still points at the object asked for.
    An id left behind by a dead key (and reused by a new object) so reads as absent, as the weak dictionary's
    entry, dropped by its callback, would; the dead entry stays until it is overwritten or the map is dropped (a
    capture's: thousands of entries). The weak dictionary makes a weak reference on every look-up (a capture
    does about ten a node)."""

    __slots__ = ("_d",)

    def __init__(self):
        self._d: dict[int, tuple[weakref.ref, Any]] = {}

    def get(self, key: Any, default: Any = None) -> Any:
        e = self._d.get(id(key))
        return e[1] if e is not None and e[0]() is key else default

    def __setitem__(self, key: Any, value: Any) -> None:
        self._d[id(key)] = (weakref.ref(key), value)


class Tracker:
    """State shared by the dispatch and function modes during one capture."""

    def __init__(self, overrides: Sequence[tuple[str, str]]):
        self.nodes: list[Node] = []
        self.producer = IdMap()  # tensor -> node id that produced it
        self.param_of = IdMap()  # tensor -> parameter / buffer name (views included)
        # storage -> last node that wrote it, keyed by the storage's own Python object (torch keeps one a storage,
        # as it does a tensor's): a raw storage address is reused once its storage is freed, and a new tensor that
        # lands there (an optimizer's step counter, a late scratch tensor) would read as written by a dead one's
        # writer, differently each run
        self.storage_writer = IdMap()
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
    def _storage(t: torch.Tensor) -> torch.UntypedStorage | None:
        try:
            return t.untyped_storage()
        except Exception:  # tensors without storage (some subclasses)
            return None

    def meta(self, t: torch.Tensor) -> TensorMeta:
        prod = self.producer.get(t)
        st = self._storage(t)
        w = self.storage_writer.get(st) if st is not None else None
        if w is not None and (prod is None or w > prod):
            prod = w
        try:
            stride = tuple(map(int, t.stride()))
        except RuntimeError:  # sparse or nested layouts
            stride = ()
        return TensorMeta(tuple(map(int, t.shape)), dtype_name(t.dtype), stride, prod, self.param_of.get(t))

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
            st = self._storage(t)
            if st is not None and (is_inplace or not is_view):
                self.storage_writer[st] = nid
            stride = tuple(map(int, t.stride())) if t.layout == torch.strided else ()
            out_meta.append(TensorMeta(tuple(map(int, t.shape)), dtype_name(t.dtype), stride,
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


def bind_args(schema_args: Sequence[Any], args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    """(schema name, value) pairs for the arguments actually passed."""
    bound: list[tuple[str, Any]] = []
    pos = list(args)
    for i, a in enumerate(schema_args):
        if i < len(pos) and not a.kwarg_only:
            bound.append((a.name, pos[i]))
        elif a.name in kwargs:
            bound.append((a.name, kwargs[a.name]))
    return bound


def split_args(bound: Iterable[tuple[str, Any]]) -> tuple[list[tuple[str, torch.Tensor]], dict[str, Any]]:
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
            scalars[name] = jsonable(v)
    return tensors, scalars


class NoMemo(Exception):
    """This call's result cannot be replayed from its signature."""


_SCALARS = (bool, int, float, str, torch.dtype, torch.device, torch.layout, torch.memory_format)
# 0-dim tensors of these dtypes may be wrapped Python numbers, which promote differently from real tensors
_WRAPPED_DTYPES = (torch.float64, torch.int64, torch.complex128, torch.bool)


def freeze(v: Any) -> Any:
    """A hashable signature of one argument: a tensor's metadata, a scalar with its type (1 and 1.0 and True
    promote differently), lists and tuples element by element."""
    if isinstance(v, torch.Tensor):
        if (type(v) is not torch.Tensor and type(v) is not torch.nn.Parameter) or v.device.type != "meta" \
                or v.layout != torch.strided or (v.dim() == 0 and v.dtype in _WRAPPED_DTYPES):
            raise NoMemo
        return (tuple(v.shape), v.stride(), v.dtype, v.storage_offset(), v.requires_grad)
    if isinstance(v, (list, tuple)):
        return (type(v) is list, tuple(freeze(x) for x in v))
    if v is None or isinstance(v, _SCALARS):
        return (type(v), v)
    raise NoMemo
