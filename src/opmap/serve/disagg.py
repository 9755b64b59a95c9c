"""Disaggregated serving (DistServe, Splitwise): P prefill replicas and D decode replicas, each of tp devices.

A request is queued at a prefill replica (the router's choice), prefilled there in iteration-level batches
(the continuous policy's token budget; the prefill pool runs prompts only), and its first token is out when
its prefill step ends. Its KV cache then moves to a decode replica: ``KvTransfer`` prices the move as
latency + prompt tokens x KV bytes per token per device / link bandwidth per device and direction (each of
the tp prefill devices sends its own KV heads to its decode peer, in parallel). The decode pool admits ready
requests at iteration boundaries while their whole KV reservation (prompt + output) fits, and decodes them
with continuous batching; the request's first inter-token gap runs from its first token, so it carries the
transfer and any wait for a decode slot.

Back-pressure (DistServe's pull, vLLM's disaggregated prefill): both pools run in one event loop. A prefilled
request keeps its KV (prompt + first token) on its prefill replica until a decode replica has room for its whole
reservation (prompt + output); only then does its transfer start, and the decode replica holds that reservation
from then until the request finishes. A prefill replica whose KV is full of requests waiting to move admits no
new prompt. Where the decode pool never fills, every transfer starts at its request's first token.

Assumptions, stated in the result: prefilled requests move first come, first served (the head waits for room,
those behind it wait too); the link carries one transfer per request with no contention between transfers;
the decode replica is the least loaded of those with room.
"""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from opmap.errors import OpmapError
from opmap.serve.arrivals import Requests
from opmap.serve.cost import StepCost
from opmap.serve.iteration import IterationFamily
from opmap.serve.policies import Policy
from opmap.serve.request import Batch, Events, Trace
from opmap.serve.run_stats import Disaggregation, KvTransfer, Spread
from opmap.serve.sim import MAX_REPLICAS, SimResult, _check

ASSUMPTIONS = ("prefill holds a request's KV until a decode replica has room for it, then its transfer starts "
               "(back-pressure, first come first served); transfers do not contend for the link; decode replica "
               "picked least-loaded among those with room")
ACCEPTED = "P:D, the prefill and decode replica counts, integers >= 1 (e.g. 1:3)"


def parse_disaggregate(spec: str) -> tuple[int, int]:
    p, sep, d = spec.strip().partition(":")
    if sep and p.strip().isdigit() and d.strip().isdigit() and 1 <= int(p) and 1 <= int(d):
        if int(p) + int(d) > MAX_REPLICAS:
            raise OpmapError(f"--disaggregate {spec!r}: P + D must be at most {MAX_REPLICAS} replicas")
        return int(p), int(d)
    raise OpmapError(f"bad --disaggregate {spec!r}: accepted: {ACCEPTED}")


def kv_transfer_for(hw, bytes_per_token: float, tp: int, replicas: int) -> KvTransfer:
    """The link a KV transfer takes on ``hw``: the scale-up switch (NVLink: half the catalog's bidirectional
    total per direction) when all ``replicas`` x ``tp`` devices sit in one node behind a switch, else the
    scale-out network (the catalog's per-direction NIC rate per device)."""
    per_node = hw.devices_per_node
    in_node = per_node is not None and replicas * tp <= per_node and hw.scale_up_topology == "switch"
    if in_node and hw.scale_up_bandwidth_bytes_per_s:
        return KvTransfer(bytes_per_token, hw.scale_up_bandwidth_bytes_per_s / 2, hw.scale_up_latency_s or 0.0,
                          f"scale-up ({hw.scale_up_topology}, {replicas * tp} of {per_node} devices in one node)")
    if hw.scale_out_bandwidth_bytes_per_s:
        why = (f"{replicas * tp} devices exceed a node of {per_node}" if per_node and replicas * tp > per_node
               else f"the scale-up topology is {hw.scale_up_topology or 'not given'}, not a switch")
        return KvTransfer(bytes_per_token, hw.scale_out_bandwidth_bytes_per_s, hw.scale_out_latency_s or 0.0,
                          f"scale-out network ({why})")
    raise OpmapError(f"{hw.name} lists no scale-out bandwidth and no scale-up switch: a KV transfer between "
                     "prefill and decode replicas cannot be priced")


