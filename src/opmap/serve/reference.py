"""The reference scheduler: vLLM V1's scheduler loop as written there, one replica, every request held and visited
every step, its blocks in a real block manager (kv_cache.py, prefix caching off: the counting scheduler models
recompute in full). It is the oracle the counting scheduler (inflight.py, the fast path that counts decodes
instead of visiting them) is held equal to in tests; far too slow for the fit matrix.

Each step: running decodes in admission order take one token each (a block short: preempt ``running[-1]``, the
most recently admitted, back to the front of the waiting queue), then partial prompts their next chunk, then
(when nothing was preempted, or nothing else runs) the waiting queue, first come first served, under the
step's token budget and max_num_seqs. Priced by ``mixed_s`` as the counting scheduler prices its steps.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from opmap.errors import OpmapError
from opmap.serve.arrivals import Requests
from opmap.serve.cost import StepCost, mixed_s
from opmap.serve.kv_cache import KVCacheManager
from opmap.serve.policies import Engine


def _tokens(rid: int, start: int, n: int) -> list[int]:
    """Request ``rid``'s own token ids ``start`` .. ``start + n - 1`` (never another request's)."""
    return list(range((rid << 32) + start, (rid << 32) + start + n))


@dataclass
class Reference:
    """Per request: start, first-token and finish times, preemptions; every inter-token gap."""

    start: list[float]
    first: list[float]
    finish: list[float]
    preemptions: list[int]
    gaps: list[float] = field(default_factory=list)


class _State:
    def __init__(self, reqs: Requests, pol: Engine, cost: StepCost) -> None:
        n = len(reqs)
        self.arr, self.inp, self.out = reqs.arrival_s.tolist(), reqs.input_len.tolist(), reqs.output_len.tolist()
        self.pol, self.cost = pol, cost
        self.kv = KVCacheManager(int(cost.kv_capacity_tokens) // pol.kv_block, pol.kv_block, caching=False)
        self.comp, self.gen, self.target, self.dec = [0] * n, [0] * n, [0] * n, [False] * n
        self.last = [0.0] * n
        self.res = Reference([math.nan] * n, [math.nan] * n, [math.nan] * n, [0] * n)
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.sched: dict[int, int] = {}

    def evict(self, v: int) -> None:
        self.kv.free(v)
        self.comp[v] = 0
        self.running.remove(v)
        self.sched.pop(v, None)
        self.dec[v] = False
        self.res.preemptions[v] += 1
        self.waiting.appendleft(v)

    def grow(self, r: int, take: int) -> bool:
        """Blocks for ``r``'s next ``take`` tokens, preempting from the most recent until they fit; False when
        ``r`` itself was preempted. ``budget`` comes back for a preempted decode of this step."""
        while not self.kv.append(r, _tokens(r, self.comp[r], take)):
            v = self.running[-1]
            if v in self.sched and self.dec[v]:
                self.budget += 1
            self.evict(v)
            self.evicted = True
            if v == r:
                return False
        return True

    def step(self, t: float) -> float:
        """Form and price one step at ``t``; returns its duration."""
        self.sched, self.evicted, self.budget = {}, False, self.pol.max_num_batched_tokens
        for r in [r for r in self.running if self.dec[r]]:
            if r in self.running and self.grow(r, 1):
                self.sched[r] = 1
                self.budget -= 1
        for r in [r for r in self.running if not self.dec[r]]:
            if r not in self.running:
                continue
            if self.budget <= 0:
                break
            take = min(self.target[r] - self.comp[r], self.budget)
            if not self.grow(r, take):
                break
            self.sched[r] = take
            self.budget -= take
        if not self.evicted or not self.sched:
            self.admit(t)
        dec, comp, sched = self.dec, self.comp, self.sched
        nd = sum(1 for r in sched if dec[r])
        kv = sum(comp[r] + 1 for r in sched if dec[r])
        pt = sum(v for r, v in sched.items() if not dec[r])
        prefix = [(comp[r], v) for r, v in sched.items() if not dec[r] and comp[r]]
        return mixed_s(self.cost, pt, len(sched) - nd, nd, kv, prefix)

    def admit(self, t: float) -> None:
        while self.waiting and self.budget > 0 and len(self.running) < self.pol.max_num_seqs:
            r = self.waiting[0]
            tot = self.inp[r] + self.gen[r]
            take = min(tot, self.budget)
            if not self.kv.allocate(r, _tokens(r, 0, take)):
                break
            self.waiting.popleft()
            self.comp[r], self.target[r] = 0, tot
            self.running.append(r)
            if math.isnan(self.res.start[r]):
                self.res.start[r] = t
            self.sched[r] = take
            self.budget -= take

    def close(self, t: float) -> None:
        """The step ending at ``t``: tokens out, finished requests' blocks freed."""
        res = self.res
        for r, take in self.sched.items():
            self.comp[r] += take
            if self.comp[r] < self.target[r] and not self.dec[r]:
                continue
            self.gen[r] += 1
            if self.gen[r] == 1:
                res.first[r] = t
            else:
                res.gaps.append(t - self.last[r])
            self.last[r] = t
            self.dec[r] = True
            if self.gen[r] == self.out[r]:
                res.finish[r] = t
                self.kv.free(r)
                self.running.remove(r)


def reference_schedule(reqs: Requests, pol: Engine, cost: StepCost) -> Reference:
    """Run ``reqs`` through one replica under ``pol`` (chunked prefill, preemption by recompute; a KV capacity
    is required), every request visited every step."""
    if not pol.chunked_prefill or pol.no_evict or cost.kv_capacity_tokens is None:
        raise OpmapError("the reference scheduler runs engine with chunked prefill and preemption (not nochunk or "
                         "noevict) on a step cost with a KV capacity")
    s = _State(reqs, pol, cost)
    n, t, ia = len(reqs), 0.0, 0
    while True:
        while ia < n and s.arr[ia] <= t:
            s.waiting.append(ia)
            ia += 1
        if not s.running and not s.waiting:
            if ia == n:
                return s.res
            t = s.arr[ia]
            continue
        t += s.step(t)
        s.close(t)
