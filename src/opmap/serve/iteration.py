"""Iteration-level batching, policies ``continuous[:TOKEN_BUDGET]`` (Orca, vLLM v0: a prefill iteration of newly
admitted prompts runs on its own, decodes wait for it) and ``chunked:CHUNK`` (Sarathi-Serve: every iteration
carries the running decodes plus prompt chunks up to CHUNK tokens).

KV cache: a request reserves input_len + output_len tokens when admitted and frees them when it finishes (no
preemption, no paging); admission is first come, first served, a request that does not fit waits at the head of
its queue. Decodes are counted, not visited: their finishes sit in a heap keyed by the decode iteration of their
last token. A decode pool (disagg.py, continuous only) admits requests whose prompt was processed elsewhere:
no prefill step, they join the next decode iteration, their first gap running from their first token.

Speculative decoding (a cost with a ``spec``: opmap.serve.spec_cost): a decode iteration emits 1 to K + 1 tokens
per request, drawn per request per step (opmap.serve.spec.step_tokens, seeded: the same draws as the reference).
Still counted, not visited: a request's steps are known when it joins, so its finish is keyed by the iteration of
its last step, and the tokens it adds to the KV at each of its steps are added ahead into ``grow`` (by iteration),
which each decode iteration reads once. A step's tokens stream together: one inter-token gap for the first, 0 for
the others (added when the request finishes).
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any

import numpy as np

from opmap.serve.cost import mixed_s
from opmap.serve.request import Batch, Events, Trace
from opmap.serve.spec import spec_of


class IterationFamily:
    policies = ("continuous", "chunked")  # the policy names it schedules (scheduler.REGISTRY)
    iterative = True
    pages_kv = preempts = False
    speculates = True  # schedules speculative decoding (a cost with a spec)

    def __init__(self, policy: Any, cost: Any, trace: Trace) -> None:
        self.policy, self.cost, self.trace = policy, cost, trace
        self.continuous = policy.name == "continuous"
        self.decode_pool = self.continuous  # only continuous runs a decode pool
        self.cap = cost.kv_capacity_tokens
        spec = spec_of(cost)
        if spec is not None:
            from opmap.serve.spec import step_tokens

            self.steps: list[np.ndarray] | None = step_tokens(spec, trace.out)  # per request, tokens per step
        else:
            self.steps = None

    def check(self) -> None:
        pass

    def replica(self, idx: int, q: deque) -> IterationReplica:
        return IterationReplica(self, q)

    def extra(self, reps: list[Any], preempted: list[int]) -> None:
        """No figures of its own: it never preempts and reserves the KV in full."""
        return None


class IterationReplica:
    __slots__ = ("f", "q", "wake", "dec", "n_dec", "n_cont", "D", "kv_sum", "kv_res", "groups", "last_dec",
                 "prefilling", "grow")

    def __init__(self, family: IterationFamily, q: deque) -> None:
        self.f, self.q, self.wake = family, q, -1.0
        self.dec: list[tuple[int, int]] = []  # heap of (decode iteration of the last token, request)
        self.n_dec = self.n_cont = self.D = self.kv_sum = self.kv_res = 0
        self.groups: list[tuple[float, int]] = []  # (first-token time, count) of decoders new since the last decode
        self.last_dec = 0.0
        self.prefilling: list[list[int]] = []  # [request, prompt tokens left] (chunked)
        # speculative decoding: KV tokens the running requests add at each decode iteration, by iteration
        self.grow = np.zeros(1024, dtype=np.int64) if family.steps is not None else None

    def _admit(self, budget: int, seqs: int) -> list[int]:
        f, q = self.f, self.q
        inp, out, cap = f.trace.inp, f.trace.out, f.cap
        got: list[int] = []
        max_seqs = f.policy.max_seqs
        while q and seqs + len(got) < max_seqs:
            rid = q[0]
            if (cap is not None and self.kv_res + inp[rid] + out[rid] > cap) or (got and inp[rid] > budget):
                break
            budget -= inp[rid]
            self.kv_res += inp[rid] + out[rid]
            got.append(q.popleft())
        return got

    def schedule(self, now: float) -> Batch | None:
        """The next iteration at a boundary (continuous here, chunked in ``_chunked``)."""
        f = self.f
        if not f.continuous:
            return self._chunked(now)
        ev = Events([], [])
        started: list[int] = []
        if f.trace.origin is not None:  # the prompts were processed elsewhere: admit by KV cache, decode at once
            got = self._admit(1 << 62, self.n_dec) if self.q else []
            if got:
                started = got
                self._join(got, now, ev)
            if not self.n_dec:
                return Batch(ev.first, ev.finished, started=started) if got else None
            got = []
        else:
            got = self._admit(f.policy.token_budget, self.n_dec) if self.q else []
        if got:
            d = f.cost.prefill_s(sum(f.trace.inp[r] for r in got), len(got))
            state = (got, None)
            started = got
        elif self.n_dec:
            d = f.cost.decode_s(self.n_dec, self.kv_sum)
            state = None
        else:
            return None
        return Batch(ev.first, ev.finished, end_s=now + d, duration_s=d, started=started, state=state)

    def _chunked(self, now: float) -> Batch | None:
        """chunked: the running decodes plus prompt chunks up to the chunk's tokens (prompts begun first, then
        new ones admitted)."""
        f, q = self.f, self.q
        inp, out = f.trace.inp, f.trace.out
        budget = f.policy.chunk - self.n_dec
        chunks = []
        pt = 0
        for item in self.prefilling:
            if budget <= 0:
                break
            take = min(item[1], budget)
            chunks.append((item, take))
            budget -= take
            pt += take
        cap, max_seqs = f.cap, f.policy.max_seqs
        started = []
        while (budget > 0 and q and self.n_dec + len(self.prefilling) < max_seqs
               and (cap is None or self.kv_res + inp[q[0]] + out[q[0]] <= cap)):
            rid = q.popleft()
            self.kv_res += inp[rid] + out[rid]
            started.append(rid)
            item = [rid, inp[rid]]
            self.prefilling.append(item)
            take = min(inp[rid], budget)
            chunks.append((item, take))
            budget -= take
            pt += take
        if not chunks and not self.n_dec:
            return None
        d = mixed_s(f.cost, pt, len(chunks), self.n_dec, self.kv_sum)
        return Batch(end_s=now + d, duration_s=d, started=started, state=(None, chunks))

    def _join(self, rids: list[int], now: float, ev: Events) -> None:
        """Requests whose prompt is done join the decodes (or finish, with a single token)."""
        tr = self.f.trace
        inp, out, origin = tr.inp, tr.out, tr.origin
        c = 0
        for rid in rids:
            t = now
            if origin is not None:  # its first token came out of the prefill pool; its gap starts there
                t = origin[rid]
                if out[rid] > 1:
                    self.groups.append((t, 1))
            ev.first.append((rid, t))
            if out[rid] == 1:
                ev.finished.append((rid, t))
                self.kv_res -= inp[rid] + out[rid]
            else:
                steps = self.f.steps[rid] if self.grow is not None else None
                heapq.heappush(self.dec, (self.D + (out[rid] - 1 if steps is None else len(steps)), rid))
                self.kv_sum += inp[rid] + 1
                c += 1
                if steps is not None:
                    self._grow(steps)
        if c:
            self.n_dec += c
            if origin is None:
                self.groups.append((now, c))

    def _grow(self, steps: np.ndarray) -> None:
        """A request joining now adds ``steps[i]`` KV tokens at decode iteration D + 1 + i."""
        a, b = self.D + 1, self.D + 1 + len(steps)
        if b > len(self.grow):
            self.grow = np.concatenate([self.grow, np.zeros(max(b, 2 * len(self.grow)), dtype=np.int64)])
        self.grow[a:b] += steps

    def _decode_done(self, now: float, ev: Events) -> None:
        inp, out = self.f.trace.inp, self.f.trace.out
        self.D += 1
        gs, gw = ev.gap_s, ev.gap_w
        if self.n_cont:
            gs.append(now - self.last_dec)
            gw.append(self.n_cont)
        for tg, c in self.groups:
            gs.append(now - tg)
            gw.append(c)
        self.groups.clear()
        self.last_dec = now
        steps = self.f.steps
        self.kv_sum += self.n_dec if steps is None else int(self.grow[self.D])
        dec, D = self.dec, self.D
        while dec and dec[0][0] <= D:
            rid = heapq.heappop(dec)[1]
            ev.finished.append((rid, now))
            if steps is not None and out[rid] - 1 > len(steps[rid]):  # the tokens after a step's first: gap 0
                gs.append(0.0)
                gw.append(out[rid] - 1 - len(steps[rid]))
            self.n_dec -= 1
            self.kv_sum -= inp[rid] + out[rid]
            self.kv_res -= inp[rid] + out[rid]
        self.n_cont = self.n_dec

    def on_batch_end(self, batch: Batch, now: float) -> Events:
        ev = Events([], [], [], [])
        p = batch.state
        if p is None:
            self._decode_done(now, ev)
            return ev
        got, chunks = p
        if got is not None:
            self._join(got, now, ev)
            return ev
        if self.n_dec:
            self._decode_done(now, ev)
        done = []
        for item, take in chunks:
            item[1] -= take
            if item[1] <= 0:
                done.append(item[0])
        if done:
            self.prefilling = [it for it in self.prefilling if it[1] > 0]
            self._join(done, now, ev)
        return ev
