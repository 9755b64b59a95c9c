"""Prefix caching (opmap.serve.prefix) in the engine policy: the hit tokens per request and the hit rate of a run
against the formula (vLLM V1: full blocks of B tokens reused, at most (tokens - 1) // B of them, so the last token
is always computed), the prefill computed only after the cached prefix (TTFT with a 1 ms/token prefill), LRU
eviction of the blocks no request holds, and the counting scheduler held equal to the reference one (every request
visited, its blocks in the block manager), on synthetic step costs, a Hugging Face config and a zoo model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from opmap.errors import OpmapError
from opmap.record import record
from opmap.serve import Requests, TableCost, make_requests, simulate, summarize
from opmap.serve.kv_cache import KVCacheManager
from opmap.serve.policies import Engine
from opmap.serve.prefix import PrefixPool, PrefixShare, block_hashes, prompt_tokens
from opmap.serve.reference import reference_schedule

ROOT = Path(__file__).resolve().parents[2]


def _spaced(n, inp, out=2, gap=10.0):
    """n requests of ``inp`` prompt and ``out`` output tokens, ``gap`` s apart: each one done before the next."""
    return Requests(np.arange(n) * gap, np.full(n, inp), np.full(n, out), "trace:hand")


def _linear(cap=100_000):
    """prefill 1 ms per prompt token (so a chunk continuing a prompt costs 1 ms per token too: P(d + t) - P(d) = t
    ms), decode 0.1 ms a step (under the 1 ms of a one-token prompt: a prompt is priced no cheaper than a decode
    step, TableCost)."""
    return TableCost([1000], [1.0], [1], [0, 1000], [[1e-4, 1e-4]], kv_capacity_tokens=cap)


# -- what a prompt holds ------------------------------------------------------------------------------------------

def test_prompts_sharing_p_tokens_share_floor_p_over_b_blocks():
    """Two prompts of 100 tokens whose first 70 are the group's: floor(70 / 16) = 4 leading blocks hash alike, the
    5th (tokens 64-79) holds 6 tokens of each one's own text and differs; 100 // 16 = 6 full blocks each."""
    segs = PrefixShare(0.7).prompts(np.array([100, 100])).segments
    a, b = block_hashes(segs[0], 16), block_hashes(segs[1], 16)
    assert len(a) == len(b) == 6
    assert a[:4] == b[:4] and a[4] != b[4]
    assert sum(n for _, n in segs[0]) == 100 and prompt_tokens(segs[0])[69] == (0, 69)


def test_groups_share_within_a_group_only():
    """G = 3: request i in group i mod 3; requests 0 and 3 share their 50-token prefix, 0 and 1 nothing."""
    segs = PrefixShare(0.5, 3).prompts(np.array([100] * 4)).segments
    h = [block_hashes(s, 10) for s in segs]
    assert h[0][:5] == h[3][:5] and h[0][0] != h[1][0] and h[0][5] != h[3][5]


# -- hits and the prefill computed ----------------------------------------------------------------------------------

@pytest.mark.parametrize("inp,share,block,hit", [
    (1000, 0.9, 16, 896),  # P = 900: floor(900 / 16) = 56 blocks = 896 tokens
    (2048, 0.5, 16, 1024),  # P = 1024 = 64 blocks exactly
    (100, 0.35, 8, 32),  # P = 35: 4 blocks of 8
    (64, 1.0, 16, 48),  # the whole prompt cached: at most (64 - 1) // 16 = 3 blocks, the last token recomputed
    (65, 1.0, 16, 64),  # (65 - 1) // 16 = 4 blocks: all 4 full blocks reused, the 65th token computed
])
def test_hit_tokens_and_the_prefill_computed_follow_the_formula(inp, share, block, hit):
    """Requests one at a time: the first computes its whole prompt, each later one finds floor(P / B) x B tokens of
    the shared prefix P = floor(R x inp) cached (capped at (inp - 1) // B blocks: vLLM recomputes the last token),
    and its prefill computes the rest: TTFT = (inp - hit) x 1 ms."""
    n = 5
    reqs = PrefixShare(share).apply(_spaced(n, inp))
    res = simulate(reqs, Engine(kv_block=block), _linear())
    assert res.prefix_hit_tokens.tolist() == [0] + [hit] * (n - 1)
    np.testing.assert_allclose(res.first_s - res.arrival_s, [inp * 1e-3] + [(inp - hit) * 1e-3] * (n - 1))
    pc = summarize(res).engine.prefix_cache
    assert (pc.hit_tokens, pc.prompt_tokens) == ((n - 1) * hit, n * inp)
    assert pc.hit_rate == pytest.approx((n - 1) * hit / (n * inp))


