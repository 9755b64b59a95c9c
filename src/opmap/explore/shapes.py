"""One captured graph per shape family: re-price a batch (or sequence) change without capturing again.

A model whose forward does the same operators whatever its batch size differs between two batch sizes only in
integers: tensor shapes and strides, and integer arguments (view sizes, split sizes). ``ShapeFamily`` captures
the graph at a few values of the parameter, checks that the graphs are the same graph (same operators, edges,
parameters, dtypes and argument structure), fits every integer as a polynomial in the parameter through those
captures (exact rational Lagrange interpolation, degree one less than the number of fit points) and checks the
fit on one more capture it did not use. Where every integer agrees there, the family is proven on that model
and ``graph_at(v)`` writes the graph for any other value with no capture; where any does not (the graph
changes with the value: a data-dependent branch, a shape that is not polynomial), the family is refused with
the first integer that disagreed and the caller captures each value itself.

The integers of a transformer are polynomial in the batch and the sequence: a (b, s, h) activation, its
strides (s h, h, 1), attention scores (b, a, s, s) with strides in s^2; degree 2 in each covers them, so three
fit points and a fourth to check.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import replace
from fractions import Fraction
from itertools import islice
from typing import Any

from opmap.graph import Node, OpGraph, TensorMeta

FIT_POINTS = 3  # integers up to degree 2 in the parameter
CHECK_POINTS = 1


class NotAFamily(Exception):
    """The graphs at the captured values are not one graph with polynomial integers (the reason is the text)."""


def _ints(g: OpGraph) -> list[int]:
    """Every integer of the graph that may follow the parameter, in a fixed order."""
    out: list[int] = []
    for t in g.inputs:
        out += [*t.shape, *t.stride]
    for n in g.nodes:
        for t in (*n.inputs, *n.outputs):
            out += [*t.shape, *t.stride]
        _arg_ints(n.args, out)
    return out


def _arg_ints(v: Any, out: list[int]) -> None:
    if isinstance(v, bool):
        return
    if isinstance(v, int):
        out.append(v)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _arg_ints(x, out)
    elif isinstance(v, dict):
        for k in sorted(v):
            _arg_ints(v[k], out)


def _skeleton(g: OpGraph) -> tuple:
    """What must not change with the parameter: operators, edges, parameters, dtypes, argument structure."""

    def t_key(t: TensorMeta) -> tuple:
        return (len(t.shape), t.dtype, t.producer, t.param)

    def a_key(v: Any) -> Any:
        if isinstance(v, bool) or v is None or isinstance(v, (str, float)):
            return v
        if isinstance(v, int):
            return int
        if isinstance(v, (list, tuple)):
            return tuple(a_key(x) for x in v)
        if isinstance(v, dict):
            return tuple((k, a_key(v[k])) for k in sorted(v))
        return repr(v)

    return (g.params, g.buffers, g.device, tuple(t_key(t) for t in g.inputs),
            tuple((n.op, n.module, n.input_names, tuple(t_key(t) for t in n.inputs),
                   tuple(t_key(t) for t in n.outputs), a_key(n.args), n.is_view, n.is_inplace) for n in g.nodes))


@functools.lru_cache(maxsize=65536)  # a graph repeats the same integer series (b s, h, 3 h, ...) many times
def _coefficients(xs: tuple[int, ...], ys: tuple[int, ...]) -> tuple[Fraction, ...]:
    """The polynomial through the points (xs, ys), degree len(xs) - 1, as exact coefficients c0, c1, ... (the
    Lagrange basis expanded once, so evaluating is a few integer operations per value)."""
    n = len(xs)
    coeffs = [Fraction(0)] * n
    for i, (xi, yi) in enumerate(zip(xs, ys)):
        basis = [Fraction(1)]  # prod over j != i of (x - xj) / (xi - xj), as coefficients
        for j, xj in enumerate(xs):
            if j == i:
                continue
            d = Fraction(1, xi - xj)
            nxt = [Fraction(0)] * (len(basis) + 1)
            for k, c in enumerate(basis):
                nxt[k] -= c * xj * d
                nxt[k + 1] += c * d
            basis = nxt
        for k, c in enumerate(basis):
            coeffs[k] += yi * c
    return tuple(coeffs)


@functools.lru_cache(maxsize=65536)
def _poly(xs: tuple[int, ...], ys: tuple[int, ...]) -> _Poly:
    return _Poly(_coefficients(xs, ys))


class _Poly:
    __slots__ = ("c", "whole")

    def __init__(self, c: tuple[Fraction, ...]):
        self.whole = all(x.denominator == 1 for x in c)
        self.c = tuple(int(x) for x in c) if self.whole else c

    def __call__(self, x: int) -> Fraction | int:
        acc = 0
        for c in reversed(self.c):
            acc = acc * x + c
        return acc


class ShapeFamily:
    """Graphs of one model over one integer parameter (the batch, or the sequence), from a few captures."""

    def __init__(self, capture_at: Callable[[int], OpGraph], values: Sequence[int]):
        vals = sorted(set(int(v) for v in values))
        if len(vals) < FIT_POINTS + CHECK_POINTS:
            raise ValueError(f"a shape family needs {FIT_POINTS + CHECK_POINTS} values, got {vals}")
        self.fit_values = vals[:FIT_POINTS]
        self.check_values = vals[FIT_POINTS:FIT_POINTS + CHECK_POINTS]
        graphs = {v: capture_at(v) for v in self.fit_values + self.check_values}
        self.captures = len(graphs)
        base = graphs[self.fit_values[0]]
        self.template = base
        skel = _skeleton(base)
        for v, g in graphs.items():
            if _skeleton(g) != skel:
                raise NotAFamily(f"the graph at {v} is not the graph at {self.fit_values[0]} (its operators, edges "
                                 "or argument structure differ)")
        series = {v: _ints(g) for v, g in graphs.items()}
        n = len(series[self.fit_values[0]])
        self._fits: list[_Poly | int] = []
        for i in range(n):
            ys = [series[v][i] for v in self.fit_values]
            if ys.count(ys[0]) == len(ys):
                self._fits.append(ys[0])
                continue
            f = _poly(tuple(self.fit_values), tuple(ys))
            for v in self.check_values:
                if f(v) != series[v][i]:
                    raise NotAFamily(f"integer {i} of the graph is not polynomial in the parameter: "
                                     f"{dict(zip(self.fit_values, ys))} predicts {f(v)} at {v}, the capture has "
                                     f"{series[v][i]}")
            self._fits.append(f)

    def graph_at(self, v: int) -> OpGraph:
        """The graph at ``v``, written from the fitted integers (no capture)."""
        vals: list[int] = []
        for f in self._fits:
            if isinstance(f, int):
                vals.append(f)
                continue
            x = f(v)
            if (not f.whole and Fraction(x).denominator != 1) or x < 0:
                raise NotAFamily(f"the fitted graph has a non-integer or negative size ({x}) at {v}")
            vals.append(int(x))
        it = iter(vals)
        g = self.template

        def tm(t: TensorMeta) -> TensorMeta:
            r = len(t.shape)
            shape = tuple(islice(it, r))
            stride = tuple(islice(it, len(t.stride)))
            return TensorMeta(shape, t.dtype, stride, t.producer, t.param)

        inputs = tuple(tm(t) for t in g.inputs)
        nodes: list[Node] = []
        for n in g.nodes:
            ins = tuple(tm(t) for t in n.inputs)
            outs = tuple(tm(t) for t in n.outputs)
            nodes.append(Node(n.id, n.op, n.module, n.module_class, n.layer_type, ins, outs, n.input_names,
                              _fill(n.args, it) if n.args else n.args, n.is_view, n.is_inplace))
        return replace(g, nodes=tuple(nodes), inputs=inputs)


def _fill(v: Any, it) -> Any:
    """``v`` with its integers taken from ``it`` in ``_arg_ints`` order."""
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return next(it)
    if isinstance(v, list):
        return [_fill(x, it) for x in v]
    if isinstance(v, tuple):
        return tuple(_fill(x, it) for x in v)
    if isinstance(v, dict):
        filled = {k: _fill(v[k], it) for k in sorted(v)}
        return {k: filled[k] for k in v}
    return v
