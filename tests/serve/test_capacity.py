"""The capacity search: probes fixed by the starting rate alone (so any engine gives the same answer), worked by
hand against a step function whose edge is known."""

from __future__ import annotations

import signal

import numpy as np
import pytest
from step_runs import step_at  # noqa: E402

from opmap.errors import Interrupted, OpmapError
from opmap.record import record
from opmap.serve.capacity import find_capacity


def test_capacity_search_by_hand():
    # rate0 = 1, edge at 3: grid 1/8 .. 16 -> first invalid 4, bracket [2, 4]; four evenly spaced probes a round:
    # 2.4 2.8 | 3.2 3.6 -> [2.8, 3.2]; 2.88 2.96 | 3.04 3.12 -> [2.96, 3.04] (2.7% wide);
    # 2.976 2.992 | 3.008 3.024 -> [2.992, 3.008] (0.53% <= 1%): 8 + 3 x 4 = 20 runs probed together; run inline,
    # one by one, a round stops at its first invalid rate (3.2, 3.04, 3.008): 8 + 3 x 3 = 17, the same answer; probed
    # together, the 3 runs above a round's first invalid rate decide nothing and are left out of the record: 17 too
    def together(fn, rates):
        return [fn(r) for r in rates]

    for map_fn, runs in ((together, 17), (None, 17)):
        c = find_capacity(step_at(3.0), 1.0, map_fn=map_fn)
        assert c.converged
        assert c.rate_per_s == pytest.approx(2.992, rel=1e-12)
        assert c.bracket[1] == pytest.approx(3.008, rel=1e-12)
        assert len(c.runs) == runs
        assert [r.rate_per_s for r in c.runs[:8]] == [2.0 ** k for k in range(-3, 5)]


def test_capacity_search_moves_its_grid_and_stays_within_tolerance():
    # edge at 1000 from rate0 = 1: the first grid (to 16) is all valid, the next (32 .. 4096) brackets [512, 1024]
    c = find_capacity(step_at(1000.0), 1.0)
    assert c.converged and c.rate_per_s <= 1000.0 < c.bracket[1]
    assert 1000.0 - c.rate_per_s <= 0.01 * c.rate_per_s
    assert [r.rate_per_s for r in c.runs[8:16]] == [2.0 ** k for k in range(5, 13)]
    low = find_capacity(step_at(0.001), 1.0)  # the first grid all invalid: it moves down
    assert low.converged and 0.001 - low.rate_per_s <= 0.01 * low.rate_per_s


def test_capacity_search_brackets_an_edge_between_two_grids():
    """Edge at 20 from rate0 = 1: the first grid (1/8 .. 16) is all valid and the next (32 .. 4096) all invalid,
    so the edge lies between the grids: bracket [16, 32], then rounds of four probes: 19.2 22.4 -> [19.2, 22.4];
    19.84 20.48 -> [19.84, 20.48]; ... down to 1%. (Judging each grid alone, it would swing back and forth.)"""
    c = find_capacity(step_at(20.0), 1.0)
    assert c.converged and c.rate_per_s <= 20.0 < c.bracket[1]
    assert 20.0 - c.rate_per_s <= 0.01 * c.rate_per_s
    assert [r.rate_per_s for r in c.runs[16:18]] == pytest.approx([19.2, 22.4])  # inline: stops at 22.4


def test_capacity_search_does_not_depend_on_the_order_probes_finish():
    def backwards(fn, rates):  # evaluates last to first, as a pool might finish them, returns in input order
        return list(reversed([fn(r) for r in reversed(rates)]))

    def forwards(fn, rates):
        return [fn(r) for r in rates]

    assert find_capacity(step_at(7.7), 5.0, map_fn=backwards) == find_capacity(step_at(7.7), 5.0, map_fn=forwards)


def _stopped_in_round(k: int, finished: int):
    """An engine's map that runs rounds whole until round ``k`` (from 1), where a stop (SIGTERM) lands once its
    first ``finished`` probes have run: the stop carries those, by index, as the engine's map does."""
    rounds = []

    def map_fn(fn, rates):
        rounds.append(rates)
        if len(rounds) < k:
            return [fn(r) for r in rates]
        raise Interrupted(signal.SIGTERM, {i: fn(r) for i, r in enumerate(rates[:finished])})
    return map_fn


