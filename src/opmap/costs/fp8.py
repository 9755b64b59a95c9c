"""The kernels fp8 training adds (opmap.mapping.fp8 places them in a training graph): Transformer Engine's cast
(+ transpose) with the amax reduction fused, and its once-per-iteration amax-history and scale update.

Delayed scaling (TE's DelayedScaling recipe): each cast scales by the factor derived from earlier iterations' amax,
so the amax of the tensor being cast is reduced inside the same pass (an atomic max per block) rather than in a pass
of its own; the scale update then runs once per iteration over every fp8 tensor's amax history.
"""

from __future__ import annotations

from opmap.costs.base import OpCost, io_cost, rule
from opmap.graph import Node


@rule("fp8_cast_transpose")
def fp8_cast_transpose_cost(node: Node) -> OpCost:
    """Cast a bf16 tensor of N elements to fp8 and, where a later GEMM needs it (Hopper's fp8 GEMMs take TN
    operands only), write its transpose too, reducing |x| to the tensor's amax in the same pass (TE's
    fp8_cast_transpose_fused): reads 2N bytes, writes N bytes per fp8 output (N, or 2N with the transpose);
    per element one multiply by the scale and one max for the amax: 2N vector FLOPs. Memory-bound."""
    n = sum(t.numel for t in node.inputs)
    return io_cost(node, vector_flops=2.0 * n)


@rule("fp8_scale_update")
def fp8_scale_update_cost(node: Node) -> OpCost:
    """TE's amax-and-scale update, once per iteration for all fp8 tensors (one multi-tensor kernel): reads each
    tensor's fp32 amax history (H entries) and scale, takes the history's max (H compares), rolls the history and
    writes it and the new scale back (scale = fp8 max / amax / 2^margin: a few FLOPs per tensor)."""
    hist = node.inputs[0]
    return io_cost(node, vector_flops=float(hist.numel) + 4.0 * hist.shape[0])