def simulate_disaggregated(reqs: Requests, policy: Policy, cost: StepCost, prefill_replicas: int,
                           decode_replicas: int, transfer: KvTransfer, router: str = "round_robin",
                           seed: int = 0, decode_cost: StepCost | None = None) -> SimResult:
    """Serve ``reqs`` on a prefill pool priced by ``cost`` and a decode pool priced by ``decode_cost`` (default
    ``cost``), both in one event loop (see the module docstring). ``policy`` must be continuous: its token budget
    bounds a prefill iteration; decode admission is bounded by the KV cache. ``seed`` is unused (no draws)."""
    if policy.name != "continuous":
        raise OpmapError(f"--disaggregate runs iteration-level batching in both pools: use --policy "
                         f"continuous[:TOKEN_BUDGET], got {policy.spec()!r}")
    if router not in ("round_robin", "least_loaded", "shared"):
        raise OpmapError(f"--disaggregate routes to prefill replicas with round_robin or least_loaded, not {router}")
    dcost = cost if decode_cost is None else decode_cost
    n = len(reqs)
    ones = np.ones(n, dtype=reqs.output_len.dtype)
    if reqs.prompt is not None:
        raise OpmapError(f"prompts that share prefixes ({reqs.prompt.source}) are served from the engine policy's "
                         "prefix cache, in one pool: drop --disaggregate")
    _check(Requests(reqs.arrival_s, reqs.input_len, ones, reqs.arrival), policy, IterationFamily(policy, cost, None),
           cost, prefill_replicas, router, False)
    _check(reqs, policy, IterationFamily(policy, dcost, None), dcost, decode_replicas, "least_loaded", True)
    move_s = transfer.seconds(reqs.input_len.astype(np.float64))
    sim = _Pools(reqs, policy, cost, dcost, prefill_replicas, decode_replicas, router, move_s.tolist())
    sim.run()
    if any(np.isnan(sim.finish)):
        raise OpmapError("simulation ended with unfinished requests (a policy or capacity deadlock): "
                         "report this with the command line")
    held_wait = np.asarray(sim.xfer) - np.asarray(sim.first)
    decode_wait = held_wait + np.asarray(sim.dstart) - (np.asarray(sim.xfer) + move_s)
    dis = Disaggregation(prefill_replicas, decode_replicas, transfer, Spread.of(move_s), Spread.of(decode_wait),
                         tuple(sim.busy_s[:prefill_replicas]), tuple(sim.busy_s[prefill_replicas:]), ASSUMPTIONS,
                         dcost.to_dict() if decode_cost is not None else None,
                         # only where back-pressure bound: the default output is unchanged
                         Spread.of(held_wait) if held_wait.size and held_wait.max() > 0 else None)
    return SimResult(reqs.arrival_s, np.asarray(sim.start), np.asarray(sim.first), np.asarray(sim.finish),
                     reqs.input_len, reqs.output_len, np.asarray(sim.where), np.asarray(sim.itl_g, dtype=np.float64),
                     np.asarray(sim.itl_w, dtype=np.float64), policy, cost.to_dict(), router,
                     prefill_replicas + decode_replicas, reqs.arrival, sim.steps, list(sim.busy_s),
                     disaggregation=dis)


