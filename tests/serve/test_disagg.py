"""Disaggregated prefill / decode serving (DistServe, Zhong et al. OSDI 2024; Splitwise, Patel et al. ISCA 2024).

Expected times are written out by hand from the step costs: prefill of L tokens takes ``PRE_S_PER_TOKEN * L``,
a decode iteration takes ``DEC_S`` whatever its batch, and moving a prompt's KV takes
``LAT + L * BYTES / BW``."""

from __future__ import annotations

import numpy as np
import pytest

from opmap.errors import OpmapError
from opmap.hardware import get_hardware
from opmap.record import record
from opmap.serve import Requests, Slo, TableCost, simulate, summarize
from opmap.serve.disagg import KvTransfer, kv_transfer_for, parse_disaggregate, simulate_disaggregated
from opmap.serve.policies import Continuous, Static

PRE_S_PER_TOKEN = 1e-3  # prefill: 1 ms per prompt token
DEC_S = 0.01  # decode: 10 ms per iteration, flat in batch and KV
COST = TableCost([1000], [1000 * PRE_S_PER_TOKEN], [1], [0], [[DEC_S]])
XFER = KvTransfer(bytes_per_token=1e6, bandwidth_bytes_per_s=1e9, latency_s=0.002)  # 1 ms per token + 2 ms


def _reqs(arr, inp, out):
    return Requests(np.asarray(arr, float), np.asarray(inp), np.asarray(out), "trace:hand")


def test_one_request_by_hand():
    """TTFT = prefill(100) = 0.1 s; KV moved in 0.002 + 100 x 1e6 / 1e9 = 0.102 s; then 9 decode iterations:
    finish = 0.1 + 0.102 + 9 x 0.01 = 0.292 s. The first inter-token gap carries the transfer: 0.112 s."""
    res = simulate_disaggregated(_reqs([0.0], [100], [10]), Continuous(), COST, 1, 1, XFER)
    assert res.first_s[0] == pytest.approx(0.1)
    assert res.finish_s[0] == pytest.approx(0.1 + 0.102 + 9 * DEC_S)
    gaps = np.repeat(res.itl_gap_s, res.itl_weight.astype(int))
    assert sorted(gaps) == pytest.approx(sorted([0.102 + DEC_S] + [DEC_S] * 8))
    s = record(summarize(res, Slo()))
    assert s["disaggregation"]["kv_transfer_s"]["mean_s"] == pytest.approx(0.102)
    assert s["replicas"] == 2 and len(s["utilization"]) == 2


def test_decode_pool_kv_capacity_makes_the_second_request_wait():
    """Two prompts of 50 arrive together; the prefill replica holds both (50 + 1 tokens each in 110) and
    prefills them in one step of 100 tokens (0.1 s). The decode replica holds one whole request (50 + 60 = 110
    tokens) at a time: the first moves at once, lands at 0.1 + 0.002 + 50 x 1e-3 = 0.152 s and finishes at
    0.152 + 59 x 0.01 = 0.742 s. The second's KV stays on the prefill replica until then (back-pressure: the decode
    replica has no room to receive it), moves at 0.742 s, lands at 0.794 s and finishes at 0.794 + 0.59 = 1.384 s;
    it waited 0.742 - 0.1 = 0.642 s between its first token and its transfer. (Before back-pressure: moved at
    0.1 s, admitted at 0.742 s, finished 1.332 s.)"""
    cost = TableCost([1000], [1.0], [1], [0], [[DEC_S]], kv_capacity_tokens=110)
    res = simulate_disaggregated(_reqs([0.0, 0.0], [50, 50], [60, 60]), Continuous(), cost, 1, 1, XFER)
    assert res.first_s == pytest.approx([0.1, 0.1])
    assert sorted(res.finish_s) == pytest.approx([0.742, 1.384])
    s = record(summarize(res))
    assert s["disaggregation"]["decode_admission_wait_s"]["max_s"] == pytest.approx(0.642)
    assert s["disaggregation"]["kv_held_on_prefill_s"]["max_s"] == pytest.approx(0.642)


def _held_on_prefill(start_s, xfer_s, tokens):
    """The most KV tokens held on one prefill replica at once: request i holds ``tokens[i]`` from ``start_s[i]``
    (admitted) to ``xfer_s[i]`` (its transfer starts); at a tie a release comes before an admission."""
    events = sorted([(t, 0, -k) for t, k in zip(xfer_s, tokens)] + [(t, 1, k) for t, k in zip(start_s, tokens)])
    held = most = 0
    for _, _, k in events:
        held += k
        most = max(most, held)
    return most


