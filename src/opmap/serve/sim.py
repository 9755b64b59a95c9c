"""The discrete-event serving simulator: one heap of step-end and timer events, requests merged in from the
sorted arrival times, R replicas behind a router.

Routers: ``round_robin`` (request i to replica i mod R), ``least_loaded`` (join the shortest queue: the
replica with the fewest outstanding requests, queued or running; ties to the lowest index), ``shared`` (one
queue for all replicas: an M/M/c system with policy none).

Time of a request: ``start_s`` when it is first scheduled (its queueing ends), ``first_s`` when its first
token is out (end of the step that finishes its prompt), ``finish_s`` when its last token is out. Tokens
stream: each request's tokens come at the end of the iteration that produced them.

KV cache (policies continuous and chunked): a request reserves input_len + output_len tokens when admitted and
frees them when it finishes (no preemption, no paging). Admission is first come, first served; a request that
does not fit waits at the head of its queue. Policy ``engine`` pages the KV cache in blocks allocated as tokens
are produced and preempts by recompute when they run out, as vLLM does (inflight.py).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opmap.errors import OpmapError
from opmap.serve.arrivals import Requests
from opmap.serve.cost import ServiceTime, StepCost, mixed_s
from opmap.serve.inflight import InflightScheduler
from opmap.serve.policies import Chunked, Continuous, Dynamic, Engine, NoBatching, Policy, Static
from opmap.validate import count

# The most replicas one simulation runs: 10k, a fleet beyond any one deployment a capacity plan is made for; the
# routers look at every replica per request, so time grows as requests x replicas (10M replicas: minutes, not
# seconds).
MAX_REPLICAS = 10_000

ROUTERS = ("round_robin", "least_loaded", "shared")
_EPS = 1e-12


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
    policy: dict[str, Any]
    cost: dict[str, Any]
    router: str
    replicas: int
    arrival: str
    steps: int
    busy_s: list[float]
    streams_tokens: bool = True  # False with a service time: a request is one unit of work, no tokens
    extra: dict[str, Any] = field(default_factory=dict)
    preemptions: np.ndarray | None = None  # per request, how often it was preempted (policy engine)


class _Rep:
    __slots__ = ("idx", "q", "busy", "timer_at", "outstanding", "busy_s", "pending",
                 "dec", "n_dec", "n_cont", "D", "kv_sum", "kv_res", "groups", "last_dec", "prefilling", "eng")

    def __init__(self, idx: int, q: deque) -> None:
        self.idx, self.q = idx, q
        self.busy, self.timer_at, self.outstanding, self.busy_s, self.pending = False, -1.0, 0, 0.0, None
        self.dec: list[tuple[int, int]] = []  # heap of (decode iteration of the last token, request)
        self.n_dec = self.n_cont = self.D = self.kv_sum = self.kv_res = 0
        self.groups: list[tuple[float, int]] = []  # (first-token time, count) of decoders new since the last decode
        self.last_dec = 0.0
        self.prefilling: list[list[int]] = []  # [request, prompt tokens left] (chunked)
        self.eng = None  # the engine policy's state (inflight.EngineReplica)


def simulate(reqs: Requests, policy: Policy, cost: StepCost | ServiceTime, replicas: int = 1,
             router: str = "round_robin", seed: int = 0, prefilled_first_s: np.ndarray | None = None) -> SimResult:
    """Run ``reqs`` through ``replicas`` servers under ``policy``, each step priced by ``cost`` (or each
    request served for a drawn ``ServiceTime``, from ``np.random.default_rng([seed, 1])``).

    ``prefilled_first_s`` (a decode pool, see disagg.py): every request arrives with its prompt already
    processed elsewhere and its first token out at ``prefilled_first_s[i]``; admission (continuous policy
    only, KV cache permitting) costs no prefill step, the request joins the next decode iteration, and its
    first inter-token gap runs from ``prefilled_first_s[i]``."""
    _check(reqs, policy, cost, replicas, router, prefilled_first_s is not None)
    sim = _Sim(reqs, policy, cost, replicas, router, seed, prefilled_first_s)
    sim.run()
    if any(np.isnan(sim.finish)):
        raise OpmapError("simulation ended with unfinished requests (a policy or capacity deadlock): "
                         "report this with the command line")
    sched, reps, n = sim.sched, sim.reps, sim.n
    return SimResult(reqs.arrival_s, np.asarray(sim.start), np.asarray(sim.first), np.asarray(sim.finish),
                     reqs.input_len, reqs.output_len, np.asarray(sim.where), np.asarray(sim.itl_g, dtype=np.float64),
                     np.asarray(sim.itl_w, dtype=np.float64), policy.to_dict(),
                     cost.to_dict() if hasattr(cost, "to_dict") else {"kind": type(cost).__name__},
                     router, replicas, reqs.arrival, sim.steps, [r.busy_s for r in reps],
                     streams_tokens=not sim.service, extra=sched.extra([r.eng for r in reps]) if sched else {},
                     preemptions=np.asarray(sched.preemptions(n)) if sched else None)


def _check(reqs: Requests, policy: Policy, cost: StepCost | ServiceTime, replicas: int, router: str,
           decode_only: bool) -> None:
    """The router, the replicas, the policy against the cost (iterations need a step cost) and every request's KV
    cache against the device's (the engine policy pages it: checked by its scheduler)."""
    if router not in ROUTERS:
        raise OpmapError(f"bad router {router!r}: accepted: {', '.join(ROUTERS)}")
    count(replicas, "--replicas", hi=MAX_REPLICAS)
    service = isinstance(cost, ServiceTime)
    iterative = isinstance(policy, (Continuous, Chunked, Engine))
    if decode_only and not isinstance(policy, Continuous):
        raise OpmapError(f"a decode pool schedules iterations: it needs policy continuous, got {policy.spec()!r}")
    if service and iterative:
        raise OpmapError(f"policy {policy.spec()!r} schedules iterations, which a service time does not have: "
                         "use none, static:B or dynamic:B,WAIT_MS with --service-time")
    cap = cost.kv_capacity_tokens
    engine = isinstance(policy, Engine) and not service
    if cap is not None and len(reqs) and not engine:
        need = int((reqs.input_len + reqs.output_len).max())
        if need > cap:
            raise OpmapError(f"a request needs {need} tokens of KV cache, the device holds {cap}: "
                             "shorten --input-len/--output-len, raise --tp or pick a larger device")


