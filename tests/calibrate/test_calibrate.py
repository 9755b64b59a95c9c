"""Local calibration: the quick grid end to end, the profile through the catalog loader, --hardware local."""

from __future__ import annotations

import time

import pytest
import torch

from opmap.calibrate import calibrate, to_toml, write_profile
from opmap.calibrate.grids import QUICK_GRID, QUICK_GRID_TA
from opmap.cli import main
from opmap.errors import OpmapError
from opmap.hardware import get_hardware
from opmap.timing import time_op


def test_time_op_measures_a_known_duration():
    # time.sleep(2 ms) takes at least 2 ms of wall time per call; scheduling only adds to it
    s = time_op(lambda: time.sleep(0.002), torch.device("cpu"), warmup=1, repeats=3, min_time_s=0.004)
    assert 0.002 <= s.median_s < 0.02
    assert s.spread()["min_s"] <= s.median_s <= s.spread()["max_s"]


@pytest.fixture(scope="module")
def quick():
    return calibrate("cpu", quick=True)


def test_quick_calibration_rows(quick):
    fp32 = [r for r in quick.matmul if r["dtype"] == "fp32" and r["layout"] == "nt"]  # nn.Linear's: x @ W.T
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


def test_profile_loads_as_hardware_local(quick, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(OpmapError, match="run `opmap calibrate` first"):
        get_hardware("local")
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
