"""Two bench runs compared (store/bench_compare.py through store/compare.py's compare): the rank test's p-value
against the Mann-Whitney normal approximation worked by hand, the verdicts, and a different load refused."""

from __future__ import annotations

import json
import math

import pytest

from opmap.errors import OpmapError
from opmap.record import record
from opmap.store.compare import compare


def bench_dir(tmp_path, name, ttft, output_len="4", tokens_per_s=100.0):
    body = {"schema_version": 1, "kind": "bench", "latency": {"ttft": {"p50_s": 0.0}},
            "spec": {"arrival": None, "concurrency": 2, "requests": len(ttft), "duration_s": None, "warmup": 0,
                     "input_len": "8", "output_len": output_len, "seed": 0},
            "endpoint": {"base_url": f"http://{name}:8000", "api": "completions", "model": "m",
                         "server_models": ["m"], "server_header": None},
            "client": {"opmap": "0"}, "throughput": {"requests_per_s": 10.0, "output_tokens_per_s": tokens_per_s},
            "validity": {"verdict": "INVALID"},
            "samples": {"ttft_s": ttft, "tpot_s": [0.01] * len(ttft), "e2e_s": [t + 0.04 for t in ttft]}}
    d = tmp_path / name
    d.mkdir()
    (d / "bench.json").write_text(json.dumps(body))
    return str(d)


def test_a_clear_shift_is_a_regression_with_the_hand_computed_p_value(tmp_path):
    """A's 10 TTFTs all below B's 10: U_A = 0; z = (|0 - 50| - 0.5) / sqrt(10 x 10 / 12 x 21) = 49.5 / 13.229
    = 3.742; two-sided p = 2 (1 - Phi(3.742)) = 1.83e-4."""
    a = bench_dir(tmp_path, "a", [0.010 + 0.001 * i for i in range(10)])
    b = bench_dir(tmp_path, "b", [0.030 + 0.001 * i for i in range(10)], tokens_per_s=80.0)
    r = compare(a, b)
    ttft = next(m for m in r.metrics if m.metric == "ttft")
    z = 49.5 / math.sqrt(100 / 12 * 21)
    assert ttft.u == 0 and ttft.p == pytest.approx(2 * (1 - 0.5 * (1 + math.erf(z / math.sqrt(2)))), rel=1e-9)
    assert ttft.rel == pytest.approx(0.0345 / 0.0145 - 1)  # medians 14.5 ms -> 34.5 ms
    assert ttft.verdict == "regression" and r.verdict == "regression" and r.regressed
    tpot = next(m for m in r.metrics if m.metric == "tpot")
    assert tpot.p == 1.0 and tpot.verdict == "no significant change"  # the same values on both sides
    d = record(r)
    assert d["throughput"]["output_tokens_per_s"]["rel"] == pytest.approx(-0.2)
    # compare --json's shape, key for key as BenchComparison.to_dict wrote it before it was declared
    assert list(d) == ["kind", "a", "b", "forced_tags", "metrics", "throughput", "verdict", "verdict_line",
                       "min_effect", "alpha", "test", "endpoints", "validity"]
    assert d["kind"] == "bench" and list(d["throughput"]) == ["requests_per_s", "output_tokens_per_s", "tokens_per_s"]
    assert list(d["metrics"][0]) == ["metric", "n_a", "n_b", "p", "u", "a_p50_s", "b_p50_s", "a_p99_s", "b_p99_s",
                                     "rel", "verdict"]
    assert d["throughput"]["tokens_per_s"] == {"a": None, "b": None, "rel": None}
    assert d["endpoints"] == {"a": "http://a:8000", "b": "http://b:8000"}  # bench_dir's base_url per run
    assert d["validity"] == {"a": "INVALID", "b": "INVALID"} and list(d["test"]) == ["name"]
    assert compare(b, a).verdict == "improvement"


def test_the_same_distribution_is_no_significant_change(tmp_path):
    xs = [0.010 + 0.001 * i for i in range(10)]
    r = compare(bench_dir(tmp_path, "a", xs), bench_dir(tmp_path, "b", list(reversed(xs))))
    assert r.verdict == "no significant change" and all(m.p == 1.0 for m in r.metrics)


def test_a_different_load_is_refused_unless_forced(tmp_path):
    a = bench_dir(tmp_path, "a", [0.01, 0.02, 0.03])
    b = bench_dir(tmp_path, "b", [0.01, 0.02, 0.03], output_len="64")
    with pytest.raises(OpmapError, match="not the same load"):
        compare(a, b)
    assert compare(a, b, force=True).forced_tags == ("workload_spec",)
