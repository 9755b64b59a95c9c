"""OpCost and the rule registry.

A rule is one small function per op family, registered by decorator under the aten overload packet
names it covers (``@rule("mm", "addmm")``). It takes a Node and returns an OpCost. Conventions
(README, "Conventions"): a multiply-add is 2 FLOPs; matrix-engine FLOPs are kept apart from vector FLOPs and
transcendental ops; bytes are the minimum a kernel must move through device memory, each input read
once and each output written once, parameters apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields

from opmap.graph import Node, TensorMeta
from opmap.ops import MatrixProblem, VectorKind


@dataclass(frozen=True)
class OpCost:
    """Cost of one node. Immutable; costs add up with ``+``."""

    matrix_flops: float = 0.0  # on the matrix engine: GEMM, conv, attention products
    vector_flops: float = 0.0  # pointwise, reduction, softmax and norm arithmetic
    transcendental_flops: float = 0.0  # exp, log, tanh, erf, rsqrt, sin, ...: one per evaluation
    macs: float = 0.0  # multiply-accumulates of the matrix work (matrix_flops / 2), reported beside
    bytes_read: float = 0.0  # activations read (minimum: each input once)
    param_bytes_read: float = 0.0  # parameters and buffers read
    bytes_written: float = 0.0
    skipped_flops: float = 0.0  # matrix FLOPs a causal kernel skips (masked half); not in matrix_flops
    counted: bool = True  # False: no rule for this op (listed as uncounted, never a silent zero)
    is_view: bool = False  # a view: no kernel, no cost
    kernel: bool = True  # False: no kernel runs (views, allocations, metadata)
    # The matrix-engine problem (family and shape), for shape-dependent efficiency and tiling; None elsewhere.
    problem: MatrixProblem | None = None
    # The vector family whose measured rate applies (softmax, layer_norm, batch_norm, pool, reduce); None
    # for plain pointwise work. Set by cost_node from the rule that costed the node.
    vector_kind: VectorKind | None = None
    # bytes of outputs the op allocates fresh (an eager out-of-place op; 0 for in-place and views): on a CPU
    # large fresh outputs cost first-touch page faults beyond their write. Set by cost_node.
    allocated_bytes: float = 0.0

    @property
    def flops(self) -> float:
        return self.matrix_flops + self.vector_flops + self.transcendental_flops

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.param_bytes_read + self.bytes_written

    @property
    def intensity(self) -> float:
        """FLOPs per byte of minimum traffic (0 where nothing moves)."""
        return self.flops / self.bytes if self.bytes else 0.0

    def __add__(self, other: OpCost) -> OpCost:
        kw = {f: getattr(self, f) + getattr(other, f) for f in _ADDITIVE}
        return OpCost(**kw, counted=self.counted and other.counted, is_view=self.is_view and other.is_view,
                      kernel=self.kernel or other.kernel)

    @staticmethod
    def sum(costs: Iterable[OpCost]) -> OpCost:
        """The counted ``costs`` added up in order: ``OpCost() + c1 + c2 + ...`` over those with ``counted``, the
        same additions field by field without an OpCost per step (a 142,806-node graph's totals)."""
        acc = dict.fromkeys(_ADDITIVE, 0.0)
        for c in costs:
            if c.counted:
                d = c.__dict__
                for f in _ADDITIVE:
                    acc[f] += d[f]
        return OpCost(**acc)

    def to_dict(self) -> dict[str, float]:
        return {
            "flops": self.flops, "matrix_flops": self.matrix_flops, "vector_flops": self.vector_flops,
            "transcendental_flops": self.transcendental_flops, "macs": self.macs, "bytes": self.bytes,
            "bytes_read": self.bytes_read, "param_bytes_read": self.param_bytes_read,
            "bytes_written": self.bytes_written, "skipped_flops": self.skipped_flops,
            "intensity": self.intensity,
        }


_ADDITIVE = tuple(f.name for f in fields(OpCost)
                  if f.name not in ("counted", "is_view", "kernel", "problem", "vector_kind"))
Rule = Callable[[Node], OpCost]
RULES: dict[str, Rule] = {}


def rule(*packets: str) -> Callable[[Rule], Rule]:
    """Register ``fn`` as the cost rule of the given aten overload packets."""

    def deco(fn: Rule) -> Rule:
        for p in packets:
            if p in RULES and RULES[p] is not fn:
                raise ValueError(f"two cost rules for aten.{p}: {RULES[p].__name__} and {fn.__name__}")
            RULES[p] = fn
        return fn

    return deco


# -- helpers shared by the rules --------------------------------------------------------------------------

def prod(xs) -> int:
    n = 1
    for x in xs:
        n *= int(x)
    return n


def split_reads(tensors) -> tuple[float, float]:
    """(activation bytes, parameter bytes) to read ``tensors`` once each."""
    act = par = 0.0
    for t in tensors:
        if t.param is not None:
            par += t.storage_bytes
        else:
            act += t.storage_bytes
    return act, par


def io_cost(node: Node, *, reads: list[TensorMeta] | None = None, written: float | None = None,
            **flops: float) -> OpCost:
    """Minimum traffic: each input read once (or ``reads``), each output written once (or ``written``)."""
    act, par = split_reads(node.inputs if reads is None else reads)
    w = sum(t.nbytes for t in node.outputs) if written is None else written
    return OpCost(bytes_read=act, param_bytes_read=par, bytes_written=w, **flops)

