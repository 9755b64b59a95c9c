"""Costs: one rule per op family (see base.py for the registry and OpCost).

``cost_node`` looks up a node's rule by its aten overload packet (in-place variants fall back to the
out-of-place rule); a view costs nothing; an op with no rule gets ``OpCost(counted=False)`` and is listed
as uncounted by name, never a silent zero.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from opmap.costs import (  # noqa: F401  (registers rules)
    attention,
    backward,
    fp8,
    loss,
    matmul,
    movement,
    pointwise,
    vector,
)
from opmap.costs.base import RULES, OpCost, rule
from opmap.costs.movement import view_cost
from opmap.graph import Node, OpGraph
from opmap.ops import VectorKind, base_name

# Vector families with a rate of their own in a calibrated profile (calibrate/run.py measures each).
VECTOR_KINDS = {
    vector.softmax_cost: VectorKind.SOFTMAX, vector.log_softmax_cost: VectorKind.SOFTMAX,
    vector.layer_norm_cost: VectorKind.LAYER_NORM, vector.group_norm_cost: VectorKind.LAYER_NORM,
    vector.rms_norm_cost: VectorKind.LAYER_NORM,
    vector.batch_norm_cost: VectorKind.BATCH_NORM,
    backward.batch_norm_backward_cost: VectorKind.BATCH_NORM_BACKWARD,
    vector.pool_cost: VectorKind.POOL,
    vector.adaptive_pool_cost: VectorKind.REDUCE, vector.reduction_cost: VectorKind.REDUCE,
    vector.variance_cost: VectorKind.REDUCE, vector.logsumexp_cost: VectorKind.REDUCE,
}


def rule_for(node: Node):
    if node.is_view:
        return view_cost
    return RULES.get(node.packet) or RULES.get(base_name(node.packet))


def cost_node(node: Node) -> OpCost:
    fn = rule_for(node)
    if fn is None:
        return OpCost(counted=False)
    cost = fn(node)
    kind = VECTOR_KINDS.get(fn)
    if kind == VectorKind.BATCH_NORM and node.args.get("training"):
        kind = VectorKind.BATCH_NORM_TRAIN
    fresh = sum(t.nbytes for t in node.outputs) if cost.kernel and not node.is_inplace else 0.0
    return replace(cost, vector_kind=kind, allocated_bytes=fresh) if kind or fresh else cost


def cost_graph(graph: OpGraph) -> list[OpCost]:
    """Costs of every node, in node order: one rule call per distinct node signature (a cost is a function of the
    op, its tensors' shapes, dtypes, strides and parameters, and its arguments; never of its id, edges or
    module), so the repeated nodes of 58 MoE layers x 256 experts share theirs."""
    memo: dict[tuple, OpCost] = {}
    out = []
    for n in graph.nodes:
        key = _signature(n)
        c = memo.get(key) if key is not None else None
        if c is None:
            c = cost_node(n)
            if key is not None:
                memo[key] = c
        out.append(c)
    return out


def _signature(n: Node) -> tuple | None:
    """What a cost rule reads of a node (cost_graph); None where an argument is not a plain value."""
    try:
        args = tuple([(k, _frozen(v)) for k, v in n.args.items()])
    except TypeError:
        return None
    return (n.op, n.is_view, n.is_inplace, n.input_names, args,
            tuple([(m.shape, m.dtype, m.stride, m.param) for m in n.inputs]),
            tuple([(m.shape, m.dtype, m.stride, m.param) for m in n.outputs]))


def _frozen(v):
    """A JSON-like argument as a hashable value (lists as tuples, typed: 1 and 1.0 and True differ)."""
    t = type(v)
    if t in _PLAIN:
        return (t, v)
    if isinstance(v, (list, tuple)):
        return tuple([_frozen(x) for x in v])
    if v is None or isinstance(v, (bool, int, float, str)):
        return (type(v), v)
    raise TypeError(type(v).__name__)


_PLAIN = frozenset({bool, int, float, str, type(None)})  # _frozen's common case, by exact type


def uncounted(graph: OpGraph, costs: list[OpCost]) -> dict[str, int]:
    """Op name -> count for the ops that have no rule."""
    return dict(Counter(n.op for n, c in zip(graph.nodes, costs) if not c.counted))


__all__ = ["RULES", "OpCost", "cost_graph", "cost_node", "rule", "rule_for", "uncounted"]
