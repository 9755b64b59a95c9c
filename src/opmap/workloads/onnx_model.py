"""The parsed state of an ONNX model shared by the reader (onnx.py), the folder (onnx_fold.py) and the op mapping
(onnx_ops.py, onnx_attention.py): element types, the checked and shape-inferred model, small helpers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SMALL = 1 << 12  # initializers up to this many elements are read as values (folding, exponents, masks)
FOLD_LIMIT = 1 << 22  # a folded constant holds at most this many elements (a causal mask at 2048 tokens)
# all folded constants together hold at most this many elements (eight such masks; 256 MiB at int64): past it
# nodes stay nodes, priced, so a small file cannot make opmap compute and hold gigabytes of constants
FOLD_TOTAL = 1 << 25


FLOAT_ELEMS = (1, 10, 11, 16)


@dataclass
class OnnxModel:
    """A checked, bound and shape-inferred ONNX graph: what onnx_ops.build_graph turns into an OpGraph."""

    path: Path
    model: Any  # onnx.ModelProto (initializer data not loaded where it is external)
    opset: int
    dims: dict[str, int]  # the dynamic dims and the values they were bound to
    shapes: dict[str, tuple[int, ...]]  # tensor name -> shape (every tensor inference or the inputs gave one)
    elem: dict[str, int]  # tensor name -> ONNX element type
    consts: dict[str, np.ndarray]  # tensor name -> value, for small initializers, Constants and folded tensors
    folded: set[str] = field(default_factory=set)  # outputs of nodes folded away (shape arithmetic)
    initializers: dict[str, Any] = field(default_factory=dict)  # name -> TensorProto (the weights)
    live: list = field(default_factory=list)  # the nodes left to price, in graph order
    at_load: set[str] = field(default_factory=set)  # results computed from weights alone, once at load
    folded_elems: int = 0  # elements of the folded constants so far (at most FOLD_TOTAL)
    notes: list[str] = field(default_factory=list)

    def value(self, name: str, limit: int = FOLD_LIMIT) -> np.ndarray | None:
        """The value of a constant tensor (a folded one, or an initializer up to ``limit`` elements, read from
        external data if need be), else None."""
        if name in self.consts:
            return self.consts[name]
        t = self.initializers.get(name)
        if t is None or numel(t.dims) > limit:
            return None
        from opmap.errors import OpmapError
        from opmap.workloads.onnx_data import tensor_value

        try:
            return tensor_value(t, self.path)
        except OpmapError:  # data that does not match its type: a value we do not know
            return None


def numel(dims) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n




def attrs(node) -> dict[str, Any]:
    """A NodeProto's attributes by name, as Python values."""
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of ``shape`` (ONNX tensors are dense, row-major)."""
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(stride))
