"""The telemetry tags value (opmap.tags): each command's tag set written in its order, nulls kept, the recorded
prefix ahead of it; the JSON is what the run store and profile.json held before Tags was a value."""

from __future__ import annotations

import json

import pytest

from opmap.record import record
from opmap.tags import KEYS, TAGS_VERSION, Fingerprint, Tags


def test_an_analysis_run_writes_its_twelve_tags_in_order_with_nulls():
    t = Tags("analysis", workload="gpt2", hardware="h100-sxm", phase="prefill", precision="bf16", batch=1, seq=8,
             fusion="eager", parallelism="single device", graph_hash="0123456789abcdef", opmap_version="0.1",
             torch_version=None)
    assert list(t.to_dict()) == ["tags_version", "workload", "hardware", "phase", "precision", "batch", "seq",
                                 "fusion", "parallelism", "graph_hash", "opmap_version", "torch_version"]
    # written as the dict literal store/rows.py built before (byte for byte)
    assert json.dumps(t.to_dict()) == (
        '{"tags_version": 1, "workload": "gpt2", "hardware": "h100-sxm", "phase": "prefill", "precision": "bf16", '
        '"batch": 1, "seq": 8, "fusion": "eager", "parallelism": "single device", "graph_hash": "0123456789abcdef", '
        '"opmap_version": "0.1", "torch_version": null}')
    assert t.get("device") is None and not t.has("device")  # a profile tag: not in an analysis run's set


def test_a_recorded_run_carries_version_commit_and_command_first():
    # before: {"opmap_version": v, "git_commit": g, "command": c, **tags}: a key of tags kept its first place
    plan = Tags("plan", workload="llama-3-8b", hardware="h100-sxm", phase="prefill", precision="bf16",
                parallelism="8 devices").as_recorded("9.9", "abc", "opmap plan llama-3-8b")
    assert plan.to_dict() == {"opmap_version": "9.9", "git_commit": "abc", "command": "opmap plan llama-3-8b",
                              "workload": "llama-3-8b", "hardware": "h100-sxm", "phase": "prefill",
                              "precision": "bf16", "parallelism": "8 devices"}
    assert list(plan.to_dict())[:3] == ["opmap_version", "git_commit", "command"]
    # an analysis run's own opmap version (the file's) wins over the recording opmap's, even when null
    a = Tags("analysis", workload="w", opmap_version=None).as_recorded("9.9", None, "opmap analyze w")
    assert a.to_dict()["opmap_version"] is None and list(a.to_dict()).count("opmap_version") == 1
    # a shape check names the compare it ran under: its command is kept
    s = Tags("shape-check", workload="shape-check a -> b", command="opmap compare a --production b")
    assert s.as_recorded("9.9", None, "opmap compare x").to_dict()["command"] == "opmap compare a --production b"


def test_an_imported_run_names_its_file_last():
    t = Tags("sweep", workload="m", hardware="h", phase="decode", precision="fp8").as_recorded("1", None, "c")
    from dataclasses import replace

    d = replace(t, imported_from="/x/profile.json").to_dict()
    assert list(d)[-1] == "imported_from" and d["imported_from"] == "/x/profile.json"


def test_a_calibration_runs_fingerprint_and_a_bench_runs_models_are_json():
    c = Tags("calibration", workload="calibration", hardware="local: EPYC", phase="calibrate",
             fingerprint=Fingerprint(model="EPYC", machine="x86_64", threads=2, cores=2, memory_bytes=2 ** 33))
    assert c.to_dict()["fingerprint"] == {"model": "EPYC", "machine": "x86_64", "threads": 2, "cores": 2,
                                          "memory_bytes": 8589934592}
    assert c.to_dict()["precision"] is None and c.to_dict()["tags_version"] == TAGS_VERSION
    assert record(c) == c.to_dict() and record(c.fingerprint) == c.to_dict()["fingerprint"]
    b = Tags("bench", served_models=("a", "b"))
    assert b.to_dict()["served_models"] == ["a", "b"] and len(b.to_dict()) == len(KEYS["bench"]) == 12


def test_an_unknown_tag_set_is_refused():
    with pytest.raises(ValueError, match="no tag set 'nope'; accepted: analysis"):
        Tags("nope")
