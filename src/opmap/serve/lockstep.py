"""DP attention's attention ranks in lockstep: one replica of N ranks (a cost with ``attention_ranks`` N: opmap.serve.
model_cost with ``dp_attention``), as SGLang --enable-dp-attention and TensorRT-LLM enable_attention_dp run a MoE.

Each rank is a scheduler of the policy's own family (its own queue, its own batch, its own KV pool of
``kv_capacity_tokens``: one device's), the requests the replica receives dealt to its ranks round-robin in arrival
order (SGLang's data-parallel controller's default, round_robin). The ranks step together: every MoE layer's
dispatch and combine all-to-all needs every rank (an idle rank runs an empty batch to take part), so a step of the
replica starts when the ranks are all free, each rank forms its own step from its own state, and the step lasts as
long as its busiest rank's (``TableCost`` prices a rank's step at its own batch as if every rank carried the same:
the expert work and the all-to-all of the busiest rank's tokens, an upper bound where the others carry fewer).
Every rank's step is then closed at that common end: its inter-token gaps are the group's step time. With pp
pipeline stages a rank is a pipeline of pp devices, its step its own microbatches through them (``TableCost._piped``).

``Lockstep`` wraps the policy's family (the simulator builds it where the cost has ranks: sim.py), ``Group`` is the
replica scheduler it hands the simulator; both keep the scheduler protocol (scheduler.py).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from opmap.errors import OpmapError
from opmap.serve.request import Batch, Events

_ITERATIVE = ("engine", "continuous", "chunked")  # policies that form steps a rank can run in lockstep


class Lockstep:
    """The policy's family ``inner`` with each replica ``ranks`` attention ranks in lockstep (module docstring); its
    attributes are the inner family's."""

    def __init__(self, inner: Any, ranks: int, policy: Any) -> None:
        if policy.name not in _ITERATIVE:
            raise OpmapError(f"DP attention runs its ranks' iterations in lockstep: use --policy engine, continuous or "
                             f"chunked, got {policy.spec()!r}")
        self.inner, self.ranks = inner, ranks

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def replica(self, idx: int, q: deque) -> Group:
        return Group([self.inner.replica(idx * self.ranks + i, deque()) for i in range(self.ranks)], q)

    def extra(self, reps: list[Group], preempted: list[int]) -> Any:
        """The inner family's figures over every rank of every replica (a KV pool's peak: the busiest rank's)."""
        return self.inner.extra([r for g in reps for r in g.ranks], preempted)


class Group:
    """One replica's ranks: ``q`` the replica's queue (the simulator's), dealt round-robin to the ranks' own queues
    when the replica forms a step."""

    __slots__ = ("ranks", "q", "wake", "dealt")

    def __init__(self, ranks: list[Any], q: deque) -> None:
        self.ranks, self.q, self.wake = ranks, q, -1.0
        self.dealt = 0  # requests dealt so far: the next goes to rank dealt mod N

    def schedule(self, now: float) -> Batch | None:
        """Every rank's next step, formed together; the replica's step lasts as long as the longest (None: no rank
        has anything to run or report)."""
        q, ranks = self.q, self.ranks
        n = len(ranks)
        while q:
            ranks[self.dealt % n].q.append(q.popleft())
            self.dealt += 1
        parts = [(i, r.schedule(now)) for i, r in enumerate(ranks)]
        parts = [(i, b) for i, b in parts if b is not None]
        if not parts:
            return None
        runs = [b for _, b in parts if b.end_s is not None]
        d = max((b.duration_s for b in runs), default=0.0)
        for b in runs:  # every rank's step ends with the busiest rank's
            b.end_s, b.duration_s = now + d, d
        out = Batch(started=_cat(b.started for _, b in parts), preempted=_cat(b.preempted for _, b in parts),
                    state=[(i, b) for i, b in parts if b.end_s is not None])
        _merge(out, [b for _, b in parts])
        if runs:
            out.end_s, out.duration_s = now + d, d
        return out

    def on_batch_end(self, batch: Batch, now: float) -> Events | None:
        """Close every rank's step at the common end; their events together."""
        ev = Events([], [], [], [])
        _merge(ev, [e for e in (self.ranks[i].on_batch_end(b, now) for i, b in batch.state) if e is not None])
        return ev


def _cat(lists) -> list:
    out: list = []
    for x in lists:
        if x:
            out.extend(x)
    return out


def _merge(into: Events, parts: list[Events]) -> None:
    """``into``'s first tokens, finishes and inter-token gaps: those of ``parts`` in rank order."""
    into.first = _cat(p.first for p in parts)
    into.finished = _cat(p.finished for p in parts)
    into.gap_s = _cat(p.gap_s for p in parts)
    into.gap_w = _cat(p.gap_w for p in parts)
