"""opmap memo on every run kind, by run id and by output folder: real runs of plan, sweep, serve and fit."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("duckdb")


def test_memo_of_every_kind_by_run_id_and_by_folder(tmp_path, cli, refused):
    # the memo crashed on fit, plan and sweep runs (their assumptions are a list, not a dict); each kind now gets
    # the findings its result supports
    store = tmp_path / "runs.duckdb"
    runs = {"plan": ("plan", "gpt2", "--devices", 2, "--seq", 64, "--rows", 1),
            "sweep": ("sweep", "gpt2", "--batch", "1,4,16", "--seq", 64),
            "serve": ("serve", "gpt2", "--requests", 50),
            "fit": ("fit", "--models", "gpt2", "--hardware", "l4", "--slo-p99", "3000", "--requests", 20,
                    "--devices-budget", 1)}
    expect = {"plan": "ranks first by throughput", "sweep": "knee at batch", "serve": "SLO VALID",
              "fit": "gpt2: l4 ranks first"}
    for kind, args in runs.items():
        rc, _, err = cli(*args, "--out", tmp_path / kind, "--store", store)
        assert rc == 0, err
    rc, out, _ = cli("runs", "list", "--json", "--store", store)
    ids = {r["kind"]: r["id"] for r in json.loads(out)}
    for kind, needle in expect.items():
        rc, out, err = cli("memo", ids[kind], "--store", store, "--out", tmp_path / f"memo-{kind}")
        assert rc == 0 and needle in out and f"run {ids[kind]} ({kind}" in out, (kind, err)
        body = json.loads((tmp_path / f"memo-{kind}" / "memo.json").read_text())
        assert body["kind"] == kind and body["findings"] and body["pitfalls"]
        assert all(f["owner"] in ("ML compiler", "runtime", "performance modelling") for f in body["findings"])
        rc, out, err = cli("memo", tmp_path / kind)
        assert rc == 0 and needle in out and f"the {kind} output in {tmp_path / kind}" in out, (kind, err)
    refused("memo", tmp_path / "nowhere", needle="no folder")
    (tmp_path / "empty").mkdir()
    refused("memo", tmp_path / "empty", needle="nothing to read in")
