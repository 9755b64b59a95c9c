"""Repeated calls in a meta capture: a loop that calls one function on inputs of the same layout, the calls differing
only in an index (a mixture-of-experts block's expert loop: 256 experts of a DeepSeek-V3 layer, each its slice of
the routed tokens, ``expert(chunk, i)``), recorded once and replayed as nodes.

``repeat_calls(fn, calls)`` runs ``fn(x, i)`` for each ``(x, i)``. Under a replaying capture (opmap.capture.capture
on meta, not training, ``memoize`` on) the first two calls whose input has one layout (shape, stride, dtype, the node
that made it) run as usual; where their nodes match one for one (the same ops, modules, layer types, shapes,
dtypes, strides, parameters; edges inside the call shifted by the id offset, edges from outside the same; each
argument equal or an integer that moves with the index, as ``select``'s ``index`` does), every later call of that
layout appends the same nodes with their ids and internal edges shifted and those arguments moved to its own index,
and returns a fresh meta tensor of the recorded result's layout, made by the replayed node that made it. The graph
is the one running every call would record, node for node (tests/capture/test_repeat.py checks it against the full
capture for each MoE family); only the Python and torch's meta kernels are skipped (a 671B DeepSeek-R1 prefill:
58 layers x 256 experts). Calls that do not match, and calls in a training capture, simply run. Outside a capture,
on meta without autograd or a torch mode watching (a forward run for its shapes alone), only the first call of each
input layout runs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.utils._mode_utils import no_dispatch

from opmap.capture.tracker import Tracker
from opmap.graph import Node

_ACTIVE: list[tuple[Tracker, bool]] = []  # the captures in progress (innermost last), whether each replays


@contextlib.contextmanager
def replaying(tracker: Tracker, replay: bool = True) -> Iterator[None]:
    """A capture into ``tracker`` while the block runs (opmap.capture.tracer.capture): ``repeat_calls`` replays into
    it where ``replay``, else runs every call."""
    entry = (tracker, replay)
    _ACTIVE.append(entry)
    try:
        yield
    finally:
        _ACTIVE.remove(entry)


@dataclass(frozen=True)
class _Call:
    """One call run as usual: its nodes' id range, its index, its result's layout and the nodes that made it."""

    start: int
    end: int
    index: int
    layout: tuple  # (shape, stride, dtype) of the result
    producer: int  # the node that made the result
    writer: int  # the node that last wrote the result's storage


@dataclass(frozen=True)
class _Template:
    """A call's nodes and, per node, the arguments that move with the index and the inputs made inside the call
    (their producer shifts)."""

    call: _Call
    nodes: tuple[Node, ...]
    moving: tuple[tuple[str, ...], ...]
    inside: tuple[tuple[int, ...], ...]

    def replay(self, t: Tracker, index: int) -> torch.Tensor:
        c = self.call
        shift = len(t.nodes) - c.start
        step = index - c.index
        append = t.nodes.append
        for n, moving, inside in zip(self.nodes, self.moving, self.inside):
            inputs = n.inputs
            if inside:
                inputs = list(inputs)
                for j in inside:
                    inputs[j] = _copy(inputs[j], producer=inputs[j].producer + shift)
                inputs = tuple(inputs)
            args = n.args
            args = {**args, **{k: args[k] + step for k in moving}} if moving else dict(args)
            append(_copy(n, id=n.id + shift, inputs=inputs, args=args))
        shape, stride, dtype = c.layout
        # a fresh meta tensor made unseen by the capture's modes (what they would record of it is dropped anyway)
        with torch._C.DisableTorchFunction(), no_dispatch():
            out = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
        t.producer[out] = c.producer + shift
        t.storage_writer[out.untyped_storage()] = c.writer + shift
        return out


def _copy(obj, **changes):
    """``dataclasses.replace`` for the frozen Node and TensorMeta (no __post_init__, no slots) without their
    __init__'s per-field checks: a fresh instance holding the fields as they are, ``changes`` applied (the replay
    appends 140,000 nodes for a DeepSeek-R1 prefill)."""
    new = object.__new__(type(obj))
    d = new.__dict__
    d.update(obj.__dict__)
    d.update(changes)
    return new


def repeat_calls(fn: Callable[[torch.Tensor, int], torch.Tensor],
                 calls: Sequence[tuple[torch.Tensor, int]]) -> list[torch.Tensor]:
    """``[fn(x, i) for x, i in calls]``, the later calls of one input layout replayed under a replaying capture
    (module docstring)."""
    if not _ACTIVE:
        return _shapes_only(fn, calls)
    t, replay = _ACTIVE[-1]
    if not replay or t.train or t.suppress:
        return [fn(x, i) for x, i in calls]
    seen: dict[tuple, _Call | _Template | None] = {}  # input layout -> its first call, its template, or None
    outs = []
    for x, i in calls:
        with _unwatched():
            key = _layout_key(t, x)
            known = seen.get(key, False) if key is not None else None
            if isinstance(known, _Template):
                outs.append(known.replay(t, i))
                continue
        start = len(t.nodes)
        y = fn(x, i)
        outs.append(y)
        if known is None:
            continue
        with _unwatched():
            call = _ran(t, start, i, y)
        if known is False:
            seen[key] = call
        elif isinstance(known, _Call):
            seen[key] = _template(t, known, call) if call is not None else None
    return outs


def _unwatched():
    """The bookkeeping's own tensor reads (shape, stride, storage) unseen by the capture's function mode, which
    would otherwise take each as a call (thousands per MoE layer)."""
    return torch._C.DisableTorchFunction()


def _shapes_only(fn: Callable[[torch.Tensor, int], torch.Tensor],
                 calls: Sequence[tuple[torch.Tensor, int]]) -> list[torch.Tensor]:
    """Outside a capture, on meta tensors without autograd (a forward run for its shapes alone: a decode step's
    cache layout probe, opmap.workloads.hf_cache), the first call of each input layout runs and the later ones get
    a fresh tensor of its result's layout (nothing records their ops, and a meta result holds no values)."""
    if torch.is_grad_enabled() or _watched():
        return [fn(x, i) for x, i in calls]
    with _unwatched():  # ``with torch.device("meta")``'s mode would see each shape and stride read as a call
        keys = [_plain(x) for x, _ in calls]
    if any(k is None for k in keys):
        return [fn(x, i) for x, i in calls]
    seen: dict[tuple, tuple | None] = {}
    outs = []
    for (x, i), key in zip(calls, keys):
        layout = seen.get(key)
        if layout is not None:
            shape, stride, dtype = layout
            with _unwatched(), no_dispatch():  # unseen by shapes_only's memo too (a fresh tensor is no op of the model)
                outs.append(torch.empty_strided(shape, stride, dtype=dtype, device="meta"))
            continue
        y = fn(x, i)
        outs.append(y)
        with _unwatched():
            seen[key] = _plain(y) if key not in seen else None
    return outs


