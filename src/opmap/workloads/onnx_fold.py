"""Constant folding of an ONNX graph's shape arithmetic, with numpy on small tensors whose values are known.

A node folds when its op is one below, every input is a known constant (or, for Shape and Size, its input's
shape is known), and its result holds at most onnx_model.FOLD_LIMIT elements (FOLD_TOTAL for all of them
together): the arithmetic exporters emit to
compute reshape targets, scales and masks from input shapes (Shape -> Gather -> Unsqueeze -> Concat -> Reshape,
Expand -> Trilu -> Where for a causal mask). onnxruntime folds the same nodes when it creates a session with
the shapes fixed. Model weights are never touched (they are not read as values).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from opmap.workloads.onnx_model import FLOAT_ELEMS, FOLD_LIMIT, FOLD_TOTAL, numel

WEIGHT_MIN = 64  # a float initializer of more elements is a weight, not a constant of the shape arithmetic
FoldFn = Callable[[Any, list, dict[str, Any]], list]


def _attrs(node, om=None) -> dict[str, Any]:
    """The node's attributes as Python values, a tensor attribute as its numpy value (read as onnx_data reads any
    tensor: external data only from inside the model's folder)."""
    from onnx import helper

    from opmap.workloads.onnx_data import tensor_value

    out = {}
    for a in node.attribute:
        if a.type == a.TENSOR and om is not None:
            where = f"{node.op_type} node {node.name or node.output[0]!r} attribute {a.name!r}"
            out[a.name] = tensor_value(a.t, om.path, where)
        else:
            out[a.name] = helper.get_attribute_value(a)
    return out


def _shape(node, xs, a, om):
    s = np.asarray(om.shapes[node.input[0]], dtype=np.int64)
    start, end = a.get("start", 0), a.get("end", None)
    return [s[start:end]]


def _gather(node, xs, a):
    return [np.take(xs[0], xs[1].astype(np.int64), axis=a.get("axis", 0))]


def _unsqueeze(node, xs, a):
    axes = list(xs[1]) if len(xs) > 1 else list(a.get("axes", []))
    out = xs[0]
    nd = out.ndim + len(axes)
    for ax in sorted(int(x) % nd for x in axes):
        out = np.expand_dims(out, ax)
    return [out]


def _squeeze(node, xs, a):
    axes = list(xs[1]) if len(xs) > 1 else a.get("axes")
    return [np.squeeze(xs[0], axis=tuple(int(x) for x in axes) if axes is not None else None)]


def _slice(node, xs, a):
    data, starts, ends = xs[0], xs[1], xs[2]
    axes = xs[3] if len(xs) > 3 and xs[3] is not None else range(len(starts))
    steps = xs[4] if len(xs) > 4 and xs[4] is not None else [1] * len(starts)
    idx = [slice(None)] * data.ndim
    for s, e, ax, st in zip(starts, ends, axes, steps):
        idx[int(ax)] = slice(int(s), int(e), int(st))
    return [data[tuple(idx)]]


def _cast(node, xs, a):
    from onnx import helper

    return [xs[0].astype(helper.tensor_dtype_to_np_dtype(a["to"]))]


def _div(node, xs, a):
    x, y = xs
    if np.issubdtype(x.dtype, np.integer):
        return [np.trunc(x / y).astype(x.dtype)]
    return [x / y]


def _reshape(node, xs, a):
    shape = [int(s) for s in xs[1]]
    shape = [xs[0].shape[i] if s == 0 and not a.get("allowzero", 0) else s for i, s in enumerate(shape)]
    return [xs[0].reshape(shape)]


def _range(node, xs, a):
    return [np.arange(xs[0], xs[1], xs[2]).astype(xs[0].dtype)]


def _const_of_shape(node, xs, a):
    v = a["value"] if "value" in a else np.zeros(1, np.float32)
    return [np.full([int(s) for s in xs[0]], v.reshape(-1)[0], dtype=v.dtype)]


def _trilu(node, xs, a):
    k = int(xs[1]) if len(xs) > 1 and xs[1] is not None else 0
    return [np.triu(xs[0], k) if a.get("upper", 1) else np.tril(xs[0], k)]


def _concat(node, xs, a):
    return [np.concatenate([x for x in xs], axis=a.get("axis", 0))]


def _transpose(node, xs, a):
    return [np.transpose(xs[0], a.get("perm"))]


def _reduce(fn):
    def go(node, xs, a):
        axes = tuple(int(x) for x in xs[1]) if len(xs) > 1 and xs[1] is not None else a.get("axes")
        return [fn(xs[0], axis=tuple(axes) if axes else None, keepdims=bool(a.get("keepdims", 1)))]
    return go


def _binary(fn):
    return lambda node, xs, a: [np.asarray(fn(xs[0], xs[1]))]


def _unary(fn):
    return lambda node, xs, a: [np.asarray(fn(xs[0]))]


