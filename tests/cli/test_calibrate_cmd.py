"""opmap calibrate: the measured table, the datasheet comparison, the profile written (library stood in)."""

from __future__ import annotations

from opmap.hardware import load_spec_file


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