class _Pools:
    """One disaggregated simulation: P prefill and D decode iteration schedulers (iteration.py) on one event heap of
    (time, kind, seq, replica or request): kind 0 a transfer lands on its decode replica, 1 a step ends (replicas
    0..P-1 prefill, P..P+D-1 decode). Arrivals are merged in from the sorted arrival times, as in sim.py.

    Back-pressure: a prefilled request keeps its KV (prompt + first token) reserved on its prefill replica in
    ``waiting`` (first come, first served) until a decode replica has room for its whole reservation (prompt +
    output, ``dres``); its transfer starts then and the decode replica's KV is reserved from that moment until the
    request finishes. The decode schedulers admit what has landed without a KV check of their own."""

    def __init__(self, reqs: Requests, policy: Policy, cost: StepCost, dcost: StepCost, P: int, D: int, router: str,
                 move_s: list[float]) -> None:
        self.n = n = len(reqs)
        self.P, self.D, self.router, self.move_s = P, D, router, move_s
        inp, out = reqs.input_len.tolist(), reqs.output_len.tolist()
        self.arr, self.inp, self.out = reqs.arrival_s.tolist(), inp, out
        nan = float("nan")
        self.start, self.first, self.finish, self.xfer, self.dstart = ([nan] * n for _ in range(5))
        self.where = [0] * n
        self.itl_g: list[float] = []
        self.itl_w: list[int] = []
        pfam = IterationFamily(policy, cost, Trace(self.arr, inp, [1] * n))
        dfam = IterationFamily(policy, dcost, Trace(self.arr, inp, out, origin=self.first))
        dfam.cap = None  # the decode KV is reserved here, when a transfer starts (back-pressure)
        self.dcap = dcost.kv_capacity_tokens
        shared = deque() if router == "shared" else None
        self.queues = [shared if shared is not None else deque() for _ in range(P)] + [deque() for _ in range(D)]
        self.scheds = [pfam.replica(r, self.queues[r]) for r in range(P)]
        self.scheds += [dfam.replica(d, self.queues[P + d]) for d in range(D)]
        self.busy = [False] * (P + D)
        self.pending: list[Batch | None] = [None] * (P + D)
        self.outstanding = [0] * (P + D)
        self.busy_s = [0.0] * (P + D)
        self.dres = [0] * D  # decode KV reserved per decode replica (tokens)
        self.waiting: deque[int] = deque()  # prefilled requests holding prefill KV, waiting for decode room
        self.heap: list[tuple[float, int, int, int]] = []
        self.seq = self.steps = 0
        self.shared = shared

    def push(self, t: float, kind: int, x: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, x))

    def begin(self, r: int, now: float) -> None:
        """Ask replica ``r`` for its next step at ``now``; record what forming it did and start it."""
        if self.busy[r]:
            return
        b = self.scheds[r].schedule(now)
        if b is not None:
            self.started(r, b, now)

    def started(self, r: int, b: Batch, now: float) -> None:
        """Record what forming step ``b`` on replica ``r`` did (admissions, a decode pool's one-token finishes),
        and start it (unless it runs nothing)."""
        if b.started:
            if r < self.P:
                for rid in b.started:
                    self.start[rid] = now
                    self.where[rid] = r
            else:
                for rid in b.started:
                    self.dstart[rid] = now
        if b.first or b.finished:
            self.events(b, r, now)
        if b.end_s is None:
            return
        self.steps += 1
        self.busy[r] = True
        self.busy_s[r] += b.duration_s
        self.pending[r] = b
        self.push(b.end_s, 1, r)

    def events(self, ev: Events, r: int, now: float) -> None:
        """A prefill replica's first tokens (the request then holds its KV there, waiting to move) or a decode
        replica's gaps and finishes (its decode KV freed)."""
        if r < self.P:
            for rid, t in ev.first:
                self.first[rid] = t
                self.scheds[r].kv_res += self.inp[rid] + 1  # held (iteration.py frees a one-token request's)
                self.waiting.append(rid)
            return
        if ev.gap_s:
            self.itl_g.extend(ev.gap_s)
            self.itl_w.extend(ev.gap_w)
        for rid, t in ev.finished:
            self.finish[rid] = t
            self.outstanding[r] -= 1
            self.dres[r - self.P] -= self.inp[rid] + self.out[rid]

    def transfers(self, now: float, skip: int = -1) -> None:
        """Start the transfers of the waiting requests, first come first served, while a decode replica has room
        (the least loaded of those that have); a prefill replica whose KV this frees is asked for a step (but
        ``skip``, which the caller asks next)."""
        waiting, P, D, cap, dres, outstanding = self.waiting, self.P, self.D, self.dcap, self.dres, self.outstanding
        if not waiting:
            return
        inp, out, where, heap = self.inp, self.out, self.where, self.heap
        freed = []
        while waiting:
            rid = waiting[0]
            need = inp[rid] + out[rid]
            d = -1
            for e in range(D):  # the least loaded with room (ties: the lowest index)
                if (cap is None or dres[e] + need <= cap) and (d < 0 or outstanding[P + e] < outstanding[P + d]):
                    d = e
            if d < 0:
                break
            waiting.popleft()
            dres[d] += need
            outstanding[P + d] += 1
            p = where[rid]
            self.scheds[p].kv_res -= inp[rid] + 1
            if p != skip and p not in freed:
                freed.append(p)
            self.xfer[rid] = now
            self.seq += 1
            heapq.heappush(heap, (now + self.move_s[rid], 0, self.seq, rid * D + d))
        for p in sorted(freed):
            self.begin(p, now)

    def route(self, now: float, ia: int) -> int:
        """Queue the requests arriving at ``now`` (from ``ia``) on the prefill replicas; start the idle ones."""
        arr, n, P, router, outstanding, queues = self.arr, self.n, self.P, self.router, self.outstanding, self.queues
        touched: list[int] = []
        while ia < n and arr[ia] == now:
            if router == "round_robin":
                r = ia % P
            elif router == "least_loaded":
                r = min(range(P), key=outstanding.__getitem__)
            else:
                r = 0
            queues[r].append(ia)
            outstanding[r] += 1
            if r not in touched:
                touched.append(r)
            ia += 1
        if self.shared is not None or ia == n:
            touched = range(P)
        elif len(touched) > 1:
            touched.sort()
        for r in touched:
            if not self.busy[r]:
                self.begin(r, now)
        return ia

    def land(self, now: float) -> None:
        """Transfers landing at ``now`` join their decode replicas' queues together; the idle ones start."""
        heap, D, touched = self.heap, self.D, []
        while heap and heap[0][0] == now and heap[0][1] == 0:
            x = heapq.heappop(heap)[3]
            r = self.P + x % D
            self.queues[r].append(x // D)
            if r not in touched:
                touched.append(r)
        for r in (touched if len(touched) == 1 else sorted(touched)):
            if not self.busy[r]:
                self.begin(r, now)

    def run(self) -> None:
        """The event loop: the earliest of the next heap event and the next arrival (arrivals first on a tie). A
        step's end is handled inline (most events): its events recorded, transfers started where a request waits
        to move, and the replica's next step formed."""
        arr, n, heap, P, ia, waiting = self.arr, self.n, self.heap, self.P, 0, self.waiting
        scheds, pending, busy, busy_s, outstanding = self.scheds, self.pending, self.busy, self.busy_s, self.outstanding
        itl_g, itl_w, shared = self.itl_g, self.itl_w, self.shared
        while ia < n or heap:
            ta = arr[ia] if ia < n else float("inf")
            if not heap or heap[0][0] >= ta:
                ia = self.route(ta, ia)
                continue
            if heap[0][1] == 0:
                self.land(heap[0][0])
                continue
            now, _, _, r = heapq.heappop(heap)
            b, pending[r] = pending[r], None
            busy[r] = False
            ev = scheds[r].on_batch_end(b, now)
            if r < P:
                if ev.first:
                    outstanding[r] -= len(ev.first)
                    self.events(ev, r, now)
                if shared is not None:
                    if waiting:
                        self.transfers(now)
                    for q in range(P):
                        self.begin(q, now)
                    continue
            else:
                if ev.gap_s:
                    itl_g.extend(ev.gap_s)
                    itl_w.extend(ev.gap_w)
                if ev.finished:
                    self.events(Events(finished=ev.finished), r, now)
            if waiting:  # before the next step: a transfer frees prefill KV, a finish makes decode room
                self.transfers(now, r)
            b = scheds[r].schedule(now)  # begin(r, now), inlined for a plain next step (most steps)
            if b is None:
                continue
            if b.started or b.first or b.finished or b.end_s is None:
                self.started(r, b, now)
                continue
            self.steps += 1
            busy[r] = True
            busy_s[r] += b.duration_s
            pending[r] = b
            self.seq += 1
            heapq.heappush(heap, (b.end_s, 1, self.seq, r))
