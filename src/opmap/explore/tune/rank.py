"""Rank candidates by opmap's cost model, and score a ranking against measurement (Kendall's tau).

``predict_candidate``: the candidate's operator (candidates.op_for) is captured on the meta device, costed by
the cost rules and predicted by the one time model (predict.predict_cost, with the calibrated curves of
``--hardware local``) node by node, summed: casts, layout conversions, chunk concatenations and the unfused
math attention all count. Thread count: the profile was measured on ``calibrated_threads`` threads; a
candidate on ``t`` threads gets its matrix and vector terms scaled by ``calibrated_threads / t`` (each core
brings its own FMA units) while its memory term and dispatch overhead stay (one socket's memory system, one
host thread dispatching). On more than one thread, each kernel that runs as a parallel region (a matrix
product; a softmax, norm, pooling or reduction, which ATen splits over rows or channels with a grain of 1, e.g.
``at::parallel_for(0, M, 1, ...)`` in aten/src/ATen/native/cpu/layer_norm_kernel.cpp; any other kernel from
ATen's grain size up, 32768 output elements: aten/src/ATen/Parallel.h) also pays the
fork / join cost ``parallel_s`` (calibrate.run.parallel_overhead, re-measured when tuning starts: on a host
shared with other busy processes it is mostly the wait for the scheduler to run the worker threads, and it
changes minute to minute).

``kendall_tau``: tau-b over (predicted, measured) pairs, ties counted as neither concordant nor discordant
and taken out of the denominator (Kendall 1945, "The treatment of ties in ranking problems"); pooled over
groups (signatures) by summing the pair counts of each group, so only candidates of one signature are
compared with each other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from opmap.explore.tune.candidates import Candidate, op_for
from opmap.explore.tune.signatures import Signature
from opmap.hardware.spec import HardwareSpec
from opmap.roofline import roofline


class _Op(torch.nn.Module):
    """The candidate's function as a module; ``args`` with None (no bias) kept in place."""

    def __init__(self, fn, args: tuple):
        super().__init__()
        self.fn, self.holes = fn, tuple(a is None for a in args)

    def forward(self, *xs):
        it = iter(xs)
        return self.fn(*(None if hole else next(it) for hole in self.holes))


GRAIN_SIZE = 32768  # ATen's at::internal::GRAIN_SIZE: smaller pointwise kernels run on one thread


def predict_candidate(sig: Signature, cand: Candidate, hw: HardwareSpec, calibrated_threads: int,
                      parallel_s: float = 0.0) -> float:
    """Predicted seconds per call of ``cand`` for ``sig`` on ``hw`` (see the module docstring)."""
    from opmap.capture import capture
    from opmap.costs import cost_graph
    from opmap.precision import resolve_precision
    from opmap.predict import predict_cost

    fn, args = op_for(sig, cand, "meta")
    graph = capture(_Op(fn, args), tuple(a for a in args if a is not None), memoize=False)
    prec = resolve_precision(hw, cand.dtype)
    scale = calibrated_threads / cand.threads
    total = 0.0
    for n, c in zip(graph.nodes, cost_graph(graph)):
        p = predict_cost(c, hw, prec, hw.curves)
        if scale != 1.0 and (p.matrix_s or p.vector_s):
            p = roofline(p.matrix_s * scale, p.vector_s * scale, p.memory_s, p.overhead_s)
        total += p.predicted_s
        if cand.threads > 1 and c.kernel and (c.matrix_flops or c.vector_kind
                                              or sum(o.numel for o in n.outputs) >= GRAIN_SIZE):
            total += parallel_s
    return total


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def pair_counts(pred: Sequence[float], meas: Sequence[float],
                noise: Sequence[float] | None = None) -> tuple[int, int, int, int, int]:
    """(concordant, discordant, tied in pred only, tied in meas only, total pairs) over one group. ``noise``: per
    item, a measured difference not above the larger of the two is a tie (the measurement cannot order them)."""
    c = d = tp = tm = 0
    n = len(pred)
    for i in range(n):
        for j in range(i + 1, n):
            dm = meas[i] - meas[j]
            if noise is not None and abs(dm) <= max(noise[i], noise[j]):
                dm = 0.0
            a, b = _sign(pred[i] - pred[j]), _sign(dm)
            if a and b:
                c, d = (c + 1, d) if a == b else (c, d + 1)
            elif not a and b:
                tp += 1
            elif a and not b:
                tm += 1
    return c, d, tp, tm, n * (n - 1) // 2


def kendall_tau(groups: Sequence[tuple[Sequence[float], ...]]) -> float | None:
    """Kendall's tau-b pooled over groups of (predicted, measured[, noise]); None where no pair is untied in
    both. With a noise list per group, measured differences within it count as ties (pair_counts)."""
    c = d = tp = tm = 0
    for g in groups:
        gc, gd, gtp, gtm, _ = pair_counts(g[0], g[1], g[2] if len(g) > 2 else None)
        c, d, tp, tm = c + gc, d + gd, tp + gtp, tm + gtm
    # tau-b: (C - D) / sqrt((n0 - n1)(n0 - n2)) with n0 - n1 = pairs untied in pred = C + D + (tied in meas only)
    den = math.sqrt((c + d + tm) * (c + d + tp))
    return (c - d) / den if den else None
