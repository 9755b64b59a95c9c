"""Losses: cross-entropy's negative log-likelihood (``F.cross_entropy`` is log_softmax, costed in
opmap.costs.vector, then nll_loss) and the mean squared error, forward and backward.

- nll_loss_forward / nll_loss2d_forward: per target element, the ignore-index test and the accumulation of the
  gathered -log p (2 vector FLOPs), with a class weight also its product and the total weight's accumulation
  (4). Reads the targets and the one log-probability each picks (not the whole (N, C) input: a gather, as
  opmap.costs.movement counts one), the weights they pick; writes the loss and the total weight.
- nll_loss_backward / nll_loss2d_backward: the (N, C) input gradient written whole (zeros but for one entry per
  target), per target the ignore-index test and -dy / total_weight (2), times the class weight (3). Reads the
  incoming gradient, the targets, the total weight and the weights they pick; the saved input gives only its
  shape and is not read.
- mse_loss: per element (x - y)^2 (2) and, reduced, its accumulation (3). mse_loss_backward: (x - y) times
  2 dy / N, a scalar (2), or, unreduced, times 2 and dy (3).
"""

from __future__ import annotations

from opmap.costs.base import OpCost, io_cost, rule
from opmap.costs.movement import touched
from opmap.graph import Node

REDUCTION_NONE = 0  # at::Reduction::None (1: Mean, 2: Sum)


def _weight(node: Node, targets: int):
    """The class weights a loss reads (one per target), or None without weights."""
    w = node.input("weight") if "weight" in node.input_names else None
    return touched(w, targets) if w is not None else None


@rule("nll_loss_forward", "nll_loss2d_forward")
def nll_loss_cost(node: Node) -> OpCost:
    x, target = node.input("self"), node.input("target")
    n = target.numel
    w = _weight(node, n)
    reads = [target, touched(x, n)] + ([w] if w is not None else [])
    return io_cost(node, reads=reads, vector_flops=(4.0 if w is not None else 2.0) * n)


@rule("nll_loss_backward", "nll_loss2d_backward")
def nll_loss_backward_cost(node: Node) -> OpCost:
    target = node.input("target")
    n = target.numel
    w = _weight(node, n)
    reads = [node.input("grad_output"), target, node.input("total_weight")] + ([w] if w is not None else [])
    return io_cost(node, reads=reads, vector_flops=(3.0 if w is not None else 2.0) * n)


@rule("mse_loss")
def mse_loss_cost(node: Node) -> OpCost:
    reduced = node.args.get("reduction", 1) != REDUCTION_NONE
    return io_cost(node, vector_flops=(3.0 if reduced else 2.0) * node.input("self").numel)


@rule("mse_loss_backward")
def mse_loss_backward_cost(node: Node) -> OpCost:
    reduced = node.args.get("reduction", 1) != REDUCTION_NONE
    return io_cost(node, vector_flops=(2.0 if reduced else 3.0) * node.input("self").numel)
