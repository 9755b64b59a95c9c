"""What every phase's figures read off an analysis: each kernel's time and bound, and the bound holding the most
time."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opmap.analyze import Analysis


def dominant_bound(kernels: Sequence[tuple[str, float]]) -> str:
    by: dict[str, float] = defaultdict(float)
    for b, t in kernels:
        if b not in ("view", "alloc"):
            by[str(b)] += t
    return max(by, key=by.get) if by else "view"


def kernel_times(a: Analysis) -> list[tuple[int, str, float]]:
    """(anchor node id, bound, predicted s) of every kernel, or of every kernel node without a plan."""
    if a.kernel_results:
        return [(k.kernel.anchor, str(k.bound), k.predicted_s) for k in a.kernel_results]
    return [(r.node.id, str(r.pred.bound), r.pred.predicted_s) for r in a.results if r.cost.kernel]
