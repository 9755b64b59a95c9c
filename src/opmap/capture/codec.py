"""An OpGraph as compact, plain JSON data for the capture cache, and back, checked field by field.

The cache is written by one opmap and read by the next run, so what it reads is treated as untrusted data:
``decode_graph`` rebuilds the graph from JSON values only (no pickle, no imports, no calls named by the data)
and refuses with ``BadEntry`` anything of the wrong type, out of range, or inconsistent (a producer that is not
an earlier node). Equal graphs encode to equal data, and ``decode_graph(encode_graph(g)) == g``.

Layout (columnar, so a 6,000-node graph parses in tens of milliseconds): every distinct string once in
``strings``, every distinct TensorMeta once in ``tensors``; a node row refers to both by index::

    strings: [str, ...]
    tensors: [[shape, dtype (string index), stride, producer (node id or null), param (string index or null)], ...]
    nodes:   [[op, module, module_class, layer_type (string indices), inputs (tensor indices),
               input_names (string indices), outputs (tensor indices), args (JSON object), is_view, is_inplace], ...]
    inputs:  [tensor index, ...]       (the graph's inputs)
    params, param_bytes, buffers, device, notes, param_sizes ([[name, elements], ...])
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, repeat
from operator import lt
from typing import Any

from opmap.graph import Node, OpGraph, TensorMeta
from opmap.precision import DTYPE_BYTES


class BadEntry(ValueError):
    """The data is not a graph this codec wrote: a cache miss, never an error the user sees."""


def check(cond: bool, what: str) -> None:
    if not cond:
        raise BadEntry(what)


def is_int(v: Any) -> bool:
    return type(v) is int  # bool is not an int here


def is_num(v: Any) -> bool:
    return type(v) is int or type(v) is float


def str_list(v: Any, what: str) -> tuple[str, ...]:
    check(type(v) is list and all(type(x) is str for x in v), f"{what}: a list of strings")
    return tuple(v)


def encode_graph(g: OpGraph) -> dict[str, Any]:
    """``g`` as JSON data (see the module docstring)."""
    strings: dict[str, int] = {}
    tensors: dict[TensorMeta, int] = {}

    def s(x: str) -> int:
        return strings.setdefault(x, len(strings))

    def t(x: TensorMeta) -> int:
        return tensors.setdefault(x, len(tensors))

    nodes = [[s(n.op), s(n.module), s(n.module_class), s(n.layer_type), [t(x) for x in n.inputs],
              [s(x) for x in n.input_names], [t(x) for x in n.outputs], n.args, n.is_view, n.is_inplace]
             for n in g.nodes]
    inputs = [t(x) for x in g.inputs]
    rows = [[list(x.shape), s(x.dtype), list(x.stride), x.producer, None if x.param is None else s(x.param)]
            for x in tensors]
    return {"strings": list(strings), "tensors": rows, "nodes": nodes, "inputs": inputs, "params": g.params,
            "param_bytes": g.param_bytes, "buffers": g.buffers, "device": g.device, "notes": list(g.notes),
            "param_sizes": [[name, n] for name, n in g.param_sizes]}


def _indices(values: Sequence[Any], n: int, what: str) -> None:
    """Every value an int in [0, n) (checked in bulk: a 6,000-node graph has ~10^5 of them)."""
    check(set(map(type, values)) <= {int} and (not values or (min(values) >= 0 and max(values) < n)),
          f"{what}: indices below {n}")


def _lists(column: Sequence[Any], what: str) -> list[Any]:
    """The lists of ``column`` flattened, once each is known to be a list."""
    check(set(map(type, column)) <= {list}, f"{what}: lists")
    return list(chain.from_iterable(column))


def _rows(rows: Any, width: int, what: str) -> list[tuple[Any, ...]]:
    """``rows`` as ``width`` columns."""
    check(type(rows) is list and all(type(r) is list and len(r) == width for r in rows), f"{what}: rows of {width}")
    return list(zip(*rows)) if rows else [()] * width


_SCALARS = frozenset({type(None), bool, int, float, str})


def _plain(values: list[Any], depth: int = 0) -> None:
    """Node arguments as the tracer records them: None, bool, int, float, str, or lists of them (nested)."""
    check(depth < 8, "node args: nested at most 8 deep")
    types = set(map(type, values))
    check(types <= _SCALARS | {list}, "node args: plain values")
    if list in types:
        _plain(list(chain.from_iterable(v for v in values if type(v) is list)), depth + 1)


def _tensors(rows: Any, strings: tuple[str, ...], n_nodes: int) -> list[TensorMeta]:
    shapes, dts, strides, prods, params = _rows(rows, 5, "tensors")
    dims = _lists(shapes, "tensor shapes")
    check(set(map(type, dims)) <= {int} and (not dims or min(dims) >= 0), "tensor shapes: sizes >= 0")
    check(set(map(type, _lists(strides, "tensor strides"))) <= {int}, "tensor strides: integers")
    # one stride per dimension (none for a non-strided layout)
    check(all(len(st) in (0, len(sh)) for sh, st in zip(shapes, strides)), "tensor strides: one per dimension")
    _indices(dts, len(strings), "tensor dtypes")
    check({strings[d] for d in set(dts)} <= DTYPE_BYTES.keys(), "tensor dtypes: known dtypes")
    _indices([p for p in prods if p is not None], n_nodes, "tensor producers")
    _indices([p for p in params if p is not None], len(strings), "tensor params")
    return [TensorMeta(tuple(sh), strings[d], tuple(st), pr, None if pa is None else strings[pa])
            for sh, d, st, pr, pa in zip(shapes, dts, strides, prods, params)]


def _nodes(rows: Any, strings: tuple[str, ...], tensors: list[TensorMeta]) -> tuple[Node, ...]:
    ops, mods, clss, lts, ins, names, outs, args, views, inplace = _rows(rows, 10, "nodes")
    ns, nt = len(strings), len(tensors)
    _indices(ops + mods + clss + lts, ns, "node strings")
    flat_in = _lists(ins, "node inputs")
    _indices(flat_in + _lists(outs, "node outputs"), nt, "node tensors")
    _indices(_lists(names, "node input names"), ns, "node input names")
    check(list(map(len, names)) == list(map(len, ins)), "nodes: one input name per input")
    check(set(map(type, args)) <= {dict} and set(map(type, views + inplace)) <= {bool}, "node args and flags")
    _plain(list(chain.from_iterable(a.values() for a in args)))
    # execution order: a node reads only what an earlier node wrote
    prod = [-1 if t.producer is None else t.producer for t in tensors]
    reader = list(chain.from_iterable(repeat(i, len(x)) for i, x in enumerate(ins)))
    check(all(map(lt, map(prod.__getitem__, flat_in), reader)), "node inputs: produced by an earlier node")
    t, s = tensors.__getitem__, strings.__getitem__
    return tuple(Node(i, strings[o], strings[m], strings[c], strings[lt_], tuple(map(t, a)), tuple(map(t, b)),
                      tuple(map(s, nm)), ar, v, ip)
                 for i, (o, m, c, lt_, a, nm, b, ar, v, ip)
                 in enumerate(zip(ops, mods, clss, lts, ins, names, outs, args, views, inplace)))


def decode_graph(d: Any) -> OpGraph:
    """The graph ``encode_graph`` wrote; ``BadEntry`` for anything else."""
    check(type(d) is dict, "graph: an object")
    strings = str_list(d.get("strings"), "strings")
    rows = d.get("nodes")
    check(type(rows) is list, "nodes: a list")
    tensors = _tensors(d.get("tensors"), strings, len(rows))
    nodes = _nodes(rows, strings, tensors)
    check(type(d.get("inputs")) is list, "graph inputs: a list")
    _indices(d["inputs"], len(tensors), "graph inputs")
    params, pbytes, buffers, device = (d.get(k) for k in ("params", "param_bytes", "buffers", "device"))
    check(is_int(params) and params >= 0 and is_int(buffers) and buffers >= 0, "params, buffers: counts")
    check(is_num(pbytes) and 0 <= pbytes < float("inf") and type(device) is str, "param_bytes: bytes; device: a name")
    sizes = d.get("param_sizes")
    check(type(sizes) is list and all(type(p) is list and len(p) == 2 and type(p[0]) is str and is_int(p[1])
                                      and p[1] >= 0 for p in sizes), "param_sizes: [name, elements] pairs")
    return OpGraph(nodes, params, pbytes, buffers, tuple(tensors[j] for j in d["inputs"]), device,
                   str_list(d.get("notes"), "notes"), tuple((name, n) for name, n in sizes))
