"""A run read from an output folder as from the store: compare takes folders, bad folders are refused."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("duckdb")

from opmap.errors import OpmapError  # noqa: E402
from opmap.store.compare import compare  # noqa: E402
from opmap.store.source import load  # noqa: E402


def _profile_json(scale: float) -> dict:
    lat = [0.010 * scale * (1 + 0.001 * i) for i in range(20)]  # 20 steady steps of 10 ms x scale
    return {"schema_version": 3, "kind": "profile",
            "assumptions": {"workload": "m.py:m", "hardware": "h100-sxm", "dtype": "fp32", "batch": 1},
            "nodes": [{"id": 0, "op": "aten.mm.default", "module": "fc", "layer_type": "mlp", "flops": 1.0,
                       "inputs": [], "outputs": []}],
            "kernels": [{"anchor": 0, "nodes": [0], "predicted_s": 1e-3, "measured_s": 0.010 * scale,
                         "measured_samples_s": lat[-3:]}],
            "layer_types": {"mlp": {"share_of_time": 1.0, "predicted_s": 1e-3}},
            "latency": {"samples_s": lat, "p50_s": lat[10]},
            "tags": {"device_name": "AMD EPYC", "device": "cpu", "threads": 2, "host": "ci-1",
                     "time_utc": "2026-12-04T00:00:00Z"}}


def _folder(tmp_path, name, body, file="profile.json"):
    d = tmp_path / name
    d.mkdir()
    (d / file).write_text(json.dumps(body))
    return str(d)


def test_compare_reads_two_output_folders_without_a_store(tmp_path):
    a = _folder(tmp_path, "a", _profile_json(1.0))
    b = _folder(tmp_path, "b", _profile_json(1.25))
    nowhere = tmp_path / "no-store.duckdb"
    r = compare(a, b, nowhere)
    # +25% on steady samples, but folders have no repeats: the noise between runs is not measured, inconclusive
    assert r.verdict.verdict == "inconclusive" and r.verdict.effect == pytest.approx(0.25)
    assert r.verdict.evidence.noise.runs_a == (a,) and r.times == "measured" and r.kernels[0].rel == pytest.approx(0.25)
    assert not nowhere.exists()
    run = load(a, nowhere)
    assert (run.kind, run.stored, run.time_utc, run.tags["workload"]) == ("profile", False, "2026-12-04T00:00:00Z",
                                                                         "m.py:m")


def test_bad_folders_are_refused_in_one_line(tmp_path):
    nowhere = tmp_path / "no-store.duckdb"
    bad = _profile_json(1.0)
    bad["latency"]["samples_s"][3] = float("nan")
    cases = {_folder(tmp_path, "nan", bad): "holds nan; accepted: finite times >= 0 s",
             _folder(tmp_path, "foreign", {"hello": 1}): "is not opmap's profile.json (no 'assumptions')",
             _folder(tmp_path, "empty", {}, file="notes.txt"): "nothing to read in",
             str(tmp_path / "missing"): "no folder",
             _folder(tmp_path, "swept", {"points": [{"batch": 1}]}, file="sweep.json"): "is a sweep run"}
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "analysis.json").write_text("{not json")
    cases[str(tmp_path / "broken")] = "cannot read"
    good = _folder(tmp_path, "good", _profile_json(1.0))
    for folder, needle in cases.items():
        with pytest.raises(OpmapError, match=None) as e:
            compare(good, folder, nowhere)
        assert needle in str(e.value) and "\n" not in str(e.value), (folder, e.value)


@pytest.mark.parametrize("kind", ["link to a good file", "link to /dev/zero", "fifo", "over the limit"])
def test_a_folder_file_must_be_a_bounded_regular_file(tmp_path, kind):
    """A run folder's file is read as opmap.safeio reads what others wrote: a link was followed (to any file the
    reader can open), /dev/zero behind a link was skipped as 'nothing to read', a file of any size was read whole.
    Each is now one line naming the file and what it is."""
    import os

    from opmap.safeio import LIMIT_JSON_BYTES

    good = _folder(tmp_path, "good", _profile_json(1.0))
    d = tmp_path / "bad"
    d.mkdir()
    f = d / "profile.json"
    if kind == "link to a good file":
        f.symlink_to(os.path.join(good, "profile.json"))
    elif kind == "link to /dev/zero":
        f.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(f)
    else:
        with open(f, "wb") as fh:  # sparse: refused on its size, nothing read
            fh.truncate(LIMIT_JSON_BYTES + 1)
    needle = {"link to a good file": "is a symbolic link", "link to /dev/zero": "is a symbolic link",
              "fifo": "is a FIFO: expected a regular file", "over the limit": "over the 64 MiB opmap reads for it"}
    with pytest.raises(OpmapError) as e:
        load(str(d), tmp_path / "no-store.duckdb")
    assert f"run file {f}" in str(e.value) and needle[kind] in str(e.value) and "\n" not in str(e.value)