def test_a_stopped_search_keeps_every_run_finished_and_the_best_rate_so_far():
    # edge at 3 from rate0 = 1 (test_capacity_search_by_hand): the grid brackets [2, 4]; the first round of four,
    # 2.4 2.8 3.2 3.6, is stopped after its first two (both valid): the answer so far is 2.8, the bracket [2.8, 4]
    with pytest.raises(Interrupted) as e:
        find_capacity(step_at(3.0), 1.0, map_fn=_stopped_in_round(2, finished=2))
    stop = e.value
    assert stop.exit_status == 143 and stop.partial is not None
    c = stop.partial
    assert [r.rate_per_s for r in c.runs] == pytest.approx([2.0 ** k for k in range(-3, 5)] + [2.4, 2.8])
    assert c.rate_per_s == pytest.approx(2.8) and c.bracket == pytest.approx([2.8, 4.0])
    assert c.limited_by == "interrupted" and not c.converged and c.summary.validity.valid


def test_a_search_stopped_before_any_run_keeps_nothing():
    with pytest.raises(Interrupted) as e:
        find_capacity(step_at(3.0), 1.0, map_fn=_stopped_in_round(1, finished=0))
    assert e.value.partial is None


def test_capacity_search_refuses_a_zero_start():
    with pytest.raises(OpmapError, match="starting rate > 0"):
        find_capacity(step_at(1.0), 0.0)


def test_a_ceiling_caps_the_search_and_the_answer():
    """With a ceiling (the saturation rate) no probe goes above it: an SLO that holds everywhere (the 2^28
    requests/s fit once printed came from an unbounded grid moving up three times: 2^(3 x 8 + 4)) answers the
    ceiling itself, from one run at the ceiling; an edge below the ceiling is bracketed from the top down,
    600 x 2^0, then (2^-1, 2^-2), (2^-3, 2^-4), stopping at the first valid rate: 600 / 8 = 75 <= 100 < 150, so
    no rate under 600 / 16 is run (the lowest rates, a batch of one, cost the most to simulate)."""
    c = find_capacity(step_at(1e12), 1.0, ceiling=600.0)
    assert c.rate_per_s == 600.0 and c.limited_by == "ceiling" and c.converged
    assert [r.rate_per_s for r in c.runs] == [600.0]
    c = find_capacity(step_at(100.0), 1.0, ceiling=600.0)
    assert c.converged and 100.0 - c.rate_per_s <= 0.01 * c.rate_per_s and c.rate_per_s <= 100.0
    assert all(r.rate_per_s <= 600.0 for r in c.runs) and c.summary.validity.valid
    assert [r.rate_per_s for r in c.runs[:5]] == [600.0, 300.0, 150.0, 75.0, 37.5]
    assert min(r.rate_per_s for r in c.runs) >= 600.0 / 16
    # an SLO no rate meets: the descent goes as far down as the uncapped grid moves (8 x 4 grid steps), no further
    c = find_capacity(step_at(1e-12), 1.0, ceiling=600.0)
    assert c.rate_per_s == 0.0 and not c.converged and len(c.runs) == 32
    assert min(r.rate_per_s for r in c.runs) == 600.0 * 2.0 ** -31


def test_queue_trend_tells_a_stationary_queue_from_a_diverging_one():
    """A wait drawn afresh for every request (exponential, mean 0.5 s) has no trend; a wait growing at 0.2 s per s
    (an arrival rate 20% over the service rate: the wait grows at rho - 1 s per s) grows by 0.2 x 50 = 10 s over
    the second half of arrivals spread evenly over 100 s."""
    from opmap.serve.capacity import queue_trend

    rng = np.random.default_rng(0)
    t = np.linspace(0.0, 100.0, 1000)
    flat = queue_trend(t, rng.exponential(0.5, t.size))
    assert flat.verdict == "stationary" and abs(flat.growth_s) < 3 * flat.growth_se_s + 0.5
    grow = queue_trend(t, 0.2 * t + rng.exponential(0.5, t.size))
    assert grow.verdict == "diverging"
    assert grow.growth_s == pytest.approx(0.2 * (t[-1] - t[500]), rel=0.05)
    assert queue_trend(t[:10], t[:10]).verdict == "too short"  # 5 requests in the second half


