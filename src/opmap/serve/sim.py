"""The discrete-event serving simulator: one heap of step-end and timer events, requests merged in from the
sorted arrival times, R replicas behind a router.

Routers: ``round_robin`` (request i to replica i mod R), ``least_loaded`` (join the shortest queue: the
replica with the fewest outstanding requests, queued or running; ties to the lowest index), ``shared`` (one
queue for all replicas: an M/M/c system with policy none; a replica takes from it whenever it forms a step),
``batched:SIZE,WAIT_MS`` (a harness batcher in front: requests held and handed over in groups, each group to the
next replica; batcher.py). A request's latencies run from its arrival, a batcher's hold included.

Time of a request: ``start_s`` when it is first scheduled (its queueing ends), ``first_s`` when its first
token is out (end of the step that finishes its prompt), ``finish_s`` when its last token is out. Tokens
stream: each request's tokens come at the end of the iteration that produced them.

KV cache (policies continuous and chunked): a request reserves input_len + output_len tokens when admitted and
frees them when it finishes (no preemption, no paging). Admission is first come, first served; a request that
does not fit waits at the head of its queue. Policy ``engine`` pages the KV cache in blocks allocated as tokens
are produced and preempts by recompute when they run out, as vLLM does (inflight.py).

DP attention (a cost with ``attention_ranks`` N > 1): each replica is N attention ranks stepping in lockstep, the
replica's requests dealt round-robin over them, each with its own scheduler and KV pool (lockstep.py).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from opmap.errors import OpmapError
from opmap.serve.arrivals import Requests
from opmap.serve.batcher import dispatch, parse_batcher
from opmap.serve.closed_loop import Client, ClosedLoop
from opmap.serve.cost import ServiceTime, StepCost
from opmap.serve.policies import Policy
from opmap.serve.request import Batch, Events, Trace
from opmap.serve.run_stats import Disaggregation, EngineStats
from opmap.serve.scheduler import Family, family_for
from opmap.serve.spec import spec_of
from opmap.validate import count

# The most replicas one simulation runs: 10k, a fleet beyond any one deployment a capacity plan is made for; the
# routers look at every replica per request, so time grows as requests x replicas (10M replicas: minutes, not
# seconds).
MAX_REPLICAS = 10_000

ROUTERS = ("round_robin", "least_loaded", "shared")  # and batched:SIZE,WAIT_MS (check_router)


def check_router(router: str) -> None:
    """The router by name, or a batcher's spec (one line naming what is accepted otherwise)."""
    if router not in ROUTERS and parse_batcher(router) is None:
        raise OpmapError(f"bad router {router!r}: accepted: {', '.join(ROUTERS)}, batched:SIZE,WAIT_MS")


@dataclass
class SimResult:
    """Per-request times (s; numpy arrays aligned with the requests) and the inter-token gaps, pooled over
    all tokens as (gap_s, weight) pairs: ``itl_weight[k]`` tokens came ``itl_gap_s[k]`` after their
    request's previous token."""

    arrival_s: np.ndarray
    start_s: np.ndarray
    first_s: np.ndarray
    finish_s: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    replica: np.ndarray
    itl_gap_s: np.ndarray
    itl_weight: np.ndarray
    policy: Policy
    cost: dict[str, Any]  # the pricing as written (its to_dict)
    router: str
    replicas: int
    arrival: str
    steps: int
    busy_s: list[float]
    streams_tokens: bool = True  # False with a service time: a request is one unit of work, no tokens
    engine: EngineStats | None = None  # the engine policy's preemptions and paged KV (its scheduler's ``extra``)
    preemptions: np.ndarray | None = None  # per request, how often it was preempted (policy engine)
    disaggregation: Disaggregation | None = None  # a disaggregated run's pools (opmap.serve.disagg)
    prefix_hit_tokens: np.ndarray | None = None  # shared prefixes: per request, its prompt tokens found cached


