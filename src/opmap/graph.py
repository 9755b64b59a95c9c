"""OpGraph: the captured operator graph. Immutable values, serialisable to plain dicts.

A node is one aten operator call (or one fused torch-level call that opmap records whole, such as
``scaled_dot_product_attention``). Edges run producer -> consumer through tensor identity: each input
records the node that produced it (None for graph inputs, parameters and buffers).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from opmap.precision import dtype_bytes
from opmap.record import key, record


@dataclass(frozen=True)
class TensorMeta:
    """Shape, dtype and layout of one tensor argument or result.

    ``producer`` is the id of the node whose output this is (None: graph input, parameter, buffer or
    constant); ``param`` names the parameter or buffer when the tensor is one, or a view of one.
    """

    shape: tuple[int, ...]
    dtype: str
    stride: tuple[int, ...]
    producer: int | None = field(default=None, metadata=key(omit="none"))
    param: str | None = field(default=None, metadata=key(omit="none"))

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def itemsize(self) -> float:
        return dtype_bytes(self.dtype)

    @property
    def nbytes(self) -> float:
        """Bytes of the logical tensor (every element once)."""
        return self.numel * self.itemsize

    @property
    def storage_bytes(self) -> float:
        """Bytes a kernel must read at least: broadcast (stride-0) dimensions are read once."""
        if self.numel == 0:
            return 0
        n = 1
        for size, st in zip(self.shape, self.stride):
            if st != 0:
                n *= size
        return n * self.itemsize

    @staticmethod
    def from_dict(d: dict[str, Any]) -> TensorMeta:
        return TensorMeta(tuple(d["shape"]), d["dtype"], tuple(d["stride"]), d.get("producer"), d.get("param"))


@dataclass(frozen=True)
class Node:
    """One operator call.

    ``args`` holds the non-tensor arguments the cost rules need (scalars, int lists, flags) by schema
    name, ``inputs``/``outputs`` the tensor arguments in schema order (lists of tensors are flattened).
    ``input_names`` gives the schema argument name of each input.
    """

    id: int
    op: str  # e.g. "aten.addmm.default"
    module: str  # module path, e.g. "h.3.attn.c_attn"; "" at the top level
    module_class: str
    layer_type: str
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]
    input_names: tuple[str, ...] = ()
    args: dict[str, Any] = field(default_factory=dict)
    is_view: bool = False
    is_inplace: bool = False

    @functools.cached_property
    def packet(self) -> str:
        """The overload packet: "aten.addmm.default" -> "addmm". Kept on the node once read (a pure function of
        ``op``, which a node never changes; the passes over a graph read it about ten times a node)."""
        parts = self.op.split(".")
        return parts[1] if len(parts) >= 2 else parts[0]

    @property
    def producers(self) -> tuple[int, ...]:
        return tuple(sorted({t.producer for t in self.inputs if t.producer is not None}))

    def input(self, name: str) -> TensorMeta | None:
        for n, t in zip(self.input_names, self.inputs):
            if n == name:
                return t
        return None

    def to_dict(self) -> dict[str, Any]:
        """A computed shape: each input's record carries its schema name (``input_names``, zipped in), which is
        not written as a field of its own."""
        return {
            "id": self.id, "op": self.op, "module": self.module, "module_class": self.module_class,
            "layer_type": self.layer_type,
            "inputs": [dict(record(t), name=n) for t, n in zip(self.inputs, self.input_names)],
            "outputs": [record(t) for t in self.outputs],
            "args": self.args, "is_view": self.is_view, "is_inplace": self.is_inplace,
        }


@dataclass(frozen=True)
class OpGraph:
    """The captured graph: nodes in execution order plus the model's parameter count and inputs."""

    nodes: tuple[Node, ...]
    params: int  # parameter elements, each shared parameter counted once
    param_bytes: float
    buffers: int
    inputs: tuple[TensorMeta, ...]
    device: str
    notes: tuple[str, ...] = ()
    # every parameter's name and element count (shared ones once): what the model holds, whether or not a node
    # read it (a decode step's idle experts launch nothing, yet their weights sit in memory)
    param_sizes: tuple[tuple[str, int], ...] = ()
    # the model's geometry (opmap.geometry.ModelGeometry) where the workload carries one (its config's or spec's):
    # set by opmap.analyze.analyze_graph, never stored with a capture
    geometry: Any = None

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def consumers(self) -> dict[int, list[int]]:
        """Node id -> ids of the nodes that read one of its outputs."""
        out: dict[int, list[int]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for p in n.producers:
                out[p].append(n.id)
        return out
