"""The simulator against queueing theory, with --service-time and policy none. Fixed seeds; the tolerances
are set for the request counts used (the sample mean of a waiting time at utilisation 0.7 over 200,000
requests is within a few percent)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from opmap.record import record
from opmap.serve import make_requests, parse_policy, parse_service_time, simulate, summarize

N = 200_000


def _run(rate: float, service: str, replicas: int = 1, router: str = "round_robin", seed: int = 7):
    reqs = make_requests(f"poisson:{rate}", "1", "1", N, seed=seed)
    res = simulate(reqs, parse_policy("none"), parse_service_time(service), replicas, router, seed=seed)
    return res, record(summarize(res))


def test_mm1_mean_wait_and_sojourn_percentile():
    """M/M/1 (Kleinrock 1975, Queueing Systems vol. 1, sec. 3.2): Wq = rho / (mu - lambda); the sojourn time
    is exponential with rate mu - lambda, so its p99 is ln(100) / (mu - lambda)."""
    lam, mu = 7.0, 10.0
    rho = lam / mu
    _, s = _run(lam, "exp:100")
    wq = rho / (mu - lam)  # 0.2333 s
    assert s["latency"]["queue"]["mean_s"] == pytest.approx(wq, rel=0.05)
    assert s["latency"]["e2e"]["p99_s"] == pytest.approx(math.log(100) / (mu - lam), rel=0.05)
    assert s["utilization"][0] == pytest.approx(rho, rel=0.02)


def test_md1_mean_wait_pollaczek_khinchine():
    """M/D/1 (Pollaczek-Khinchine mean-value formula, Kleinrock 1975 sec. 5.7): Wq = rho / (2 mu (1 - rho)),
    half the M/M/1 wait at the same load."""
    lam, mu = 7.0, 10.0
    rho = lam / mu
    _, s = _run(lam, "fixed:100")
    wq = rho / (2 * mu * (1 - rho))  # 0.1167 s
    assert s["latency"]["queue"]["mean_s"] == pytest.approx(wq, rel=0.05)
    assert s["latency"]["e2e"]["mean_s"] == pytest.approx(wq + 1 / mu, rel=0.03)


def _erlang_c(c: int, a: float) -> float:
    """Erlang C: the probability that an arrival waits in M/M/c with offered load a = lambda / mu
    (Kleinrock 1975 eq. 3.40)."""
    top = a**c / math.factorial(c) * c / (c - a)
    return top / (sum(a**k / math.factorial(k) for k in range(c)) + top)


def test_mmc_shared_queue_against_erlang_c():
    """M/M/c with one shared queue: P(wait) = C(c, a) and Wq = C(c, a) / (c mu - lambda) (Erlang C)."""
    c, lam, mu = 3, 21.0, 10.0
    a = lam / mu  # utilisation a / c = 0.7
    res, s = _run(lam, "exp:100", replicas=c, router="shared")
    pc = _erlang_c(c, a)  # 0.4923
    wait = res.start_s - res.arrival_s
    assert float(np.mean(wait > 1e-12)) == pytest.approx(pc, rel=0.03)
    assert s["latency"]["queue"]["mean_s"] == pytest.approx(pc / (c * mu - lam), rel=0.05)


def test_join_shortest_queue_waits_less_than_round_robin_and_more_than_shared():
    """Three servers at 0.7 load: a shared queue (M/M/3) <= join-the-shortest-queue <= round robin; round robin
    splits a Poisson stream into three Erlang-2 streams, each queue an E2/M/1 (ordering, not a formula)."""
    w = {r: _run(21.0, "exp:100", 3, r)[1]["latency"]["queue"]["mean_s"]
         for r in ("shared", "least_loaded", "round_robin")}
    assert w["shared"] < w["least_loaded"] < w["round_robin"]


def test_mm1_sojourn_cdf_is_exponential():
    """serve.json's compact CDF against M/M/1 theory (Kleinrock 1975 sec. 3.2): the sojourn time is
    exponential with rate mu - lambda, so its q-quantile is -ln(1 - q) / (mu - lambda)."""
    lam, mu = 7.0, 10.0
    _, s = _run(lam, "exp:100")
    c = s["cdf"]
    assert len(c["quantiles"]) == 101 and c["quantiles"][0] == 0.0 and c["quantiles"][-1] == 1.0
    for i in (10, 50, 90):  # quantiles 0.1, 0.5, 0.9
        q = c["quantiles"][i]
        assert c["e2e_s"][i] == pytest.approx(-math.log(1 - q) / (mu - lam), rel=0.05)
    assert all(a <= b for a, b in zip(c["e2e_s"], c["e2e_s"][1:]))  # a CDF never decreases
    assert c["tpot_s"] is None  # one output token per request: no time per output token
