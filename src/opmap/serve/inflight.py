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

vLLM V0's default scheduler (``Engine.no_mix``, nomix, whole prompts): a step runs the waiting prompts that fit
alone, ahead of the decodes, else the decodes alone, admitting nothing; a prompt is admitted only while the blocks
left free after it stay at 1% of the blocks (the V0 block manager's watermark). The decodes' inter-token gaps then
span the prompt steps between their tokens.

GUARANTEED_NO_EVICT (``Engine.no_evict``, TensorRT-LLM's default capacity scheduler): a request is admitted only
when its KV blocks at its last token (prompt + output - 1 tokens), with those reserved by every running request,
fit the replica's blocks; the blocks are still taken as tokens are produced, but the reservation guarantees they
are there, so nothing is preempted, at the price of fewer requests running while the reserved blocks sit empty.

Prefix caching (vLLM's, on by default in V1), where the requests' prompts share prefixes (``Trace.prompt``:
``--prefix-share``, a Mooncake trace): a request admitted holds the cached blocks of its longest cached prefix
(shared, reference-counted; at most ``(tokens - 1) // kv_block`` blocks, the last token always recomputed) and its
prefill computes only the tokens after them, its first chunk attending to the cached ones; the full blocks of a
prompt are cached as a chunk fills them, and a block no request holds waits in the free queue, evicted least
recently freed first (``PrefixPool``, opmap.serve.prefix, where the rules are). Without shared prompts the blocks
are only counted, as a plain ``vllm serve`` of distinct prompts runs. Left out: speculative decoding, priorities,
swapping to host memory. vLLM V1 walks its running list in admission order,
decodes and partly prefilled prompts interleaved; a prompt still prefilling is always the newest running
request when decodes come first in the budget, so the two orders schedule the same tokens.

The work per step is independent of the number of running requests: decodes are counted, not visited (a
decode needs a new block when its KV length is a multiple of the block size, so the decoders are counted by
the residue of their join step; their finishes sit in a heap keyed by the step count at which they end).
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from opmap.errors import OpmapError
from opmap.serve.cost import StepCost, mixed_s
from opmap.serve.policies import Engine
from opmap.serve.prefix import PrefixCache, PrefixPool, block_hashes
from opmap.serve.request import Batch, Events, Trace
from opmap.serve.run_stats import EngineStats, PagedKv, Preemptions

_UNLIMITED = 1 << 62  # blocks of a KV cache without a capacity (kv_capacity_tokens None)
# vLLM V0's block manager keeps 1% of the blocks free at admission, "to avoid frequent cache eviction"
# (vllm/core/block_manager_v1.py, BlockSpaceManagerV1(watermark=0.01); vllm-project/vllm @ 00a456f1)
V0_WATERMARK = 0.01
_NONE: tuple = ()  # no events (shared, never appended to)
PREFILLING, DECODING, GONE = 1, 2, 3  # GONE: finished or preempted (its entries in heaps and stacks are stale)


class _Run:
    """One admission of a request, from the first chunk of its (re)prefill to its last token or its preemption.
    Only running requests have one, so memory follows the running batch, not the trace."""

    __slots__ = ("rid", "state", "gen", "done", "target", "h0", "j0", "res", "serial", "commit", "held", "tj")

    def __init__(self, rid: int, gen: int, target: int, serial: int) -> None:
        self.rid, self.state, self.serial = rid, PREFILLING, serial
        self.gen = gen  # tokens emitted so far (a decode: at its join; see h0, j0)
        self.done, self.target = 0, target  # KV tokens computed in this (re)prefill, of prompt + tokens emitted
        self.h0 = self.j0 = self.res = 0  # a decode: KV tokens and the replica's decode step count at its join;
        # the residue (mod kv_block) of the decode steps at which it needs a new block
        self.commit = 0  # no_evict: the KV blocks reserved for it, those it holds at its last token
        self.held: list[int | None] = []  # shared prefixes: its prompt's full blocks held (hash, None: uncached)
        self.tj = 0.0  # a decode: when it joined the decodes (its (re)prefill's token came out then)


class InflightScheduler:
    """The engine policy's state shared by the replicas of one simulation (``policy`` an Engine, priced by
    ``cost``): the paged KV cache's geometry, the preempted requests waiting (a request may come back on another
    replica behind the shared router) and the admission serial."""

    policies = ("engine",)  # the policy names it schedules (scheduler.REGISTRY)
    iterative = pages_kv = preempts = True
    decode_pool = False

    def __init__(self, policy: Engine, cost: StepCost, trace: Trace) -> None:
        self.p, self.cost = policy, cost
        self.B = policy.kv_block
        cap = cost.kv_capacity_tokens
        self.blocks = _UNLIMITED if cap is None else int(cap) // self.B
        # nomix (vLLM V0): a prompt is admitted only while the blocks left free after it stay at the block
        # manager's watermark, 1% of the blocks (BlockSpaceManagerV1.can_allocate, watermark=0.01)
        self.watermark = int(V0_WATERMARK * self.blocks) if policy.no_mix and cap is not None else 0
        self.inp, self.out = trace.inp, trace.out
        self.parked: dict[int, tuple[int, float]] = {}  # preempted, waiting: (tokens emitted, last token's time)
        self.serial = 0
        self.prompt = trace.prompt  # shared prefixes (opmap.serve.prefix.Prompts) or None: no prefix cache
        self.hit = [0] * len(self.inp) if self.prompt is not None else None  # first admission's cached tokens
        self.rehit = 0  # cached tokens found by readmitted (preempted) requests
        self.hashes: dict[int, list[int]] = {}  # a request's prompt block hashes, from its first lookup to its end

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
        if not self.p.chunked_prefill and self.p.no_evict:  # never preempted: only the prompt is ever prefilled
            need = max(self.inp)
        if not self.p.chunked_prefill and need > self.p.max_num_batched_tokens:
            raise OpmapError(f"without chunked prefill a request's prompt (and recompute, {need} tokens) must fit "
                             f"max_num_batched_tokens ({self.p.max_num_batched_tokens}): raise it or chunk")

    def replica(self, idx: int, q: deque) -> EngineReplica:
        return EngineReplica(self, q)

    def extra(self, reps: list[EngineReplica], preempted: list[int]) -> EngineStats:
        """SimResult.engine: the preemptions (total, requests preempted at least once, most for one request) and
        the paged KV cache of a replica (block size, blocks, the most blocks any replica held at once)."""
        limited = self.blocks != _UNLIMITED
        peak = max((self.blocks - e.min_free for e in reps), default=0) if limited else None
        pc = (PrefixCache.of(self.inp, self.hit, self.rehit, self.B, self.prompt.source)
              if self.hit is not None else None)
        return EngineStats(Preemptions.of(preempted),
                           PagedKv(self.B, self.blocks if limited else None, self.cost.kv_capacity_tokens, peak), pc)

    def prompt_hashes(self, rid: int) -> list[int]:
        """Request ``rid``'s prompt block hashes (kept from its first lookup until it finishes)."""
        hs = self.hashes.get(rid)
        if hs is None:
            hs = self.hashes[rid] = block_hashes(self.prompt.segments[rid], self.B)
        return hs


class EngineReplica:
    """The engine state of one replica: free KV blocks, the decodes (counted), the prompts being prefilled; its
    steps formed by ``schedule`` and closed by ``on_batch_end``."""

    __slots__ = ("f", "q", "wake", "free", "D", "n_dec", "kv_sum", "cnt", "fin", "prefilling", "stack", "running",
                 "last_end", "min_free", "committed", "pool", "apart", "dec_end", "joined")

    def __init__(self, family: InflightScheduler, q: deque) -> None:
        self.f, self.q, self.wake = family, q, -1.0
        blocks, kv_block = family.blocks, family.B
        self.free = blocks  # KV blocks not held by any request
        self.D = 0  # steps so far that carried decodes
        self.n_dec = 0  # running decodes
        self.kv_sum = 0  # KV tokens the running decodes attend to in the next step (their KV + the new token)
        self.cnt = [0] * kv_block  # decodes by the residue (mod kv_block) of the decode steps that need a block
        self.fin: list[tuple[int, int, _Run]] = []  # heap of (decode step of the last token, serial, run)
        self.prefilling: list[_Run] = []  # admitted, (re)prefill not done, in admission order
        self.stack: list[_Run] = []  # in admission order: the victims come from its top
        self.running = 0  # decodes + prefilling
        self.last_end = 0.0  # when the last step ended: every running decode's last token came then
        self.min_free = blocks  # the fewest blocks free at any step: the peak use is blocks - min_free
        self.committed = 0  # no_evict: blocks reserved by the running requests (each its blocks at its last token)
        self.pool = PrefixPool(blocks) if family.prompt is not None else None  # the free queue, cached blocks' hashes
        # nomix (vLLM V0): whether the step in flight runs prompts alone (the decodes sit it out); when the last
        # step that carried decodes ended; the decodes that joined since, as [join time, count] groups
        self.apart = False
        self.dec_end = 0.0
        self.joined: list[list] = []

    # -- eviction ---------------------------------------------------------------------------------------------

    def _victim(self) -> _Run:
        """The most recently admitted request still running (finished or preempted entries dropped on the way)."""
        stack = self.stack
        while True:
            r = stack.pop()
            if r.state != GONE:
                return r

    def _evict(self, r: _Run, step: int, scheduled: bool) -> bool:
        """Preempt ``r`` (recompute): free its blocks, put it at the front of the queue. ``scheduled``: the
        decodes of the step ``step`` already hold their new blocks. True when it was a decode of this step."""
        f = self.f
        B = f.B
        if r.state == PREFILLING:
            self._give(r, -(-r.done // B))
            self.prefilling.remove(r)
            gen, last = r.gen, f.parked.get(r.rid, (0, 0.0))[1]
            was_decode = False
        else:
            h = r.h0 + self.D - r.j0
            grows = r.res == step % B  # it needed a new block in this step
            self._give(r, -(-h // B) + (1 if scheduled and grows else 0))
            self.n_dec -= 1
            self.kv_sum -= h + 1
            self.cnt[r.res] -= 1
            gen, last = r.gen + self.D - r.j0, self.last_end
            if f.p.no_mix:  # its last token: the last decode step's, or its join's if it joined since
                last = self._left(r)
            was_decode = True
        r.state = GONE
        self.running -= 1
        self.committed -= r.commit
        f.parked[r.rid] = (gen, last)
        self.q.appendleft(r.rid)
        return was_decode

    # -- a step -----------------------------------------------------------------------------------------------

    def schedule(self, now: float) -> Batch | None:
        """Form the next step at ``now`` (None when there is nothing to run): the requests admitted and those
        preempted to form it. nomix: a step of prompts alone when any is admitted, else the decodes alone."""
        f = self.f
        B, M = f.B, f.p.max_num_batched_tokens
        if f.p.no_mix:
            b = self._prompts_apart(now)
            if b is not None:
                return b
        step = self.D + 1
        pre: list[int] = _NONE  # the requests preempted to form it (a list once one is)
        need = self.cnt[step % B] if self.n_dec else 0  # decodes whose KV length is a multiple of the block size
        while need > self.free:  # evict from the most recent until the oldest decodes' new blocks fit
            v = self._victim()
            pre = pre or []
            pre.append(v.rid)
            if self._evict(v, step, False) and v.res == step % B:
                need -= 1
        self.free -= need
        if self.pool is not None and need:
            self.pool.take(need)
        budget = M - self.n_dec
        chunks: list[tuple[_Run, int]] = []
        prefilling = self.prefilling
        i = 0
        while i < len(prefilling) and budget > 0:  # prompts partly prefilled: their next chunk
            r = prefilling[i]
            take = min(r.target - r.done, budget)
            nb = -(-(r.done + take) // B) - (-(-r.done // B))
            while nb > self.free:
                v = self._victim()
                pre = pre or []
                pre.append(v.rid)
                # with decodes scheduled first, a decode is never admitted after a prompt still prefilling:
                # the victim is this prompt or a later one; a decode's token of the budget comes back all the same
                if self._evict(v, step, True):
                    budget += 1
                if v is r:
                    break
            if r.state == GONE:
                break
            self.free -= nb
            if self.pool is not None:
                self._fill(r, nb, r.done + take)
            chunks.append((r, take))
            budget -= take
            i += 1
        admits = not f.p.no_mix and (not pre or (not chunks and not self.n_dec))
        started = self._admit(budget, chunks) if admits else _NONE
        if not chunks and not self.n_dec:
            return None if not pre else Batch(started=started, preempted=pre)
        if self.free < self.min_free:
            self.min_free = self.free
        if chunks:
            pt = sum(t for _, t in chunks)
            prefix = [(r.done, t) for r, t in chunks if r.done]  # chunks continuing a prompt attend to its start
            d = mixed_s(f.cost, pt, len(chunks), self.n_dec, self.kv_sum, prefix)
        else:  # decodes only (most steps): what mixed_s comes to without prompt tokens
            d = f.cost.decode_s(self.n_dec, self.kv_sum)
        return Batch(_NONE, _NONE, _NONE, _NONE, now + d, d, started, pre, chunks)  # positional: the hot path

    def _prompts_apart(self, now: float) -> Batch | None:
        """nomix: the waiting prompts that fit admitted into a step of their own (None: none fits, the step is the
        decodes'). Its budget is all prompt tokens: the running decodes count against max_num_seqs alone."""
        chunks: list[tuple[_Run, int]] = []
        started = self._admit(self.f.p.max_num_batched_tokens, chunks)
        self.apart = bool(started)
        if not started:
            return None
        if self.free < self.min_free:
            self.min_free = self.free
        pt = sum(t for _, t in chunks)
        prefix = [(r.done, t) for r, t in chunks if r.done]  # prompts found cached attend to their prefix
        d = mixed_s(self.f.cost, pt, len(chunks), 0, 0, prefix)
        return Batch(end_s=now + d, duration_s=d, started=started, state=chunks)

    def _left(self, r: _Run) -> float:
        """nomix: a decode leaving (finished or preempted): when its last token came out; dropped from its join
        group if it joined since the last decode step."""
        if r.tj <= self.dec_end:
            return self.dec_end
        for g in self.joined:
            if g[0] == r.tj:
                g[1] -= 1
                break
        return r.tj

    def _gaps(self, now: float) -> tuple[list[float], list[int]]:
        """nomix: the inter-token gaps of a decode step ending at ``now``: the decodes running at the last decode
        step wait since it ended, those that joined since (prompt steps between) since they joined."""
        new = sum(c for _, c in self.joined)
        gs, gw = ([now - self.dec_end], [self.n_dec - new]) if self.n_dec > new else ([], [])
        for t, c in self.joined:
            if c:
                gs.append(now - t)
                gw.append(c)
        self.joined = []
        self.dec_end = now
        return gs, gw

    def _admit(self, budget: int, chunks: list[tuple[_Run, int]]) -> list[int]:
        """New requests from the head of the queue, FCFS, while the budget, max_num_seqs and free blocks allow;
        returns them."""
        f, q = self.f, self.q
        B, chunked, S, no_evict = f.B, f.p.chunked_prefill, f.p.max_num_seqs, f.p.no_evict
        inp, parked = f.inp, f.parked
        got: list[int] = _NONE  # a list once one is admitted (most steps admit none)
        while q and budget > 0 and self.running < S:
            rid = q[0]
            gen = parked[rid][0] if rid in parked else 0
            tot = inp[rid] + gen  # a preempted request recomputes its prompt and the tokens it emitted
            k = waiting = 0  # its cached prefix, in blocks; of those, the blocks no request holds
            if self.pool is not None:
                hs = f.prompt_hashes(rid)
                k, waiting = self.pool.lookup(hs, min(len(hs), (tot - 1) // B))
            hit = k * B
            take = min(tot - hit, budget) if chunked else tot - hit
            if take > budget:
                break
            nb = -(-(hit + take) // B) - k
            if nb > self.free - waiting - f.watermark:
                break
            commit = -(-(inp[rid] + f.out[rid] - 1) // B) if no_evict else 0
            if commit and self.committed + commit > f.blocks:  # GUARANTEED_NO_EVICT: its whole KV must be free
                break
            q.popleft()
            self.free -= nb + waiting
            f.serial += 1
            r = _Run(rid, gen, tot, f.serial)
            r.commit = commit
            if self.pool is not None:
                self._hit(r, hs[:k], rid in parked)
                self._fill(r, nb, hit + take)
            self.committed += commit
            if len(self.stack) > 2 * self.running + 64:  # drop finished and preempted entries now and then
                self.stack = [x for x in self.stack if x.state != GONE]
            self.stack.append(r)
            self.prefilling.append(r)
            self.running += 1
            if got is _NONE:
                got = []
            got.append(rid)
            chunks.append((r, take))
            budget -= take
        return got

    def on_batch_end(self, batch: Batch, now: float) -> Events:
        """Close the step that ends at ``now``: tokens out, finished requests' blocks freed, finished prefills
        joined to the decodes. Returns the batch itself, its events now those of its end."""
        f = self.f
        self.last_end = now
        B = f.B
        ev = batch  # its events (none known when it was formed) become the end's: no new object on the hot path
        if self.n_dec and not self.apart:  # nomix: the decodes sat out a step of prompts
            ev.gap_s, ev.gap_w = self._gaps(now) if f.p.no_mix else ([batch.duration_s], [self.n_dec])
            self.D += 1
            self.kv_sum += self.n_dec
            fin, D = self.fin, self.D
            while fin and fin[0][0] <= D:
                r = heapq.heappop(fin)[2]
                if r.state != DECODING:
                    continue  # preempted since
                h = r.h0 + D - r.j0
                self._give(r, -(-h // B))
                self.n_dec -= 1
                self.kv_sum -= h + 1
                self.cnt[r.res] -= 1
                self._done(r)
                if ev.finished is _NONE:
                    ev.finished = []
                ev.finished.append((r.rid, now))
        if batch.state:
            self._prefills_done(batch.state, now, ev)
        return ev

    def _prefills_done(self, chunks: list[tuple[_Run, int]], now: float, ev: Events) -> None:
        """The chunks of the step just ended: a (re)prefill done emits its request's next token; the request
        joins the decodes or, at its last token, finishes."""
        f = self.f
        B, out, parked = f.B, f.out, f.parked
        any_done = False
        for r, take in chunks:
            r.done += take
            if r.done < r.target or r.state == GONE:
                continue
            any_done = True
            rid = r.rid
            r.gen += 1
            if r.gen == 1:
                if ev.first is _NONE:
                    ev.first = []
                ev.first.append((rid, now))
                parked.pop(rid, None)  # preempted while prefilling its prompt the first time
            else:  # the token after a recompute
                if ev.gap_s is _NONE:
                    ev.gap_s, ev.gap_w = [], []
                ev.gap_s.append(now - parked.pop(rid)[1])
                ev.gap_w.append(1)
            if r.gen >= out[rid]:
                self._give(r, -(-r.done // B))
                self._done(r)
                if ev.finished is _NONE:
                    ev.finished = []
                ev.finished.append((rid, now))
                continue
            h = r.done
            r.state = DECODING
            r.h0, r.j0, r.tj = h, self.D, now
            if f.p.no_mix:  # joins the decodes between decode steps: its first gap runs from now
                if self.joined and self.joined[-1][0] == now:
                    self.joined[-1][1] += 1
                else:
                    self.joined.append([now, 1])
            r.res = (self.D + 1 - h) % B
            self.cnt[r.res] += 1
            self.n_dec += 1
            self.kv_sum += h + 1
            heapq.heappush(self.fin, (self.D + out[rid] - r.gen, r.serial, r))
        if any_done:
            self.prefilling = [r for r in self.prefilling if r.state == PREFILLING]

    def _done(self, r: _Run) -> None:
        r.state = GONE
        self.running -= 1
        self.committed -= r.commit
        if self.pool is not None:
            self.f.hashes.pop(r.rid, None)

    # -- the prefix cache (shared prompts only) ------------------------------------------------------------------

    def _give(self, r: _Run, blocks: int) -> None:
        """``r`` (finished or preempted) lets go of its ``blocks`` KV blocks: free, but for its cached prompt
        blocks other requests still hold."""
        self.free += blocks if self.pool is None else self.pool.release(r.held, blocks)

    def _hit(self, r: _Run, hashes: list[int], again: bool) -> None:
        """``r`` admitted holds the cached blocks ``hashes`` (its prefix, already computed); the hit is its first
        admission's or a readmission's."""
        self.pool.hold(hashes)
        r.held = list(hashes)
        r.done = len(hashes) * self.f.B
        if again:
            self.f.rehit += r.done
        else:
            self.f.hit[r.rid] = r.done

    def _fill(self, r: _Run, nb: int, upto: int) -> None:
        """``r``'s step takes ``nb`` new blocks off the free queue (evicting the cached ones there) and computes its
        KV up to ``upto`` tokens: the prompt's blocks it fills are cached."""
        pool = self.pool
        if nb:
            pool.take(nb)
        full = min(upto, self.f.inp[r.rid]) // self.f.B
        if len(r.held) < full:
            hs = self.f.prompt_hashes(r.rid)
            for i in range(len(r.held), full):
                r.held.append(pool.fill(hs[i]))
