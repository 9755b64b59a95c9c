"""serve.json's summary of a simulated run (opmap.serve.metrics.summarize): the scheduler block and preemptions."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from opmap.record import record


@pytest.mark.parametrize("spec,want", [
    ("engine:8,64,32", {"max_num_seqs": 8, "max_num_batched_tokens": 64, "kv_block": 32, "chunked_prefill": True}),
    ("continuous:1024", {"max_num_seqs": 256, "max_num_batched_tokens": 1024, "kv_block": None,
                         "chunked_prefill": False}),
    ("chunked:256", {"max_num_seqs": 256, "max_num_batched_tokens": 256, "kv_block": None, "chunked_prefill": True}),
    ("static:4", {"max_num_seqs": 4, "max_num_batched_tokens": None, "kv_block": None, "chunked_prefill": False}),
    ("none", {"max_num_seqs": 1, "max_num_batched_tokens": None, "kv_block": None, "chunked_prefill": False}),
])
def test_summary_names_the_step_limits_and_preemptions(spec, want):
    """serve.json's scheduler block in vLLM's names, from the policy's own parameters (the continuous and chunked
    policies cap a step at 256 sequences, vLLM's max_num_seqs); policies other than engine never preempt."""
    import numpy as np

    from opmap.serve import Requests, TableCost, parse_policy, simulate, summarize

    reqs = Requests(np.zeros(3), np.full(3, 10), np.full(3, 2), "offline")
    s = record(summarize(simulate(reqs, parse_policy(spec), TableCost([1000], [1.0], [1], [0], [[0.01]]))))
    assert s["scheduler"] == want
    assert s["preemptions"] == {"total": 0, "requests_preempted": 0, "max_per_request": 0}


def test_a_figure_that_overflows_is_refused_not_printed():
    """Three requests of 1e306 s each in a row: their latencies are finite in s but overflow in ms (the p99 TTFT
    was printed as 'inf ms'). Such a service time reaches the summary only around the input checks
    (opmap.validate.CEILINGS); the summary refuses it, naming the figure, rather than print it as a value."""
    import numpy as np

    from opmap.errors import OpmapError
    from opmap.serve import Requests, parse_policy, simulate, summarize
    from opmap.serve.cost import ServiceTime

    reqs = Requests(np.zeros(3), np.full(3, 10), np.full(3, 2), "offline")
    res = simulate(reqs, parse_policy("none"), ServiceTime("fixed", 1e306))
    with pytest.raises(OpmapError, match=r"^serve: e2e mean came out inf, not a finite figure") as e:
        summarize(res)
    assert "\n" not in str(e.value)
    ok = summarize(simulate(reqs, parse_policy("none"), ServiceTime("fixed", 1.0)))  # 3 in a row: 1, 2, 3 s
    assert ok.latency.e2e.mean_s == pytest.approx(2.0)


@pytest.mark.parametrize("spec", ["none", "static:4", "dynamic:4,5", "continuous:1024", "chunked:256",
                                  "engine:8,64,32,nochunk,noevict"])
def test_the_limits_come_from_the_typed_policy_the_run_wrote(spec):
    """The run carries the typed policy it was given (SimResult.policy, ServeReport.policy), so the scheduler limits
    are each policy's own fields (Policy.limits), not a guess among other policies' parameter names; serve.json's
    policy block writes those fields as its params."""
    import numpy as np

    from opmap.serve import Requests, parse_policy, simulate, summarize
    from opmap.serve.cost import TableCost

    p = parse_policy(spec)
    assert record(p)["params"] == dataclasses.asdict(p)
    assert list(record(p)) == ["name", "version", "spec", "params"] and record(p)["spec"] == p.spec()
    cost = TableCost([1000], [0.01], [1, 8], [0, 1000], [[0.01, 0.01], [0.01, 0.01]])
    r = summarize(simulate(Requests(np.zeros(2), np.full(2, 8), np.full(2, 2), "offline"), p, cost))
    assert r.policy is p and r.scheduler == p.limits
    lim = p.limits
    assert lim.max_num_seqs == {"none": 1, "static": 4, "dynamic": 4, "continuous": 256, "chunked": 256,
                                "engine": 8}[p.name]
    assert lim.max_num_batched_tokens == {"continuous": 1024, "chunked": 256, "engine": 64}.get(p.name)
    assert lim.kv_block == (32 if p.name == "engine" else None)
    assert lim.chunked_prefill == (p.name == "chunked")  # engine:...,nochunk turns the engine's off


