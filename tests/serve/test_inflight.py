"""Policy engine (in-flight batching, paged KV, preemption by recompute) by hand: every time below is worked
out in the docstring from the hand-built step costs, never read off the code under test. Then the counting
scheduler against the reference one (serve/reference.py) that visits every request every step, written from
vLLM V1's scheduler loop."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from opmap.errors import OpmapError
from opmap.record import record
from opmap.serve import Requests, TableCost, make_requests, simulate, summarize
from opmap.serve.cost import mixed_s
from opmap.serve.policies import Chunked, Engine
from opmap.serve.reference import reference_schedule
from opmap.serve.run_stats import Preemptions

ROOT = Path(__file__).resolve().parents[2]


def _reqs(arr, inp, out):
    return Requests(np.asarray(arr, float), np.asarray(inp), np.asarray(out), "trace:hand")


def _cost(cap=None, kv_s_per_token=0.0):
    """prefill: 1 ms per prompt token (one point, so prefill_s(n) = n ms exactly); decode: 10 ms whatever the
    batch, plus ``kv_s_per_token`` per KV token read (two KV points: exact)."""
    return TableCost([1000], [1.0], [1], [0, 1000], [[0.01, 0.01 + 1000 * kv_s_per_token]], kv_capacity_tokens=cap)


# -- (a) the token budget splits a long prompt into chunks ----------------------------------------------------

def test_a_long_prompt_is_prefilled_in_budget_sized_chunks():
    """max_num_batched_tokens 4096, one prompt of 10,000 tokens: chunks of 4096, 4096 and 10,000 - 8192 = 1808
    tokens in three steps; TTFT = (4096 + 4096 + 1808) x 1 ms = 10.000 s."""
    res = simulate(_reqs([0], [10_000], [1]), Engine(max_num_batched_tokens=4096), _cost())
    assert res.steps == 3
    assert res.first_s[0] == pytest.approx(10.0)


def test_a_chunk_attends_to_the_earlier_chunks_of_its_prompt():
    """A prompt priced 1 ms/token up to 4096 tokens and 2 ms/token beyond (attention grows with the prefix):
    P(4096) = 4.096 s, P(8192) = 12.288 s, P(10,000) = 12.288 + 1808 x 2 ms = 15.904 s. Chunked at 4096, the
    chunk (d, t) costs P(t) + P(d + t) - P(d) - P(t) + P(0) = P(d + t) - P(d) (mixed_s): 4.096, then
    12.288 - 4.096 = 8.192, then 15.904 - 12.288 = 3.616; TTFT 15.904 s, the prompt's cost in one step
    (without the prefix term: 4.096 + 4.096 + 1.808 = 10.0 s, chunking made a long prompt 37% cheaper)."""
    cost = TableCost([0, 4096, 8192], [0.0, 4.096, 12.288], [1], [0], [[0.01]])
    res = simulate(_reqs([0], [10_000], [1]), Engine(max_num_batched_tokens=4096), cost)
    assert res.first_s[0] == pytest.approx(15.904)
    assert mixed_s(cost, 1808, 1, 0, 0, [(8192, 1808)]) == pytest.approx(3.616)
    assert mixed_s(cost, 1808, 1, 0, 0) == pytest.approx(1.808)


def test_running_decodes_take_their_token_of_the_budget_first():
    """Budget 4096; D (16 prompt, 3 out) then A (10,000 prompt, 1 out), both at 0; decode 10 ms + 10 us/KV token.
    step 1: no decodes: D 16 + A 4080 = 4096 tokens, 4.096 s. D's first token at 4.096.
    step 2: D decodes (KV 16 + 1 = 17), A gets 4096 - 1 = 4095: prefill of 4096 tokens (the weights read once,
            mixed_s) + D's KV read 17 x 10 us = 4.09617 s; ends 8.19217 (D's 2nd token).
    step 3: D decodes (KV 18), A's last 10,000 - 4080 - 4095 = 1825: prefill of 1826 + 0.18 ms = 1.82618 s;
            ends 10.01835: A's first (and only) token, D's 3rd and last.
    """
    res = simulate(_reqs([0, 0], [16, 10_000], [3, 1]), Engine(max_num_batched_tokens=4096), _cost(None, 1e-5))
    assert res.steps == 3
    np.testing.assert_allclose(res.first_s, [4.096, 10.01835])
    np.testing.assert_allclose(res.finish_s, [10.01835, 10.01835])
    s = record(summarize(res))
    assert s["latency"]["itl"]["mean_s"] == pytest.approx((4.09617 + 1.82618) / 2)  # D's two gaps


def test_without_chunked_prefill_a_prompt_waits_to_fit_whole():
    """engine:nochunk, budget 64: A (40 prompt) and B (40) at 0, 2 tokens out each. Step 1: A alone (B's 40
    do not fit the 24 left), 40 ms. Step 2: A decodes (1 token), B's 40 fit the 63 left: prefill of 41 tokens,
    41 ms, ends 0.081: A done, B's first token. Step 3: B decodes, 10 ms: done at 0.091."""
    res = simulate(_reqs([0, 0], [40, 40], [2, 2]), Engine(4, 64, 16, chunked_prefill=False), _cost())
    np.testing.assert_allclose(res.first_s, [0.04, 0.081])
    np.testing.assert_allclose(res.finish_s, [0.081, 0.091])
    with pytest.raises(OpmapError, match="without chunked prefill"):
        simulate(_reqs([0], [100], [2]), Engine(4, 64, 16, chunked_prefill=False), _cost())