FOLDS: dict[str, Callable] = {
    "Gather": _gather, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Slice": _slice, "Cast": _cast,
    "Concat": _concat, "Reshape": _reshape, "Range": _range, "ConstantOfShape": _const_of_shape, "Trilu": _trilu,
    "Transpose": _transpose, "Identity": _unary(lambda x: x), "Div": _div,
    "Add": _binary(np.add), "Sub": _binary(np.subtract), "Mul": _binary(np.multiply), "Pow": _binary(np.power),
    "Equal": _binary(np.equal), "Less": _binary(np.less), "Greater": _binary(np.greater),
    "LessOrEqual": _binary(np.less_equal), "GreaterOrEqual": _binary(np.greater_equal),
    "And": _binary(np.logical_and), "Or": _binary(np.logical_or), "Max": _binary(np.maximum),
    "Min": _binary(np.minimum), "Mod": _binary(np.mod),
    "Not": _unary(np.logical_not), "Neg": _unary(np.negative), "Abs": _unary(np.abs), "Sqrt": _unary(np.sqrt),
    "Floor": _unary(np.floor), "Ceil": _unary(np.ceil), "Reciprocal": _unary(np.reciprocal),
    "Where": lambda node, xs, a: [np.where(xs[0], xs[1], xs[2])],
    "Expand": lambda node, xs, a: [xs[0] * np.ones([int(s) for s in xs[1]], dtype=xs[0].dtype)],
    "ReduceProd": _reduce(np.prod), "ReduceSum": _reduce(np.sum), "ReduceMax": _reduce(np.max),
    "ReduceMin": _reduce(np.min),
}


def _out_elems(node, om, xs) -> int | None:
    """Elements of the node's first output, from inference, or from the requested shape of the ops that make
    large tensors from small ones; None: unknown (not folded)."""

    if node.op_type in ("ConstantOfShape",):
        return numel(int(s) for s in xs[0])
    if node.op_type == "Expand":
        return max(numel(int(s) for s in xs[1]), xs[0].size)
    if node.op_type == "Range":
        return int(max(0, np.ceil((float(xs[1]) - float(xs[0])) / float(xs[2]))))
    s = om.shapes.get(node.output[0])
    if s is not None:
        return numel(s)
    return max((x.size for x in xs if x is not None), default=0)


def fold_node(node, om) -> list | None:
    """The node's output values when it folds (see the module docstring), else None."""

    if node.domain not in ("", "ai.onnx"):
        return None
    op = node.op_type
    if op in ("Shape", "Size"):
        s = om.shapes.get(node.input[0])
        if s is None:
            return None
        if op == "Size":
            return [np.asarray(int(np.prod(s)), dtype=np.int64)]
        return _shape(node, [], _attrs(node), om)
    fn = FOLDS.get(op)
    if fn is None or not node.input or any(n and n not in om.consts for n in node.input):
        return None
    if any(n in om.initializers and om.elem.get(n) in FLOAT_ELEMS and om.consts[n].size > WEIGHT_MIN
           for n in node.input if n):
        return None  # weights are priced where they are read, never folded away
    xs = [om.consts[n] if n else None for n in node.input]
    try:
        n = _out_elems(node, om, xs)
        if n is None or n > FOLD_LIMIT or om.folded_elems + n > FOLD_TOTAL:
            return None
        with np.errstate(all="ignore"):
            out = [np.asarray(o) for o in fn(node, xs, _attrs(node, om))]
    except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, OverflowError, MemoryError):
        return None  # a node numpy cannot evaluate stays a node (priced, or listed as uncounted)
    om.folded_elems += sum(o.size for o in out)
    return out


LOAD_DEPTH = 8  # producers walked back from a tensor computed at load (ones -> Trilu -> Equal -> Where: four)


def value_at_load(om, name: str, depth: int = LOAD_DEPTH) -> np.ndarray | None:
    """The value of a tensor onnx._at_load left to compute once at load (from weights and constants alone), where
    it is needed as a value: a causal mask the dynamo exporter builds from a 128 x 128 float ``ones`` initializer
    (Trilu -> Equal -> Where), which folding leaves alone as it leaves any weight. Evaluated on demand with the same
    numpy folds, each tensor at most FOLD_LIMIT elements; None when any step is unknown or too large."""
    v = om.value(name)
    if v is not None or depth <= 0 or name not in om.at_load:
        return v
    node = next((n for n in om.model.graph.node if name in n.output), None)
    fn = None if node is None or node.domain not in ("", "ai.onnx") else FOLDS.get(node.op_type)
    if fn is None:
        return None
    xs = []
    for i in node.input:
        x = value_at_load(om, i, depth - 1) if i else None
        if i and x is None:
            return None
        xs.append(x)
    try:
        n = _out_elems(node, om, xs)
        if n is None or n > FOLD_LIMIT:
            return None
        with np.errstate(all="ignore"):
            out = [np.asarray(o) for o in fn(node, xs, _attrs(node, om))]
    except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, OverflowError, MemoryError):
        return None
    return dict(zip(node.output, out)).get(name)