def test_back_pressure_a_full_decode_pool_holds_prefill_back():
    """Four prompts of 100 (11 output tokens each) arrive at 0. Prefill: 1 ms a token, KV for two requests
    (2 x (100 + 1) = 202 tokens); decode: 10 ms an iteration, KV for exactly one request (100 + 11 = 111 tokens);
    a transfer takes 0.002 + 100 x 1e-3 = 0.102 s, a decode 10 iterations = 0.1 s, so a request finishes 0.202 s
    after its transfer starts, and the k-th transfer starts when the (k-1)-th request finishes:

    ====  =========  ===========  ==================  =====================
    req   admitted   first token  transfer starts     finish (+ 0.202)
    ====  =========  ===========  ==================  =====================
    0     0          0.2          0.2                 0.402
    1     0          0.2          0.402 (0 finishes)  0.604
    2     0.2 (0's   0.3          0.604 (1 finishes)  0.806
          KV left)
    3     0.402      0.502        0.806 (2 finishes)  1.008
    ====  =========  ===========  ==================  =====================

    Request 3 waits for prefill from 0.3 to 0.402: the prefill replica is idle with its KV full of requests 1 and
    2, which the decode pool cannot take (without back-pressure it would be prefilled with request 2 by 0.4)."""
    pre = TableCost([1000], [1000 * PRE_S_PER_TOKEN], [1], [0], [[DEC_S]], kv_capacity_tokens=202)
    dec = TableCost([1000], [1000 * PRE_S_PER_TOKEN], [1], [0], [[DEC_S]], kv_capacity_tokens=111)
    reqs = _reqs([0.0] * 4, [100] * 4, [11] * 4)
    res = simulate_disaggregated(reqs, Continuous(), pre, 1, 1, XFER, decode_cost=dec)
    assert res.start_s == pytest.approx([0.0, 0.0, 0.2, 0.402])
    assert res.first_s == pytest.approx([0.2, 0.2, 0.3, 0.502])
    assert res.finish_s == pytest.approx([0.402, 0.604, 0.806, 1.008])
    xfer_s = [0.2, 0.402, 0.604, 0.806]
    assert np.asarray(res.finish_s) - 0.202 == pytest.approx(xfer_s)
    assert _held_on_prefill(res.start_s, xfer_s, [101] * 4) == 202  # full, never over its capacity
    d = record(summarize(res))["disaggregation"]
    assert d["kv_held_on_prefill_s"]["max_s"] == pytest.approx(0.604 - 0.3)  # requests 2 and 3: 0.304 s
    assert d["decode_cost"]["kv_capacity_tokens"] == 111


@pytest.mark.parametrize("model", ["examples/tiny-llama.json", "gpt2"])
def test_back_pressure_on_priced_models(model):
    """A Hugging Face config and a zoo model priced by model_table_cost on h100-sxm; the decode pool's KV cut to
    one request's reservation. Every request's transfer then waits for the one before it to finish (one decode
    replica, first come first served): no two requests decode at once, prefill never holds more KV than it has."""
    from dataclasses import replace
    from pathlib import Path

    from opmap.serve.model_cost import model_table_cost

    root = Path(__file__).resolve().parents[2]
    cost = model_table_cost(str(root / model) if model.endswith(".json") else model, "h100-sxm")
    inp, out = 64, 16
    dec = replace(cost, kv_capacity_tokens=inp + out)
    pre = replace(cost, kv_capacity_tokens=3 * (inp + 1))
    n = 6
    res = simulate_disaggregated(_reqs([0.0] * n, [inp] * n, [out] * n), Continuous(), pre, 1, 1, XFER,
                                 decode_cost=dec)
    move = 0.002 + inp * 1e-3
    order = np.argsort(res.finish_s)
    fin = np.asarray(res.finish_s)[order]
    assert np.all(np.diff(fin) >= move - 1e-12)  # the next one moves only when the last has finished
    xfer_s = np.concatenate([[res.first_s[order[0]]], fin[:-1]])  # k-th transfer at the (k-1)-th finish
    assert np.all(xfer_s >= np.asarray(res.first_s)[order] - 1e-12)
    assert _held_on_prefill(np.asarray(res.start_s)[order], xfer_s, [inp + 1] * n) <= 3 * (inp + 1)


