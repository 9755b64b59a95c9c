"""Local calibration: the quick grid end to end, the profile through the catalog loader, --hardware local."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from opmap.calibrate import calibrate, to_toml, write_profile
from opmap.calibrate.grids import QUICK_GRID, QUICK_GRID_TA
from opmap.calibrate.load import LoadVerdict
from opmap.cli import main
from opmap.errors import OpmapError
from opmap.hardware import get_hardware
from opmap.hardware.host import allowed_cpus
from opmap.timing import time_op


def test_time_op_measures_a_known_duration():
    # time.sleep(2 ms) takes at least 2 ms of wall time per call; scheduling only adds to it
    s = time_op(lambda: time.sleep(0.002), torch.device("cpu"), warmup=1, repeats=3, min_time_s=0.004)
    assert 0.002 <= s.median_s < 0.02
    assert s.spread()["min_s"] <= s.median_s <= s.spread()["max_s"]


@pytest.fixture(scope="module")
def quick():
    """A real quick calibration, measured however loaded the host is (the rows are what is tested here;
    tests/calibrate/test_load.py tests the load)."""
    return calibrate("cpu", quick=True, allow_busy=True)


def test_quick_calibration_rows(quick):
    fp32 = [r for r in quick.matmul if r["dtype"] == "fp32" and r["layout"] == "nt"  # nn.Linear's: x @ W.T
            and not r.get("ceiling")]
    assert sorted((r["m"], r["n"], r["k"]) for r in fp32) == sorted(QUICK_GRID)
    ta = [r for r in quick.matmul if r["dtype"] == "fp32" and r["layout"] == "tt"]  # x.t() @ W.T
    assert sorted((r["m"], r["n"], r["k"]) for r in ta) == sorted(QUICK_GRID_TA)
    (conv,) = [r for r in quick.conv if r["dtype"] == "fp32" and r["pass"] == "forward"]
    (bwd,) = [r for r in quick.conv if r["pass"] == "backward"]  # fp32 only: grad input + grad weight
    assert (bwd["m"], bwd["n"], bwd["k"]) == (256, 16, 144) and bwd["flops_per_s"] > 0
    # QUICK_CONV (1, 16, 16, 16, 3, 1): 3x3, stride 1, padding 1 keeps 16x16: implicit GEMM M = 1*16*16,
    # N = Cout = 16, K = Cin*3*3 = 144
    assert (conv["m"], conv["n"], conv["k"]) == (256, 16, 144)
    assert {r["causal"] for r in quick.attention if r["dtype"] == "fp32"} == {False, True}
    assert quick.transcendental_per_s > 0 and quick.view_overhead_s > 0
    for r in quick.matmul:
        assert r["min_s"] <= r["max_s"] and r["flops_per_s"] > 0
    kinds = {r["kind"] for r in quick.bandwidth}
    assert kinds == {"copy", "read", "write", "fresh_write"}  # fresh writes from 1 MiB (the quick grid has one)
    assert quick.launch_overhead.median_s > 0
    assert quick.fingerprint["threads"] == torch.get_num_threads()
    # the host's load over the run goes with it (tests/calibrate/test_load.py: its verdict)
    c = quick.conditions
    assert c.cpus == len(allowed_cpus()) and 0 < c.run.wall_s and c.spread.rows == len(
        quick.matmul) + len(quick.conv) + len(quick.attention) + len(quick.bandwidth)
    assert c.busy == bool(c.verdict.reasons) and c.before.window_s >= 0.5


def test_profile_loads_as_hardware_local(quick, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(OpmapError, match="run `opmap calibrate` first"):
        get_hardware("local")
    # the loader path is tested here, on a shared test host: the run's load verdict is set to quiet
    quick = dataclasses.replace(quick, conditions=dataclasses.replace(
        quick.conditions, verdict=LoadVerdict((), quick.conditions.verdict.warnings)))
    path = write_profile(quick)
    assert path == tmp_path / "opmap" / "local.toml"
    hw = get_hardware("local")
    assert all(v.kind == "measured" for v in hw.matrix_peak_flops_per_s.values())
    assert hw.matrix_peak_flops_per_s["fp32"].value == max(
        r["flops_per_s"] for r in quick.matmul if r["dtype"] == "fp32")
    copy_rows = [r for r in quick.bandwidth if r["kind"] == "copy"]
    assert hw.memory_bandwidth_bytes_per_s == max(copy_rows, key=lambda r: r["bytes"])["bytes_per_s"]
    assert hw.calibration["fingerprint"]["model"]
    assert main(["analyze", "gpt2", "--seq", "16", "--dtype", "fp32", "--hardware", "local"]) == 0
    assert "local cpu" in capsys.readouterr().out


def test_toml_writer_round_trips():
    import tomllib

    d = {"a": 1, "t": {"x": 1.5, "s": 'q"uote', "l": ["p", "q"], "rows": [{"m": 1}, {"m": 2}], "sub": {"y": 2}}}
    assert tomllib.loads(to_toml(d)) == d


def test_vector_family_rates_are_in_the_rules_units(quick):
    from opmap.calibrate.run import _rule_vector_flops, _vector_kind_benchmarks

    assert set(quick.vector_kinds) == {"softmax", "layer_norm", "batch_norm", "batch_norm_train",
                                       "batch_norm_backward", "pool", "reduce"}
    assert all(r > 0 for r in quick.vector_kinds.values())
    fn, args = _vector_kind_benchmarks(torch.device("cpu"))["pool"]
    # max_pool2d 3x3 stride 2 padding 1 on 4x64x56x56 -> 4x64x28x28; the pool rule: one op per output per tap
    assert _rule_vector_flops(fn, args) == 4 * 64 * 28 * 28 * 9
    # training batch norm and its backward on 4x64x56x56: 8 vector ops per element each (costs/vector.py and
    # costs/backward.py: batch statistics, normalise, scale and shift; the gradients of x, weight and bias)
    for kind in ("batch_norm_train", "batch_norm_backward"):
        fn, args = _vector_kind_benchmarks(torch.device("cpu"))[kind]
        assert _rule_vector_flops(fn, args) == 8 * 4 * 64 * 56 * 56


def test_unknown_device_is_one_line_exit_2(capsys):
    assert main(["calibrate", "--device", "tpu"]) == 2
    assert "calibrate cannot run on 'tpu'; accepted: cpu, cuda" in capsys.readouterr().err


def test_each_format_has_a_ceiling_at_one_shared_size(quick):
    ceilings = [r for r in quick.matmul if r.get("ceiling")]
    # one large square GEMM per format that ran, all at the same side (timed interleaved: a load falls on each)
    assert {r["dtype"] for r in ceilings} >= {"fp32"} and len({r["m"] for r in ceilings}) == 1
    for r in ceilings:
        assert r["m"] == r["n"] == r["k"] and r["m"] % 256 == 0 and r["layout"] == "nt"
        # the rate is the median sample's: between the slowest and the fastest sample's
        assert 2.0 * r["m"] ** 3 / r["max_s"] <= r["flops_per_s"] * (1 + 1e-9)
        assert r["flops_per_s"] <= 2.0 * r["m"] ** 3 / r["min_s"] * (1 + 1e-9)
    from opmap.calibrate.grids import CEILING_CALL_S, CEILING_MAX
    from opmap.calibrate.run import ceiling_side

    # one call of 2 side^3 FLOPs lasts about CEILING_CALL_S: 1e11 FLOP/s x 0.05 s / 2 = 2.5e9 -> cube root 1357,
    # down to a multiple of 256: 1280
    assert ceiling_side(1e11) == (int((1e11 * CEILING_CALL_S / 2) ** (1 / 3)) // 256) * 256 == 1280
    assert ceiling_side(1e16) == CEILING_MAX and ceiling_side(1.0) == 256


def test_the_curve_runs_a_large_gemm_at_its_formats_ceiling():
    from opmap.hardware.curves import Curves
    from opmap.ops import MatrixFamily, MatrixProblem

    rows = [{"m": s, "n": s, "k": s, "dtype": "bf16", "layout": "nt", "flops_per_s": 1e10} for s in (256, 1024)]
    rows.append({"m": 2048, "n": 2048, "k": 2048, "dtype": "bf16", "layout": "nt", "flops_per_s": 4e10,
                 "ceiling": True})
    c = Curves.from_calibration({"matmul": rows}, 0.0)
    big = MatrixProblem(MatrixFamily.GEMM, 1, 8192, 8192, 8192)
    assert c.matrix_rate(big, "bf16") == 4e10  # past the ceiling in m, n and k: its rate, not a blend
    # 1024^3 is a measured point: its own rate, though the ceiling is larger
    assert c.matrix_rate(MatrixProblem(MatrixFamily.GEMM, 1, 1024, 1024, 1024), "bf16") == 1e10
    # a ceiling measured below the grid (a stalled run) is a floor, never a cut: the curve's own inverse-distance
    # blend of the three points holds (log2 distances from 8192^3: sqrt(3) x 5, 3 and 2; weights 1 / d^2)
    rows[-1] = {**rows[-1], "flops_per_s": 1e9}
    w = [1 / (3 * d * d) for d in (5, 3, 2)]
    idw = (w[0] * 1e10 + w[1] * 1e10 + w[2] * 1e9) / sum(w)
    assert Curves.from_calibration({"matmul": rows}, 0.0).matrix_rate(big, "bf16") == pytest.approx(idw)


def test_a_stalled_first_shape_does_not_skip_the_grid_and_the_budget_does():
    from opmap.calibrate.grids import BUDGET_S
    from opmap.calibrate.run import Calibration, _Bench

    cal = Calibration("cpu", {})
    b = _Bench(cal, torch.device("cpu"), False, lambda _m: None)
    rates = {"gemm": 1e3}  # a first shape stalled by the scheduler: 1 kFLOP/s
    # 2e7 FLOPs at the floor of 1e9 per thread: at most 0.02 s, under MAX_CALL_S: timed, not skipped
    assert b.shape("tiny", 2e7, lambda: (lambda: None), rates, "gemm") is not None and not cal.skipped
    b.deadline = (time.perf_counter() - 1.0, "past the 4 s share of the time budget for gemm")
    assert b.shape("late", 1.0, lambda: (lambda: None), rates, "gemm") is None
    assert cal.skipped == ["late: past the 4 s share of the time budget for gemm"]
    b.budget("gemm")  # the full grid's budget: grids.BUDGET_S["gemm"] from now
    assert b.deadline[0] - time.perf_counter() == pytest.approx(BUDGET_S["gemm"], abs=0.5)
    free = _Bench(cal, torch.device("cpu"), False, lambda _m: None, budgeted=False)
    free.budget("gemm")
    assert free.deadline is None  # --no-budget: no deadline


def test_parallel_overhead_is_measured_on_a_multithreaded_cpu():
    from opmap.calibrate.run import parallel_overhead

    p = parallel_overhead(torch.device("cpu"), rounds=3)
    if torch.get_num_threads() < 2:
        assert p == {}
        return
    assert p["threads"] == torch.get_num_threads()
    assert p["overhead_s"] == pytest.approx(max(0.0, p["many_s"] - p["one_s"] / p["threads"]))


def test_a_shape_is_timed_in_every_kept_format_at_once():
    from opmap.calibrate.run import Calibration, _Bench

    cal = Calibration("cpu", {})
    b = _Bench(cal, torch.device("cpu"), True, lambda _m: None)
    fast, slow = {"gemm": 1e15}, {"gemm": 1.0}
    calls = []
    makes = [lambda: (lambda: calls.append("a")), lambda: (lambda: calls.append("b"))]
    # 1e12 FLOPs: 1 ms at the first format's 1e15 FLOP/s; at the second's floor (1e9 per thread) over MAX_CALL_S
    out = b.shapes(["matmul a", "matmul b"], 1e12, makes, [fast, slow], "gemm")
    assert out[0] is not None and out[1] is None and set(calls) == {"a"}
    assert len(cal.skipped) == 1 and cal.skipped[0].startswith("matmul b: one call would take")
    out = b.shapes(["x", "y"], 1.0, makes, [fast, slow], "gemm")  # both kept: timed together, a Sample each
    assert all(s is not None and s.median_s > 0 for s in out) and set(calls) == {"a", "b"}


def _stand_in_calibration():
    """A calibration with stated rates (not measured): enough for the profile writer and the catalog loader."""
    from opmap.calibrate.fingerprint import fingerprint
    from opmap.calibrate.run import Calibration
    from opmap.timing import Sample

    cal = Calibration("cpu", fingerprint(torch.device("cpu")))
    cal.matmul = [{"m": s, "n": s, "k": s, "dtype": "fp32", "layout": "nt", "flops_per_s": 1e11, "min_s": 1e-4,
                   "max_s": 1e-4, "iqr_s": 0.0, "samples": 3} for s in (64, 256)]
    cal.bandwidth = [{"kind": "copy", "bytes": 2 ** 20, "bytes_per_s": 2e10, "min_s": 1e-4, "max_s": 1e-4,
                      "iqr_s": 0.0, "samples": 3}]
    cal.launch_overhead = Sample((3e-6, 3e-6, 3e-6))
    cal.vector = {"fp32": 2e10}
    cal.transcendental_per_s = 1e9
    cal.view_overhead_s = 1e-6
    return cal


def test_the_profile_is_never_written_through_a_planted_link(tmp_path):
    """The profile went through a fixed temporary name (local.tmp) opened by write_text, which follows a link:
    a link planted there overwrote its target with the profile. The temporary file is now created new (mkstemp),
    and a link at the profile's own name is replaced, not followed."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    other = tmp_path / "other.txt"
    other.write_text("keep me too")
    d = tmp_path / "opmap"
    d.mkdir()
    (d / "local.tmp").symlink_to(victim)
    (d / "local.toml").symlink_to(other)
    path = write_profile(_stand_in_calibration(), d / "local.toml")
    assert victim.read_text() == "keep me" and other.read_text() == "keep me too"
    assert not path.is_symlink() and get_hardware(str(path)).calibration["fingerprint"]
    assert sorted(p.name for p in d.iterdir()) == ["local.tmp", "local.toml"]  # no temporary file left
