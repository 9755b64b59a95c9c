"""``opmap calibrate --from-bench`` and ``opmap bench --predict --stack`` on the session's real ``transformers
serve``: two measured runs (closed loop at 1 and 4) fitted into a profile, the profile read back and applied to a
third run's prediction; the fit's own figures (after <= before, summed over the runs) are the check a broken fit
fails. The accuracy target at held-out concurrencies is benchmarks/bench_stack_calibration.py's (timing)."""

from __future__ import annotations

import json
import math

import pytest

from opmap.calibrate.stack_profile import read_stack_profile


def _bench(opmap_cli, server, tiny_config, hw, out, concurrency, requests, *extra):
    rc, stdout, err = opmap_cli("bench", server.base_url, "--model", server.model_id, "--concurrency", concurrency,
                                "--requests", requests, "--input-len", 24, "--output-len", 16, "--no-store",
                                "--out", out, "--config", tiny_config, "--hardware", hw, *extra)
    assert rc == 0, err
    return stdout


@pytest.fixture(scope="module")
def two_runs(server, tmp_path_factory):
    from opmap.cli import main

    d = tmp_path_factory.mktemp("stackfit")
    outs = []
    for c, n in ((1, 8), (4, 16)):
        out = d / f"c{c}"
        rc = main(["bench", server.base_url, "--model", server.model_id, "--concurrency", str(c), "--requests",
                   str(n), "--input-len", "24", "--output-len", "16", "--no-store", "--out", str(out)])
        assert rc == 0
        outs.append(out)
    return d, outs


@pytest.fixture(scope="module")
def calibrated(two_runs, tiny_config, local_hw):
    """(the profile's path, what the command printed)."""
    import contextlib
    import io

    from opmap.cli import main

    d, outs = two_runs
    prof_path = d / "stack.json"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["calibrate", "--from-bench", str(outs[0]), "--from-bench", str(outs[1]), "--config",
                   str(tiny_config), "--hardware", local_hw, "--dtype", "fp32", "--out", str(prof_path)])
    assert rc == 0
    return prof_path, buf.getvalue()


def test_calibrate_from_bench_writes_a_profile_that_fits_better(calibrated):
    prof_path, out = calibrated
    assert "predicted / measured, before" in out and f"wrote {prof_path}" in out.replace("\n", "")
    prof = read_stack_profile(prof_path)
    assert prof.concurrency_range == (1, 4) and [r.requests for r in prof.runs] == [8, 16]
    loss = lambda k: sum(math.log(getattr(r, k)) ** 2 for r in prof.residuals if getattr(r, k))
    assert loss("after") <= loss("before")
    assert prof.outside(concurrency=8).endswith("extrapolated") and prof.outside(concurrency=2) == ""


def test_bench_predict_with_a_stack_profile(opmap_cli, two_runs, calibrated, server, tiny_config, local_hw):
    d, _ = two_runs
    prof = calibrated[0]
    out = d / "c2"
    stdout = _bench(opmap_cli, server, tiny_config, local_hw, out, 2, 8, "--predict", "--stack", prof)
    assert "stack profile (opmap calibrate --from-bench)" in stdout
    doc = json.loads((out / "bench_predict.json").read_text())
    assert list(doc["predictions"]) == ["model", "model+stack"] and doc["stack"]["kind"] == "stack-profile"
    assert "overhead" not in doc  # the profile stands for the probes: none ran


@pytest.mark.parametrize("args, message", [
    (["calibrate", "--from-bench", "."], "--from-bench writes a stack profile: name it with --out PATH"),
    (["calibrate", "--from-bench", "/nonexistent-run", "--out", "/tmp/x.json"], "not a folder"),
    (["bench", "http://127.0.0.1:9", "--model", "m", "--stack", "s.json"], "--stack applies a stack profile"),
])
def test_bad_input_is_one_line(opmap_cli, args, message):
    rc, out, err = opmap_cli(*args)
    assert rc == 2 and message in err and "Traceback" not in err