# -- vLLM V0's default scheduler (nomix): prompt steps apart from decode steps -----------------------------------

def test_nomix_a_prompt_arriving_during_a_decode_step_gets_a_step_of_its_own():
    """engine:nochunk,nomix (vLLM 0.4's ``_schedule_default``), prefill 1 ms/token, decode 10 ms. A (40 prompt,
    3 out) at 0, B (20 prompt, 2 out) at 0.045. Step 1: A's prompt, 0 -> 0.040 (A's first token). Step 2: nothing
    waits, so A decodes, 0.040 -> 0.050. Step 3: B waits, so the step is B's prompt alone, 20 ms, 0.050 -> 0.070
    (A sits it out): B's TTFT = 0.005 (the rest of the decode step it arrived in) + 0.020 = 0.025 s. Step 4: both
    decode, 0.070 -> 0.080: A's last token (its gap 0.080 - 0.050 = 0.030 spans B's prompt step), B's last (gap
    0.010). A's TPOT = (0.080 - 0.040) / 2 = 0.020 s. Mixing B's prompt with A's decode (vLLM V1) instead runs
    step 3 as 21 tokens, 0.050 -> 0.071, B first at 0.071."""
    pol = Engine(4, 64, 16, chunked_prefill=False, no_mix=True)
    res = simulate(_reqs([0, 0.045], [40, 20], [3, 2]), pol, _cost())
    np.testing.assert_allclose(res.first_s, [0.040, 0.070])
    np.testing.assert_allclose(res.first_s - res.arrival_s, [0.040, 0.025])
    np.testing.assert_allclose(res.finish_s, [0.080, 0.080])
    np.testing.assert_allclose(np.sort(np.repeat(res.itl_gap_s, res.itl_weight.astype(int))), [0.01, 0.01, 0.03])
    assert res.steps == 4
    mixed = simulate(_reqs([0, 0.045], [40, 20], [3, 2]), Engine(4, 64, 16, chunked_prefill=False), _cost())
    np.testing.assert_allclose(mixed.first_s, [0.040, 0.071])


def test_nomix_keeps_one_percent_of_the_blocks_free_at_admission():
    """vLLM V0's block manager admits a prompt only while int(0.01 x blocks) stay free after it (its watermark):
    1600 tokens of KV in blocks of 16 = 100 blocks, watermark 1. A and B (800-token prompts, 50 blocks each; 2
    out) at 0: A is admitted (50 left), B is not (0 < 1 left). A's prompt 0 -> 0.8; B still does not fit, so A
    decodes (its 801st token's KV takes block 51), 0.8 -> 0.81, and finishes; B's prompt 0.81 -> 1.61, its
    decode 1.61 -> 1.62. Without the watermark both prompts would run in one 1.6 s step."""
    pol = Engine(4, 2048, 16, chunked_prefill=False, no_mix=True)
    res = simulate(_reqs([0, 0], [800, 800], [2, 2]), pol, _cost(cap=1600))
    np.testing.assert_allclose(res.first_s, [0.8, 1.61])
    np.testing.assert_allclose(res.finish_s, [0.81, 1.62])
    assert not res.preemptions.any()


