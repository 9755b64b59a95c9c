"""Sweeps: the knee and the Pareto front on points worked by hand; a predicted sweep against single analyses."""

from __future__ import annotations

import dataclasses

import pytest

from opmap.analyze import analyze
from opmap.errors import OpmapError
from opmap.explore.sweep import BatchSeq, Sweep, SweepPoint, SweepStop, knees, pareto, sweep
from opmap.hardware import get_hardware
from opmap.record import record
from opmap.workloads import build_zoo


def _pt(b, s, lat, tps):
    return SweepPoint(b, s, "prefill", "by hand", "bf16", lat, None, None, None, 0.0, tps, {}, None, True, 0.0,
                      "by hand")


def test_pareto_front_by_hand():
    pts = [_pt(1, 1, 1.0, 10.0), _pt(2, 1, 2.0, 30.0), _pt(4, 1, 3.0, 25.0), _pt(8, 1, 4.0, 40.0)]
    # (3.0, 25) is beaten by (2.0, 30): lower latency and more tokens per second
    assert pareto(pts) == (BatchSeq(1, 1), BatchSeq(2, 1), BatchSeq(8, 1))


def test_knee_is_farthest_above_the_chord():
    # normalised: latency 0, 1/7, 3/7, 1; tokens 0, 0.8, 0.95, 1. Distance above the chord y = x:
    # 0.8 - 1/7 = 0.657 at batch 2 (the largest), 0.95 - 3/7 = 0.52 at batch 4
    pts = [_pt(1, 8, 1.0, 100.0), _pt(2, 8, 2.0, 180.0), _pt(4, 8, 4.0, 195.0), _pt(8, 8, 8.0, 200.0)]
    assert knees(pts) == (BatchSeq(2, 8),)
    assert knees([_pt(1, 8, 1.0, 1.0), _pt(2, 8, 2.0, 2.0), _pt(4, 8, 4.0, 4.0)]) == ()  # a straight line


def test_predicted_sweep_matches_single_analyses_with_fewer_captures():
    hw = get_hardware("h100-sxm")
    r = sweep("gpt2", hw, [1, 5, 16], [32], "prefill", "bf16", runtime="eager")
    assert r.captures == 4  # the batch family (1, 2, 3, 4); 5 and 16 written from it
    for p in r.points:
        a = analyze(build_zoo("gpt2", p.batch, 32, "bf16"), hw, "bf16")
        assert p.latency_s == pytest.approx(a.predicted_latency_s, rel=1e-12)
        assert p.tokens_per_s == pytest.approx(p.batch * 32 / p.latency_s)
        assert p.latency_p99_s is None and p.method.startswith("predicted")
        assert sum(p.bound_mix.values()) == pytest.approx(1.0)


def test_a_predicted_sweep_prices_the_runtime_and_the_layout():
    """Default (engine): each point is the analysis on the device with the runtime's per-kernel gap and fusion,
    plus its per-step time (a graph launch and the scheduler's host time) once. --tp 2: the layout's latency
    (opmap.mapping.sharding), the weights split over two devices' memory."""
    from opmap.mapping.sharding import Parallelism, shard
    from opmap.phases.runtime import get_runtime

    hw = get_hardware("h100-sxm")
    rt = get_runtime(hw, "engine")
    r = sweep("gpt2", hw, [2], [32], "prefill", "bf16")
    (p,) = r.points
    a = analyze(build_zoo("gpt2", 2, 32, "bf16"), rt.apply(hw), "bf16", fusion=rt.fusion)
    assert r.runtime["name"] == "engine" and rt.per_step_s > 0
    assert p.latency_s == pytest.approx(a.predicted_latency_s + rt.per_step_s, rel=1e-12)
    two = sweep("gpt2", hw, [2], [32], "prefill", "bf16", runtime="eager", tp=2)
    (q,) = two.points
    one = analyze(build_zoo("gpt2", 2, 32, "bf16"), hw, "bf16")
    assert q.latency_s == pytest.approx(shard(one, Parallelism(tp=2, devices=2)).latency_s, rel=1e-12)
    assert (two.tp, two.pp) == (2, 1) and record(two)["layout"] == {"tp": 2, "pp": 1, "devices": 2} and q.mfu is None
    assert q.memory_bytes < one.memory.total_bytes  # per device: half the weights


