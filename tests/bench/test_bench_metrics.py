"""opmap.bench.metrics on hand-made records: every expected value is worked out beside it from the definitions
(TTFT = first text event - send; TPOT = (e2e - TTFT) / (output tokens - 1); ITL = gaps between text events;
percentiles linear-interpolated, numpy's and serve's default). (Named test_bench_metrics: tests/serve has a
test_metrics.py and the tests folders are not packages.)"""

from __future__ import annotations

import pytest

from opmap.bench.metrics import LAG_LIMIT_S, summarize
from opmap.bench.records import RequestRecord
from opmap.record import record


def rec(i, sched, sent, times, end, asked_out, usage_out, status="ok", warmup=False, asked_in=10, usage_in=10):
    return RequestRecord(i, sched, sent, times[0] if times else None, tuple(times), end, asked_in, asked_out,
                         usage_in if status == "ok" else None, usage_out, len(times) + 2, status, "", 200, warmup)


A = rec(0, 0.0, 0.0, (0.1, 0.2, 0.4), 0.4, 3, 3)  # ttft 0.1, e2e 0.4, tpot 0.3 / 2 = 0.15, gaps 0.1, 0.2
B = rec(1, 0.99, 1.0, (1.3, 1.5), 1.5, 2, 4)  # merged events: 4 tokens; ttft 0.3, e2e 0.5, tpot 0.2 / 3
C = rec(2, 1.99, 2.0, (), 2.01, 3, None, status="http_error")
W = rec(3, 0.0, 0.0, (5.0, 6.0), 9.0, 3, 3, warmup=True)  # left out of everything but the warm-up count


def test_latencies_against_hand_computed_values():
    s = summarize([W, A, B, C], min_duration_s=0, min_queries=0)
    ttft, tpot, itl, e2e = (s.latency.ttft, s.latency.tpot, s.latency.itl, s.latency.e2e)
    assert ttft.mean_s == pytest.approx(0.2) and ttft.p50_s == pytest.approx(0.2)
    assert ttft.p99_s == pytest.approx(0.1 + 0.99 * 0.2)  # linear between the 2 samples
    assert tpot.p50_s == pytest.approx((0.15 + 0.2 / 3) / 2)
    assert itl.mean_s == pytest.approx(0.5 / 3) and itl.p50_s == pytest.approx(0.2)  # gaps 0.1, 0.2, 0.2
    assert e2e.p90_s == pytest.approx(0.4 + 0.9 * 0.1)
    assert dict(s.samples_s)["ttft_s"] == pytest.approx([0.1, 0.3])


def test_rates_errors_usage_and_requests():
    s = summarize([W, A, B, C], min_duration_s=0, min_queries=0)
    r = s.requests
    assert (r.measured, r.warmup, r.ok, r.failed) == (3, 1, 2, 1)
    assert r.window_s == pytest.approx(2.01)  # first measured send 0.0 to last measured end 2.01
    assert r.output_tokens == 7 and r.input_tokens == 20
    assert s.throughput.requests_per_s == pytest.approx(2 / 2.01)
    assert s.throughput.output_tokens_per_s == pytest.approx(7 / 2.01)
    assert s.throughput.tokens_per_s == pytest.approx(27 / 2.01)
    assert s.offered_per_s == pytest.approx(2 / 1.99)  # 3 sends scheduled over 0 .. 1.99 s
    assert dict(s.errors) == {"http_error": 1, "stream_error": 0, "dropped": 0, "timeout": 0, "connect_error": 0}
    u = s.usage_check
    assert (u.output_mismatches, u.input_mismatches, u.output_diff_mean) == (1, 0, 1.0)  # (0 + 2) / 2


def test_goodput_under_each_slo():
    ttft_only = summarize([A, B, C], slo_ttft_s=0.2, min_duration_s=0, min_queries=0).goodput
    assert ttft_only.requests_per_s == pytest.approx(1 / 2.01)  # A (0.1 s) meets it, B (0.3 s) does not
    assert ttft_only.output_tokens_per_s == pytest.approx(3 / 2.01)
    assert ttft_only.attainment == pytest.approx(1 / 3)  # of the measured requests, the failed one included
    tpot_only = summarize([A, B, C], slo_tpot_s=0.1, min_duration_s=0, min_queries=0).goodput
    assert tpot_only.output_tokens_per_s == pytest.approx(4 / 2.01)  # B's 0.067 s meets it, A's 0.15 does not