class _Sim:
    """One simulation (``simulate``): the requests' times as lists, the replicas, the event heap, and a pair of
    step handlers per policy family: ``begin`` forms a replica's next step at a boundary, ``end_step`` books it
    when its end event fires. none / static / dynamic run a batch to its end as one step (start_batch); continuous
    and chunked form iterations (start_iter / end_iter); engine asks the in-flight scheduler (inflight.py)."""

    def __init__(self, reqs: Requests, policy: Policy, cost: StepCost | ServiceTime, replicas: int, router: str,
                 seed: int, prefilled_first_s: np.ndarray | None) -> None:
        self.policy, self.cost, self.router, self.replicas = policy, cost, router, replicas
        self.service = service = isinstance(cost, ServiceTime)
        self.decode_only = prefilled_first_s is not None
        self.n = n = len(reqs)
        self.arr, self.inp, self.out = reqs.arrival_s.tolist(), reqs.input_len.tolist(), reqs.output_len.tolist()
        self.cap = cost.kv_capacity_tokens
        self.engine = engine = isinstance(policy, Engine) and not service
        self.svc = cost.draw(n, np.random.default_rng([seed, 1])).tolist() if service else None
        nan = float("nan")
        self.start, self.first, self.finish = [nan] * n, [nan] * n, [nan] * n
        self.where = [0] * n
        self.itl_g: list[float] = []
        self.itl_w: list[int] = []
        self.shared = shared = deque() if router == "shared" else None
        self.reps = [_Rep(r, shared if shared is not None else deque()) for r in range(replicas)]
        self.sched = None
        if engine:
            self.sched = InflightScheduler(policy, cost, self.inp, self.out, self.start, self.first, self.finish,
                                           self.where, self.itl_g, self.itl_w)
            self.sched.check()
            for rep in self.reps:
                rep.eng = self.sched.replica()
        self.heap: list[tuple[float, int, int, int]] = []  # (time, seq, kind 0 step end / 1 timer, replica)
        self.seq = 0
        self.steps = 0
        self.batch_size = {NoBatching: 1}.get(type(policy), getattr(policy, "batch", 0))
        self.wait_s = policy.wait_s if isinstance(policy, Dynamic) else 0.0
        self.max_seqs = getattr(policy, "max_seqs", 0)
        self.ia = 0  # next arrival
        self.origin = prefilled_first_s.tolist() if self.decode_only else None
        self.continuous = isinstance(policy, Continuous)
        if engine:
            self.begin, self.end_step = self.start_engine, self.end_engine
        elif isinstance(policy, (Continuous, Chunked, Engine)):
            self.begin, self.end_step = self.start_iter, self.end_iter
        else:
            self.begin, self.end_step = self.start_batch, self.end_batch

    def push(self, t: float, kind: int, r: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, r))

    def start_batch(self, rep: _Rep, now: float) -> None:
        """none / static / dynamic: take up to B queued requests and run them to the end as one step."""
        q, arr, inp, out, cap = rep.q, self.arr, self.inp, self.out, self.cap
        batch_size = self.batch_size
        if not q:
            return
        if batch_size > 1 and len(q) < batch_size:
            if isinstance(self.policy, Static):
                if self.ia < self.n:
                    return
            elif now - arr[q[0]] < self.wait_s - _EPS:
                t = arr[q[0]] + self.wait_s
                if rep.timer_at != t:
                    rep.timer_at = t
                    self.push(t, 1, rep.idx)
                return
        batch = []
        res = 0
        while q and len(batch) < batch_size:
            rid = q[0]
            if cap is not None and res + inp[rid] + out[rid] > cap:
                break
            res += inp[rid] + out[rid]
            batch.append(q.popleft())
        self.steps += 1
        for rid in batch:
            self.start[rid] = now
            self.where[rid] = rep.idx
        if self.service:
            t = now + max(self.svc[rid] for rid in batch)
            for rid in batch:
                self.first[rid] = self.finish[rid] = t
        else:
            t = self._run_batch(batch, now)
        rep.busy = True
        rep.busy_s += t - now
        rep.pending = batch
        self.push(t, 0, rep.idx)

    def _run_batch(self, batch: list[int], now: float) -> float:
        """A batch's prefill, then its decode steps to its longest output, finished slots still held (a padded
        batch): each request's first and last token times set; returns the batch's end."""
        inp, out, cost, first = self.inp, self.out, self.cost, self.first
        b = len(batch)
        sum_in = sum(inp[rid] for rid in batch)
        t = now + cost.prefill_s(sum_in, b)
        for rid in batch:
            first[rid] = t
        outs = sorted(out[rid] for rid in batch)
        alive, j = b, 0
        done_at: dict[int, float] = {}
        k = 1
        while outs[j] <= k:  # requests with a single token end at the prefill
            j += 1
            done_at.setdefault(outs[j - 1], t)
            if j == b:
                break
        alive = b - j
        while alive:
            d = cost.decode_s(b, sum_in + b * k)  # finished slots stay held (padded batch)
            t += d
            self.itl_g.append(d)
            self.itl_w.append(alive)
            k += 1
            while j < b and outs[j] <= k:
                done_at.setdefault(outs[j], t)
                j += 1
            alive = b - j
        for rid in batch:
            self.finish[rid] = done_at[out[rid]]
        return t

    def end_batch(self, rep: _Rep, now: float) -> None:
        rep.outstanding -= len(rep.pending)
        rep.pending = None

    def admit(self, rep: _Rep, now: float, budget: int, seqs: int) -> list[int]:
        q, inp, out, cap, start, where = rep.q, self.inp, self.out, self.cap, self.start, self.where
        got: list[int] = []
        max_seqs = self.max_seqs
        while q and seqs + len(got) < max_seqs:
            rid = q[0]
            if (cap is not None and rep.kv_res + inp[rid] + out[rid] > cap) or (got and inp[rid] > budget):
                break
            budget -= inp[rid]
            rep.kv_res += inp[rid] + out[rid]
            got.append(q.popleft())
            start[rid] = now
            where[rid] = rep.idx
        return got

    def start_iter(self, rep: _Rep, now: float) -> None:
        """continuous / chunked: form the next iteration at a boundary."""
        policy, cost = self.policy, self.cost
        if self.continuous:
            if self.decode_only:  # the prompts were processed elsewhere: admit by KV cache, then decode at once
                got = self.admit(rep, now, 1 << 62, rep.n_dec) if rep.q else []
                if got:
                    self.join_decoders(rep, got, now)
                if not rep.n_dec:
                    return
                got = []
            else:
                got = self.admit(rep, now, policy.token_budget, rep.n_dec) if rep.q else []
            if got:
                d = cost.prefill_s(sum(self.inp[r] for r in got), len(got))
                rep.pending = (got, None)
            elif rep.n_dec:
                d = cost.decode_s(rep.n_dec, rep.kv_sum)
                rep.pending = None
            else:
                return
        else:
            d = self._chunked_step(rep, now)
            if d is None:
                return
        self.steps += 1
        rep.busy = True
        rep.busy_s += d
        self.seq += 1
        heapq.heappush(self.heap, (now + d, self.seq, 0, rep.idx))

    def _chunked_step(self, rep: _Rep, now: float) -> float | None:
        """chunked: the running decodes plus prompt chunks up to the chunk's tokens (prompts begun first, then
        new ones admitted); the step's time, None when there is nothing to run."""
        inp, out = self.inp, self.out
        budget = self.policy.chunk - rep.n_dec
        chunks = []
        pt = 0
        for item in rep.prefilling:
            if budget <= 0:
                break
            take = min(item[1], budget)
            chunks.append((item, take))
            budget -= take
            pt += take
        q, cap, max_seqs, start, where = rep.q, self.cap, self.max_seqs, self.start, self.where
        while (budget > 0 and q and rep.n_dec + len(rep.prefilling) < max_seqs
               and (cap is None or rep.kv_res + inp[q[0]] + out[q[0]] <= cap)):
            rid = q.popleft()
            rep.kv_res += inp[rid] + out[rid]
            start[rid] = now
            where[rid] = rep.idx
            item = [rid, inp[rid]]
            rep.prefilling.append(item)
            take = min(inp[rid], budget)
            chunks.append((item, take))
            budget -= take
            pt += take
        if not chunks and not rep.n_dec:
            return None
        rep.pending = (None, chunks)
        return mixed_s(self.cost, pt, len(chunks), rep.n_dec, rep.kv_sum)

    def join_decoders(self, rep: _Rep, rids: list[int], now: float) -> None:
        inp, out, first, origin = self.inp, self.out, self.first, self.origin
        c = 0
        for rid in rids:
            if origin is not None:  # its first token came out of the prefill pool; its gap starts there
                first[rid] = origin[rid]
                if out[rid] > 1:
                    rep.groups.append((origin[rid], 1))
            else:
                first[rid] = now
            if out[rid] == 1:
                self.finish[rid] = first[rid]
                rep.kv_res -= inp[rid] + out[rid]
                rep.outstanding -= 1
            else:
                heapq.heappush(rep.dec, (rep.D + out[rid] - 1, rid))
                rep.kv_sum += inp[rid] + 1
                c += 1
        if c:
            rep.n_dec += c
            if origin is None:
                rep.groups.append((now, c))

    def decode_done(self, rep: _Rep, now: float) -> None:
        inp, out, itl_g, itl_w, finish = self.inp, self.out, self.itl_g, self.itl_w, self.finish
        rep.D += 1
        if rep.n_cont:
            itl_g.append(now - rep.last_dec)
            itl_w.append(rep.n_cont)
        for tg, c in rep.groups:
            itl_g.append(now - tg)
            itl_w.append(c)
        rep.groups.clear()
        rep.last_dec = now
        rep.kv_sum += rep.n_dec
        dec, D = rep.dec, rep.D
        while dec and dec[0][0] <= D:
            rid = heapq.heappop(dec)[1]
            finish[rid] = now
            rep.n_dec -= 1
            rep.kv_sum -= inp[rid] + out[rid]
            rep.kv_res -= inp[rid] + out[rid]
            rep.outstanding -= 1
        rep.n_cont = rep.n_dec

    def end_iter(self, rep: _Rep, now: float) -> None:
        p = rep.pending
        rep.pending = None
        if p is None:
            self.decode_done(rep, now)
            return
        got, chunks = p
        if got is not None:
            self.join_decoders(rep, got, now)
            return
        if rep.n_dec:
            self.decode_done(rep, now)
        done = []
        for item, take in chunks:
            item[1] -= take
            if item[1] <= 0:
                done.append(item[0])
        if done:
            rep.prefilling = [it for it in rep.prefilling if it[1] > 0]
            self.join_decoders(rep, done, now)

    def start_engine(self, rep: _Rep, now: float) -> None:
        """engine: the next step of in-flight batching (inflight.py)."""
        d = self.sched.begin(rep.eng, rep.q, rep.idx, now)
        if d is None:
            return
        self.steps += 1
        rep.busy = True
        rep.busy_s += d
        self.push(now + d, 0, rep.idx)

    def end_engine(self, rep: _Rep, now: float) -> None:
        rep.outstanding -= self.sched.end(rep.eng, now)

    def kick(self, now: float) -> None:
        for rep in self.reps:
            if not rep.busy:
                self.begin(rep, now)

    def run(self) -> None:
        """The event loop: the earliest of the next step end or timer (the heap) and the next arrival. Arrivals
        are routed as they come (requests arriving together are queued together: offline), then the replicas
        they reached start a step if idle (all of them with one shared queue, or once the last request is in)."""
        arr, n, reps, heap, router, replicas = self.arr, self.n, self.reps, self.heap, self.router, self.replicas
        shared, begin, end_step = self.shared, self.begin, self.end_step
        while self.ia < n or heap:
            ia = self.ia
            ta = arr[ia] if ia < n else float("inf")
            if heap and heap[0][0] < ta:
                now, _, kind, r = heapq.heappop(heap)
                rep = reps[r]
                if kind == 0:
                    rep.busy = False
                    end_step(rep, now)
                    if shared is not None:
                        self.kick(now)
                    else:
                        begin(rep, now)
                elif not rep.busy and rep.timer_at == now:
                    begin(rep, now)
                continue
            now = ta
            touched = set()
            while ia < n and arr[ia] == now:  # requests arriving together are queued together (offline)
                if router == "round_robin":
                    rep = reps[ia % replicas]
                elif router == "least_loaded":
                    rep = min(reps, key=lambda x: x.outstanding)
                else:
                    rep = reps[0]  # the one shared queue
                rep.q.append(ia)
                rep.outstanding += 1
                touched.add(rep.idx)
                ia += 1
            self.ia = ia
            if shared is not None or ia == n:
                self.kick(now)
            else:
                for r in sorted(touched):
                    if not reps[r].busy:
                        begin(reps[r], now)
