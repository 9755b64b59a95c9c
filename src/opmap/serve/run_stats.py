"""What a simulated run reports beside its per-request times: frozen values the schedulers and the simulators hand
to the summary (``opmap.serve.metrics.ServeReport``), each recorded (``opmap.record``) for serve.json, where it is
written.

- ``EngineStats``: the engine policy's preemptions (``Preemptions``) and paged KV cache (``PagedKv``);
- ``Disaggregation``: a disaggregated run's pools, its KV move (``KvTransfer``) and the waits it caused;
- ``QueueTrend`` and ``SteadyState``: whether a run's queue is stationary, and the window a capacity run measured
  (``opmap.serve.capacity``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from opmap.errors import OpmapError
from opmap.record import key
from opmap.serve.prefix import PrefixCache


@dataclass(frozen=True)
class Preemptions:
    """Requests evicted when KV blocks ran out (recomputed later): in all, requests preempted at least once, the
    most for one request."""

    total: int
    requests_preempted: int
    max_per_request: int

    @classmethod
    def of(cls, per_request: list[int]) -> Preemptions:
        return cls(sum(per_request), sum(1 for k in per_request if k), max(per_request, default=0))


NO_PREEMPTIONS = Preemptions(0, 0, 0)  # the policies that never preempt


@dataclass(frozen=True)
class PagedKv:
    """The paged KV cache of a replica: block size (tokens), blocks (None: no capacity given), the capacity in
    tokens, the most blocks any replica held at once (None without a capacity), how a preemption is undone. Its
    record (serve.json's ``kv_cache``) says first that the cache is paged."""

    RECORD: ClassVar[tuple[str, ...]] = ("paged", ...)
    paged: ClassVar[bool] = True
    kv_block: int
    blocks: int | None
    capacity_tokens: int | None
    peak_blocks_used: int | None
    preemption: str = "recompute"


@dataclass(frozen=True)
class EngineStats:
    """The engine policy's own figures of a run (opmap.serve.inflight): serve.json's ``preemptions``, ``kv_cache``
    and, where prompts share prefixes, ``prefix_cache`` (opmap.serve.prefix.PrefixCache)."""

    preemptions: Preemptions
    kv_cache: PagedKv
    prefix_cache: PrefixCache | None = None


@dataclass(frozen=True)
class KvTransfer:
    """The move of a prompt's KV cache from a prefill to a decode replica: ``latency_s`` + tokens x
    ``bytes_per_token`` (per device) / ``bandwidth_bytes_per_s`` (per device, one direction)."""

    bytes_per_token: float
    bandwidth_bytes_per_s: float
    latency_s: float = 0.0
    link: str = "given"

    def __post_init__(self) -> None:
        if not (self.bytes_per_token >= 0 and self.bandwidth_bytes_per_s > 0 and self.latency_s >= 0):
            raise OpmapError("a KV transfer needs bytes_per_token >= 0, bandwidth > 0 and latency >= 0")

    def seconds(self, tokens: np.ndarray) -> np.ndarray:
        return self.latency_s + tokens * self.bytes_per_token / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class Spread:
    """The mean and the largest of a per-request time (s); None each over no request."""

    mean_s: float | None
    max_s: float | None

    @classmethod
    def of(cls, x: np.ndarray) -> Spread:
        return cls(float(x.mean()), float(x.max())) if x.size else cls(None, None)


@dataclass(frozen=True)
class Disaggregation:
    """A disaggregated run (opmap.serve.disagg): its pools, the KV move and its time per request, the wait for a
    decode slot, each replica's busy time (s), the stated assumptions; the decode pool's own pricing where it has
    one (``decode_cost``, as written) and the time prefilled KV was held back where back-pressure bound. Its record
    is serve.json's ``disaggregation`` block: the busy times by pool (``busy_s``), the last two only where set."""

    RECORD: ClassVar[tuple[str, ...]] = ("prefill_replicas", "decode_replicas", "kv_transfer", "kv_transfer_s",
                                         "decode_admission_wait_s", "busy_s", "assumptions", "decode_cost",
                                         "kv_held_on_prefill_s")
    prefill_replicas: int
    decode_replicas: int
    kv_transfer: KvTransfer
    kv_transfer_s: Spread
    decode_admission_wait_s: Spread
    prefill_busy_s: tuple[float, ...]
    decode_busy_s: tuple[float, ...]
    assumptions: str
    decode_cost: dict[str, Any] | None = field(default=None, metadata=key(omit="none"))
    kv_held_on_prefill_s: Spread | None = field(default=None, metadata=key(omit="none"))

    @property
    def busy_s(self) -> dict[str, tuple[float, ...]]:
        """Each replica's busy time (s), by pool."""
        return {"prefill": self.prefill_busy_s, "decode": self.decode_busy_s}


@dataclass(frozen=True)
class QueueTrend:
    """Is a run's queue stationary (``opmap.serve.capacity.queue_trend``)? Over ``window`` (``window_requests``
    requests), the least-squares growth of the waiting time (s) with its standard error, the mean wait (s) and the
    window's arrival span (s); ``verdict`` "stationary", "diverging" or "too short" (then no growth, and no span
    where the window had none)."""

    window: str
    window_requests: int
    rule: str
    verdict: str
    growth_s: float | None
    growth_se_s: float | None
    mean_s: float | None
    span_s: float | None = field(default=None, metadata=key(omit="none"))  # None: not written (window too short)


@dataclass(frozen=True)
class SteadyState:
    """The window a capacity run measured: its requests (lengthened as it needed), those left out as warm-up and
    cool-down, those measured, its queue's trend, and whether every request was served alone
    (``RateProbe._alone``). Its record writes the trend's keys in place."""

    requests: int
    warmup_requests: int
    cooldown_requests: int
    measured_requests: int
    trend: QueueTrend = field(metadata=key(flatten=True))
    alone: bool = False

    @property
    def verdict(self) -> str:
        return self.trend.verdict
