"""Request-level batching, policies ``none``, ``static:B`` and ``dynamic:B,WAIT_MS``: take up to B queued
requests (1 for none) and run them to the end as one step, a padded batch (finished slots stay held until the
longest is done). static sends a short batch only once every request has arrived; dynamic when the oldest has
waited WAIT_MS. With a KV capacity the batch stops at the first request whose prompt + output no longer fits.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from opmap.serve.request import Batch, Events, Trace

_EPS = 1e-12


class BatchFamily:
    policies = ("none", "static", "dynamic")  # the policy names it schedules (scheduler.REGISTRY)
    iterative = decode_pool = pages_kv = preempts = False

    def __init__(self, policy: Any, cost: Any, trace: Trace) -> None:
        self.cost, self.trace = cost, trace
        self.batch_size = 1 if policy.name == "none" else policy.batch
        self.static = policy.name == "static"
        self.wait_s = policy.wait_s if policy.name == "dynamic" else 0.0
        self.cap = getattr(cost, "kv_capacity_tokens", None)

    def check(self) -> None:
        pass

    def replica(self, idx: int, q: deque) -> BatchReplica:
        return BatchReplica(self, q)

    def extra(self, reps: list[Any], preempted: list[int]) -> None:
        """No figures of its own: it never preempts and reserves the KV in full."""
        return None


class BatchReplica:
    __slots__ = ("f", "q", "wake")

    def __init__(self, family: BatchFamily, q: deque) -> None:
        self.f, self.q, self.wake = family, q, -1.0

    def schedule(self, now: float) -> Batch | None:
        """Up to B queued requests run to their end as one step (see the module docstring)."""
        f, q = self.f, self.q
        if not q:
            return None
        tr, batch_size = f.trace, f.batch_size
        if batch_size > 1 and len(q) < batch_size:
            if f.static:
                if tr.arrived < tr.n:
                    return None
            elif now - tr.arr[q[0]] < f.wait_s - _EPS:
                self.wake = tr.arr[q[0]] + f.wait_s
                return None
        inp, out, cap = tr.inp, tr.out, f.cap
        batch = []
        res = 0
        while q and len(batch) < batch_size:
            rid = q[0]
            if cap is not None and res + inp[rid] + out[rid] > cap:
                break
            res += inp[rid] + out[rid]
            batch.append(q.popleft())
        if tr.svc is not None:
            t = now + max(tr.svc[rid] for rid in batch)
            return Batch(end_s=t, duration_s=t - now, started=batch, state=(None, [(r, t) for r in batch]))
        times, gap_s, gap_w, t = self._run(batch, now)
        return Batch(gap_s=gap_s, gap_w=gap_w, end_s=t, duration_s=t - now, started=batch, state=times)

    def _run(self, batch: list[int], now: float) -> tuple[tuple[list, list], list[float], list[int], float]:
        """A batch's prefill, then its decode steps to its longest output, finished slots still held (a padded
        batch): ((first-token pairs, last-token pairs), the gaps, their token counts, the batch's end)."""
        tr, cost = self.f.trace, self.f.cost
        inp, out = tr.inp, tr.out
        b = len(batch)
        sum_in = sum(inp[rid] for rid in batch)
        t = now + cost.prefill_s(sum_in, b)
        first = [(rid, t) for rid in batch]
        outs = sorted(out[rid] for rid in batch)
        j = 0
        done_at: dict[int, float] = {}
        k = 1
        gap_s: list[float] = []
        gap_w: list[int] = []
        while outs[j] <= k:  # requests with a single token end at the prefill
            j += 1
            done_at.setdefault(outs[j - 1], t)
            if j == b:
                break
        alive = b - j
        while alive:
            d = cost.decode_s(b, sum_in + b * k)  # finished slots stay held (padded batch)
            t += d
            gap_s.append(d)
            gap_w.append(alive)
            k += 1
            while j < b and outs[j] <= k:
                done_at.setdefault(outs[j], t)
                j += 1
            alive = b - j
        return (first, [(rid, done_at[out[rid]]) for rid in batch]), gap_s, gap_w, t

    def on_batch_end(self, batch: Batch, now: float) -> Events:
        first, finished = batch.state
        return Events(first=first if first is not None else finished, finished=finished)
