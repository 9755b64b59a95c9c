"""Stopping a command: Ctrl-C (SIGINT) or SIGTERM ends fit, serve --find-capacity and sweep within seconds, keeps
what was finished (printed and written, marked interrupted), exits 128 + the signal's number and leaves no process
of its pool behind; a command killed outright (SIGKILL) takes its pool's workers with it.

Each command runs as a real process (``python -m opmap.cli``) with its progress bar drawn (TTY_COMPATIBLE), so a
test can see a task finish before it sends the signal, while the pool is still busy with others (fit: gpt2 on one
L4, seconds, beside llama-3-8b on one L4, about 20 s).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

psutil = pytest.importorskip("psutil")

STOP_S = 3.0  # the signal to the command's exit
GONE_S = 3.0  # the exit to the last process of its pool gone
START_S = 120.0  # the command's start to the progress the test waits for (a loaded machine)
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")
PROGRESS = re.compile(r"(\d+)/(\d+) \d+:\d\d:\d\d")  # the bar's "done/total elapsed"

# p99 9 s: llama-3-8b on one L4 takes 7.3 s a request alone, so its capacity is searched (at 2 s no rate is, and
# the search now says so at once)
FIT = ["fit", "--models", "gpt2,llama-3-8b", "--hardware", "l4", "--devices-budget", "1", "--slo-p99", "9000",
       "--no-store"]
SWEEP = ["sweep", "gpt2", "--seq", "32,64,128,256,512,1024", "--batch", "1,2,4,8", "--engine", "local", "--no-store"]
SERVE = ["serve", "gpt2", "--find-capacity", "--arrival", "poisson:10", "--slo-p99", "300", "--requests", "30000",
         "--engine", "local", "--no-store"]


class Command:
    """``opmap ARGS`` as a process of its own session, its output read as it comes."""

    def __init__(self, args: list[str], cwd) -> None:
        env = {**os.environ, "TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1", "COLUMNS": "200"}
        env.pop("OPMAP_WORKERS", None)  # the pool is what is stopped: the CPU count's workers (tests/conftest.py)
        self.p = subprocess.Popen([sys.executable, "-m", "opmap.cli", *args], cwd=cwd, env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  start_new_session=True)
        self.out, self.err = bytearray(), bytearray()
        self.kids: list = []
        self._readers = [threading.Thread(target=self._read, args=(f, buf), daemon=True)
                         for f, buf in ((self.p.stdout, self.out), (self.p.stderr, self.err))]
        for t in self._readers:
            t.start()

    @staticmethod
    def _read(f, buf: bytearray) -> None:
        for chunk in iter(lambda: f.read1(65536), b""):
            buf.extend(chunk)

    def text(self, buf: bytearray | None = None) -> str:
        return ANSI.sub(b"", bytes(self.out if buf is None else buf)).decode(errors="replace")

    def words(self) -> str:
        """The output with every run of white space one space (a wrapped table title reads whole)."""
        return " ".join(self.text().split())

    def progress(self, total: int, done: int = 1) -> None:
        """Wait until the bar (on stderr, where progress goes; stdout read too) shows ``done`` of ``total`` tasks
        finished and the pool's workers are up."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < START_S:
            seen = [(int(d), int(t)) for d, t in PROGRESS.findall(self.text(self.err) + self.text())]
            if any(t == total and d >= done for d, t in seen) and self.workers():
                return
            assert self.p.poll() is None, f"ended before the signal: {self.p.returncode}\n{self.text(self.err)}"
            time.sleep(0.1)
        pytest.fail(f"no {done}/{total} in the progress within {START_S} s:\n{self.text(self.err)[-2000:]}")

    def workers(self) -> list:
        self.kids = psutil.Process(self.p.pid).children(recursive=True)
        return [k for k in self.kids if "multiprocessing" in " ".join(_cmdline(k))]

    def signal(self, sig: int) -> float:
        """Send ``sig``; the seconds to the command's exit (the test fails past STOP_S)."""
        t0 = time.monotonic()
        self.p.send_signal(sig)
        try:
            self.p.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {STOP_S} s after {signal.Signals(sig).name}")
        for t in self._readers:
            t.join(timeout=5)
        return time.monotonic() - t0

    def left_behind(self) -> list[int]:
        """The pids of the command's processes (taken before the signal) still alive GONE_S after its exit."""
        t0 = time.monotonic()
        while True:  # a zombie is gone (re-parented, it waits for an init that may never reap it)
            alive = [k.pid for k in self.kids if _running(k)]
            if not alive or time.monotonic() - t0 > GONE_S:
                return alive
            time.sleep(0.05)

    def close(self) -> None:
        """Whatever is left of the command, killed (a failed test leaves nothing running)."""
        for k in [*self.kids, self.p]:
            try:
                os.kill(k.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.p.wait()


def _cmdline(k) -> list[str]:
    try:
        return k.cmdline()
    except psutil.Error:
        return []


def _running(k) -> bool:
    try:
        return k.is_running() and k.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture
def command(tmp_path):
    made = []

    def start(*args) -> Command:
        c = Command([*args], tmp_path)
        made.append(c)
        return c

    yield start
    for c in made:
        c.close()


def _stopped(c: Command, sig: int) -> None:
    """Exit 128 + the signal within STOP_S, one line naming it on stderr, no traceback, no process left."""
    took = c.signal(sig)
    err = c.text(c.err)
    assert c.p.returncode == 128 + sig, (c.p.returncode, err)
    assert f"opmap: stopped by {signal.Signals(sig).name}" in err and "Traceback" not in err, err
    assert c.left_behind() == [], f"alive {GONE_S} s after the exit ({took:.2f} s after the signal)"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_fit_stops_keeping_the_cells_finished(command, tmp_path, sig):
    """gpt2 on an L4 finishes in seconds; llama-3-8b on an L4 (handed out first, the costlier) runs for about 20:
    the stop keeps the gpt2 cell, names the llama cell not run, and kills the worker running it."""
    c = command(*FIT, "--out", tmp_path / "out")
    c.progress(total=2, done=1)
    _stopped(c, sig)
    name = signal.Signals(sig).name
    d = json.loads((tmp_path / "out" / "fit.json").read_text())
    assert [x["model"] for x in d["cells"]] == ["gpt2"] and d["cells"][0]["throughput_at_slo"] > 0
    assert d["interrupted"] == {"signal": name, "cells_done": 1, "cells_total": 2,
                                "cells_not_run": ["llama-3-8b on l4"]}
    out = c.words()
    assert f"INTERRUPTED by {name}, 1 of 2 cells run (not run: llama-3-8b on l4)" in out
    assert "not run: interrupted" in out and "trade_curve.png not drawn: the fit was interrupted" in out
    assert f"INTERRUPTED by {name}" in (tmp_path / "out" / "fit.md").read_text()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_sweep_stops_keeping_the_sequence_lengths_finished(command, tmp_path, sig):
    c = command(*SWEEP, "--out", tmp_path / "out")
    c.progress(total=6, done=1)
    _stopped(c, sig)
    d = json.loads((tmp_path / "out" / "sweep.json").read_text())
    stop = d["interrupted"]
    assert stop["signal"] == signal.Signals(sig).name and stop["seqs_done"] and stop["seqs_not_run"]
    assert sorted(stop["seqs_done"] + stop["seqs_not_run"]) == [32, 64, 128, 256, 512, 1024]
    # every point of a finished length kept, none of the others
    assert sorted({p["seq"] for p in d["points"]}) == sorted(stop["seqs_done"])
    assert len(d["points"]) == 4 * len(stop["seqs_done"])
    assert f"INTERRUPTED by {stop['signal']}, seq " in c.words()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_serve_capacity_search_stops_keeping_the_runs_finished(command, tmp_path, sig):
    """The search probes the saturation rate alone, then two rates below it at once, then rounds of four: a stop
    during the first round of four keeps the valid rate the earlier runs found (a lower bound), marked."""
    c = command(*SERVE, "--out", tmp_path / "out")
    c.progress(total=4, done=0)
    _stopped(c, sig)
    d = json.loads((tmp_path / "out" / "serve.json").read_text())
    cap, name = d["capacity"], signal.Signals(sig).name
    assert d["interrupted"] == cap["interrupted"] and cap["interrupted"]["signal"] == name
    assert cap["limited_by"] == "interrupted" and not cap["converged"] and len(cap["runs"]) >= 3
    valid = [r["rate_per_s"] for r in cap["runs"] if r["valid"]]
    assert cap["rate_per_s"] == max(v for v in valid if v < cap["bracket"][1])
    assert d["validity"]["valid"]  # the table printed is the run at that rate
    assert f"capacity: at least {cap['rate_per_s']:.4g} requests/s meet the SLO" in c.words()
    assert f"INTERRUPTED by {name} after {len(cap['runs'])} runs" in c.words()


def test_a_killed_command_takes_its_pool_with_it(command):
    """SIGKILL leaves no handler to run: the workers die with their parent (the kernel's parent-death signal),
    and the resource tracker once the last of them is gone."""
    c = command(*FIT)
    c.progress(total=2, done=0)
    assert len(c.workers()) >= 2, [_cmdline(k) for k in c.kids]
    c.p.send_signal(signal.SIGKILL)
    c.p.wait(timeout=STOP_S)
    assert c.left_behind() == []


def test_a_second_signal_ends_the_process_during_its_clean_up():
    """The first SIGTERM is an ``Interrupted`` the command cleans up after; a second signal during a clean-up that
    hangs ends the process at once, by that signal."""
    code = ("import time\nfrom opmap.cli.common import StopSignals\nwith StopSignals():\n    try:\n"
            "        print('ready', flush=True)\n        time.sleep(60)\n    except KeyboardInterrupt as e:\n"
            "        print(type(e).__name__, e.signum, flush=True)\n        time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        p.send_signal(signal.SIGTERM)
        assert p.stdout.readline() == f"Interrupted {int(signal.SIGTERM)}\n"
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=STOP_S) == -signal.SIGINT
    finally:
        p.kill()
        p.wait()
