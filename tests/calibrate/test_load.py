"""A busy host: calibration under a real load (busy-loop processes, 3 per CPU) is refused and never stored as the
host's profile; the load readings against their formulas. (A forced busy profile, written apart and marked:
tests/cli/test_calibrate_cmd.py.)"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import torch

from opmap.calibrate import calibrate
from opmap.calibrate.load import BUSY_SHARE, UNSTABLE_SPREAD, Clock, LoadVerdict, Precheck, conditions, spread, window
from opmap.cli import main
from opmap.errors import OpmapError
from opmap.hardware import get_hardware
from opmap.hardware.host import allowed_cpus, cpu_busy_s
from opmap.record import record


@contextlib.contextmanager
def busy_loops(per_cpu: int = 3):
    """``per_cpu`` busy-loop processes per allowed CPU, spinning until the block ends; each one killed and reaped by
    its own pid."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(per_cpu * len(allowed_cpus()))]
    try:
        time.sleep(0.5)  # started and spinning
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def test_a_calibration_under_a_real_load_is_refused_and_not_stored(tmp_path, monkeypatch, capsys):
    """At 3 busy loops per CPU, ``opmap calibrate`` (once silent: it wrote ceilings 100-1000x low as the host's) is
    refused in one line before measuring, and ``--hardware local`` finds no profile."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with busy_loops():
        t0 = time.perf_counter()
        rc = main(["calibrate", "--quick", "--no-store"])
        took = time.perf_counter() - t0
        with pytest.raises(OpmapError, match=r"the host is busy \(other processes took"):
            calibrate("cpu", quick=True)
    out, err = capsys.readouterr()
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 2 and len(lines) == 1 and "the host is busy (other processes took" in lines[0], (rc, out, err)
    assert "a calibration now would read low, so none was run" in lines[0] and "Traceback" not in out + err
    assert took < 5.0  # refused from the half-second window before the run, not after a calibration
    assert not (tmp_path / "opmap" / "local.toml").exists()
    with pytest.raises(OpmapError, match="run `opmap calibrate` first"):
        get_hardware("local")


def test_a_load_that_starts_after_the_first_window_is_caught_over_the_run():
    """The readings calibrate takes (load.Clock at the start and the end of its run), around 1.5 s of real matmuls
    with the busy loops started after the first one: others' share of the CPUs over the run, or the run's own CPU
    time a wall second, says busy (a whole quick calibration under this load takes a minute on 2 cores)."""
    quiet_pre = Precheck(len(allowed_cpus()), 0.5, 0.0, None, LoadVerdict((), ()))
    a = torch.randn(256, 256)
    start = Clock.now()
    with busy_loops():
        t = time.perf_counter()
        while time.perf_counter() - t < 1.5:
            a @ a
        c = conditions(quiet_pre, start, Clock.now(), [], cpu_run=True)
    run = c.run
    assert c.busy and all("during the run" in r for r in c.verdict.reasons), c
    assert (run.others_cpu_share if run.others_cpu_share is not None else 1.0) >= BUSY_SHARE \
        or run.own_cpu_per_wall < 0.5, run
    assert 2.0 <= run.wall_s < 10.0  # the half second the loops took to start, then 1.5 s of matmuls


def test_cpu_busy_time_reads_proc_stat(tmp_path):
    """proc(5): per-CPU columns user nice system idle iowait irq softirq steal guest guest_nice, in USER_HZ ticks;
    busy = user + nice + system + irq + softirq + steal (idle, iowait and the guest columns, already in user and
    nice, left out). cpu0: 100 + 2 + 30 + 5 + 1 + 7 = 145 ticks; cpu1: 10 + 0 + 20 + 0 + 0 + 0 = 30."""
    stat = tmp_path / "stat"
    stat.write_text("cpu  110 2 50 9000 40 5 1 7 3 0\n"
                    "cpu0 100 2 30 4000 20 5 1 7 3 0\n"
                    "cpu1 10 0 20 5000 20 0 0 0 0 0\n"
                    "intr 12345\n")
    hz = os.sysconf("SC_CLK_TCK")
    assert cpu_busy_s([0], stat) == pytest.approx(145 / hz)
    assert cpu_busy_s([0, 1], stat) == pytest.approx(175 / hz)
    assert cpu_busy_s([7], stat) is None and cpu_busy_s([0], tmp_path / "missing") is None


def test_window_and_verdict_follow_their_formulas():
    """others' share = (busy time of the allowed CPUs - this process's CPU time) / (wall x CPUs):
    10 s on 2 CPUs, 15 s busy of which 5 s ours -> 10 / 20 = 0.5; ours a wall second: 5 / 10 = 0.5."""
    w = window(Clock(0.0, 0.0, 0.0, 2), Clock(10.0, 5.0, 15.0, 2))
    assert (w.wall_s, w.own_cpu_s, w.own_cpu_per_wall, w.others_cpu_share) == pytest.approx((10.0, 5.0, 0.5, 0.5))
    quiet_pre = Precheck(2, 0.5, 0.0, None, LoadVerdict((), ()))
    steady = [{"min_s": 1.0, "max_s": 1.1}] * 5
    # 19.5 of 20 CPU seconds ours: others 0.5 / 20 = 2.5%, quiet
    c = conditions(quiet_pre, Clock(0.0, 0.0, 0.0, 2), Clock(10.0, 19.5, 20.0, 2), steady, cpu_run=True)
    assert not c.busy and c.verdict == LoadVerdict((), ())
    # 2.4 CPU s of ours in 10 s (0.24 a wall second), 17.6 s of others' on 2 CPUs: 88%
    c = conditions(quiet_pre, Clock(0.0, 0.0, 0.0, 2), Clock(10.0, 2.4, 20.0, 2), steady, cpu_run=True)
    assert c.busy and c.run.others_cpu_share == pytest.approx(0.88)
    assert c.verdict.reasons[:2] == ("other processes took 88% of the 2 CPUs' time during the run",
                                     "the run got 0.24 CPU seconds a wall second during the run")
    # as the profile file holds it under [calibration.conditions]
    d = record(c)
    after = ["load_average_1m_after"] if c.load_average_1m_after is not None else []  # where the OS has one
    assert list(d) == ["cpus", "before", "run", "spread", *after, "busy", "reasons", "warnings"]
    assert "load_average_1m_after" not in record(replace(c, load_average_1m_after=None))
    assert list(d["run"]) == ["wall_s", "own_cpu_s", "own_cpu_per_wall", "others_cpu_share"]
    assert d["busy"] is True and d["run"]["own_cpu_per_wall"] == pytest.approx(0.24) and d["spread"]["rows"] == 5.0
    assert d["before"] == {"cpus": 2, "window_s": 0.5, "others_cpu_share": 0.0} and d["reasons"][0].startswith(
        "other processes took 88%")
    # a GPU run waits on the device: its own CPU time is not judged
    c = conditions(quiet_pre, Clock(0.0, 0.0, 0.0, 2), Clock(10.0, 2.4, 2.4, 2), steady, cpu_run=False)
    assert not c.busy


def test_repeats_that_disagree_are_unstable():
    """The median over rows of slowest / fastest: ratios 1.1, 2.5, 3.0 -> 2.5, at or past UNSTABLE_SPREAD (2.0)."""
    rows = [{"min_s": 1.0, "max_s": 1.1}, {"min_s": 2.0, "max_s": 5.0}, {"min_s": 1.0, "max_s": 3.0}]
    assert spread(rows).median_max_over_min == pytest.approx(2.5) and 2.5 >= UNSTABLE_SPREAD
    quiet_pre = Precheck(2, 0.5, 0.0, None, LoadVerdict((), ()))
    c = conditions(quiet_pre, Clock(0.0, 0.0, 0.0, 2), Clock(10.0, 20.0, 20.0, 2), rows, cpu_run=True)
    assert c.busy and c.verdict.reasons == (
        "repeats of one shape disagreed (slowest / fastest 2.50 at the median row)",)
    assert spread([{"min_s": 1.0, "max_s": 1.2}] * 3).median_max_over_min == pytest.approx(1.2)
