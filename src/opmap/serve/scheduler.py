"""The replica scheduler protocol and the registry of batching policies, keyed by the policy's name.

A policy's ``Family`` is built once per simulation (``Family(policy, cost, trace)``: its shared state, its checks,
its run's own figures, ``extra``: an EngineStats or None) and makes one ``ReplicaScheduler`` per replica
(``family.replica(idx, queue)``; replicas behind the ``shared`` router are handed the same queue). The simulator
appends arriving request ids to the queue, asks ``schedule(now)`` for the next step whenever the replica is idle,
and calls ``on_batch_end(batch, now)`` when that step's end event fires. A scheduler that returns None and wants
to be asked again at a later time without an event of its own (dynamic batching's wait) sets ``wake`` to that time.

Each family names the policies it schedules (``policies``; batching.py: none, static, dynamic; iteration.py:
continuous, chunked; inflight.py: engine); ``family_for(policy)`` finds one in ``REGISTRY``.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

from opmap.errors import OpmapError
from opmap.serve.request import Batch, Events
from opmap.serve.run_stats import EngineStats


class ReplicaScheduler(Protocol):
    wake: float  # when it wants to be asked again (-1: never)

    def schedule(self, now: float) -> Batch | None: ...

    def on_batch_end(self, batch: Batch, now: float) -> Events | None: ...


class Family(Protocol):
    policies: tuple[str, ...]  # the names of the policies it schedules
    iterative: bool  # forms iterations (needs a StepCost, not a ServiceTime)
    decode_pool: bool  # can run a disaggregated decode pool (prompts processed elsewhere)
    pages_kv: bool  # checks every request against the KV cache itself (else: prompt + output must fit)
    preempts: bool  # can preempt: the result carries per-request preemption counts

    def check(self) -> None: ...

    def replica(self, idx: int, q: deque) -> ReplicaScheduler: ...

    def extra(self, reps: list[Any], preempted: list[int]) -> EngineStats | None: ...


def _registry() -> dict[str, type]:
    from opmap.serve.batching import BatchFamily
    from opmap.serve.inflight import InflightScheduler
    from opmap.serve.iteration import IterationFamily

    return {name: fam for fam in (BatchFamily, IterationFamily, InflightScheduler) for name in fam.policies}


REGISTRY: dict[str, type] = {}  # policy name -> its Family class, filled on first use


def family_for(policy: Any) -> type:
    if not REGISTRY:
        REGISTRY.update(_registry())
    try:
        return REGISTRY[policy.name]
    except KeyError:
        raise OpmapError(f"no scheduler for policy {policy.name!r}: known: {', '.join(sorted(REGISTRY))}") from None
