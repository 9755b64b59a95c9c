"""The suite reads nothing a user's machine left behind (tests/conftest.py): every cache is the session's own, and a
bad calibration planted in the user's cache reaches no test (one calibrated under load made a bench test's
predicted TTFT 48x the measured on a clean clone)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from opmap.calibrate import Calibration, fingerprint, to_spec_dict, to_toml
from opmap.errors import OpmapError
from opmap.hardware import get_hardware
from opmap.timing import Sample

PLANTED = "planted: ceilings 1000x low"
TESTS = Path(__file__).resolve().parent


def test_probe_every_cache_is_the_sessions_own(own_caches):
    """The calibrated profile, the graph and tune caches and the run store lie in the session's folder."""
    from opmap.capture.cache import cache_dir as graph_cache
    from opmap.explore.tune.cache import cache_dir as tune_cache
    from opmap.hardware.local import cache_path
    from opmap.store.db import default_path

    cache = Path(own_caches["XDG_CACHE_HOME"])
    assert cache_path("cpu") == cache / "opmap" / "local.toml"
    assert cache_path("cuda") == cache / "opmap" / "local-cuda.toml"
    assert graph_cache().is_relative_to(cache) and tune_cache().is_relative_to(cache)
    assert default_path() == Path(own_caches["OPMAP_STORE"])
    assert not cache.is_relative_to(Path.home()) and os.environ["OPMAP_GRAPH_CACHE"] == "0"


def test_probe_hardware_local_is_never_the_users():
    """``--hardware local`` in a test is the session's profile or none: never a profile the user's cache holds."""
    try:
        hw = get_hardware("local")
    except OpmapError as e:
        assert "run `opmap calibrate` first" in str(e)
        return
    assert PLANTED not in hw.display_name


def _planted() -> str:
    """A profile as a loaded host once wrote it (issue 35: vector fp32 16.4 MFLOP/s, a 16.4 MB/s bandwidth), about
    1000x under this class of CPU's rates."""
    cal = Calibration(
        "cpu", fingerprint(torch.device("cpu")),
        matmul=[{"m": 256, "n": 256, "k": 256, "dtype": "fp32", "layout": "nt", "flops_per_s": 1.64e7,
                 "min_s": 2.0e-3, "max_s": 2.1e-3}],
        bandwidth=[{"kind": "copy", "bytes": 2 ** 20, "bytes_per_s": 1.64e7, "min_s": 0.13, "max_s": 0.14}],
        launch_overhead=Sample((5e-3, 6e-3, 7e-3)), vector={"fp32": 1.64e7}, transcendental_per_s=1e6,
        view_overhead_s=2e-3)
    return to_toml({**to_spec_dict(cal), "display_name": PLANTED})


def test_a_bad_profile_in_the_users_cache_reaches_no_test(tmp_path, monkeypatch):
    """The planted profile sits where a user's opmap calibrate writes it ($XDG_CACHE_HOME/opmap and
    ~/.cache/opmap, HOME a temporary folder). Outside the suite it is what --hardware local reads; the suite's
    probes, run under that environment, never see it."""
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    for base in (home / ".cache", xdg):
        (base / "opmap").mkdir(parents=True)
        (base / "opmap" / "local.toml").write_text(_planted())
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    hw = get_hardware("local")  # the plant works: outside the suite's own caches, --hardware local reads it
    assert hw.display_name == PLANTED and hw.memory_bandwidth_bytes_per_s == 1.64e7
    env = {k: v for k, v in os.environ.items() if k not in ("OPMAP_STORE", "XDG_DATA_HOME", "OPMAP_GRAPH_CACHE")}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(xdg))
    r = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p", "no:cacheprovider", "-k", "probe",
                        str(TESTS / "test_isolation.py")], cwd=TESTS.parent, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "2 passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
