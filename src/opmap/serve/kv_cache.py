"""A paged KV cache as vLLM's block manager keeps it (vllm/v1/core/kv_cache_manager.py, block_pool.py): a pool of
``num_blocks`` blocks of ``block_size`` tokens, a block table per request, reference counts, and prefix caching.

A full block is known by the chained hash of its tokens, ``hash((parent_hash, tokens))``, the parent being the
hash of the block before it (None for the first): equal hashes mean equal prefixes up to and including that
block. A request's blocks are held (refcount >= 1) while it runs; freed, a block goes to the tail of the free
queue and keeps its hash (its KV stays usable: a later request with the same prefix takes it back, refcount 1
again). A new block is taken from the head of the free queue (least recently freed first); a block taken that
still carries a hash is evicted: its hash is forgotten. ``caching=False``: no hashes, blocks are only counted.

Token ids are what the caller says they are (the serving simulator has none: its reference scheduler gives each
request its own, or, where prompts share prefixes, the tokens of opmap.serve.prefix's segments). ``cache_upto``
(``allocate``): only the blocks inside a request's first that many tokens are hashed and cached (its prompt: the
blocks holding output tokens are freed uncached, as opmap.serve.prefix states).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from opmap.errors import OpmapError


class _Req:
    __slots__ = ("table", "tokens", "hashes", "limit")

    def __init__(self, limit: int | None = None) -> None:
        self.table: list[int] = []  # block ids, in order
        self.tokens: list = []  # the token ids whose KV the request holds
        self.hashes: list[int] = []  # the chained hashes of its full blocks (inside ``limit`` tokens)
        self.limit = limit  # the blocks cached lie inside its first ``limit`` tokens (None: all)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, caching: bool = True) -> None:
        if not (isinstance(num_blocks, int) and num_blocks >= 0 and isinstance(block_size, int) and block_size >= 1):
            raise OpmapError(f"a KV cache needs num_blocks >= 0 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks, self.block_size, self.caching = num_blocks, block_size, caching
        self.ref = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.free_q: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))  # LRU first
        self.reqs: dict[int, _Req] = {}

    # -- what is there ------------------------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Blocks a request can take: free ones and cached ones no request holds (evictable)."""
        return len(self.free_q)

    def blocks_of(self, rid: int) -> list[int]:
        return list(self.reqs[rid].table)

    def block_hashes(self, tokens: Sequence[int]) -> list[int]:
        """The chained hash of each full block of ``tokens``."""
        bs, out, parent = self.block_size, [], None
        for i in range(len(tokens) // bs):
            parent = hash((parent, tuple(tokens[i * bs:(i + 1) * bs])))
            out.append(parent)
        return out

    def lookup(self, tokens: Sequence, most: int | None = None) -> int:
        """How many leading full blocks of ``tokens`` are cached (the longest cached prefix, in blocks; at most
        ``most``)."""
        if not self.caching:
            return 0
        k = 0
        for h in self.block_hashes(tokens):
            if h not in self.cached or (most is not None and k >= most):
                break
            k += 1
        return k

    # -- taking and giving back ---------------------------------------------------------------------------------

    def allocate(self, rid: int, tokens: Sequence, max_hit: int | None = None, cache_upto: int | None = None) -> bool:
        """Admit request ``rid`` holding the KV of ``tokens``: its longest cached prefix (at most ``max_hit``
        blocks) shared, new blocks for the rest. False (nothing taken) when the blocks are not there."""
        if rid in self.reqs:
            raise OpmapError(f"request {rid} already holds KV blocks")
        hashes = self.block_hashes(tokens) if self.caching else []
        if cache_upto is not None:
            hashes = hashes[:cache_upto // self.block_size]
        hit = []
        for h in hashes:
            b = self.cached.get(h)
            if b is None or (max_hit is not None and len(hit) >= max_hit):
                break
            hit.append(b)
        need = -(-len(tokens) // self.block_size) - len(hit)
        if need > len(self.free_q) - sum(1 for b in hit if self.ref[b] == 0):
            return False
        req = self.reqs[rid] = _Req(cache_upto)
        for b in hit:
            self._touch(b)
        req.table = hit
        req.hashes = hashes[:len(hit)]
        req.tokens = list(tokens[:len(hit) * self.block_size])
        self._grow(req, tokens[len(hit) * self.block_size:])
        return True

    def append(self, rid: int, tokens: Sequence[int]) -> bool:
        """Request ``rid`` computes the KV of ``tokens`` more: blocks taken as needed (a block that fills is
        hashed and cached). False (nothing taken) when the blocks are not there."""
        req = self.reqs[rid]
        need = -(-(len(req.tokens) + len(tokens)) // self.block_size) - len(req.table)
        if need > len(self.free_q):
            return False
        self._grow(req, tokens)
        return True

    def free(self, rid: int) -> None:
        """Request ``rid`` finished or was preempted: its blocks' refcounts drop; those at 0 go to the free queue's
        tail, the request's last block first (so its tail is evicted before its prefix, as vLLM frees)."""
        req = self.reqs.pop(rid)
        for b in reversed(req.table):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free_q[b] = None

    # -- inside ---------------------------------------------------------------------------------------------------

    def _touch(self, b: int) -> None:
        if self.ref[b] == 0:
            del self.free_q[b]
        self.ref[b] += 1

    def _take(self) -> int:
        """A block off the head of the free queue; a cached one is evicted (its hash forgotten)."""
        b, _ = self.free_q.popitem(last=False)
        h = self.hash_of[b]
        if h is not None:
            self.hash_of[b] = None
            if self.cached.get(h) == b:
                del self.cached[h]
        self.ref[b] = 1
        return b

    def _grow(self, req: _Req, tokens: Sequence[int]) -> None:
        bs = self.block_size
        req.tokens.extend(tokens)
        while len(req.table) * bs < len(req.tokens):
            req.table.append(self._take())
        if not self.caching:
            return
        full = len(req.tokens) if req.limit is None else min(len(req.tokens), req.limit)
        while len(req.hashes) < full // bs:  # blocks just filled: hash them, cache them
            i = len(req.hashes)
            h = hash((req.hashes[-1] if req.hashes else None, tuple(req.tokens[i * bs:(i + 1) * bs])))
            req.hashes.append(h)
            b = req.table[i]
            if self.hash_of[b] is None and h not in self.cached:
                self.hash_of[b] = h
                self.cached[h] = b
