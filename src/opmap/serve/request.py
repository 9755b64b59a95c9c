"""The values the simulator and its replica schedulers pass each other.

``Request``: one request of a trace (frozen). ``Trace``: the trace as plain lists (what the schedulers read on
their hot path; ``trace.request(i)`` gives the value), the service times drawn for it, the first-token times of a
decode pool's requests and how many requests have arrived so far. ``Batch``: one step a replica scheduler formed
(``schedule(now)``); ``Events``: what a step's end produced (``on_batch_end(batch, now)``). Both carry times
as (request, time) pairs and inter-token gaps as two aligned lists (gap s, tokens); the simulator records them,
a scheduler never writes into the simulator's results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opmap.serve.prefix import Prompts

_NONE: tuple = ()  # an empty list of events, shared (never appended to)


@dataclass(frozen=True, slots=True)
class Request:
    rid: int
    arrival_s: float
    input_len: int
    output_len: int


@dataclass(slots=True)
class Trace:
    """The requests of one simulation as lists (index = request id)."""

    arr: list[float]
    inp: list[int]
    out: list[int]
    svc: list[float] | None = None  # per request, its drawn service time (a ServiceTime instead of a step cost)
    origin: list[float] | None = None  # a decode pool: each request's first token, out of the prefill pool
    arrived: int = 0  # requests arrived so far (the simulator's; static batching waits for more unless all in)
    prompt: Prompts | None = None  # shared prefixes: what each prompt holds (engine policy only)

    @property
    def n(self) -> int:
        return len(self.arr)

    def request(self, rid: int) -> Request:
        return Request(rid, self.arr[rid], self.inp[rid], self.out[rid])


@dataclass(slots=True)
class Events:
    """What happened at a step boundary: first tokens and last tokens out (request, time), inter-token gaps
    (``gap_s[k]`` seconds for ``gap_w[k]`` tokens). A finished request leaves its replica."""

    first: Any = _NONE  # (request, time) pairs
    finished: Any = _NONE
    gap_s: Any = _NONE
    gap_w: Any = _NONE


@dataclass(slots=True)
class Batch(Events):
    """One step a replica scheduler formed at ``now``: it runs until ``end_s`` (``duration_s`` of busy time; None:
    no step, only the events of admitting requests). ``started``: requests admitted in it (first scheduled, or
    re-admitted after a preemption); ``preempted``: requests evicted to form it; the inherited events are those
    already known when it was formed. ``state``: the scheduler's own record of the step, for ``on_batch_end``."""

    end_s: float | None = None
    duration_s: float = 0.0
    started: Any = _NONE
    preempted: Any = _NONE
    state: Any = None