def test_sweep_refuses_what_it_cannot_measure():
    hw = get_hardware("h100-sxm")
    with pytest.raises(OpmapError, match=r"--measure times one local device: --tp 2 x --pp 1 needs 2"):
        sweep("gpt2", hw, [1], [8], measure=True, tp=2)
    with pytest.raises(OpmapError, match=r"--measure times eager PyTorch on this CPU: --runtime engine"):
        sweep("gpt2", hw, [1], [8], measure=True, runtime="engine")
    with pytest.raises(OpmapError, match=r"unknown runtime 'jit'"):
        sweep("gpt2", hw, [1], [8], runtime="jit")


def _rapl(root, max_uj):
    d = root / "intel-rapl:0"
    d.mkdir(parents=True)
    (d / "energy_uj").write_text("0\n")
    (d / "max_energy_range_uj").write_text(f"{max_uj}\n")


def test_measured_sweep_energy_from_the_rapl_counter_with_wraparound(tmp_path, monkeypatch, session_calibration):
    from opmap.measure.energy import RaplMeter

    # a common Intel package range (max_energy_range_uj = 262143328850); only the counter reads are faked: the
    # counter wraps between them. Energy = (max - before) + after = 328850 + 1500000 uJ = 1.82885 J
    _rapl(tmp_path / "powercap", 262_143_328_850)
    reads = iter([[262_143_000_000], [1_500_000]])
    monkeypatch.setattr(RaplMeter, "read_uj", lambda self: next(reads))
    r = sweep("gpt2", get_hardware(session_calibration), [1], [8], "prefill", "fp32", measure=True, repeats=3,
              rapl_root=tmp_path / "powercap")
    (p,) = r.points
    assert p.energy_j == pytest.approx(1.82885)
    assert p.power_method.startswith("measured (RAPL package domain, 1 package(s)")
    # W = J / s over the timed window; per token = J / (3 repeats x 1 x 8 tokens); tokens per J its inverse
    assert p.energy_window_s > 0 and p.power_w == pytest.approx(1.82885 / p.energy_window_s)
    assert p.energy_per_token_j == pytest.approx(1.82885 / 24)
    assert p.tokens_per_j == pytest.approx(24 / 1.82885)
    # the window holds the timed repeats: at least their summed latency
    assert p.energy_window_s >= 3 * p.latency_p50_s * 0.5


def test_measured_sweep_without_a_meter_is_null_or_modelled_and_says_so(tmp_path, monkeypatch, session_calibration):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no local profile
    r = sweep("gpt2", get_hardware(session_calibration), [1], [8], "prefill", "fp32", measure=True, repeats=2,
              rapl_root=tmp_path / "absent")
    (p,) = r.points
    assert p.energy_j is None and p.power_w is None and p.energy_per_token_j is None
    assert p.power_method.startswith("not measured: no RAPL package domain under")
    assert "not modelled either: the local profile lists no tdp_w" in p.power_method
    # a local profile with a TDP (here the Xeon 8480+ catalog entry, 350 W datasheet) models the busy loop at it
    (tmp_path / "cache" / "opmap").mkdir(parents=True)
    src = get_hardware("xeon-8480")
    from opmap.hardware.spec import CATALOG_DIR

    (tmp_path / "cache" / "opmap" / "local.toml").write_text((CATALOG_DIR / f"{src.name}.toml").read_text())
    r = sweep("gpt2", get_hardware(session_calibration), [1], [8], "prefill", "fp32", measure=True, repeats=2,
              rapl_root=tmp_path / "absent")
    (p,) = r.points
    assert p.power_w == pytest.approx(350.0) and p.energy_j == pytest.approx(350.0 * p.energy_window_s)
    assert p.power_method.startswith("modelled: the local profile's TDP 350 W")


def test_predicted_points_carry_null_energy():
    r = sweep("gpt2", get_hardware("h100-sxm"), [1], [16], "prefill", "bf16")
    (p,) = r.points
    assert p.energy_j is None and p.tokens_per_j is None and p.power_method.startswith("not measured")


