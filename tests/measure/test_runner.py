"""Latency statistics against numpy's percentile; the profiled run on a real (tiny) CPU model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opmap.measure.attribute import attribute
from opmap.measure.runner import ITER_MARK, make_call, profile_iterations
from opmap.timing import LatencyStats, time_iterations


def test_quantiles_match_numpy():
    ts = (0.9, 0.1, 0.5, 0.3, 0.7, 0.2, 1.5)
    s = LatencyStats(ts).to_dict()
    for key, q in (("p50_s", 50), ("p95_s", 95), ("p99_s", 99)):
        assert s[key] == pytest.approx(float(np.percentile(ts, q)))
    assert s["mean_s"] == pytest.approx(float(np.mean(ts)))
    assert s["std_s"] == pytest.approx(float(np.std(ts, ddof=1)))
    assert s["iqr_s"] == pytest.approx(float(np.percentile(ts, 75) - np.percentile(ts, 25)))
    assert s["n"] == 7


def test_make_call_forms():
    m = torch.nn.Linear(4, 2)
    x = torch.ones(3, 4)
    assert make_call(m, (x,))().shape == (3, 2)
    assert make_call(m, {"input": x})().shape == (3, 2)


def test_profiled_iterations_attribute_every_kernel_of_a_real_run():
    from opmap.capture import capture

    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8))
    x = torch.randn(4, 16)
    call = make_call(net, (x,))
    with torch.no_grad():
        g = capture(net, (x,))
        lat = time_iterations(call, torch.device("cpu"), 3)
        run = profile_iterations(call, torch.device("cpu"), 2, keep_trace=True)
    assert len(lat.times_s) == 3 and all(t > 0 for t in lat.times_s)
    assert len(run.iterations) == 2
    assert not any(e.name.startswith(ITER_MARK) for _, evs in run.iterations for e in evs)
    kernels = [i for i, n in enumerate(g.nodes) if not n.is_view]
    a = attribute([n.op for n in g.nodes], kernels, run.iterations)
    assert a.coverage == 1.0
    assert set(kernels) <= set(a.timings)
    assert 0 < a.attributed_s <= a.iteration_s
    assert "traceEvents" in run.trace


def test_profiler_progress_lines_are_silenced_real_errors_kept(capfd):
    """kineto's USDT / STAGE lines at each profiler start and stop do not reach stderr; what the model itself
    writes there does."""
    import os

    def call():
        os.write(2, b"a real error line\n")
        return torch.randn(8, 8) @ torch.randn(8, 8)

    profile_iterations(call, torch.device("cpu"), 1, keep_trace=False)
    err = capfd.readouterr().err
    assert "USDT:" not in err and "STAGE:" not in err and "profiler_start" not in err, err
    assert err.count("a real error line") == 2  # the set-up iteration and the marked one
