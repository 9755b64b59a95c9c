"""Sweeps: the knee and the Pareto front on points worked by hand; a predicted sweep against single analyses."""

from __future__ import annotations

import pytest

from opmap.analyze import analyze
from opmap.explore.sweep import knees, pareto, sweep
from opmap.hardware import get_hardware
from opmap.workloads import build_zoo


def _pt(b, s, lat, tps):
    return {"batch": b, "seq": s, "latency_s": lat, "tokens_per_s": tps}


def test_pareto_front_by_hand():
    pts = [_pt(1, 1, 1.0, 10.0), _pt(2, 1, 2.0, 30.0), _pt(4, 1, 3.0, 25.0), _pt(8, 1, 4.0, 40.0)]
    # (3.0, 25) is beaten by (2.0, 30): lower latency and more tokens per second
    assert pareto(pts) == [{"batch": 1, "seq": 1}, {"batch": 2, "seq": 1}, {"batch": 8, "seq": 1}]


def test_knee_is_farthest_above_the_chord():
    # normalised: latency 0, 1/7, 3/7, 1; tokens 0, 0.8, 0.95, 1. Distance above the chord y = x:
    # 0.8 - 1/7 = 0.657 at batch 2 (the largest), 0.95 - 3/7 = 0.52 at batch 4
    pts = [_pt(1, 8, 1.0, 100.0), _pt(2, 8, 2.0, 180.0), _pt(4, 8, 4.0, 195.0), _pt(8, 8, 8.0, 200.0)]
    assert knees(pts) == [{"batch": 2, "seq": 8}]
    assert knees([_pt(1, 8, 1.0, 1.0), _pt(2, 8, 2.0, 2.0), _pt(4, 8, 4.0, 4.0)]) == []  # a straight line


def test_predicted_sweep_matches_single_analyses_with_fewer_captures():
    hw = get_hardware("h100-sxm")
    r = sweep("gpt2", hw, [1, 5, 16], [32], "prefill", "bf16")
    assert r["captures"] == 4  # the batch family (1, 2, 3, 4); 5 and 16 written from it
    for p in r["points"]:
        a = analyze(build_zoo("gpt2", p["batch"], 32, "bf16"), hw, "bf16")
        assert p["latency_s"] == pytest.approx(a.predicted_latency_s, rel=1e-12)
        assert p["tokens_per_s"] == pytest.approx(p["batch"] * 32 / p["latency_s"])
        assert p["latency_p99_s"] is None and p["method"].startswith("predicted")
        assert sum(p["bound_mix"].values()) == pytest.approx(1.0)