def test_decodes_no_longer_wait_for_prefills():
    """Colocated continuous batching runs a prefill iteration on its own, so a running decode stalls for the
    whole prefill of a newcomer (here 0.5 s); with a separate prefill pool no gap after a request's first
    decode exceeds one decode iteration."""
    reqs = _reqs([0.0, 0.05], [10, 500], [40, 2])
    colo = simulate(reqs, Continuous(), COST, 1)
    assert colo.itl_gap_s.max() >= 500 * PRE_S_PER_TOKEN
    dis = simulate_disaggregated(reqs, Continuous(), COST, 1, 1, XFER)
    first_gap = {0: 0.002 + 10e-3 + DEC_S, 1: 0.002 + 500e-3 + DEC_S}  # transfer + one iteration, at most
    assert dis.itl_gap_s.max() <= max(first_gap.values()) + 1e-9
    long_tail = dis.itl_gap_s[np.isclose(dis.itl_gap_s, DEC_S)]
    assert long_tail.size > 0
    assert dis.finish_s[0] < colo.finish_s[0]


def test_every_request_finishes_in_arrival_order_mixups():
    """Ready times come out of order (short prompts overtake long ones); each request keeps its own times."""
    rng = np.random.default_rng(0)
    n = 300
    arr = np.sort(rng.uniform(0, 5, n))
    inp = rng.integers(10, 800, n)
    out = rng.integers(1, 60, n)
    res = simulate_disaggregated(_reqs(arr, inp, out), Continuous(), COST, 2, 3, XFER)
    assert np.all(res.first_s >= arr + inp * PRE_S_PER_TOKEN - 1e-9)
    xfer = 0.002 + inp * 1e-3
    want = res.first_s + xfer + (out - 1) * DEC_S  # no waiting is the lower bound
    assert np.all(res.finish_s >= np.where(out > 1, want, res.first_s) - 1e-9)
    assert np.all(res.finish_s[out == 1] == res.first_s[out == 1])
    # tokens: every output token after the first is one inter-token gap
    assert res.itl_weight.sum() == pytest.approx(int((out - 1).sum()))


def test_kv_transfer_link_from_the_catalog():
    """H100 SXM (NVIDIA DGX H100 datasheet): 8 GPUs per node on NVSwitch, NVLink 900 GB/s bidirectional
    (450 GB/s each way); one 400 Gb/s NIC per GPU (50 GB/s). 1:1 at tp 1 stays in the node; 8:8 leaves it."""
    hw = get_hardware("h100-sxm")
    assert kv_transfer_for(hw, 1.0, 1, 2).bandwidth_bytes_per_s == pytest.approx(450e9)
    far = kv_transfer_for(hw, 1.0, 1, 16)
    assert far.bandwidth_bytes_per_s == pytest.approx(50e9) and "exceed a node of 8" in far.link


@pytest.mark.parametrize("spec", ["1", "0:1", "a:b", "1:0", "1:2:3"])
def test_bad_split(spec):
    with pytest.raises(OpmapError, match="accepted: P:D"):
        parse_disaggregate(spec)


def test_needs_iteration_batching():
    with pytest.raises(OpmapError, match="continuous"):
        simulate_disaggregated(_reqs([0.0], [10], [2]), Static(2), COST, 1, 1, XFER)


def test_absurd_replica_counts_are_refused_before_simulating():
    """Before: 10M prefill replicas were taken and the routers, which look at every replica per request, ran
    for minutes; the cap is sim.MAX_REPLICAS (10k) over both pools."""
    with pytest.raises(OpmapError, match=r"^--disaggregate '10000000:1': P \+ D must be at most 10000 replicas$"):
        parse_disaggregate("10000000:1")
    assert parse_disaggregate("9999:1") == (9999, 1)
    from opmap.serve import parse_service_time
    from opmap.serve.policies import NoBatching

    reqs = Requests(np.zeros(1), np.ones(1, dtype=np.int64), np.ones(1, dtype=np.int64))
    with pytest.raises(OpmapError, match=r"^--replicas must be an integer from 1 to 10000 \(got 10001\)$"):
        simulate(reqs, NoBatching(), parse_service_time("fixed:1"), replicas=10_001)