def test_validity_names_every_reason():
    v = summarize([A, B, C], min_duration_s=600, min_queries=10).validity
    assert v.verdict == "INVALID"
    assert "under the minimum 600 s" in v.reason and "3 requests measured, under the minimum 10" in v.reason
    assert "1 of 3 requests failed" in v.reason
    ok = summarize([A, B], min_duration_s=1.0, min_queries=2).validity
    assert ok.valid and ok.verdict == "VALID"
    stopped = summarize([A, B], min_duration_s=1.0, min_queries=2, interrupted=True).validity
    assert stopped.reason == "interrupted"


def test_a_late_scheduler_is_flagged():
    late = [rec(i, i * 0.1, i * 0.1 + 0.05, (i * 0.1 + 0.06,), i * 0.1 + 0.06, 1, 1) for i in range(20)]
    s = summarize(late, min_duration_s=0, min_queries=0)
    lag = s.scheduler_lag
    assert lag.stats.p50_s == pytest.approx(0.05) and lag.behind and 0.05 > LAG_LIMIT_S
    assert "fell behind schedule" in s.validity.reason
    closed = [rec(0, None, 0.0, (0.1,), 0.1, 1, 1)]
    closed_lag = summarize(closed, min_duration_s=0, min_queries=0).scheduler_lag
    assert not closed_lag.open_loop and closed_lag.to_dict() == {"open_loop": False, "behind": False}


def test_an_ok_request_without_usage_counts_its_text_events():
    r = rec(0, None, 0.0, (0.1, 0.2, 0.3), 0.3, 3, None)
    s = summarize([r], min_duration_s=0, min_queries=0)
    assert s.requests.output_tokens == 3 and s.usage_check.requests_without_usage == 1
    assert s.latency.tpot.p50_s == pytest.approx(0.1)


def test_set_aside_usage_and_untimed_events_count_as_the_client_saw_them():
    """A request whose usage was set aside (records.usage_counts) counts its text events, the timed and the
    untimed past the client's cap: 2 + 8 = 10 tokens, TPOT (0.3 - 0.1) / 9; the run is INVALID naming it, and
    the set-aside request is not also counted as one without usage."""
    from dataclasses import replace

    odd = replace(rec(0, None, 0.0, (0.1, 0.2), 0.3, 10, None), usage_error="usage completion_tokens -537 is not a "
                  "count from 0 to 74 (max_tokens 10 + 64)", token_times_dropped=8)
    s = summarize([odd, A], min_duration_s=0, min_queries=0)
    assert s.requests.output_tokens == 10 + 3
    assert s.latency.tpot.p50_s == pytest.approx((0.2 / 9 + 0.15) / 2)
    u = s.usage_check
    assert (u.implausible, u.requests_without_usage) == (1, 0) and "-537" in u.implausible_example
    assert "1 of 2 ok requests reported implausible usage counts" in s.validity.reason


def test_each_kind_of_failure_keeps_its_first_reason():
    from dataclasses import replace

    c1, c2 = replace(C, error="HTTP 500: first"), replace(C, index=4, error="HTTP 503: later")
    d = replace(rec(5, None, 3.0, (), 3.1, 3, None, status="stream_error"), error="the answer is text/html")
    s = summarize([A, c1, c2, d, replace(W, status="dropped", error="warm-up")], min_duration_s=0, min_queries=0)
    assert dict(s.error_examples) == {"http_error": "HTTP 500: first", "stream_error": "the answer is text/html"}


def test_the_figures_are_written_as_bench_json_had_them():
    """BenchFigures' record is bench.json's figures, key for key in the order the dict summarize returned before
    had them; the achieved rate is the ok requests' rate (2 of them over 2.01 s), the goodput's SLO nested."""
    d = record(summarize([W, A, B, C], slo_ttft_s=0.2, min_duration_s=0, min_queries=0))
    assert list(d) == ["schema_version", "requests", "latency", "cdf", "throughput", "rate", "goodput", "errors",
                       "error_examples", "usage_check", "scheduler_lag", "validity", "samples"]
    assert list(d["requests"]) == ["measured", "warmup", "ok", "failed", "input_tokens", "output_tokens", "window_s",
                                   "window_start_s", "window_end_s"]
    assert d["rate"]["achieved_per_s"] == pytest.approx(2 / 2.01) == d["throughput"]["requests_per_s"]
    assert d["goodput"]["slo"] == {"ttft_s": 0.2, "tpot_s": None} and list(d["goodput"]) == [
        "requests_per_s", "output_tokens_per_s", "slo", "attainment"]
    assert list(d["scheduler_lag"]) == ["open_loop", "mean_s", "p50_s", "p90_s", "p95_s", "p99_s", "max_s", "limit_s",
                                        "behind"]
    assert list(d["samples"]) == ["ttft_s", "tpot_s", "e2e_s"] and d["samples"]["e2e_s"] == pytest.approx([0.4, 0.5])