TP_S = 0.010  # one prefill step, whatever it holds: 10 ms


def _constant_steps(n: int = 1024):
    """Every step takes TP_S: prompts of 32 tokens, one output token each, so each request is one prefill step;
    continuous batching admits up to 256 sequences a step (vLLM's max_num_seqs; 256 x 32 = 8192 tokens, the whole
    budget). Closed form: the server completes at most 256 requests per TP_S, 25,600 requests/s; the offline run
    of 1024 requests takes exactly 4 steps, so it measures that rate."""
    from opmap.serve import Continuous, TableCost, parse_arrival, parse_length
    from opmap.serve.capacity import RateProbe
    from opmap.serve.metrics import Slo

    cost = TableCost([1, 1e6], [TP_S, TP_S], [1, 2], [0, 1], [[TP_S, TP_S], [TP_S, TP_S]])
    return RateProbe(parse_arrival("poisson:1"), parse_length("32"), parse_length("1"), n,
                     Continuous(8192), cost, slo=Slo(ttft_s=100 * TP_S, tpot_s=None))


def test_capacity_never_above_the_closed_form_saturation():
    from opmap.serve.capacity import steady_capacity

    probe = _constant_steps()
    sat = 256 / TP_S
    c = steady_capacity(probe)
    assert c.saturation_per_s == pytest.approx(sat, rel=1e-9)
    assert c.rate_per_s <= sat
    # a 1 s TTFT limit is 100 steps: the limit is the queue's stability, not the SLO; the capacity sits close to
    # the saturation rate (a bulk-service queue of 256 a step is short until its load nears 1)
    assert c.rate_per_s >= 0.5 * sat and c.limited_by in ("stationarity", "saturation")
    assert all(r.rate_per_s <= sat * (1 + 1e-12) for r in c.search.runs)
    # the headline is the run at the answer, its warm-up excluded; its throughput is that run's departures
    head = c.headline
    assert head.arrival == f"poisson:{c.rate_per_s:g}"
    assert head.steady_state.verdict == "stationary" and head.steady_state.warmup_requests >= 103
    assert head.throughput.requests_per_s == pytest.approx(c.rate_per_s, rel=0.1)
    d = record(c)  # the capacity block serve.json and fit.json write
    assert d["run"]["requests"] == head.steady_state.requests >= 1024
    assert list(d) == ["rate_per_s", "bracket", "converged", "rel_tol", "limited_by", "runs", "saturation_per_s",
                       "saturation", "method", "run"]  # no reason (a rate was found), no stop
    assert list(d["saturation"]) == ["arrival", "requests", "span_s", "requests_per_s", "tokens_per_s",
                                     "output_tokens_per_s"] and d["saturation"]["arrival"] == "offline"
    # the steady state's keys (its trend's window span among them) with the span the measured run took
    assert list(d["run"]) == list(record(head.steady_state)) and d["run"]["span_s"] == head.requests.span_s
    assert list(d["runs"][0]) == ["rate_per_s", "valid", "reason"]


def test_a_run_over_saturation_is_diverging_and_invalid_below_it_stationary():
    probe = _constant_steps(8192)  # at twice the saturation rate: 80 ms of arrivals, 8 steps of the second half
    sat = 256 / TP_S
    low, high = probe(0.5 * sat), probe(2 * sat)
    assert low.steady_state.verdict == "stationary" and low.validity.valid
    assert high.steady_state.verdict == "diverging" and not high.validity.valid
    assert high.validity.reason.startswith("queue not stationary (diverging)")
    # twice the rate the server completes: the queue grows at 1 s per s (rho - 1 = 1), so the wait grows by about
    # the second half's span; the p99 TTFT alone (under the 1 s limit in a short run) would have passed it
    ss = high.steady_state.trend
    assert ss.growth_s == pytest.approx(ss.span_s, rel=0.25)
