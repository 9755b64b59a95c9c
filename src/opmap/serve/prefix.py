"""Prefix caching in the serving simulator: what each prompt holds, and the pool of cached KV blocks.

A prompt is a run of segments ``(id, tokens)``: token ``k`` of a segment is the token ``(id, k)``, so two prompts
hold the same tokens where they hold the same segment at the same offset. Segment ids >= 0 are shared (a group's
system prompt, a Mooncake trace's block hash id); a request's own text is the segment ``-(rid + 2)``, never shared
(never -1: CPython hashes -1 as -2, so the two would hash alike).

- ``PrefixShare`` (``--prefix-share R [--prefix-groups G]``): request ``i`` belongs to group ``i mod G``; its first
  ``floor(R x input_len)`` tokens are its group's shared text (a system prompt), the rest its own. Prompts of
  different lengths share ``min(floor(R x a), floor(R x b))`` tokens.
- A Mooncake trace (opmap.serve.mooncake): one segment of ``MOONCAKE_BLOCK`` tokens per hash id (the last one
  the prompt's remainder); blocks past the ids given are the request's own.

The KV pool caches as vLLM V1 does (vllm/v1/core/kv_cache_manager.py, block_pool.py, kv_cache_utils.py): a full
KV block of B tokens is known by its chained hash ``hash((parent, tokens))``; a request admitted looks up its
longest run of cached leading blocks, holds those (reference counts, shared, never allocated twice) and computes
only the tokens after them; when every block of the prompt hits, the last token is recomputed all the same (the
lookup stops at ``(tokens - 1) // B`` blocks: the step needs the last token's logits). A block whose last holder
leaves goes to the tail of the free queue and keeps its hash; a block taken from the head of the queue that still
has one is evicted (least recently freed first: LRU). Here only the blocks inside the prompt are cached: a block
that holds output tokens is freed uncached (no later prompt can share it: a request's output is its own), so a
request preempted and readmitted finds its prompt's blocks, not its output's, where they were not evicted.

``PrefixPool`` is the counting scheduler's (opmap.serve.inflight) view of that pool: the free queue as runs of
uncached blocks and single cached ones, by hash; ``KVCacheManager`` (kv_cache.py) is the block-for-block one the
reference scheduler runs, and a test holds the two equal.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace

import numpy as np

from opmap.errors import OpmapError
from opmap.validate import count, finite_number

Segments = tuple[tuple[int, int], ...]  # a prompt: (segment id, tokens), in order
MAX_GROUPS = 1_000_000  # --prefix-groups: more groups than any run has requests shares nothing


@dataclass(frozen=True)
class Prompts:
    """Per request (index = request id), the segments its prompt is made of; ``source`` says where they came from
    (``share:R,groups:G`` or ``mooncake``)."""

    segments: tuple[Segments, ...]
    source: str

    def __len__(self) -> int:
        return len(self.segments)

    def take(self, order: np.ndarray | list[int]) -> Prompts:
        """The prompts of the requests ``order`` (a trace sorted by arrival, cut to its first rows)."""
        return Prompts(tuple(self.segments[int(i)] for i in order), self.source)


@dataclass(frozen=True)
class PrefixShare:
    """``--prefix-share R --prefix-groups G``: the first ``floor(R x input_len)`` tokens of each prompt shared with
    the requests of its group (request i in group i mod G)."""

    share: float
    groups: int = 1

    def __post_init__(self) -> None:
        finite_number(self.share, "--prefix-share", lo=0, hi=1)
        count(self.groups, "--prefix-groups", hi=MAX_GROUPS)

    def spec(self) -> str:
        return f"share:{self.share:g},groups:{self.groups}"

    def prompts(self, input_len: np.ndarray) -> Prompts:
        segs = []
        for i, n in enumerate(input_len.tolist()):
            p = int(self.share * n)  # floor: the shared tokens of this prompt
            segs.append(tuple(s for s in ((i % self.groups, p), (-(i + 2), n - p)) if s[1] > 0))
        return Prompts(tuple(segs), self.spec())

    def apply(self, reqs):
        """``reqs`` (opmap.serve.arrivals.Requests) with these prompts; a trace that brings its own is refused."""
        if reqs.prompt is not None:
            raise OpmapError(f"--prefix-share shares a part of every prompt, but the trace gives its prompts' blocks "
                             f"({reqs.prompt.source}): drop --prefix-share or use a trace without hash_ids")
        return replace(reqs, prompt=self.prompts(reqs.input_len))


def block_hashes(segs: Segments, block: int) -> list[int]:
    """The chained hash of each full ``block``-token block of the prompt ``segs``: equal values, equal prompts up
    to the end of that block (a block's tokens as pieces ``(segment, first offset, end offset)``)."""
    out: list[int] = []
    parent, pieces, filled = None, [], 0
    for sid, n in segs:
        off = 0
        while off < n:
            k = min(block - filled, n - off)
            pieces.append((sid, off, off + k))
            filled += k
            off += k
            if filled == block:
                parent = hash((parent, tuple(pieces)))
                out.append(parent)
                pieces, filled = [], 0
    return out


def prompt_tokens(segs: Segments) -> list[tuple[int, int]]:
    """The prompt's tokens one by one, ``(segment, offset)`` (the reference scheduler's block manager hashes them)."""
    return [(sid, k) for sid, n in segs for k in range(n)]


@dataclass(frozen=True)
class PrefixCache:
    """A run's prefix cache: the prompt tokens of every request, those found cached when it was first admitted
    (its prefill computed the rest), their ratio; the tokens found cached again when preempted requests were
    readmitted (their recompute skipped them); the KV block the hashes are taken over."""

    prompt_tokens: int
    hit_tokens: int
    hit_rate: float
    recompute_hit_tokens: int
    kv_block: int
    prompts: str

    @classmethod
    def of(cls, input_len: list[int], hits: list[int], rehits: int, kv_block: int, prompts: str) -> PrefixCache:
        tot, hit = int(sum(input_len)), int(sum(hits))
        return cls(tot, hit, hit / tot if tot else 0.0, int(rehits), kv_block, prompts)


class PrefixPool:
    """The free queue of a replica's KV blocks with the hashes of the cached ones (``PrefixPool(blocks)``: all free,
    none cached). ``ref[h]``: how many running requests hold the cached block of hash ``h`` (0: it waits in the
    queue, evictable). The queue holds runs of uncached blocks (a one-item list, its count) and cached blocks (their
    hash), oldest first. The caller keeps the count of free blocks; each call says how many blocks it took or gave
    back."""

    __slots__ = ("q", "ref", "where", "serial")

    def __init__(self, blocks: int) -> None:
        self.q: OrderedDict[int, object] = OrderedDict()
        self.ref: dict[int, int] = {}
        self.where: dict[int, int] = {}  # hash of a cached block in the queue -> its queue key
        self.serial = 0
        if blocks:
            self._anon(blocks)

    def _anon(self, n: int) -> None:
        if self.q:
            last = next(reversed(self.q.values()))
            if type(last) is list:
                last[0] += n
                return
        self.serial += 1
        self.q[self.serial] = [n]

    def take(self, n: int) -> None:
        """``n`` blocks off the head of the queue (the caller checked they are there); a cached one is evicted."""
        q, where, ref = self.q, self.where, self.ref
        while n:
            key, v = q.popitem(last=False)
            if type(v) is list:
                if v[0] > n:  # a run longer than needed: the rest stays at the head
                    v[0] -= n
                    q[key] = v
                    q.move_to_end(key, last=False)
                    return
                n -= v[0]
            else:
                del where[v]
                del ref[v]
                n -= 1

    def lookup(self, hashes: list[int], most: int) -> tuple[int, int]:
        """(the leading blocks of ``hashes`` cached, at most ``most``; how many of those wait in the queue)."""
        k = waiting = 0
        ref = self.ref
        while k < most and hashes[k] in ref:
            waiting += ref[hashes[k]] == 0
            k += 1
        return k, waiting

    def hold(self, hashes: list[int]) -> None:
        """A request takes the cached blocks ``hashes`` (a lookup's hit): those waiting leave the queue."""
        for h in hashes:
            if self.ref[h] == 0:
                del self.q[self.where.pop(h)]
            self.ref[h] += 1

    def fill(self, h: int) -> int | None:
        """A request's block just filled with the tokens of hash ``h``: cached (``h``) unless a block of that hash
        already is (then the block stays uncached: None), as vLLM keeps one block per hash."""
        if h in self.ref:
            return None
        self.ref[h] = 1
        return h

    def release(self, held: list[int | None], blocks: int) -> int:
        """A request leaves holding ``blocks`` blocks, its first ``len(held)`` the prompt's full blocks (a hash, or
        None where uncached): they go to the queue's tail in reverse order (its last block first, as vLLM frees),
        a cached one only when no other request holds it. Returns the blocks that became free."""
        tail = blocks - len(held)
        if tail:
            self._anon(tail)
        freed = tail
        ref, q = self.ref, self.q
        for h in reversed(held):
            if h is None:
                self._anon(1)
                freed += 1
                continue
            ref[h] -= 1
            if ref[h] == 0:
                self.serial += 1
                q[self.serial] = h
                self.where[h] = self.serial
                freed += 1
        return freed
