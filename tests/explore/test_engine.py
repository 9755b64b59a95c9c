"""Engines: the local process pool and a real local Ray instance give the same results as running inline."""

from __future__ import annotations

import builtins
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from opmap.errors import Interrupted, OpmapError
from opmap.explore.engine import ENGINES, LocalEngine, check_engine, get_engine
from opmap.explore.fit import fit_matrix
from opmap.explore.sweep import sweep
from opmap.hardware import get_hardware
from opmap.record import record
from opmap.serve.metrics import Slo

SWEEP = ("gpt2", [1, 2, 8], [32, 64])  # two sequence lengths: two tasks


def test_map_keeps_input_order_and_reports_progress():
    seen = []
    with LocalEngine(workers=2) as eng:
        out = eng.map(math.sqrt, [16.0, 1.0, 9.0, 4.0], progress=lambda what, d, t: seen.append((d, t)))
    assert out == [4.0, 1.0, 3.0, 2.0]
    assert sorted(seen) == [(1, 4), (2, 4), (3, 4), (4, 4)]


def _started_at(seconds: float) -> float:
    """Sleep ``seconds`` and return when the task started (module level: the pool's workers import it)."""
    t = time.monotonic()
    time.sleep(seconds)
    return t


def test_the_pool_takes_its_worker_cap_from_the_caller_else_opmap_workers_else_the_cpu_count(monkeypatch):
    """$OPMAP_WORKERS caps the pool where the caller names no count (the test session sets it to 1: tests/conftest.py);
    a named count wins; unset, the CPU count; anything but a positive integer is one line naming what is accepted."""
    from opmap.explore.engine import WORKERS_ENV

    assert WORKERS_ENV == "OPMAP_WORKERS" and os.environ[WORKERS_ENV] == "1"
    assert LocalEngine().workers_for(8) == 1 and LocalEngine(workers=2).workers_for(8) == 2
    monkeypatch.setenv(WORKERS_ENV, "3")
    assert LocalEngine().workers_for(8) == 3 and LocalEngine().workers_for(2) == 2
    assert get_engine("local").workers_for(8) == 3 and get_engine("local", 1).workers_for(8) == 1
    monkeypatch.delenv(WORKERS_ENV)
    assert LocalEngine().workers_for(10 ** 6) == os.cpu_count()
    for bad in ("0", "two", "-1", "1.5"):
        monkeypatch.setenv(WORKERS_ENV, bad)
        with pytest.raises(OpmapError, match=rf"OPMAP_WORKERS='{re.escape(bad)}' is not a worker count; accepted: "
                                             "a positive integer"):
            LocalEngine()
    monkeypatch.setenv(WORKERS_ENV, " ")
    assert LocalEngine().workers_for(10 ** 6) == os.cpu_count()


def test_the_costliest_task_is_handed_out_first():
    """Two workers, two short tasks listed before a long one: in input order the long task waits for a short one
    to finish (0.6 s) and starts last; handed out by cost it starts before one of the short ones (longest
    processing time first, so the wall is 1.2 s, not 1.8). The results stay in input order. Start order, not a
    time bound: a loaded host may start the second worker late, which moves every start alike."""
    with LocalEngine(workers=2) as eng:
        out = eng.map(_started_at, [0.6, 0.6, 1.2], cost=lambda s: s)
    assert out[2] < max(out[:2])


def test_fit_hands_out_the_largest_model_on_the_slowest_device_first():
    """A fit cell's cost guess: published parameters over the device's achievable memory rate (catalog), the
    weight read that paces decode; a model outside the zoo, whose size is unknown until built, goes first."""
    from opmap.explore.fit import CellJob, cell_cost

    def job(m, h):
        return CellJob(m, h, Slo(1, 0.1), "8", "8", 10, "bf16", None, None, None, 0)

    assert cell_cost(job("llama-3-70b", "l4")) == 70_553_706_496 / get_hardware("l4").memory_rate_bytes_per_s
    assert cell_cost(job("llama-3-70b", "l4")) > cell_cost(job("llama-3-70b", "h100-sxm")) > cell_cost(
        job("gpt2", "l4"))
    assert cell_cost(job("configs/model.json", "l4")) == math.inf