def test_hit_rate_over_a_run_with_groups():
    """12 requests one at a time, G = 4 groups, prompts of 500 tokens, R = 0.8 (P = 400 = 25 blocks of 16): the
    first request of each group misses, the other 8 hit 400 tokens: hit rate 8 x 400 / (12 x 500) = 0.5333."""
    reqs = PrefixShare(0.8, 4).apply(_spaced(12, 500))
    res = simulate(reqs, Engine(), _linear())
    assert res.prefix_hit_tokens.tolist() == [0] * 4 + [400] * 8
    assert res.engine.prefix_cache.hit_rate == pytest.approx(8 * 400 / (12 * 500))


def test_a_cached_prefix_is_evicted_least_recently_freed_first():
    """A KV cache of 12 blocks of 16 tokens; prompts of 64 tokens (4 blocks), all of it the group's (R = 1), one
    output token (a request ends with its prefill); groups in the order A B C A D A C B, one at a time. A, B and C
    fill the 12 blocks; A again finds 3 of its blocks (48 tokens: the 4th holds the last token, recomputed) and is
    freed last; D, missing, takes the 4 blocks at the head of the free queue: B's, the least recently freed, not A's.
    Then A hits 48 tokens again, C too, B misses."""
    from opmap.serve.prefix import Prompts

    groups = [0, 1, 2, 0, 3, 0, 2, 1]
    reqs = replace(_spaced(len(groups), 64, out=1), prompt=Prompts(tuple(((g, 64),) for g in groups), "hand"))
    want = [0, 0, 0, 48, 0, 48, 48, 0]
    assert simulate(reqs, Engine(kv_block=16), _linear(cap=12 * 16)).prefix_hit_tokens.tolist() == want
    assert reference_schedule(reqs, Engine(kv_block=16), _linear(cap=12 * 16)).hit == want


def test_the_pool_frees_a_request_tail_first_and_evicts_from_the_head():
    """4 blocks; a request holds 3 (2 full prompt blocks cached, h1 and h2, then an uncached tail block) and leaves:
    the queue is [1 never used, tail, h2, h1]. Taking 3 evicts h2 (h1 stays): its prefix is then 1 block long."""
    pool = PrefixPool(4)
    pool.take(3)
    held = [pool.fill(11), pool.fill(12)]
    assert pool.release(held, 3) == 3
    assert pool.lookup([11, 12], 2) == (2, 2)
    pool.take(3)
    assert pool.lookup([11, 12], 2) == (1, 1)
    m = KVCacheManager(4, 2)  # the block manager the reference runs: the same order
    assert m.allocate(0, ["a", "b", "c", "d", "e"])
    m.free(0)
    assert m.allocate(1, ["x", "y", "z", "w", "v"][:5]) and m.lookup(["a", "b", "c", "d"]) == 1


# -- the counting scheduler is the reference one -----------------------------------------------------------------

def _same_as_reference(reqs, pol, cost):
    res = simulate(reqs, pol, cost)
    ref = reference_schedule(reqs, pol, cost)
    np.testing.assert_allclose(res.start_s, ref.start)
    np.testing.assert_allclose(res.first_s, ref.first)
    np.testing.assert_allclose(res.finish_s, ref.finish)
    np.testing.assert_array_equal(res.preemptions, ref.preemptions)
    np.testing.assert_array_equal(res.prefix_hit_tokens, ref.hit)
    assert res.engine.prefix_cache.recompute_hit_tokens == ref.rehit
    assert float((res.itl_gap_s * res.itl_weight).sum()) == pytest.approx(sum(ref.gaps))
    return res, ref


