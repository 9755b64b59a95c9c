"""opmap calibrate: the measured table, the datasheet comparison, the profile written (library stood in); a busy
host's calibration never written as the host's profile."""

from __future__ import annotations

import pytest
import torch

from opmap.calibrate import Calibration, fingerprint, write_profile
from opmap.calibrate.load import Conditions, LoadVerdict, Precheck, Spread, Window
from opmap.errors import OpmapError
from opmap.hardware import load_spec_file
from opmap.timing import Sample


def test_writes_the_profile_and_compares(tmp_path, cli, stand_in_calibration):
    rc, out, err = cli("calibrate", "--quick", "--out", tmp_path / "cal.toml", "--datasheet", "xeon-8480")
    assert rc == 0, err
    assert stand_in_calibration == [("cpu", True)]
    assert "measured on" in out and "matmul fp32" in out and "dispatch overhead" in out
    assert "measured over datasheet (xeon-8480" in out
    assert f"wrote {tmp_path / 'cal.toml'}; use it with --hardware local" in out
    assert load_spec_file(tmp_path / "cal.toml").name == "local"


def test_default_path_is_the_cache(tmp_path, monkeypatch, cli, stand_in_calibration):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    rc, out, err = cli("calibrate")
    assert rc == 0, err
    assert (tmp_path / "opmap" / "local.toml").is_file() and "measured over datasheet" not in out


def test_bad_datasheet_fails_before_measuring(tmp_path, refused, fail_if_called):
    fail_if_called("opmap.calibrate.calibrate")
    refused("calibrate", "--out", tmp_path / "cal.toml", "--datasheet", "nope", needle="unknown hardware 'nope'")
    assert not (tmp_path / "cal.toml").exists()


def test_calibrate_is_recorded(tmp_path, cli, stand_in_calibration):
    import json

    import pytest

    pytest.importorskip("duckdb")
    store = tmp_path / "runs.duckdb"
    rc, out, err = cli("calibrate", "--quick", "--out", tmp_path / "cal.toml", "--store", store)
    assert rc == 0 and "recorded as run" in out, err
    rc, out, _ = cli("runs", "list", "--json", "--where", "kind=calibrate", "--store", store)
    (run,) = json.loads(out)
    assert run["tags"]["phase"] == "calibrate" and run["tags"]["hardware"].startswith("local: ")
    assert run["tags"]["fingerprint"]["threads"]
    rc, out, _ = cli("calibrate", "--quick", "--out", tmp_path / "cal.toml", "--store", store, "--no-store")
    assert rc == 0 and "recorded as run" not in out


def _busy_calibration(device: str = "cpu", quick: bool = False, progress=None, budgeted: bool = True,
                      allow_busy: bool = False) -> Calibration:
    """A small calibration as one measured at load 9.5 on 2 cores returned it (issue 35: ceilings 100-1000x low)."""
    return Calibration(
        device, fingerprint(torch.device(device)),
        matmul=[{"m": 256, "n": 256, "k": 256, "dtype": "fp32", "layout": "nt", "flops_per_s": 1.64e7,
                 "min_s": 2e-3, "max_s": 9e-3}],
        bandwidth=[{"kind": "copy", "bytes": 2 ** 20, "bytes_per_s": 1.64e7, "min_s": 1e-2, "max_s": 8e-2}],
        launch_overhead=Sample((5e-5, 6e-5, 4e-4)), vector={"fp32": 1.64e7}, transcendental_per_s=1e6,
        view_overhead_s=2e-5,
        conditions=Conditions(2, Precheck(2, 0.5, 0.05, 9.5, LoadVerdict((), ())), Window(60.0, 22.8, 0.81),
                              Spread(2, 4.3), 9.5,
                              LoadVerdict(("other processes took 81% of the 2 CPUs' time during the run",), ())))


def test_a_busy_profile_goes_only_elsewhere_and_marked(tmp_path, monkeypatch, cli, refused, fail_if_called):
    """The calibration itself stood in by a busy one (the failure it imitates): the host's profile is never written;
    --allow-busy needs --out elsewhere (refused before measuring) and writes a profile marked busy."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    host = tmp_path / "cache" / "opmap" / "local.toml"
    fail_if_called("opmap.calibrate.calibrate")
    refused("calibrate", "--allow-busy", needle="--allow-busy keeps a busy host's profile apart from the host's")
    refused("calibrate", "--allow-busy", "--out", host, needle="name another file with --out PATH")
    monkeypatch.setattr("opmap.calibrate.calibrate", _busy_calibration)
    line = refused("calibrate", needle="the host was busy while calibrating (other processes took 81%")
    assert "nothing was written" in line and "during the run; 1-minute load average 9.5 on 2 CPUs)" in line
    refused("calibrate", "--out", tmp_path / "x.toml", needle="the host was busy while calibrating")
    assert not host.exists() and not (tmp_path / "x.toml").exists()
    rc, out, err = cli("calibrate", "--allow-busy", "--out", tmp_path / "busy.toml", "--no-store")
    assert rc == 0, err
    assert "warning: measured on a busy host (other processes took 81%" in out and not host.exists()
    spec = load_spec_file(tmp_path / "busy.toml")
    assert spec.display_name.startswith("local cpu (busy host): ") and "BUSY host" in spec.notes
    assert spec.calibration["conditions"]["busy"] is True
    with pytest.raises(OpmapError, match="not stored as this host's profile"):
        write_profile(_busy_calibration())
    assert not host.exists()
