"""The reference scheduler: vLLM V1's scheduler loop as written there, one replica, every request held and visited
every step, its blocks in a real block manager (kv_cache.py; prefix caching on where the requests' prompts share
prefixes, ``Requests.prompt``: a request admitted computes only the tokens after its longest cached prefix, at most
``(tokens - 1) // block`` blocks, opmap.serve.prefix; off otherwise: every prompt its own, recompute in full). It
is the oracle the counting scheduler (inflight.py, the fast path that counts decodes instead of visiting them) is
held equal to in tests; far too slow for the fit matrix.

Each step: running decodes in admission order take one token each (a block short: preempt ``running[-1]``, the
most recently admitted, back to the front of the waiting queue), then partial prompts their next chunk, then
(when nothing was preempted, or nothing else runs) the waiting queue, first come first served, under the
step's token budget and max_num_seqs. Priced by ``mixed_s`` as the counting scheduler prices its steps. With
``nomix`` (vLLM V0's default scheduler) the waiting queue goes first: a step of the prompts admitted alone, else
a step of every running decode, admitting nothing.

``reference_continuous``: the same for the continuous policy (iteration.py counts its decodes too): every request
held and visited every iteration; a prefill iteration of the prompts admitted at its start (first come, first
served, under the token budget, max_seqs and the KV cache reserved whole), else a decode iteration of every
running request. With speculative decoding (a cost with a ``spec``), each request emits the tokens drawn for its
step (opmap.serve.spec.step_tokens): one gap for the first, 0 for each other, and its KV grows by all of them.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from opmap.errors import OpmapError
from opmap.serve.arrivals import Requests
from opmap.serve.cost import StepCost, mixed_s
from opmap.serve.kv_cache import KVCacheManager
from opmap.serve.policies import Continuous, Engine
from opmap.serve.prefix import prompt_tokens
from opmap.serve.spec import spec_of


def _tokens(rid: int, start: int, n: int) -> list[int]:
    """Request ``rid``'s own token ids ``start`` .. ``start + n - 1`` (never another request's)."""
    return list(range((rid << 32) + start, (rid << 32) + start + n))


@dataclass
class Reference:
    """Per request: start, first-token and finish times, preemptions, prompt tokens found cached when first
    admitted; every inter-token gap; the tokens found cached when preempted requests were readmitted."""

    start: list[float]
    first: list[float]
    finish: list[float]
    preemptions: list[int]
    gaps: list[float] = field(default_factory=list)
    hit: list[int] = field(default_factory=list)
    rehit: int = 0


class _State:
    def __init__(self, reqs: Requests, pol: Engine, cost: StepCost) -> None:
        n = len(reqs)
        self.arr, self.inp, self.out = reqs.arrival_s.tolist(), reqs.input_len.tolist(), reqs.output_len.tolist()
        self.pol, self.cost = pol, cost
        self.prompt = reqs.prompt
        self.kv = KVCacheManager(int(cost.kv_capacity_tokens) // pol.kv_block, pol.kv_block,
                                 caching=self.prompt is not None)
        self.ptoks: dict[int, list] = {}  # with shared prefixes: a request's prompt tokens, while it is there
        self.comp, self.gen, self.target, self.dec = [0] * n, [0] * n, [0] * n, [False] * n
        self.last = [0.0] * n
        self.res = Reference([math.nan] * n, [math.nan] * n, [math.nan] * n, [0] * n, hit=[0] * n)
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.sched: dict[int, int] = {}
        self.reserved: dict[int, int] = {}  # noevict: the running requests' blocks at their last token

    def tokens(self, r: int, start: int, n: int) -> list:
        """Request ``r``'s tokens ``start`` .. ``start + n - 1``: its own ids, or with shared prefixes its prompt's
        tokens (opmap.serve.prefix) and then its output's, ``("out", r, position)``."""
        if self.prompt is None:
            return _tokens(r, start, n)
        if r not in self.ptoks:
            self.ptoks[r] = prompt_tokens(self.prompt.segments[r])
        p, inp = self.ptoks[r], self.inp[r]
        return p[start:min(start + n, inp)] + [("out", r, k) for k in range(max(start, inp), start + n)]

    def evict(self, v: int) -> None:
        self.kv.free(v)
        self.reserved.pop(v, None)
        self.comp[v] = 0
        self.running.remove(v)
        self.sched.pop(v, None)
        self.dec[v] = False
        self.res.preemptions[v] += 1
        self.waiting.appendleft(v)

    def grow(self, r: int, take: int) -> bool:
        """Blocks for ``r``'s next ``take`` tokens, preempting from the most recent until they fit; False when
        ``r`` itself was preempted. ``budget`` comes back for a preempted decode of this step."""
        while not self.kv.append(r, self.tokens(r, self.comp[r], take)):
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
        if self.pol.no_mix:  # vLLM V0: the waiting prompts first, in a step of their own when any fits
            self.admit(t)
            if self.sched:
                return self.price()
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
        if (not self.evicted or not self.sched) and not self.pol.no_mix:
            self.admit(t)
        return self.price()

    def price(self) -> float:
        """The step's duration: its decodes and prompt tokens priced by ``mixed_s``."""
        dec, comp, sched = self.dec, self.comp, self.sched
        nd = sum(1 for r in sched if dec[r])
        kv = sum(comp[r] + 1 for r in sched if dec[r])
        pt = sum(v for r, v in sched.items() if not dec[r])
        prefix = [(comp[r], v) for r, v in sched.items() if not dec[r] and comp[r]]
        return mixed_s(self.cost, pt, len(sched) - nd, nd, kv, prefix)

    def admit(self, t: float) -> None:
        """New requests, first come first served, under the budget and max_num_seqs, while their first chunk's
        blocks are free (nochunk: the whole prompt, and its recompute, in one step; noevict: also while every
        running request's blocks at its last token, and its own, fit the cache)."""
        B, blocks = self.pol.kv_block, int(self.cost.kv_capacity_tokens) // self.pol.kv_block
        while self.waiting and self.budget > 0 and len(self.running) < self.pol.max_num_seqs:
            r = self.waiting[0]
            tot = self.inp[r] + self.gen[r]
            k = self.kv.lookup(self.tokens(r, 0, tot), (tot - 1) // B) if self.prompt is not None else 0
            hit = k * B  # the longest cached prefix, the last token always computed
            take = min(tot - hit, self.budget) if self.pol.chunked_prefill else tot - hit
            if take > self.budget:
                break
            whole = math.ceil((self.inp[r] + self.out[r] - 1) / B) if self.pol.no_evict else 0
            if whole and sum(self.reserved.values()) + whole > blocks:
                break
            upto = self.inp[r] if self.prompt is not None else None
            if self.pol.no_mix and self.kv.num_free - math.ceil((hit + take) / B) + k < int(0.01 * blocks):
                break  # vLLM V0's block manager: 1% of the blocks kept free at admission (its watermark)
            if not self.kv.allocate(r, self.tokens(r, 0, hit + take), k, upto):
                break
            self.waiting.popleft()
            if whole:
                self.reserved[r] = whole
            if math.isnan(self.res.start[r]):
                self.res.hit[r] = hit
            else:
                self.res.rehit += hit
            self.comp[r], self.target[r] = hit, tot
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
                self.ptoks.pop(r, None)
                self.running.remove(r)
                self.reserved.pop(r, None)


def reference_schedule(reqs: Requests, pol: Engine, cost: StepCost) -> Reference:
    """Run ``reqs`` through one replica under ``pol`` (chunked prefill or not, preemption by recompute or
    GUARANTEED_NO_EVICT admission; a KV capacity is required), every request visited every step."""
    if cost.kv_capacity_tokens is None:
        raise OpmapError("the reference scheduler runs engine on a step cost with a KV capacity")
    s = _State(reqs, pol, cost)

    def step(t: float) -> float:
        t += s.step(t)
        s.close(t)
        return t

    _run(reqs, s.running, s.waiting, step)
    return s.res


def _run(reqs: Requests, running, waiting: deque, step) -> None:
    """The loop every reference shares: arrivals queued up to the step's start, an idle replica waits for the next
    arrival, ``step(t)`` runs one step from ``t`` and returns its end; until every request is done."""
    arr, n, t, ia = reqs.arrival_s.tolist(), len(reqs), 0.0, 0
    while True:
        while ia < n and arr[ia] <= t:
            waiting.append(ia)
            ia += 1
        if not running and not waiting:
            if ia == n:
                return
            t = arr[ia]
            continue
        t = step(t)


def reference_continuous(reqs: Requests, pol: Continuous, cost: StepCost) -> Reference:
    """Run ``reqs`` through one replica under the continuous policy, every request visited every iteration (the
    module docstring): the oracle iteration.py's counted decodes are held equal to."""
    inp, out = reqs.input_len.tolist(), reqs.output_len.tolist()
    n, cap = len(reqs), cost.kv_capacity_tokens
    res = Reference([math.nan] * n, [math.nan] * n, [math.nan] * n, [0] * n)
    gen, last, done = [0] * n, [0.0] * n, [0] * n  # done: speculative steps taken
    spec = spec_of(cost)
    if spec is not None:
        from opmap.serve.spec import step_tokens

        steps = [s.tolist() for s in step_tokens(spec, out)]
    waiting: deque[int] = deque()
    running: list[int] = []  # decoding, in admission order

    def step(t: float) -> float:
        got, budget = [], pol.token_budget
        while waiting and len(running) + len(got) < pol.max_seqs:
            r = waiting[0]
            held = sum(inp[x] + out[x] for x in running + got)  # the KV reserved whole, prompt + output
            if (cap is not None and held + inp[r] + out[r] > cap) or (got and inp[r] > budget):
                break
            budget -= inp[r]
            got.append(waiting.popleft())
        if got:
            end = t + cost.prefill_s(sum(inp[r] for r in got), len(got))
            for r in got:
                res.start[r] = t
                res.first[r] = last[r] = end
                gen[r] = 1
                if out[r] == 1:
                    res.finish[r] = end
                else:
                    running.append(r)
            return end
        end = t + cost.decode_s(len(running), sum(inp[r] + gen[r] for r in running))
        for r in list(running):
            a = 1 if spec is None else steps[r][done[r]]
            done[r] += 1
            gen[r] += a
            res.gaps.append(end - last[r])
            res.gaps.extend([0.0] * (a - 1))
            last[r] = end
            if gen[r] == out[r]:
                res.finish[r] = end
                running.remove(r)
        return end

    _run(reqs, running, waiting, step)
    return res
