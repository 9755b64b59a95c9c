"""opmap report: a recorded run and an output folder rendered; bad input refused in one line (exit 2)."""

from __future__ import annotations

import json
import re


def _tags(page: str):
    return json.loads(re.search(r'<script type="application/json" id="opmap-tags">(.*?)</script>', page, re.S)
                      .group(1))


def _figures(page: str) -> set[str]:
    return set(json.loads(re.search(r'<script type="application/json" id="opmap-figures">(.*?)</script>', page,
                                    re.S).group(1)))


def test_report_of_a_recorded_run(cli, tmp_path):
    from opmap.store import list_runs, show_run

    store = tmp_path / "runs.duckdb"
    rc, _, err = cli("analyze", "gpt2", "--hardware", "h100-sxm", "--seq", 32, "--store", store)
    assert rc == 0, err
    rid = list_runs(path=store)[-1]["id"]
    rc, out, err = cli("report", rid, "--store", store, "--out", tmp_path / "r" / "gpt2.html")
    assert rc == 0, err
    page = (tmp_path / "r" / "gpt2.html").read_text()
    run = show_run(rid, store)
    assert _tags(page) == run["tags"]
    body = page.split('id="kernel-table">', 1)[1].split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    assert body.count("<tr>") == run["kernels"] > 0  # one row per kernel of the store's table
    assert {"roofline", "layer_time", "layer_mfu"} <= _figures(page)
    trace = json.loads((tmp_path / "r" / "trace.json").read_text())
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == run["kernels"]  # predicted track only
    assert (tmp_path / "r" / "report_roofline.png").is_file() and "MB budget" in out


def test_report_of_a_folder_with_sweep_serve_and_fit(cli, tmp_path):
    d = tmp_path / "out"
    for args in (("sweep", "gpt2", "--batch", "1,4", "--seq", "32,64"),
                 ("serve", "gpt2", "--service-time", "exp:100", "--policy", "none", "--arrival", "poisson:5",
                  "--requests", 300),
                 ("fit", "--models", "gpt2", "--hardware", "l4", "--slo-p99", 3000, "--requests", 50)):
        rc, _, err = cli(*args, "--out", d, "--no-store")
        assert rc == 0, err
    rc, out, err = cli("report", d)
    assert rc == 0, err
    page = (d / "report.html").read_text()
    assert _figures(page) == {"sweep", "serve_cdf", "fit", "perf_per_watt"}
    sv = json.loads((d / "serve.json").read_text())
    assert _tags(page)["workload"] == "gpt2" and "batching policy" in page and sv["policy"]["spec"] in page
    assert not (d / "trace.json").exists() and "No trace" in page  # no kernels: nothing to lay out


def test_report_refuses_bad_input(refused, tmp_path):
    store = tmp_path / "runs.duckdb"
    refused("report", "no-such-run", "--store", store, needle="no run store at")
    (tmp_path / "empty").mkdir()
    refused("report", tmp_path / "empty", needle="nothing to report in")
    refused("report", tmp_path / "missing", needle="no folder")
    (tmp_path / "empty" / "profile.json").write_text("{}")
    refused("report", tmp_path / "empty" / "profile.json", needle="is a file; accepted: a run id")
    refused("report", tmp_path / "empty", needle="profile.json is not opmap's profile.json (no 'assumptions')")


def test_report_refuses_unknown_run_and_bad_out(cli, refused, tmp_path):
    store = tmp_path / "runs.duckdb"
    rc, _, err = cli("analyze", "gpt2", "--hardware", "h100-sxm", "--seq", 16, "--store", store)
    assert rc == 0, err
    refused("report", "nope", "--store", store, needle="no run 'nope' in the store")
    rid = json.loads(cli("runs", "list", "--json", "--store", store)[1])[-1]["id"]
    refused("report", rid, "--store", store, "--out", tmp_path / "r.txt", needle="ending in .html")
    refused("report", rid, "--store", store, "--out", tmp_path / "r.html", "--max-mb", 1,
            needle="over the 1.0 MB budget")
    assert not (tmp_path / "r.html").exists()


def test_report_without_plotly(refused, monkeypatch, tmp_path, fail_if_called):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "plotly" else real(name, *a))
    fail_if_called("opmap.report.dashboard.from_dir")
    refused("report", tmp_path, needle="pip install 'opmap[report]'")