@pytest.mark.parametrize("share,groups", [(0.0, 1), (0.5, 1), (0.9, 3)])
@pytest.mark.parametrize("seed,cap,pol", [(1, 2048, Engine(32, 256, 16)), (2, 1000, Engine(8, 64, 8)),
                                          (4, 600, Engine(4, 16, 1)),
                                          (5, 1000, Engine(8, 700, 8, chunked_prefill=False)),
                                          (6, 2048, Engine(32, 256, 16, no_evict=True))])
def test_the_counting_scheduler_is_the_reference_with_shared_prefixes(seed, cap, pol, share, groups):
    """Random traces under KV pressure (preemptions, cached blocks evicted, recomputes finding their prompt's blocks),
    synthetic step costs; chunked and whole prefill, no-evict admission."""
    reqs = PrefixShare(share, groups).apply(make_requests("poisson:30", "uniform:1,300", "uniform:1,200", 250,
                                                          seed=seed))
    cost = TableCost([16, 100, 4000], [0.0025, 0.02, 0.5], [1, 64], [0, 1e5], [[0.008, 0.02], [0.012, 0.03]],
                     kv_capacity_tokens=cap)
    res, ref = _same_as_reference(reqs, pol, cost)
    if share and not pol.no_evict:
        assert sum(ref.preemptions) > 0 and res.prefix_hit_tokens.sum() > 0


@pytest.mark.parametrize("model", ["examples/tiny-llama.json", "gpt2"])
def test_shared_prefixes_on_priced_models(model):
    """A Hugging Face config and a zoo model priced by opmap's cost model on an H100 (model_table_cost), the KV cache
    cut to 3000 tokens: the counting scheduler is the reference one, and TTFT p50 falls with R = 0.9 (each prompt
    computes about a tenth of its tokens once its group's prefix is cached)."""
    from opmap.serve.model_cost import model_table_cost

    cost = replace(model_table_cost(str(ROOT / model) if model.endswith(".json") else model, "h100-sxm"),
                   kv_capacity_tokens=3000)
    base = make_requests("poisson:200", "uniform:200,400", "uniform:1,300", 200, seed=7)
    p50 = {}
    for share in (0.0, 0.9):
        res, _ = _same_as_reference(PrefixShare(share, 2).apply(base), Engine(32, 512, 16), cost)
        p50[share] = float(np.median(res.first_s - res.arrival_s))
    assert p50[0.9] < 0.6 * p50[0.0]


def test_without_shared_prompts_nothing_changes():
    """No ``Requests.prompt``: no prefix cache, the run as before (no prefix_cache in serve.json)."""
    reqs = make_requests("poisson:30", "uniform:1,300", "uniform:1,200", 100, seed=3)
    res = simulate(reqs, Engine(8, 64, 8), _linear(cap=1000))
    assert res.prefix_hit_tokens is None and "prefix_cache" not in record(summarize(res))


def test_prefix_share_is_checked_and_needs_the_engine_policy():
    from opmap.serve.policies import Continuous

    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(OpmapError, match="--prefix-share"):
            PrefixShare(bad)
    with pytest.raises(OpmapError, match="--prefix-groups"):
        PrefixShare(0.5, 0)
    reqs = PrefixShare(0.5).apply(_spaced(3, 100))
    with pytest.raises(OpmapError, match="use --policy engine"):
        simulate(reqs, Continuous(), _linear())


def test_a_capacity_search_keeps_the_shared_prefixes():
    """--find-capacity draws its requests again at each rate (RateProbe): with the same prompts' shares, so the runs
    it compares all find the prefix cached; the measured window keeps each request's hit tokens."""
    from opmap.serve.arrivals import parse_arrival, parse_length
    from opmap.serve.capacity import RateProbe, steady_window

    probe = RateProbe(parse_arrival("poisson:5"), parse_length(300), parse_length(4), 40, Engine(), _linear(),
                      prefix=PrefixShare(0.5, 2))
    reqs = probe._requests(50.0)
    assert reqs.prompt.source == "share:0.5,groups:2" and len(reqs.prompt) == 40
    res = probe.result(5.0)
    assert res.prefix_hit_tokens[2:].tolist() == [144] * (len(res.arrival_s) - 2)  # floor(150 / 16) x 16
    part = steady_window(res, np.arange(5, 10))
    assert part.prefix_hit_tokens.tolist() == [144] * 5