@pytest.fixture(scope="module")
def pooled_sweep():
    """SWEEP on the local pool (two workers), run once for the module: the inline run and Ray's are compared with
    it (each a pool of spawned interpreters importing torch: 15-30 s on a loaded 2-core host)."""
    return sweep(*SWEEP[:1], get_hardware("h100-sxm"), *SWEEP[1:], workers=2)


def test_local_pool_sweep_equals_inline(pooled_sweep):
    inline = sweep(*SWEEP[:1], get_hardware("h100-sxm"), *SWEEP[1:], workers=1)
    pooled = pooled_sweep
    assert pooled.points == inline.points and pooled.captures == inline.captures == 8
    assert [(p.seq, p.batch) for p in pooled.points] == [(s, b) for s in (32, 64) for b in (1, 2, 8)]


def test_local_pool_fit_equals_inline():
    args = (["gpt2"], ["h100-sxm", "l4"], Slo(0.5, 0.05), "256", "32", 100)
    inline, pooled = fit_matrix(*args, workers=1, devices_budget=1), fit_matrix(*args, workers=2, devices_budget=1)
    cells = [json.dumps(record(r)["cells"], sort_keys=True) for r in (pooled, inline)]
    assert cells[0] == cells[1]
    assert [c.hardware for c in pooled.cells] == ["h100-sxm", "l4"]


def test_a_task_error_reaches_the_caller_as_itself():
    with pytest.raises(OpmapError, match="unknown engine 'spark'"), LocalEngine(workers=2) as eng:
        eng.map(check_engine, ["local", "spark"])


def test_bad_engine_names_the_accepted_ones():
    assert ENGINES == ("local", "ray")
    with pytest.raises(OpmapError, match=r"unknown engine 'spark'; accepted: local, ray"):
        get_engine("spark")
    with pytest.raises(OpmapError, match="unknown engine 'dask'; accepted: local, ray"):
        sweep("gpt2", get_hardware("h100-sxm"), [1], [32], engine="dask")


def test_missing_ray_names_the_extra(monkeypatch):
    real_import = builtins.__import__

    def no_ray(name, *a, **k):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(OpmapError, match=r"--engine ray needs the ray extra: pip install 'opmap\[ray\]'"):
        get_engine("ray").map(math.sqrt, [1.0, 4.0])


def test_ray_local_instance_sweep_equals_local_pool(monkeypatch, pooled_sweep):
    """A real local Ray instance (2 CPUs), shut down whatever happens."""
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'opmap[ray]')")
    from opmap.explore.engine import ray_init

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    hw = get_hardware("h100-sxm")
    try:
        ray_init(num_cpus=2)
        assert ray.cluster_resources().get("CPU") == 2
        on_ray = sweep(*SWEEP[:1], hw, *SWEEP[1:], engine="ray")
        local = pooled_sweep  # engine "local" (the default), two workers
        assert on_ray.points == local.points and on_ray.engine == "ray"
        with pytest.raises(OpmapError, match="unknown engine 'spark'"):  # a task's own error, unwrapped
            get_engine("ray").map(check_engine, ["spark"])
    finally:
        ray.shutdown()


def test_capacity_search_on_the_pool_equals_inline():
    from opmap.serve import parse_arrival, parse_length, parse_policy, parse_service_time
    from opmap.serve.capacity import RateProbe, find_capacity

    probe = RateProbe(parse_arrival("poisson:5"), parse_length("1"), parse_length("1"), 2000, parse_policy("none"),
                      parse_service_time("exp:100"), slo=Slo(None, None, 2.0))
    with LocalEngine(workers=2) as eng:
        pooled = find_capacity(probe, 5.0, map_fn=lambda fn, rates: eng.map(fn, rates))
    assert pooled == find_capacity(probe, 5.0)
    # M/M/1 with mu = 10/s: the sojourn time is exponential at rate mu - lambda (Kleinrock 1975, sec. 3.2), so a
    # 2 s p99 holds up to lambda = 10 - ln(100) / 2 = 7.70/s; 2,000 requests give a noisy p99: within 15%
    assert pooled.rate_per_s == pytest.approx(10 - math.log(100) / 2, rel=0.15)