# -- (b) preemption when the KV blocks run out ----------------------------------------------------------------

def test_preemption_by_recompute_when_blocks_run_out():
    """4 blocks of 16 tokens (capacity 64; 70 gives floor(70 / 16) = 4 as well). A (16 prompt, 40 out) and
    B (16 prompt, 30 out) at 0; prefill 1 ms/token, decode 10 ms.
    step 1: both prompts, 32 tokens, 32 ms: one block each (2 free). First tokens at 0.032.
    The step emitting token k computes KV for 16 + k - 1 tokens: a new block when that passes 16, 32, 48:
    at token 2 both take their 2nd block (0 free); at token 18 both need a 3rd: none free, B (the most
    recently admitted) is preempted at the start of that step, t = 0.032 + 16 x 10 ms = 0.192, freeing its 2
    blocks, and has emitted 17 tokens (its 17th at 0.192). A alone goes on: token k at 0.032 + (k - 1) x 0.01,
    its 4th block at token 34 (1 free before), done with token 40 at 0.422, freeing 4 blocks.
    B waits meanwhile (its recompute of 16 + 17 = 33 tokens needs 3 blocks; 1 free). At 0.422 it is
    re-admitted: prefill of 33 tokens, 33 ms, its 18th token at 0.455 (a gap of 0.263 s), then tokens 19..30
    at 10 ms each: done at 0.455 + 0.12 = 0.575 (its 3 blocks hold up to 48 tokens; it ends at 45)."""
    for cap in (64, 70):
        res = simulate(_reqs([0, 0], [16, 16], [40, 30]), Engine(4, 64, 16), _cost(cap))
        np.testing.assert_allclose(res.first_s, [0.032, 0.032])
        np.testing.assert_allclose(res.finish_s, [0.422, 0.575])
        np.testing.assert_array_equal(res.preemptions, [0, 1])
        assert res.engine.preemptions == Preemptions(total=1, requests_preempted=1, max_per_request=1)
        assert res.engine.kv_cache.blocks == 4 and res.engine.kv_cache.peak_blocks_used == 4
    s = record(summarize(res))
    assert s["preemptions"] == {"total": 1, "requests_preempted": 1, "max_per_request": 1}
    assert s["kv_cache"] == {"paged": True, "kv_block": 16, "blocks": 4, "capacity_tokens": 70,
                             "peak_blocks_used": 4, "preemption": "recompute"}  # the last cap: 70 tokens
    # gaps: A 39 of 10 ms; B 16 of 10 ms (tokens 2..17), 0.263 s, 12 of 10 ms (tokens 19..30)
    assert s["latency"]["itl"]["mean_s"] == pytest.approx((0.39 + 0.28 + 0.263) / 68)
    assert s["latency"]["itl"]["p50_s"] == pytest.approx(0.01)
    # B's TPOT carries its stall: (0.575 - 0.032) / 29
    assert sorted(s["cdf"]["tpot_s"])[-1] == pytest.approx((0.575 - 0.032) / 29)


def test_guaranteed_no_evict_admits_only_what_fits_to_the_last_token():
    """The preemption case above under TensorRT-LLM's GUARANTEED_NO_EVICT: 4 blocks of 16. A (16 prompt, 40 out)
    reserves ceil((16 + 40 - 1) / 16) = 4 blocks, all of them, so B (16 + 30 - 1 = 45 tokens, 3 blocks) waits
    for A to finish. A alone: prefill 16 ms (first token 0.016), 39 decodes of 10 ms: done at 0.406. B: prefill
    16 ms from 0.406 (first token 0.422), 29 decodes: done at 0.712. No preemption."""
    res = simulate(_reqs([0, 0], [16, 16], [40, 30]), Engine(4, 64, 16, no_evict=True), _cost(64))
    np.testing.assert_allclose(res.first_s, [0.016, 0.422])
    np.testing.assert_allclose(res.finish_s, [0.406, 0.712])
    np.testing.assert_array_equal(res.preemptions, [0, 0])
    # with room for both reservations (4 + 3 = 7 blocks) they run together as without no_evict: prefill of
    # 32 tokens (32 ms), then 10 ms decodes: B done at 0.032 + 29 x 0.01 = 0.322, A at 0.032 + 0.39 = 0.422
    res = simulate(_reqs([0, 0], [16, 16], [40, 30]), Engine(4, 64, 16, no_evict=True), _cost(7 * 16))
    np.testing.assert_allclose(res.finish_s, [0.422, 0.322])


