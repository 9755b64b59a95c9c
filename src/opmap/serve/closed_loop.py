"""Closed-loop clients as an event source of the simulator (sim.py): a request is sent when a client's previous
one is out, so the sends follow the simulated ends and the whole loop is one simulation.

``ClosedLoop`` says who waits on whom: ``users`` anonymous clients (each finish sends the next request in trace
order), or fixed chains (``after[k]``: the request whose end frees request k's client, as a measured run's slots
were taken: opmap.bench.predict). ``think_s`` (one for all or one per request) runs from that end to the send,
``lag_s`` from the send to the request's arrival at the servers (a front end's HTTP and tokenizing).

``Client`` is the simulator's side: the pending arrivals in a heap keyed by (arrival s, request), handed to the
event loop in arrival order (ties by trace order), as an open loop's sorted arrivals are.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from opmap.errors import OpmapError
from opmap.serve.request import Trace
from opmap.validate import count

MAX_USERS = 10_000_000  # sim.MAX_REPLICAS x 1000: a closed loop is bounded by its requests, not its users


@dataclass(frozen=True)
class ClosedLoop:
    """A closed loop of ``users`` clients. Without ``after``: each client sends its first request at 0 and its
    next one ``think_s`` after its previous one is recorded finished (its last token; the batch's end for none /
    static / dynamic), the requests sent in trace order. With ``after`` (one entry per request, trace order):
    request k is sent ``think_s`` after request ``after[k]`` (< k) is recorded finished, or at ``first_s[k]``
    where ``after[k]`` is -1 (a client's first request; ``users`` of them). Each request reaches the servers
    ``lag_s`` after its send; the result's arrival times are those arrivals."""

    users: int
    think_s: float | tuple[float, ...] = 0.0  # s from the end that frees the client to its send (per request)
    after: tuple[int, ...] | None = None  # per request, the request whose end frees its client; -1: a first one
    first_s: tuple[float, ...] | None = None  # per request, the send time of a client's first one (after = -1)
    lag_s: float = 0.0  # s from a send to the request's arrival at the servers

    def __post_init__(self) -> None:
        count(self.users, "closed-loop users", hi=MAX_USERS)
        thinks = self.think_s if isinstance(self.think_s, tuple) else (self.think_s,)
        for t in (*thinks, self.lag_s, *(self.first_s or ())):
            if not (t >= 0 and t < float("inf")):
                raise OpmapError(f"closed-loop think time, lag and first sends must be finite numbers of seconds "
                                 f">= 0, got {t}")
        if self.after is not None:
            if any(not -1 <= a < k for k, a in enumerate(self.after)):
                raise OpmapError("a closed loop's request can only wait on an earlier one (after[k] in -1 .. k-1)")
            if len(set(a for a in self.after if a >= 0)) != sum(a >= 0 for a in self.after):
                raise OpmapError("a closed loop's request frees its client for one next request, not several")
            if sum(a < 0 for a in self.after) != self.users:
                raise OpmapError(f"a closed loop of {self.users} users needs {self.users} first requests "
                                 f"(after = -1), got {sum(a < 0 for a in self.after)}")

    def check(self, n: int) -> None:
        """The per-request fields against ``n`` requests."""
        for name in ("think_s", "after", "first_s"):
            v = getattr(self, name)
            if isinstance(v, tuple) and len(v) != n:
                raise OpmapError(f"closed-loop {name} has {len(v)} entries for {n} requests")
        if self.after is not None and self.first_s is None:
            raise OpmapError("a closed loop with after needs first_s: the send times of the clients' first requests")


class Client:
    """The closed loop's pending arrivals (``ClosedLoop``) for the event loop: ``at_s[i]`` is the i-th arrival's
    time once it is the next one due (inf while none is pending), ``arrive(i)`` hands over its request; ``done``
    sends what the finished requests free. Sets ``trace.arr[k]`` at request k's arrival."""

    __slots__ = ("loop", "trace", "n", "at_s", "pending", "next", "succ", "think")

    def __init__(self, loop: ClosedLoop, trace: Trace) -> None:
        n = trace.n
        loop.check(n)
        self.loop, self.trace, self.n = loop, trace, n
        inf = float("inf")
        trace.arr = [inf] * n
        self.at_s = [inf] * n
        self.pending: list[tuple[float, int]] = []
        self.think = loop.think_s if isinstance(loop.think_s, tuple) else None
        if loop.after is None:  # anonymous users: the first ones at 0, each finish sends the next in trace order
            self.succ = None
            self.next = min(loop.users, n)
            for k in range(self.next):
                self.pending.append((0.0 + loop.lag_s, k))
        else:
            self.succ = [-1] * n
            for k, a in enumerate(loop.after):
                if a >= 0:
                    self.succ[a] = k
                else:
                    self.pending.append((loop.first_s[k] + loop.lag_s, k))
        heapq.heapify(self.pending)
        if self.pending:
            self.at_s[0] = self.pending[0][0]

    def arrive(self, i: int) -> int:
        """The i-th arrival (due at ``at_s[i]``): its request; the next one due goes to ``at_s[i + 1]``."""
        t, k = heapq.heappop(self.pending)
        self.trace.arr[k] = t
        if i + 1 < self.n and self.pending:
            self.at_s[i + 1] = self.pending[0][0]
        return k

    def done(self, finished, now: float, i: int) -> None:
        """``finished`` (request, time) pairs recorded at ``now``, ``i`` requests arrived so far: each sends its
        client's next request ``think`` after ``now``, arriving ``lag_s`` later."""
        loop, pending, think = self.loop, self.pending, self.think
        for rid, _ in finished:
            if self.succ is None:
                if self.next >= self.n:
                    continue
                k = self.next
                self.next += 1
            else:
                k = self.succ[rid]
                if k < 0:
                    continue
            heapq.heappush(pending, ((now + (think[k] if think is not None else loop.think_s)) + loop.lag_s, k))
        if i < self.n and pending:
            self.at_s[i] = pending[0][0]
