"""The paged KV cache manager (serve/kv_cache.py) by hand: block counts are ceil(tokens / block_size), shared
prefixes are held once with a refcount per holder, freed blocks keep their hash until taken again (LRU, the
freed request's tail first)."""

from __future__ import annotations

import pytest

from opmap.errors import OpmapError
from opmap.serve.kv_cache import KVCacheManager


def _toks(tag: int, n: int, start: int = 0) -> list[int]:
    return [tag * 1_000_000 + start + i for i in range(n)]


def test_blocks_are_ceil_of_tokens_over_the_block_size():
    """16-token blocks, 10 in the pool: 33 tokens hold ceil(33/16) = 3 blocks (7 free); 15 more make 48, still
    3; one more, 49, a 4th (6 free)."""
    kv = KVCacheManager(10, 16)
    assert kv.allocate(0, _toks(1, 33))
    assert len(kv.blocks_of(0)) == 3 and kv.num_free == 7
    assert kv.append(0, _toks(1, 15, 33))
    assert len(kv.blocks_of(0)) == 3 and kv.num_free == 7
    assert kv.append(0, _toks(1, 1, 48))
    assert len(kv.blocks_of(0)) == 4 and kv.num_free == 6


def test_a_request_that_does_not_fit_takes_nothing():
    """4 blocks of 4: 17 tokens need ceil(17/4) = 5: refused, all 4 still free; 16 fit, then one more token
    needs a 5th block: refused, the request keeps its 4."""
    kv = KVCacheManager(4, 4)
    assert not kv.allocate(0, _toks(1, 17))
    assert kv.num_free == 4
    assert kv.allocate(1, _toks(2, 16)) and kv.num_free == 0
    assert not kv.append(1, [7])
    assert len(kv.blocks_of(1)) == 4
    with pytest.raises(OpmapError, match="already holds"):
        kv.allocate(1, [1])


def test_two_requests_share_a_three_block_prefix():
    """100 blocks of 16. A = a 48-token prefix P + 10 of its own: ceil(58/16) = 4 blocks. B = P + 5:
    its 3 leading blocks are A's (refcount 2), ceil(53/16) - 3 = 1 new: 5 distinct blocks held, 95 free.
    Freeing A leaves P's blocks at refcount 1 and frees A's own 4th block: 96 free."""
    kv = KVCacheManager(100, 16)
    prefix = _toks(9, 48)
    assert kv.allocate(0, prefix + _toks(1, 10))
    assert kv.lookup(prefix + _toks(2, 5)) == 3
    assert kv.allocate(1, prefix + _toks(2, 5))
    a, b = kv.blocks_of(0), kv.blocks_of(1)
    assert a[:3] == b[:3] and a[3] != b[3]
    assert [kv.ref[x] for x in a[:3]] == [2, 2, 2] and kv.ref[a[3]] == kv.ref[b[3]] == 1
    assert kv.num_free == 100 - 5
    kv.free(0)
    assert [kv.ref[x] for x in b[:3]] == [1, 1, 1]
    assert kv.num_free == 100 - 4


def test_freed_blocks_stay_cached_until_evicted_lru_tail_first():
    """6 blocks of 4. A holds blocks 0, 1 (8 tokens, both full and hashed), B blocks 2, 3. Freed A then B, the
    free queue is 4, 5 (never taken), then A's tail first: 1, 0, then B's: 3, 2. A prefix lookup still finds
    both of A's blocks. C, 11 tokens of its own (3 blocks, the last not full), takes them from the head: 4, 5
    and 1, evicting A's second block: its hash is forgotten, A's prefix is cached for 1 block, B's for 2.
    D = B's 8 tokens + 1 takes B's cached blocks 2, 3 back (refcount 1) and the last free block, 0."""
    kv = KVCacheManager(6, 4)
    a, b = _toks(1, 8), _toks(2, 8)
    assert kv.allocate(0, a) and kv.allocate(1, b)
    assert kv.blocks_of(0) == [0, 1] and kv.blocks_of(1) == [2, 3]
    kv.free(0)
    kv.free(1)
    assert list(kv.free_q) == [4, 5, 1, 0, 3, 2] and kv.num_free == 6
    assert kv.lookup(a) == 2 and kv.lookup(b) == 2
    h1 = kv.hash_of[1]
    assert kv.allocate(2, _toks(3, 11))
    assert kv.blocks_of(2) == [4, 5, 1]
    assert kv.hash_of[1] is None and h1 not in kv.cached
    assert kv.lookup(a) == 1 and kv.lookup(b) == 2
    # a cached block no one holds comes back with refcount 1 and leaves the free queue
    assert kv.allocate(3, b + _toks(4, 1))
    assert kv.blocks_of(3)[:2] == [2, 3] and kv.ref[2] == kv.ref[3] == 1 and kv.num_free == 0


def test_without_caching_nothing_is_shared():
    kv = KVCacheManager(10, 4, caching=False)
    assert kv.allocate(0, _toks(1, 8)) and kv.allocate(1, _toks(1, 8))
    assert kv.num_free == 6 and kv.lookup(_toks(1, 8)) == 0