def test_a_request_that_never_fits_is_refused_in_one_line():
    """64 tokens of KV (4 blocks of 16): 16 prompt + 49 out holds at most 16 + 48 = 64 tokens, fits; 50 out
    would hold 65 tokens, 5 blocks."""
    simulate(_reqs([0], [16], [49]), Engine(4, 64, 16), _cost(64))
    with pytest.raises(OpmapError, match=r"needs 65 tokens of KV cache \(5 blocks of 16\), the device holds 64 "
                                         r"\(4 blocks\)") as e:
        simulate(_reqs([0], [16], [50]), Engine(4, 64, 16), _cost(64))
    assert "\n" not in str(e.value)


# -- (c) max_num_seqs caps the running batch ------------------------------------------------------------------

def test_max_num_seqs_caps_the_running_batch():
    """max_num_seqs 2: three requests of 10 prompt and 3 output tokens at 0. A and B run (prefill 20 tokens,
    20 ms; decodes at 0.03, 0.04: done); C is admitted only at 0.04 (prefill 10 ms, first token 0.05, done
    0.07). With max_num_seqs 3 all three prefill together (30 ms) and finish at 0.05."""
    res = simulate(_reqs([0, 0, 0], [10, 10, 10], [3, 3, 3]), Engine(2, 64, 16), _cost())
    np.testing.assert_allclose(res.start_s, [0, 0, 0.04])
    np.testing.assert_allclose(res.first_s, [0.02, 0.02, 0.05])
    np.testing.assert_allclose(res.finish_s, [0.04, 0.04, 0.07])
    assert res.steps == 6
    res = simulate(_reqs([0, 0, 0], [10, 10, 10], [3, 3, 3]), Engine(3, 64, 16), _cost())
    np.testing.assert_allclose(res.finish_s, [0.05] * 3)


# -- against other schedulers ---------------------------------------------------------------------------------

def test_without_a_kv_limit_engine_is_sarathi_chunked():
    """No KV capacity: no blocks to run out, so engine is the chunked policy's schedule (decodes first, partial
    prompts, then new ones under max_num_seqs) step for step."""
    reqs = make_requests("poisson:40", "uniform:10,3000", "uniform:1,200", 300, seed=5)
    cost = TableCost([100, 4000], [0.02, 0.5], [1, 64], [0, 1e5], [[0.008, 0.02], [0.012, 0.03]])
    a = simulate(reqs, Engine(16, 512, 16), cost)
    b = simulate(reqs, Chunked(512, max_seqs=16), cost)
    for k in ("start_s", "first_s", "finish_s"):
        np.testing.assert_allclose(getattr(a, k), getattr(b, k))
    sa, sb = record(summarize(a)), record(summarize(b))
    assert sa["latency"]["itl"] == pytest.approx(sb["latency"]["itl"])


def _same_as_reference(reqs, pol, cost, min_preemptions):
    """The counting scheduler against the reference one (serve/reference.py: every request visited every step,
    its blocks in the block manager): the same times, preemptions and token gaps."""
    res = simulate(reqs, pol, cost)
    ref = reference_schedule(reqs, pol, cost)
    assert sum(ref.preemptions) >= min_preemptions
    np.testing.assert_allclose(res.start_s, ref.start)
    np.testing.assert_allclose(res.first_s, ref.first)
    np.testing.assert_allclose(res.finish_s, ref.finish)
    np.testing.assert_array_equal(res.preemptions, ref.preemptions)
    assert res.itl_weight.sum() == len(ref.gaps)
    assert float((res.itl_gap_s * res.itl_weight).sum()) == pytest.approx(sum(ref.gaps))
    gaps = np.repeat(res.itl_gap_s, res.itl_weight.astype(np.int64))  # every gap, not their sum alone
    np.testing.assert_allclose(np.sort(gaps), np.sort(ref.gaps))