def test_parse_ints_refuses_sizes_past_int32():
    """Before: --batch 99999999999999999999 reached torch and died in a traceback (Overflow when unpacking long)."""
    from opmap.explore.sweep import parse_ints

    assert parse_ints("4,1,2,4", "batch") == [1, 2, 4]
    with pytest.raises(OpmapError, match=r"^--batch takes comma-separated integers from 1 to 2147483647 such as "
                                         r"1,2,4, got '1,99999999999999999999'$"):
        parse_ints("1,99999999999999999999", "batch")


def test_a_measured_sweep_refuses_a_prediction_for_another_device_or_a_dtype_it_cannot_run():
    """`sweep --measure` set the H100's prediction beside a CPU's timing: the prediction beside a measurement is for
    the CPU measured; and it runs torch dtypes only."""
    with pytest.raises(OpmapError, match=r"--measure times this CPU: the prediction beside it must be for this CPU, "
                                         r"not h100-sxm \(gpu\); use --hardware local"):
        sweep("gpt2", get_hardware("h100-sxm"), [1], [8], "prefill", "fp32", measure=True, repeats=1)
    with pytest.raises(OpmapError, match=r"--measure runs torch dtypes on this CPU; accepted: fp32, bf16, fp16 "
                                         r"\(got 'fp8'"):
        sweep("gpt2", get_hardware("xeon-8480"), [1], [8], "prefill", "fp8", measure=True, repeats=1)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_measured_point_runs_and_carries_its_dtype_beside_a_prediction_for_this_cpu(monkeypatch, session_calibration,
                                                                                     dtype):
    """`sweep --measure` labelled fp32 runs bf16: the module timed is built in the dtype the point carries, and the
    prediction beside it is the same point at that dtype on this CPU's calibrated profile, both named."""
    import torch

    import opmap.explore.sweep as sw

    built = []
    real = sw._workload

    def watched(*a, **k):  # the real build; the float dtype of each module built on the CPU noted
        w = real(*a, **k)
        if k.get("device") == "cpu":
            built.append({p.dtype for p in w.module.parameters() if p.is_floating_point()})
        return w

    monkeypatch.setattr(sw, "_workload", watched)
    hw = get_hardware(session_calibration)
    r = sweep("gpt2", hw, [1], [8], "prefill", dtype, measure=True, repeats=2)
    (p,) = r.points
    assert built == [{torch.float32 if dtype == "fp32" else torch.bfloat16}]
    assert p.dtype == r.dtype == dtype and p.method.startswith(f"measured on this CPU ({dtype}")
    assert p.hardware == r.measured_on and p.hardware.startswith("this CPU (")
    assert p.predicted.hardware == r.hardware == hw.name and p.predicted.dtype == dtype
    one = analyze(build_zoo("gpt2", 1, 8, dtype), hw, dtype)
    assert p.predicted.latency_s == pytest.approx(one.predicted_latency_s, rel=1e-9)


def test_sweep_json_keys_in_order():
    """sweep.json (schema 1): the layout as its block, knee and Pareto entries as {batch, seq}, ``interrupted`` last
    and only after a stop."""
    pts = (_pt(1, 8, 1.0, 1.0), _pt(2, 8, 1.5, 2.0))
    r = Sweep("m", "h100-sxm", None, "prefill", "bf16", {"name": "engine"}, 2, 1, pts, (BatchSeq(2, 8),),
              (BatchSeq(1, 8), BatchSeq(2, 8)), 1.0, 2, 2.0, "local", ("a",))
    d = record(r)
    assert list(d) == ["schema_version", "model", "hardware", "measured_on", "phase", "dtype", "runtime", "layout",
                       "points", "knee", "pareto", "points_per_s", "captures", "wall_s", "engine", "assumptions"]
    assert d["layout"] == {"tp": 2, "pp": 1, "devices": 2} and d["knee"] == [{"batch": 2, "seq": 8}]
    assert d["assumptions"] == ["a"] and d["schema_version"] == 1
    stopped = record(dataclasses.replace(r, interrupted=SweepStop("SIGINT", (8,), (16, 32))))
    assert list(stopped)[-1] == "interrupted"
    assert stopped["interrupted"] == {"signal": "SIGINT", "seqs_done": [8], "seqs_not_run": [16, 32]}
