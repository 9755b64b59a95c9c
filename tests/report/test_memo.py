"""The closure memo: owners by bottleneck class, gains from the model, pitfall checks."""

from __future__ import annotations

import pytest

from opmap.report.memo import Check, Finding, findings, memo_json, memo_markdown, pitfalls
from opmap.store.source import Run


def _run(layer_types, kind="analyze", **payload):
    return Run("r1", kind, "2026-12-03T00:00:00+00:00",
               {"workload": "gpt2", "hardware": "h100-sxm", "phase": "prefill", "precision": "bf16",
                "command": "opmap analyze gpt2"}, {"layer_types": layer_types, **payload}, True)


def test_owners_follow_the_bound_and_gains_come_from_the_model():
    lts = {"elementwise": {"share_of_time": 0.5, "bound": "memory", "predicted_s": 2e-3},
           "attention": {"share_of_time": 0.3, "bound": "overhead", "predicted_s": 1e-3},
           "mlp": {"share_of_time": 0.15, "bound": "compute", "predicted_s": 5e-4},
           "norm": {"share_of_time": 0.05, "bound": "memory", "predicted_s": 1e-4}}
    fs = findings(_run(lts), fusion_gain_s=4e-4)
    by = {f.finding.split(" ")[0]: f for f in fs}
    assert set(by) == {"elementwise", "attention", "mlp"}  # norm holds under 10%: no finding
    assert by["elementwise"].owner == "ML compiler" and by["elementwise"].expected_gain_s == 4e-4
    assert by["attention"].owner == "runtime" and by["attention"].expected_gain_s == 1e-3
    assert by["mlp"].owner == "ML compiler" and by["mlp"].expected_gain_s is None
    assert all("r1" in f.rollback for f in fs)


def test_a_prediction_outside_the_band_goes_to_performance_modelling():
    lts = {"mlp": {"share_of_time": 0.9, "bound": "compute", "measured": {"share_of_measured": 0.9,
                                                                        "measured_s": 1e-2,
                                                                        "predicted_over_measured": 0.6}}}
    fs = findings(_run(lts, kind="profile"))
    assert [f.owner for f in fs] == ["ML compiler", "performance modelling"]
    assert "0.60" in fs[1].finding


def test_pitfalls_flag_what_a_reviewer_would():
    run = _run({}, assumptions={"precision_evidence": "unverified: no quality evidence for int8"})
    checks = {c.check: c.verdict for c in pitfalls(run, production_compared=False)}
    assert checks["averages without p95 / p99"].startswith("flag")
    assert checks["precision without quality evidence"].startswith("flag")
    assert checks["synthetic shapes without production-shape validation"].startswith("flag")
    prof = _run({}, kind="profile", latency={"p99_s": 1.0, "n": 30},
                calibration_check={"what": "matmul", "ratio": 1.3})
    checks = {c.check: c.verdict for c in pitfalls(prof, production_compared=True)}
    assert checks["averages without p95 / p99"].startswith("ok")
    assert checks["calibration older than the runtime or drifted"].startswith("flag")
    md = memo_markdown(prof, [], pitfalls(prof, True), "opmap memo r1")
    assert md.startswith("# Closure memo: gpt2 on h100-sxm") and "opmap analyze gpt2" in md


def test_collectives_go_to_the_runtime_and_a_narrower_format_bounds_the_compute_gain():
    lts = {"collective": {"share_of_time": 0.4, "bound": "interconnect", "predicted_s": 2e-3},
           "mlp": {"share_of_time": 0.6, "bound": "compute", "predicted_s": 3e-3}}
    # H100 SXM dense peaks (datasheet): bf16 989.4 TFLOP/s, fp8 1978.9: x2.0001; the gain bound is t (1 - 1/x)
    fs = findings(_run(lts), format_step=("fp8", 1978.9 / 989.4))
    by = {f.finding.split(" ")[0]: f for f in fs}
    assert by["collective"].owner == "runtime" and by["collective"].expected_gain_s == 2e-3
    assert "overlap" in by["collective"].fix
    assert by["mlp"].owner == "ML compiler" and "fp8" in by["mlp"].fix
    assert by["mlp"].expected_gain_s == pytest.approx(3e-3 * (1 - 989.4 / 1978.9))


def _shape_verdict(run, check):
    checks = {c.check: c.verdict for c in pitfalls(run, check)}
    return checks["synthetic shapes without production-shape validation"]


def test_a_synthetic_slice_is_flagged_until_its_shape_check_carries_over():
    run = _run({})
    run.tags["workload"] = "gemm.py:square"
    checks = {c.check: c.verdict for c in pitfalls(run, production_compared=True)}
    assert checks["synthetic shapes without production-shape validation"].startswith("flag: a synthetic slice")
    partly = {"run": "s1", "production": "p1", "classes": [
        {"class": "gemm", "production_kernels": 2, "verdict": "partly", "represented_share_of_class": 0.75}]}
    v = _shape_verdict(run, partly)
    assert v.startswith("flag") and "gemm partly (75%" in v
    partly["classes"][0].update(verdict="carries over", represented_share_of_class=0.9)
    v = _shape_verdict(run, partly)
    assert v.startswith("ok")


def test_memo_json_keeps_schema_1s_keys_for_each_kind_of_run():
    """memo.json schema 1 as written: a finding's keys in the order finding, owner, fix, expected_gain_s,
    (expected_gain: the other kinds' only), risk, rollback; a check's check, verdict."""
    import json

    f = Finding("mlp holds 90%", "ML compiler", "a better tile", 2e-3, "x2 tokens/s", "low", "run r1")
    c = Check("a quick calibration", "ok: the full grid")
    kernel = json.loads(memo_json(Run("r1", "profile", None, {}, {}, True), [f], [c]))
    assert list(kernel["findings"][0]) == ["finding", "owner", "fix", "expected_gain_s", "risk", "rollback"]
    assert kernel["findings"][0]["expected_gain_s"] == 2e-3 and kernel["pitfalls"] == [
        {"check": "a quick calibration", "verdict": "ok: the full grid"}]
    fit = json.loads(memo_json(Run("r2", "fit", None, {}, {}, True), [f], []))
    assert list(fit) == ["schema_version", "run", "kind", "findings", "pitfalls"] and fit["run"] == "r2"
    assert list(fit["findings"][0]) == ["finding", "owner", "fix", "expected_gain_s", "expected_gain", "risk",
                                        "rollback"]
    assert fit["findings"][0]["expected_gain"] == "x2 tokens/s"