def simulate(reqs: Requests, policy: Policy, cost: StepCost | ServiceTime, replicas: int = 1,
             router: str = "round_robin", seed: int = 0, prefilled_first_s: np.ndarray | None = None,
             closed: ClosedLoop | None = None) -> SimResult:
    """Run ``reqs`` through ``replicas`` servers under ``policy``, each step priced by ``cost`` (or each
    request served for a drawn ``ServiceTime``, from ``np.random.default_rng([seed, 1])``).

    ``prefilled_first_s`` (a decode pool, see disagg.py): every request arrives with its prompt already
    processed elsewhere and its first token out at ``prefilled_first_s[i]``; admission (continuous policy
    only, KV cache permitting) costs no prefill step, the request joins the next decode iteration, and its
    first inter-token gap runs from ``prefilled_first_s[i]``. ``closed``: the requests are sent by a closed
    loop of users (``ClosedLoop``), not at their arrival times."""
    sim = _Sim(reqs, policy, cost, replicas, router, seed, prefilled_first_s, closed)
    sim.run()
    if any(np.isnan(sim.finish)):
        raise OpmapError("simulation ended with unfinished requests (a policy or capacity deadlock): "
                         "report this with the command line")
    fam = sim.family
    arrival_s = np.asarray(sim.trace.arr) if closed is not None else reqs.arrival_s  # a closed loop's: simulated
    return SimResult(arrival_s, np.asarray(sim.start), np.asarray(sim.first), np.asarray(sim.finish),
                     reqs.input_len, reqs.output_len, np.asarray(sim.where), np.asarray(sim.itl_g, dtype=np.float64),
                     np.asarray(sim.itl_w, dtype=np.float64), policy,
                     cost.to_dict() if hasattr(cost, "to_dict") else {"kind": type(cost).__name__},
                     router, replicas, reqs.arrival, sim.steps, list(sim.busy_s),
                     streams_tokens=not sim.service, engine=fam.extra(sim.scheds, sim.pre),
                     preemptions=np.asarray(sim.pre) if fam.preempts else None,
                     prefix_hit_tokens=_hits(fam))


def _hits(fam: Family) -> np.ndarray | None:
    """Per request, the prompt tokens found cached when it was first admitted (None: no prompts shared)."""
    hit = getattr(fam, "hit", None)
    return np.asarray(hit, dtype=np.int64) if hit is not None else None


def _check(reqs: Requests, policy: Policy, fam: Family, cost: StepCost | ServiceTime, replicas: int, router: str,
           decode_only: bool) -> None:
    """The router, the replicas, the policy against the cost (iterations need a step cost) and every request's KV
    cache against the device's (the engine policy pages it: checked by its scheduler)."""
    check_router(router)
    count(replicas, "--replicas", hi=MAX_REPLICAS)
    service = isinstance(cost, ServiceTime)
    if decode_only and not fam.decode_pool:
        raise OpmapError(f"a decode pool schedules iterations: it needs policy continuous, got {policy.spec()!r}")
    if service and fam.iterative:
        raise OpmapError(f"policy {policy.spec()!r} schedules iterations, which a service time does not have: "
                         "use none, static:B or dynamic:B,WAIT_MS with --service-time")
    spec = spec_of(cost)
    if spec is not None and (not getattr(fam, "speculates", False) or decode_only):
        raise OpmapError(f"speculative decoding ({spec.spec()}) is simulated under --policy continuous[:TOKEN_BUDGET] "
                         f"or chunked:CHUNK without --disaggregate, got {policy.spec()!r}"
                         + (" with --disaggregate" if decode_only else ""))
    if reqs.prompt is not None and not fam.pages_kv:
        raise OpmapError(f"prompts that share prefixes ({reqs.prompt.source}) are served from the prefix cache of "
                         f"the engine policy's paged KV: use --policy engine, got {policy.spec()!r}")
    cap = cost.kv_capacity_tokens
    if cap is not None and len(reqs) and not fam.pages_kv:
        need = int((reqs.input_len + reqs.output_len).max())
        if need > cap:
            raise OpmapError(f"a request needs {need} tokens of KV cache, the device holds {cap}: "
                             "shorten --input-len/--output-len, raise --tp or pick a larger device")