def _watched() -> bool:
    """Whether a torch mode other than ``with torch.device(...)``'s sees every op (a FLOP counter): then every call
    runs."""
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._device import DeviceContext
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    # a mode that keeps no ops (opmap.capture.tracer.shapes_only: a memo of meta outputs) watches nothing
    return any(getattr(m, "records_ops", True) for m in _get_current_dispatch_mode_stack()) or any(
        not isinstance(m, DeviceContext) for m in _get_current_function_mode_stack())


def _plain(x) -> tuple | None:
    """(shape, stride, dtype) of a plain meta tensor, else None."""
    if type(x) is not torch.Tensor or x.device.type != "meta" or x.layout != torch.strided or x.requires_grad:
        return None
    return tuple(x.shape), x.stride(), x.dtype


def _layout_key(t: Tracker, x: torch.Tensor) -> tuple | None:
    """The input as the graph records it (shape, stride, dtype, the node that made it, the parameter it views: the
    slices of one split differ only in their storage offset, which no node records); None where a call on it cannot
    be replayed (not a plain meta tensor)."""
    if type(x) is not torch.Tensor or x.device.type != "meta" or x.layout != torch.strided or x.requires_grad:
        return None
    m = t.meta(x)
    return m.shape, m.stride, m.dtype, m.producer, m.param


def _ran(t: Tracker, start: int, index: int, y) -> _Call | None:
    """The call just run, if its result is one fresh meta tensor made inside it."""
    end = len(t.nodes)
    if type(y) is not torch.Tensor or y.device.type != "meta" or y.storage_offset() != 0 or end == start \
            or y.layout != torch.strided or y.requires_grad:
        return None
    prod = t.producer.get(y)
    writer = t.storage_writer.get(y.untyped_storage())
    if prod is None or writer is None or not (start <= prod < end and start <= writer < end) \
            or t.param_of.get(y) is not None:
        return None
    return _Call(start, end, index, (tuple(y.shape), y.stride(), y.dtype), prod, writer)


def _template(t: Tracker, a: _Call, b: _Call) -> _Template | None:
    """The template of two calls whose nodes match one for one (module docstring), else None."""
    shift = b.start - a.start
    step = b.index - a.index
    if b.end - b.start != a.end - a.start or step == 0 or b.layout != a.layout \
            or b.producer != a.producer + shift or b.writer != a.writer + shift:
        return None
    nodes = t.nodes[a.start:a.end]
    moving = []
    for na, nb in zip(nodes, t.nodes[b.start:b.end]):
        keys = _moving_args(na, nb, step)
        if keys is None or not _same_node(na, nb, a, shift):
            return None
        moving.append(keys)
    inside = tuple(tuple(j for j, m in enumerate(n.inputs) if m.producer is not None and a.start <= m.producer < a.end)
                   for n in nodes)
    return _Template(a, tuple(nodes), tuple(moving), inside)


def _same_node(na: Node, nb: Node, a: _Call, shift: int) -> bool:
    """Whether ``nb`` is ``na`` shifted: ids and edges from inside the call by ``shift``, all else equal."""
    if (nb.id != na.id + shift or nb.op != na.op or nb.module != na.module or nb.module_class != na.module_class
            or nb.layer_type != na.layer_type or nb.input_names != na.input_names or nb.outputs != na.outputs
            or nb.is_view != na.is_view or nb.is_inplace != na.is_inplace or len(nb.inputs) != len(na.inputs)):
        return False
    for ma, mb in zip(na.inputs, nb.inputs):
        inside = ma.producer is not None and a.start <= ma.producer < a.end
        want = ma.producer + shift if inside else ma.producer
        if (mb.shape, mb.dtype, mb.stride, mb.param, mb.producer) != (ma.shape, ma.dtype, ma.stride, ma.param, want):
            return False
    return True


def _moving_args(na: Node, nb: Node, step: int) -> tuple[str, ...] | None:
    """The arguments of ``nb`` that are ``na``'s moved by the index ``step`` (integers), the rest equal; None where
    another argument differs."""
    if na.args.keys() != nb.args.keys():
        return None
    moving = []
    for k, va in na.args.items():
        vb = nb.args[k]
        if type(va) is type(vb) and va == vb:
            continue
        if type(va) is int and type(vb) is int and vb - va == step:
            moving.append(k)
            continue
        return None
    return tuple(moving)
