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
    if router not in ROUTERS:
        raise OpmapError(f"bad router {router!r}: accepted: {', '.join(ROUTERS)}")
    count(replicas, "--replicas", hi=MAX_REPLICAS)
    service = isinstance(cost, ServiceTime)
    iterative = isinstance(policy, (Continuous, Chunked, Engine))
    decode_only = prefilled_first_s is not None
    if decode_only and not isinstance(policy, Continuous):
        raise OpmapError(f"a decode pool schedules iterations: it needs policy continuous, got {policy.spec()!r}")
    if service and iterative:
        raise OpmapError(f"policy {policy.spec()!r} schedules iterations, which a service time does not have: "
                         "use none, static:B or dynamic:B,WAIT_MS with --service-time")
    n = len(reqs)
    arr = reqs.arrival_s.tolist()
    inp = reqs.input_len.tolist()
    out = reqs.output_len.tolist()
    cap = cost.kv_capacity_tokens
    engine = isinstance(policy, Engine) and not service
    if cap is not None and n and not engine:
        need = int((reqs.input_len + reqs.output_len).max())
        if need > cap:
            raise OpmapError(f"a request needs {need} tokens of KV cache, the device holds {cap}: "
                             "shorten --input-len/--output-len, raise --tp or pick a larger device")
    svc = cost.draw(n, np.random.default_rng([seed, 1])).tolist() if service else None
    nan = float("nan")
    start, first, finish = [nan] * n, [nan] * n, [nan] * n
    where = [0] * n
    itl_g: list[float] = []
    itl_w: list[int] = []
    shared = deque() if router == "shared" else None
    reps = [_Rep(r, shared if shared is not None else deque()) for r in range(replicas)]
    sched = None
    if engine:
        sched = InflightScheduler(policy, cost, inp, out, start, first, finish, where, itl_g, itl_w)
        sched.check()
        for rep in reps:
            rep.eng = sched.replica()
    heap: list[tuple[float, int, int, int]] = []  # (time, seq, kind 0 step end / 1 timer, replica)
    seq = 0
    steps = 0
    batch_size = {NoBatching: 1}.get(type(policy), getattr(policy, "batch", 0))
    wait_s = policy.wait_s if isinstance(policy, Dynamic) else 0.0
    max_seqs = getattr(policy, "max_seqs", 0)
    ia = 0  # next arrival

    def push(t: float, kind: int, r: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, kind, r))

    def fits(rep: _Rep, rid: int) -> bool:
        return cap is None or rep.kv_res + inp[rid] + out[rid] <= cap

    def start_batch(rep: _Rep, now: float) -> None:
        """none / static / dynamic: take up to B queued requests and run them to the end as one step."""
        nonlocal steps
        q = rep.q
        if not q:
            return
        if batch_size > 1 and len(q) < batch_size:
            if isinstance(policy, Static):
                if ia < n:
                    return
            elif now - arr[q[0]] < wait_s - _EPS:
                t = arr[q[0]] + wait_s
                if rep.timer_at != t:
                    rep.timer_at = t
                    push(t, 1, rep.idx)
                return
        batch = []
        res = 0
        while q and len(batch) < batch_size:
            rid = q[0]
            if cap is not None and res + inp[rid] + out[rid] > cap:
                break
            res += inp[rid] + out[rid]
            batch.append(q.popleft())
        b = len(batch)
        steps += 1
        for rid in batch:
            start[rid] = now
            where[rid] = rep.idx
        if service:
            t = now + max(svc[rid] for rid in batch)
            for rid in batch:
                first[rid] = finish[rid] = t
        else:
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
                itl_g.append(d)
                itl_w.append(alive)
                k += 1
                while j < b and outs[j] <= k:
                    done_at.setdefault(outs[j], t)
                    j += 1
                alive = b - j
            for rid in batch:
                finish[rid] = done_at[out[rid]]
        rep.busy = True
        rep.busy_s += t - now
        rep.pending = batch
        push(t, 0, rep.idx)

    def end_batch(rep: _Rep, now: float) -> None:
        rep.outstanding -= len(rep.pending)
        rep.pending = None

    def admit(rep: _Rep, now: float, budget: int, seqs: int) -> list[int]:
        q = rep.q
        got: list[int] = []
        while q and seqs + len(got) < max_seqs:
            rid = q[0]
            if not fits(rep, rid) or (got and inp[rid] > budget):
                break
            budget -= inp[rid]
            rep.kv_res += inp[rid] + out[rid]
            got.append(q.popleft())
            start[rid] = now
            where[rid] = rep.idx
        return got

    def start_iter(rep: _Rep, now: float) -> None:
        """continuous / chunked: form the next iteration at a boundary."""
        nonlocal steps
        if isinstance(policy, Continuous):
            if decode_only:  # the prompts were processed elsewhere: admit by KV cache, then decode at once
                got = admit(rep, now, 1 << 62, rep.n_dec) if rep.q else []
                if got:
                    join_decoders(rep, got, now)
                if not rep.n_dec:
                    return
                got = []
            else:
                got = admit(rep, now, policy.token_budget, rep.n_dec) if rep.q else []
            if got:
                d = cost.prefill_s(sum(inp[r] for r in got), len(got))
                rep.pending = (got, None)
            elif rep.n_dec:
                d = cost.decode_s(rep.n_dec, rep.kv_sum)
                rep.pending = None
            else:
                return
        else:
            budget = policy.chunk - rep.n_dec
            chunks = []
            pt = 0
            for item in rep.prefilling:
                if budget <= 0:
                    break
                take = min(item[1], budget)
                chunks.append((item, take))
                budget -= take
                pt += take
            q = rep.q
            while budget > 0 and q and rep.n_dec + len(rep.prefilling) < max_seqs and fits(rep, q[0]):
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
                return
            d = mixed_s(cost, pt, len(chunks), rep.n_dec, rep.kv_sum)
            rep.pending = (None, chunks)
        steps += 1
        rep.busy = True
        rep.busy_s += d
        push(now + d, 0, rep.idx)

    origin = prefilled_first_s.tolist() if decode_only else None

    def join_decoders(rep: _Rep, rids: list[int], now: float) -> None:
        c = 0
        for rid in rids:
            if origin is not None:  # its first token came out of the prefill pool; its gap starts there
                first[rid] = origin[rid]
                if out[rid] > 1:
                    rep.groups.append((origin[rid], 1))
            else:
                first[rid] = now
            if out[rid] == 1:
                finish[rid] = first[rid]
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

    def decode_done(rep: _Rep, now: float) -> None:
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

    def end_iter(rep: _Rep, now: float) -> None:
        p = rep.pending
        rep.pending = None
        if p is None:
            decode_done(rep, now)
            return
        got, chunks = p
        if got is not None:
            join_decoders(rep, got, now)
            return
        if rep.n_dec:
            decode_done(rep, now)
        done = []
        for item, take in chunks:
            item[1] -= take
            if item[1] <= 0:
                done.append(item[0])
        if done:
            rep.prefilling = [it for it in rep.prefilling if it[1] > 0]
            join_decoders(rep, done, now)

    def start_engine(rep: _Rep, now: float) -> None:
        """engine: the next step of in-flight batching (inflight.py)."""
        nonlocal steps
        d = sched.begin(rep.eng, rep.q, rep.idx, now)
        if d is None:
            return
        steps += 1
        rep.busy = True
        rep.busy_s += d
        push(now + d, 0, rep.idx)

    def end_engine(rep: _Rep, now: float) -> None:
        rep.outstanding -= sched.end(rep.eng, now)

    if engine:
        begin, finish_step = start_engine, end_engine
    else:
        begin, finish_step = (start_iter, end_iter) if iterative else (start_batch, end_batch)

    def kick(now: float) -> None:
        for rep in reps:
            if not rep.busy:
                begin(rep, now)

    while ia < n or heap:
        ta = arr[ia] if ia < n else float("inf")
        if heap and heap[0][0] < ta:
            now, _, kind, r = heapq.heappop(heap)
            rep = reps[r]
            if kind == 0:
                rep.busy = False
                finish_step(rep, now)
                if shared is not None:
                    kick(now)
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
        if shared is not None or ia == n:
            kick(now)
        else:
            for r in sorted(touched):
                if not reps[r].busy:
                    begin(reps[r], now)

    if any(np.isnan(finish)):
        raise OpmapError("simulation ended with unfinished requests (a policy or capacity deadlock): "
                         "report this with the command line")
    return SimResult(reqs.arrival_s, np.asarray(start), np.asarray(first), np.asarray(finish), reqs.input_len,
                     reqs.output_len, np.asarray(where), np.asarray(itl_g, dtype=np.float64),
                     np.asarray(itl_w, dtype=np.float64), policy.to_dict(),
                     cost.to_dict() if hasattr(cost, "to_dict") else {"kind": type(cost).__name__},
                     router, replicas, reqs.arrival, steps, [r.busy_s for r in reps], streams_tokens=not service,
                     extra=sched.extra([r.eng for r in reps]) if sched else {},
                     preemptions=np.asarray(sched.preemptions(n)) if sched else None)