class _Sim:
    """One simulation (``simulate``): the requests' times as lists, a replica scheduler per replica (the policy's
    family, scheduler.py), per replica whether busy, its outstanding requests, busy time and running step, and the
    event heap. The schedulers form and close steps; the simulator records what they report."""

    def __init__(self, reqs: Requests, policy: Policy, cost: StepCost | ServiceTime, replicas: int, router: str,
                 seed: int, prefilled_first_s: np.ndarray | None, closed: ClosedLoop | None = None) -> None:
        self.router, self.replicas = router, replicas
        self.service = service = isinstance(cost, ServiceTime)
        self.n = n = len(reqs)
        svc = cost.draw(n, np.random.default_rng([seed, 1])).tolist() if service else None
        batcher = parse_batcher(router)
        arr, self.fixed = reqs.arrival_s, None  # fixed: each request's replica, chosen before the run (a batcher)
        if batcher is not None:
            if closed is not None:
                raise OpmapError(f"router {router!r} holds an open loop's arrivals: a closed loop's users are "
                                 "served as they send (use round_robin, least_loaded or shared)")
            arr, where = dispatch(reqs.arrival_s, batcher, replicas)
            self.fixed = where.tolist()
        self.trace = Trace(arr.tolist(), reqs.input_len.tolist(), reqs.output_len.tolist(), svc,
                           prefilled_first_s.tolist() if prefilled_first_s is not None else None,
                           prompt=reqs.prompt)
        self.family = fam = family_for(policy)(policy, cost, self.trace)
        ranks = getattr(cost, "attention_ranks", 1)
        if ranks > 1:  # DP attention: each replica's ranks in lockstep (opmap.serve.lockstep)
            from opmap.serve.lockstep import Lockstep

            if router == "shared":
                raise OpmapError("DP attention deals each replica's requests over its attention ranks: use router "
                                 "round_robin or least_loaded, not shared")
            self.family = fam = Lockstep(fam, ranks, policy)
        _check(reqs, policy, fam, cost, replicas, router, prefilled_first_s is not None)
        fam.check()
        # a closed loop's requests arrive as the client sends them (record): in arrival order at client.at_s
        self.client = Client(closed, self.trace) if closed is not None else None
        self.arrived = 0  # requests arrived so far (the event loop's count)
        nan = float("nan")
        self.start, self.first, self.finish = [nan] * n, [nan] * n, [nan] * n
        self.where = [0] * n
        self.pre = [0] * n  # per request, how often it was preempted
        self.itl_g: list[float] = []
        self.itl_w: list[int] = []
        self.shared = shared = deque() if router == "shared" else None
        self.queues = [shared if shared is not None else deque() for _ in range(replicas)]
        self.scheds = [fam.replica(r, self.queues[r]) for r in range(replicas)]
        self.busy = [False] * replicas
        self.timer_at = [-1.0] * replicas
        self.outstanding = [0] * replicas
        self.busy_s = [0.0] * replicas
        self.pending: list[Batch | None] = [None] * replicas
        self.heap: list[tuple[float, int, int, int]] = []  # (time, seq, kind 0 step end / 1 timer, replica)
        self.seq = 0
        self.steps = 0

    def push(self, t: float, kind: int, r: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, r))

    def record(self, ev: Events, r: int, now: float, gaps: bool = True) -> None:
        """A step's events: first and last tokens (a finished request leaves replica ``r``), inter-token gaps
        (unless ``gaps`` is False: recorded by the caller)."""
        if ev.first:
            first = self.first
            for rid, t in ev.first:
                first[rid] = t
        if ev.finished:
            finish = self.finish
            for rid, t in ev.finished:
                finish[rid] = t
            self.outstanding[r] -= len(ev.finished)
            if self.client is not None:
                self.client.done(ev.finished, now, self.arrived)
        if gaps and ev.gap_s:
            self.itl_g.extend(ev.gap_s)
            self.itl_w.extend(ev.gap_w)

    def begin(self, r: int, now: float) -> None:
        """Ask replica ``r``'s scheduler for its next step at ``now`` and start it."""
        b = self.scheds[r].schedule(now)
        if b is None:
            self.idle(r)
        else:
            self.started(r, b, now)

    def idle(self, r: int) -> None:
        """Replica ``r`` has nothing to run: wake it when its scheduler asks (dynamic batching's wait)."""
        w = self.scheds[r].wake
        if w != self.timer_at[r]:
            self.timer_at[r] = w
            self.push(w, 1, r)

    def started(self, r: int, b: Batch, now: float) -> None:
        """Record what forming step ``b`` on replica ``r`` did, and start it (unless it runs nothing)."""
        if b.started:
            start, where = self.start, self.where
            for rid in b.started:
                if start[rid] != start[rid]:  # NaN: first scheduled now (not a re-admission after a preemption)
                    start[rid] = now
                where[rid] = r
        if b.preempted:
            for rid in b.preempted:
                self.pre[rid] += 1
        if b.first or b.finished or b.gap_s:
            self.record(b, r, now)
        if b.end_s is None:
            return
        self.steps += 1
        self.busy[r] = True
        self.busy_s[r] += b.duration_s
        self.pending[r] = b
        self.seq += 1
        heapq.heappush(self.heap, (b.end_s, self.seq, 0, r))

    def kick(self, now: float) -> None:
        busy = self.busy
        for r in range(self.replicas):
            if not busy[r]:
                self.begin(r, now)

    def run(self) -> None:
        """The event loop: the earliest of the next step end or timer (the heap) and the next arrival. Arrivals
        are routed as they come (requests arriving together are queued together: offline), then the replicas
        they reached start a step if idle (all of them with one shared queue, or once the last request is in).
        A closed loop's client hands its requests over in arrival order (``arr``: the i-th arrival's time); a
        request it sends at a step's end arrives before that replica forms its next step, as an open loop's
        arrival at that time would (the replica's start is deferred to the arrival)."""
        client = self.client
        arr = self.trace.arr if client is None else client.at_s
        n, heap, router, replicas = self.n, self.heap, self.router, self.replicas
        deferred: list[int] = []  # replicas whose next step waits on an arrival at this time (closed loop)
        shared, begin, record, busy, timer_at = self.shared, self.begin, self.record, self.busy, self.timer_at
        queues, outstanding, trace, pending = self.queues, self.outstanding, self.trace, self.pending
        scheds, itl_g, itl_w, busy_s, fixed = self.scheds, self.itl_g, self.itl_w, self.busy_s, self.fixed
        ia = 0
        while ia < n or heap:
            ta = arr[ia] if ia < n else float("inf")
            if heap and heap[0][0] < ta:
                now, _, kind, r = heapq.heappop(heap)
                if kind == 0:  # a step ends: its scheduler reports what came out of it
                    b = pending[r]
                    pending[r] = None
                    busy[r] = False
                    ev = scheds[r].on_batch_end(b, now)
                    if ev is not None:  # record(ev, r), inlined: one call less a step
                        if ev.gap_s:
                            itl_g.extend(ev.gap_s)
                            itl_w.extend(ev.gap_w)
                        if ev.first or ev.finished:
                            record(ev, r, now, False)
                    if client is not None and ia < n and arr[ia] <= now:
                        deferred.append(r)
                        continue
                    if shared is not None:
                        self.kick(now)
                        continue
                    b = scheds[r].schedule(now)  # begin(r, now), inlined for a plain next step (most steps)
                    if b is None or b.started or b.preempted or b.first or b.finished or b.gap_s or b.end_s is None:
                        self.idle(r) if b is None else self.started(r, b, now)
                        continue
                    self.steps += 1
                    busy[r] = True
                    busy_s[r] += b.duration_s
                    pending[r] = b
                    self.seq += 1
                    heapq.heappush(heap, (b.end_s, self.seq, 0, r))
                elif not busy[r] and timer_at[r] == now:
                    begin(r, now)
                continue
            now = ta
            if now == float("inf"):  # a closed loop whose users all wait on requests that never finish
                break
            touched = set(deferred)
            deferred.clear()
            while ia < n and arr[ia] == now:  # requests arriving together are queued together (offline)
                rid = ia if client is None else client.arrive(ia)
                if fixed is not None:  # a batcher's group: its replica was chosen when it left the batcher
                    r = fixed[rid]
                elif router == "round_robin":
                    r = ia % replicas
                elif router == "least_loaded":
                    r = min(range(replicas), key=outstanding.__getitem__)
                else:
                    r = 0  # the one shared queue
                queues[r].append(rid)
                outstanding[r] += 1
                touched.add(r)
                ia += 1
            self.arrived = trace.arrived = ia
            if shared is not None or ia == n:
                self.kick(now)
            else:
                for r in sorted(touched):
                    if not busy[r]:
                        begin(r, now)