def test_a_serve_report_is_frozen_and_writes_its_figures():

    import numpy as np

    from opmap.serve import Requests, parse_policy, simulate, summarize
    from opmap.serve.cost import ServiceTime

    reqs = Requests(np.zeros(3), np.full(3, 10), np.full(3, 2), "offline")
    r = summarize(simulate(reqs, parse_policy("none"), ServiceTime("fixed", 1.0)))  # 3 in a row: 1, 2, 3 s
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.slo_attainment = 1.0  # type: ignore[misc]
    d = record(r)
    assert d["latency"]["e2e"]["p50_s"] == r.latency.e2e.p50_s == pytest.approx(2.0)
    assert d["throughput"]["requests_per_s"] == pytest.approx(3 / 3.0)  # 3 requests over the 3 s span
    assert d["scheduler"]["max_num_seqs"] == 1


def test_the_rates_and_percentiles_records():
    """serve.json's throughput (the window only where named) and latency (each latency's percentiles by name)."""
    from opmap.serve.metrics import Latency, Percentiles, Throughput

    assert record(Throughput(2.0, 600.0, 64.0)) == {"requests_per_s": 2.0, "tokens_per_s": 600.0,
                                                     "output_tokens_per_s": 64.0}
    assert record(Throughput(2.0, 600.0, 64.0, "measured arrivals"))["window"] == "measured arrivals"
    p = Percentiles.of(np.array([1.0, 2.0, 3.0]))
    lat = record(Latency(p, p, p, p, Percentiles.of(np.array([]))))
    assert list(lat) == ["e2e", "ttft", "tpot", "itl", "queue"]
    assert lat["e2e"]["mean_s"] == 2.0 and lat["e2e"]["p50_s"] == 2.0  # the mean and median of 1, 2, 3
    assert lat["queue"] == {"mean_s": None, "p50_s": None, "p90_s": None, "p95_s": None, "p99_s": None}


def test_an_slo_records_its_kind_and_only_its_limits():
    from opmap.serve.metrics import Slo

    # MLPerf's LLM Server limits (TTFT 2 s, TPOT 200 ms at p99), or one end-to-end p99 limit instead of both
    assert record(Slo()) == {"kind": "ttft_tpot_p99", "ttft_s": 2.0, "tpot_s": 0.2}
    assert list(record(Slo(ttft_s=None, tpot_s=0.05))) == ["kind", "ttft_s", "tpot_s"]  # an unset limit: null
    assert record(Slo(p99_s=1.5)) == {"kind": "e2e_p99", "p99_s": 1.5}


def test_serve_json_blocks_in_order():
    """serve.json's body: the blocks every run writes, in order; the engine's paged KV cache (its first key saying
    it is paged) after them only under the engine policy."""
    from opmap.serve import Requests, parse_policy, simulate, summarize
    from opmap.serve.cost import TableCost

    reqs = Requests(np.zeros(4), np.full(4, 100), np.full(4, 4), "offline")
    cost = TableCost([1000], [0.01], [1, 8], [0, 1000], [[0.01, 0.01], [0.01, 0.01]])
    every = ["schema_version", "policy", "arrival", "router", "replicas", "cost", "requests", "throughput", "latency",
             "cdf", "goodput", "slo", "slo_attainment", "queueing_share", "utilization", "preemptions", "scheduler",
             "validity"]
    assert list(record(summarize(simulate(reqs, parse_policy("static:4"), cost)))) == every
    d = record(summarize(simulate(reqs, parse_policy("engine"), cost)))
    assert list(d) == [*every, "kv_cache"] and list(d["kv_cache"])[:2] == ["paged", "kv_block"]
    assert d["kv_cache"]["paged"] is True and d["schema_version"] == 1
