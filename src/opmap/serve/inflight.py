"""In-flight batching as production engines schedule it (policy ``engine``): vLLM V1's scheduler, which
TensorRT-LLM's in-flight batching follows in the same terms (max_num_seqs, max_num_tokens, paged KV).

Each step, on each replica:

1. every running decode gets one token (the budget always holds them: max_num_batched_tokens >= max_num_seqs);
2. the rest of the ``max_num_batched_tokens`` budget goes to prompt chunks: prompts already partly prefilled
   first (in admission order), then new requests from the head of the queue, first come first served, while
   fewer than ``max_num_seqs`` requests run (chunked prefill; without it a prompt waits until it fits whole);
3. the step is priced by ``mixed_s`` (cost.py): the weights read once for all its tokens, plus the decodes'
   KV reads, plus the attention of a chunk that continues a prompt to that prompt's earlier chunks.

Paged KV (vLLM's PagedAttention): the replica's ``kv_capacity_tokens`` is ``floor(capacity / kv_block)``
blocks. A step that computes a request's KV up to ``t`` tokens needs ``ceil(t / kv_block)`` blocks, taken
when the step is scheduled: the step that emits a request's k-th output token computes the KV of its prompt
plus the k - 1 tokens fed back, so a request of P prompt and O output tokens holds at most P + O - 1 tokens'
blocks (never a reservation of the whole P + O up front). Blocks are freed when the request finishes.

Preemption by recompute (vLLM's default): when the running decodes (or a prompt chunk already running) need
blocks that are not free, the most recently admitted running request is evicted, its blocks freed, and it goes
back to the front of the waiting queue (several evicted in one step: the earliest admitted first). Re-admitted,
it prefills its prompt plus the tokens it already emitted (they stay emitted), and the step ending that
recompute emits its next token: the gap since its previous token is one inter-token gap. A step that
preempted admits no new request (as vLLM V1). A request waiting at the head of the queue whose first chunk's
blocks are not free waits (new requests never preempt).

The work per step is independent of the number of running requests: decodes are counted, not visited (a
decode needs a new block when its KV length is a multiple of the block size, so the decoders are counted by
the residue of their join step; their finishes sit in a heap keyed by the step count at which they end).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Any

from opmap.errors import OpmapError
from opmap.serve.cost import StepCost, mixed_s
from opmap.serve.policies import Engine

_UNLIMITED = 1 << 62  # blocks of a KV cache without a capacity (kv_capacity_tokens None)
WAITING, PREFILLING, DECODING, DONE = 0, 1, 2, 3


class EngineReplica:
    """The engine state of one replica: free KV blocks, the decodes (counted), the prompts being prefilled."""

    __slots__ = ("free", "D", "n_dec", "kv_sum", "cnt", "fin", "prefilling", "stack", "running", "last_end",
                 "pending", "min_free")

    def __init__(self, blocks: int, kv_block: int) -> None:
        self.free = blocks  # KV blocks not held by any request
        self.D = 0  # steps so far that carried decodes
        self.n_dec = 0  # running decodes
        self.kv_sum = 0  # KV tokens the running decodes attend to in the next step (their KV + the new token)
        self.cnt = [0] * kv_block  # decodes by the residue (mod kv_block) of the decode steps that need a block
        self.fin: list[tuple[int, int, int]] = []  # heap of (decode step of the last token, epoch, request)
        self.prefilling: list[int] = []  # requests admitted whose (re)prefill is not done, in admission order
        self.stack: list[tuple[int, int]] = []  # (request, epoch) in admission order: the victims from its top
        self.running = 0  # decodes + prefilling
        self.last_end = 0.0  # when the last step ended: every running decode's last token came then
        self.pending: Any = None
        self.min_free = blocks  # the fewest blocks free at any step: the peak use is blocks - min_free


class InflightScheduler:
    """Schedules and prices the steps of ``policy`` (an Engine) over ``cost``, writing each request's times into
    the simulator's lists (``start``, ``first``, ``finish``, ``where``) and the inter-token gaps into
    ``itl_g`` / ``itl_w`` (gap s, tokens)."""

    def __init__(self, policy: Engine, cost: StepCost, inp: list[int], out: list[int], start: list[float],
                 first: list[float], finish: list[float], where: list[int], itl_g: list[float],
                 itl_w: list[float]) -> None:
        self.p, self.cost = policy, cost
        self.B = policy.kv_block
        cap = cost.kv_capacity_tokens
        self.blocks = _UNLIMITED if cap is None else int(cap) // self.B
        self.inp, self.out = inp, out
        self.start, self.first, self.finish, self.where = start, first, finish, where
        self.itl_g, self.itl_w = itl_g, itl_w
        n = len(inp)
        self.state = [WAITING] * n
        self.epoch = [0] * n  # bumped at every admission: older heap and stack entries are stale
        self.gen = [0] * n  # tokens emitted (for a decode: at its join, see g0 below)
        self.done = [0] * n  # KV tokens computed in the current (re)prefill
        self.target = [0] * n  # tokens the current (re)prefill computes: prompt + tokens already emitted
        self.h0 = [0] * n  # KV tokens at the join to the decodes
        self.j0 = [0] * n  # the replica's decode step count at the join
        self.res = [0] * n  # the residue of the decode steps at which this decode needs a new block
        self.last_tok = [0.0] * n  # when its last token came (kept for preempted requests)
        self.preempted = [0] * n

    def check(self) -> None:
        """Refuse, in one line, a request that could never run: its KV at its last token does not fit the
        replica's blocks even alone, or (without chunked prefill) its recompute exceeds the step budget."""
        if not self.inp:
            return
        need = max(i + o - 1 for i, o in zip(self.inp, self.out, strict=True))
        if math.ceil(need / self.B) > self.blocks:
            cap = self.cost.kv_capacity_tokens
            raise OpmapError(f"a request needs {need} tokens of KV cache ({math.ceil(need / self.B)} blocks of "
                             f"{self.B}), the device holds {cap} ({self.blocks} blocks): shorten "
                             "--input-len/--output-len, raise --tp or pick a larger device")
        if not self.p.chunked_prefill and need > self.p.max_num_batched_tokens:
            raise OpmapError(f"without chunked prefill a request's prompt (and recompute, {need} tokens) must fit "
                             f"max_num_batched_tokens ({self.p.max_num_batched_tokens}): raise it or chunk")

    def replica(self) -> EngineReplica:
        return EngineReplica(self.blocks, self.B)

    # -- eviction ---------------------------------------------------------------------------------------------

    def _victim(self, e: EngineReplica) -> int:
        """The most recently admitted request still running (stale stack entries dropped on the way)."""
        stack, state, epoch = e.stack, self.state, self.epoch
        while True:
            rid, ep = stack.pop()
            if epoch[rid] == ep and state[rid] in (PREFILLING, DECODING):
                return rid

    def _evict(self, e: EngineReplica, q: deque, rid: int, step: int, scheduled: bool) -> bool:
        """Preempt ``rid`` (recompute): free its blocks, put it at the front of the queue. ``scheduled``: the
        decodes of the step ``step`` already hold their new blocks. True when it was a decode of this step."""
        B = self.B
        if self.state[rid] == PREFILLING:
            e.free += -(-self.done[rid] // B)
            e.prefilling.remove(rid)
            was_decode = False
        else:
            h = self.h0[rid] + e.D - self.j0[rid]
            grows = self.res[rid] == step % B  # it needed a new block in this step
            e.free += -(-h // B) + (1 if scheduled and grows else 0)
            e.n_dec -= 1
            e.kv_sum -= h + 1
            e.cnt[self.res[rid]] -= 1
            self.gen[rid] += e.D - self.j0[rid]
            self.last_tok[rid] = e.last_end
            was_decode = True
        self.state[rid] = WAITING
        self.epoch[rid] += 1
        e.running -= 1
        self.preempted[rid] += 1
        q.appendleft(rid)
        return was_decode

    # -- a step -----------------------------------------------------------------------------------------------

    def begin(self, e: EngineReplica, q: deque, ridx: int, now: float) -> float | None:
        """Form the next step on a replica at ``now``: its duration (s), or None when there is nothing to run."""
        B, M = self.B, self.p.max_num_batched_tokens
        step = e.D + 1
        evicted = False
        need = e.cnt[step % B] if e.n_dec else 0  # decodes whose KV length is a multiple of the block size
        while need > e.free:  # evict from the most recent until the oldest decodes' new blocks fit
            v = self._victim(e)
            evicted = True
            if self._evict(e, q, v, step, False) and self.res[v] == step % B:
                need -= 1
        e.free -= need
        budget = M - e.n_dec
        chunks: list[tuple[int, int]] = []
        done, target = self.done, self.target
        i = 0
        while i < len(e.prefilling) and budget > 0:  # prompts partly prefilled: their next chunk
            rid = e.prefilling[i]
            take = min(target[rid] - done[rid], budget)
            nb = -(-(done[rid] + take) // B) - (-(-done[rid] // B))
            stop = False
            while nb > e.free:
                v = self._victim(e)
                evicted = True
                if v == rid:
                    self._evict(e, q, v, step, True)
                    stop = True
                    break
                if self._evict(e, q, v, step, True):
                    budget += 1  # a decode of this step evicted: its token of the budget is back
            if stop:
                break
            e.free -= nb
            chunks.append((rid, take))
            budget -= take
            i += 1
        if not evicted or (not chunks and not e.n_dec):
            budget = self._admit(e, q, ridx, now, budget, chunks)
        if not chunks and not e.n_dec:
            return None
        if e.free < e.min_free:
            e.min_free = e.free
        pt = sum(t for _, t in chunks)
        prefix = [(done[r], t) for r, t in chunks if done[r]]  # chunks continuing a prompt attend to its start
        d = mixed_s(self.cost, pt, len(chunks), e.n_dec, e.kv_sum, prefix)
        e.pending = (chunks, d)
        return d

    def _admit(self, e: EngineReplica, q: deque, ridx: int, now: float, budget: int,
               chunks: list[tuple[int, int]]) -> int:
        """New requests from the head of the queue, FCFS, while the budget, max_num_seqs and free blocks allow."""
        B, chunked, S = self.B, self.p.chunked_prefill, self.p.max_num_seqs
        while q and budget > 0 and e.running < S:
            rid = q[0]
            tot = self.inp[rid] + self.gen[rid]  # a preempted request recomputes its prompt and emitted tokens
            take = min(tot, budget) if chunked else tot
            if take > budget:
                break
            nb = -(-take // B)
            if nb > e.free:
                break
            q.popleft()
            e.free -= nb
            self.state[rid] = PREFILLING
            self.epoch[rid] += 1
            self.done[rid], self.target[rid] = 0, tot
            e.stack.append((rid, self.epoch[rid]))
            e.prefilling.append(rid)
            e.running += 1
            if self.start[rid] != self.start[rid]:  # NaN: first scheduled now
                self.start[rid] = now
            self.where[rid] = ridx
            chunks.append((rid, take))
            budget -= take
        return budget

    def end(self, e: EngineReplica, now: float) -> int:
        """Close the step that ends at ``now``: tokens out, finished requests' blocks freed, finished prefills
        joined to the decodes. Returns how many requests finished."""
        chunks, d = e.pending
        e.pending = None
        e.last_end = now
        B = self.B
        finished = 0
        if e.n_dec:
            e.D += 1
            self.itl_g.append(d)
            self.itl_w.append(e.n_dec)
            e.kv_sum += e.n_dec
            fin, D = e.fin, e.D
            while fin and fin[0][0] <= D:
                _, ep, rid = heapq.heappop(fin)
                if self.epoch[rid] != ep or self.state[rid] != DECODING:
                    continue  # preempted since
                h = self.h0[rid] + D - self.j0[rid]
                e.free += -(-h // B)
                e.n_dec -= 1
                e.kv_sum -= h + 1
                e.cnt[self.res[rid]] -= 1
                self._done(e, rid, now)
                finished += 1
        any_done = False
        for rid, take in chunks:
            self.done[rid] += take
            if self.done[rid] < self.target[rid]:
                continue
            any_done = True
            g = self.gen[rid] = self.gen[rid] + 1
            if g == 1:
                self.first[rid] = now
            else:  # the token after a recompute
                self.itl_g.append(now - self.last_tok[rid])
                self.itl_w.append(1)
            if g >= self.out[rid]:
                e.free += -(-self.done[rid] // B)
                self._done(e, rid, now)
                finished += 1
                continue
            h = self.done[rid]
            self.state[rid] = DECODING
            self.h0[rid], self.j0[rid] = h, e.D
            self.res[rid] = (e.D + 1 - h) % B
            e.cnt[self.res[rid]] += 1
            e.n_dec += 1
            e.kv_sum += h + 1
            heapq.heappush(e.fin, (e.D + self.out[rid] - g, self.epoch[rid], rid))
        if any_done:
            e.prefilling = [r for r in e.prefilling if self.state[r] == PREFILLING]
        return finished

    def _done(self, e: EngineReplica, rid: int, now: float) -> None:
        self.state[rid] = DONE
        self.finish[rid] = now
        e.running -= 1

    def extra(self, reps: list[EngineReplica]) -> dict[str, Any]:
        """SimResult.extra: the preemptions (total, requests preempted at least once, most for one request) and
        the paged KV cache of a replica (block size, blocks, the most blocks any replica held at once)."""
        pre = self.preempted
        limited = self.blocks != _UNLIMITED
        return {"preemptions": {"total": sum(pre), "requests_preempted": sum(1 for x in pre if x),
                                "max_per_request": max(pre, default=0)},
                "kv_cache": {"paged": True, "kv_block": self.B, "blocks": self.blocks if limited else None,
                             "capacity_tokens": self.cost.kv_capacity_tokens,
                             "peak_blocks_used": max((self.blocks - e.min_free for e in reps), default=0)
                             if limited else None,
                             "preemption": "recompute"}}
