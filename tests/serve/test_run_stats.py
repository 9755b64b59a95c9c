"""The records of a serving run's statistics (opmap.serve.run_stats through opmap.record): serve.json's
``steady_state`` (the window's counts, the queue trend's keys in place, span only where fitted) and
``disaggregation`` (busy times by pool, the optional blocks only where set)."""

from opmap.record import record
from opmap.serve.run_stats import Disaggregation, KvTransfer, QueueTrend, Spread, SteadyState


def test_a_steady_state_writes_its_trend_in_place_and_the_span_only_where_fitted():
    short = QueueTrend("the middle 80%", 3, "slope within 2 standard errors of 0", "too short", None, None, 0.01)
    s = SteadyState(requests=10, warmup_requests=1, cooldown_requests=1, measured_requests=8, trend=short)
    assert list(record(s)) == ["requests", "warmup_requests", "cooldown_requests", "measured_requests", "window",
                               "window_requests", "rule", "verdict", "growth_s", "growth_se_s", "mean_s", "alone"]
    fitted = QueueTrend("the middle 80%", 800, "r", "stationary", 1e-6, 2e-6, 0.01, span_s=40.0)
    assert record(SteadyState(1000, 100, 100, 800, fitted))["span_s"] == 40.0
    # measured = requests - warm-up - cool-down (the window's own count)
    assert record(s)["measured_requests"] == 10 - 1 - 1


def test_a_disaggregated_run_groups_busy_time_by_pool():
    d = Disaggregation(1, 3, KvTransfer(131072.0, 50e9, 1e-5), Spread(1e-3, 2e-3), Spread(None, None),
                       (1.0,), (0.5, 0.25, 0.75), "KV moved once per request")
    r = record(d)
    assert list(r) == ["prefill_replicas", "decode_replicas", "kv_transfer", "kv_transfer_s",
                       "decode_admission_wait_s", "busy_s", "assumptions"]
    assert r["busy_s"] == {"prefill": [1.0], "decode": [0.5, 0.25, 0.75]}
    assert r["decode_admission_wait_s"] == {"mean_s": None, "max_s": None}
    held = record(Disaggregation(1, 1, d.kv_transfer, Spread(0, 0), Spread(0, 0), (), (), "a", {"kind": "table"},
                                 Spread(0.1, 0.2)))
    assert list(held)[-2:] == ["decode_cost", "kv_held_on_prefill_s"]