@pytest.mark.parametrize("seed,cap,pol", [(1, 2048, Engine(32, 256, 16)), (2, 1000, Engine(8, 64, 8)),
                                          (3, 4096, Engine(64, 512, 32)), (4, 600, Engine(4, 16, 1))])
def test_the_counting_scheduler_is_the_plain_one(seed, cap, pol):
    """Random traces under KV pressure (many preemptions), synthetic step costs."""
    reqs = make_requests("poisson:30", "uniform:1,300", "uniform:1,200", 250, seed=seed)
    cost = TableCost([16, 100, 4000], [0.0025, 0.02, 0.5], [1, 64], [0, 1e5], [[0.008, 0.02], [0.012, 0.03]],
                     kv_capacity_tokens=cap)
    _same_as_reference(reqs, pol, cost, 11)


@pytest.mark.parametrize("seed,cap,pol,preempted", [
    (5, 1000, Engine(8, 700, 8, chunked_prefill=False), 5),  # nochunk: a prompt (and its recompute) whole
    (6, 2048, Engine(32, 256, 16, no_evict=True), 0),  # GUARANTEED_NO_EVICT: admitted only with its KV to the end
    (7, 1000, Engine(8, 700, 8, chunked_prefill=False, no_evict=True), 0),
    (8, 1000, Engine(8, 700, 8, chunked_prefill=False, no_mix=True), 5)])  # vLLM V0: prompt steps apart
def test_the_counting_scheduler_is_the_plain_one_without_chunking_or_eviction(seed, cap, pol, preempted):
    """The engine's other modes against the reference: without chunked prefill (the budget 700 holds the
    longest recompute, 300 + 200 - 1 tokens) and with TensorRT-LLM's no-evict admission, which never preempts."""
    reqs = make_requests("poisson:30", "uniform:1,300", "uniform:1,200", 250, seed=seed)
    cost = TableCost([16, 100, 4000], [0.0025, 0.02, 0.5], [1, 64], [0, 1e5], [[0.008, 0.02], [0.012, 0.03]],
                     kv_capacity_tokens=cap)
    _same_as_reference(reqs, pol, cost, preempted)
    if pol.no_evict:
        assert not simulate(reqs, pol, cost).preemptions.any()


@pytest.mark.parametrize("pol,preempted", [(Engine(32, 512, 16), 5),
                                           (Engine(32, 1024, 16, chunked_prefill=False), 5),
                                           (Engine(32, 1024, 16, chunked_prefill=False, no_mix=True), 5),
                                           (Engine(32, 512, 16, no_evict=True), 0)])
@pytest.mark.parametrize("model,arrival,cap", [("examples/tiny-llama.json", "poisson:400", 3000),
                                               ("gpt2", "poisson:100", 3000)])
def test_the_counting_scheduler_is_the_plain_one_on_priced_models(model, arrival, cap, pol, preempted):
    """A Hugging Face config and a zoo model priced by opmap's cost model on an H100 (model_table_cost), the KV
    cache cut to ``cap`` tokens so that requests are preempted (but under no-evict admission); without chunked
    prefill the budget, 1024, holds the longest recompute (400 + 300 - 1 tokens)."""
    from opmap.serve.model_cost import model_table_cost

    cost = replace(model_table_cost(str(ROOT / model) if model.endswith(".json") else model, "h100-sxm"),
                   kv_capacity_tokens=cap)
    reqs = make_requests(arrival, "uniform:16,400", "uniform:1,300", 200, seed=7)
    _same_as_reference(reqs, pol, cost, preempted)


def test_ten_thousand_requests_simulate_fast():
    """The scheduler counts decodes instead of visiting them: 10,000 requests (about 1.3M tokens) in well under
    the 3 s a whole serve process may take (a 2-core shared CI box; about 0.3 s on a workstation)."""
    reqs = make_requests("poisson:100", "uniform:64,1024", "uniform:16,256", 10_000, seed=0)
    cost = TableCost([128, 2048], [0.01, 0.12], [1, 256], [0, 1 << 22], [[0.006, 0.06], [0.012, 0.07]],
                     kv_capacity_tokens=400_000)
    t = time.perf_counter()
    res = simulate(reqs, Engine(), cost)
    assert time.perf_counter() - t < 5.0
    assert np.all(res.finish_s >= res.first_s)