def test_a_stop_kills_the_pool_at_once_and_keeps_what_finished():
    """Ctrl-C during a map: it stops within a second, though the tasks running still had 30 s to go (none is
    waited for), its workers are killed, and the stop carries the one result finished, by its input index."""
    psutil = pytest.importorskip("psutil")
    sent: list[float] = []

    def stop_after_first(what: str, done: int, total: int) -> None:  # Ctrl-C once the first task has finished
        if done == 1:
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)

    eng = LocalEngine(workers=2)
    stop = None
    try:
        eng.map(_started_at, [0.2, 30.0, 30.0, 30.0], progress=stop_after_first)
    except KeyboardInterrupt as e:  # caught whatever its class, so that a wrong one fails this test, not the run
        stop = e
    took = time.monotonic() - sent[0]
    workers = [p for p in psutil.Process().children() if "multiprocessing" in " ".join(p.cmdline())
               and "resource_tracker" not in " ".join(p.cmdline())]
    eng.close()
    assert isinstance(stop, Interrupted) and stop.signum == signal.SIGINT and stop.exit_status == 130
    assert list(stop.done) == [0] and isinstance(stop.done[0], float)
    assert took < 1.0, took  # the running tasks had 30 s to go
    assert workers == [], [p.cmdline() for p in workers]


def _gone(procs: list, within_s: float) -> list[int]:
    """The pids of ``procs`` still running ``within_s`` seconds on (a zombie counts as gone: re-parented, it waits
    for an init that may never reap it)."""
    import psutil

    def running(p) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    t0 = time.monotonic()
    while [p for p in procs if running(p)] and time.monotonic() - t0 < within_s:
        time.sleep(0.05)
    return [p.pid for p in procs if running(p)]


def test_a_killed_parent_takes_its_workers_and_resource_tracker_with_it(tmp_path):
    """SIGKILL leaves the parent no handler to run: its pool's workers die by the kernel's parent-death signal,
    and with them the last holders of the resource tracker's pipe, so it ends too."""
    psutil = pytest.importorskip("psutil")
    code = ("import time\nfrom opmap.explore.engine import LocalEngine\n"
            "if __name__ == '__main__':\n    LocalEngine(workers=2).map(time.sleep, [60, 60])\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)
    try:
        kids: list = []
        for _ in range(600):  # until the resource tracker and both workers are up
            kids = psutil.Process(p.pid).children(recursive=True)
            if len(kids) >= 3:
                break
            time.sleep(0.1)
        time.sleep(0.5)  # the workers past their start-up, in their tasks
        kids = psutil.Process(p.pid).children(recursive=True)
        assert len(kids) >= 3, [k.cmdline() for k in kids]
        p.kill()
        p.wait()
        assert _gone(kids, 3.0) == []
    finally:
        for k in psutil.Process().children(recursive=True):
            if k.pid != p.pid:
                k.kill()
        p.kill()
        p.wait()


def test_without_prctl_a_worker_polls_its_parent(tmp_path):
    """Where the kernel cannot signal a parent's death (not Linux), the worker's own thread notices it: a process
    watching its parent ends within a poll or two of that parent being killed."""
    psutil = pytest.importorskip("psutil")
    code = ("import os, sys, time\nfrom opmap.explore import engine\nengine.WATCH_S = 0.1\npid = os.fork()\n"
            "if pid == 0:\n    engine._watch_parent(os.getppid())\n    os._exit(0)\n"
            "print(pid, flush=True)\ntime.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    try:
        watcher = psutil.Process(int(p.stdout.readline()))
        time.sleep(0.3)
        assert watcher.is_running() and watcher.status() != psutil.STATUS_ZOMBIE  # alive while its parent is
        p.kill()
        p.wait()
        assert _gone([watcher], 2.0) == []
    finally:
        p.kill()
        p.wait()
