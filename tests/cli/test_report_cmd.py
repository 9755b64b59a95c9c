"""opmap report: a recorded run and an output folder rendered; bad input refused in one line (exit 2)."""

from __future__ import annotations

import json
import re

import pytest


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
    assert _tags(page) == run.tags
    body = page.split('id="kernel-table">', 1)[1].split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    assert body.count("<tr>") == run.kernels > 0  # one row per kernel of the store's table
    assert {"roofline", "layer_time", "layer_mfu"} <= _figures(page)
    trace = json.loads((tmp_path / "r" / "gpt2_trace.json").read_text())  # named by the page, as its PNGs
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == run.kernels  # predicted track only
    assert (tmp_path / "r" / "gpt2_roofline.png").is_file() and "MB budget" in out


def test_report_of_a_folder_with_sweep_serve_and_fit(cli, tmp_path):
    d = tmp_path / "out"
    for args in (("sweep", "gpt2", "--batch", "1,4", "--seq", "32,64"),
                 ("serve", "gpt2", "--service-time", "exp:100", "--policy", "none", "--arrival", "poisson:5",
                  "--requests", 300),
                 ("fit", "--models", "gpt2", "--hardware", "l4", "--slo-p99", 3000, "--requests", 50,
                  "--devices-budget", 1)):
        rc, _, err = cli(*args, "--out", d, "--no-store")
        assert rc == 0, err
    rc, out, err = cli("report", d)
    assert rc == 0, err
    page = (d / "report.html").read_text()
    assert _figures(page) == {"sweep", "serve_cdf", "fit", "perf_per_watt"}
    sv = json.loads((d / "serve.json").read_text())
    assert _tags(page)["workload"] == "gpt2" and "batching policy" in page and sv["policy"]["spec"] in page
    assert not (d / "trace.json").exists() and "No trace" in page  # no kernels: nothing to lay out


def _links(page: str) -> set[str]:
    """The files the page's body links (the head holds plotly.js, whose strings name web pages)."""
    return set(re.findall(r'(?:href|src)="([^"#:]+)"', page.split("</head>", 1)[1]))


def test_two_reports_in_one_folder_keep_each_others_files(cli, tmp_path):
    """A zoo model's run (gpt2) and a Hugging Face config's run (examples/tiny-llama.json) reported into one folder:
    every file each page links (its trace, its PNGs) is there after both, and is the page's own. Before, both
    pages linked trace.json and report_*.png: the second report replaced the first's trace (the first page then
    linked the tiny Llama's kernels) and its PNGs; a second page drawing fewer figures deleted the first's."""
    pytest.importorskip("matplotlib")
    from pathlib import Path

    runs = {"gpt2": tmp_path / "gpt2", "llama": tmp_path / "llama", "serve": tmp_path / "serve"}
    hf = Path(__file__).parents[2] / "examples" / "tiny-llama.json"
    for model, d in (("gpt2", runs["gpt2"]), (hf, runs["llama"])):
        rc, _, err = cli("analyze", model, "--seq", 16, "--rows", 1, "--out", d, "--no-store")
        assert rc == 0, err
    _serve_folder(cli, runs["serve"])
    r = tmp_path / "r"
    for name, d in runs.items():
        rc, _, err = cli("report", d, "--out", r / f"{name}.html")
        assert rc == 0, err
    kernels = {}
    for name, d in runs.items():
        page = (r / f"{name}.html").read_text()
        links = _links(page)
        assert links, name
        for link in links:
            assert (r / link).is_file(), (name, link)
            assert link.startswith(f"{name}_"), (name, link)  # no page links another's file
        assert {f"{name}_{f}.png" for f in _figures(page)} <= links
        if name != "serve":
            body = json.loads((d / "analysis.json").read_text())
            kernels[name] = len(body["kernels"])
            trace = json.loads((r / f"{name}_trace.json").read_text())
            assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == kernels[name]
    assert kernels["gpt2"] != kernels["llama"]  # the traces tell the two runs apart


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


def _serve_folder(cli, d, model="gpt2"):
    rc, _, err = cli("serve", model, "--service-time", "exp:100", "--policy", "none", "--arrival", "poisson:5",
                     "--requests", 200, "--out", d, "--no-store")
    assert rc == 0, err
    return d


def test_report_refuses_a_linked_input(cli, refused, tmp_path):
    """A run folder's trace.json (or profile.json, serve.json, ...) that is a link to another file is refused
    whole: before, the linked file was copied beside the report, readable by all (0644)."""
    d = tmp_path / "run"
    rc, _, err = cli("analyze", "gpt2", "--seq", 16, "--rows", 1, "--out", d, "--no-store")
    assert rc == 0, err
    secret = tmp_path / "secret.json"
    secret.write_text('{"traceEvents": [], "token": "hunter2"}')
    (d / "trace.json").symlink_to(secret)
    refused("report", d, "--out", tmp_path / "r" / "report.html", needle="trace.json is a symbolic link")
    assert not (tmp_path / "r").exists()
    (d / "trace.json").unlink()
    (d / "serve.json").symlink_to(secret)
    refused("report", d, needle="serve.json is a symbolic link")
    assert not (d / "report.html").exists()


def test_report_replaces_only_its_own_files_unless_forced(cli, refused, tmp_path):
    d = _serve_folder(cli, tmp_path / "out")
    mine = "<!DOCTYPE html><title>my notes</title>\n"
    (d / "report.html").write_text(mine)
    refused("report", d, needle="report.html exists and opmap report did not write it; accepted: --force")
    assert (d / "report.html").read_text() == mine
    rc, _, err = cli("report", d, "--force")
    assert rc == 0, err
    assert '<meta name="generator" content="opmap ' in (d / "report.html").read_text()[:500]
    rc, _, err = cli("report", d)  # its own page, and its own PNGs, are replaced without --force
    assert rc == 0, err
    (d / "report_serve_cdf.png").write_bytes(b"\x89PNG\r\n\x1a\n not opmap's")
    refused("report", d, needle="report_serve_cdf.png exists and opmap report did not write it")
    assert (d / "report_serve_cdf.png").read_bytes().endswith(b"not opmap's")
    victim = tmp_path / "victim.html"
    victim.write_text(mine)
    (d / "mine.html").symlink_to(victim)  # a link is never opmap's, and --force replaces it, not its target
    refused("report", d, "--out", d / "mine.html", needle="mine.html exists and opmap report did not write it")
    rc, _, err = cli("report", d, "--out", d / "mine.html", "--force")
    assert rc == 0, err
    assert victim.read_text() == mine and not (d / "mine.html").is_symlink()


def test_report_leaves_no_earlier_png_beside_a_new_page(cli, tmp_path):
    pytest.importorskip("matplotlib")
    d = _serve_folder(cli, tmp_path / "out")
    assert cli("report", d)[0] == 0
    assert (d / "report_serve_cdf.png").is_file()
    rc, out, err = cli("report", d, "--no-png")
    assert rc == 0, err
    assert sorted(p.name for p in d.iterdir()) == ["latency_cdf.png", "report.html", "serve.json"]


def test_a_name_that_closes_the_script_cannot_break_the_page(cli, tmp_path):
    """The workload's name (serve's model: a label with --service-time) holds </script>, <!-- and <script>:
    no JSON block of the page holds a "<" (each is \\u003c), the page still has its five script elements (plotly,
    tags, figures, plotly config, the page's own), and the names read back as given."""
    from html.parser import HTMLParser

    evil = "</script><script>alert(1)</script><!--<script>"
    d = _serve_folder(cli, tmp_path / "out", evil)
    rc, _, err = cli("report", d, "--no-png")
    assert rc == 0, err
    page = (d / "report.html").read_text()
    blocks = re.findall(r'<script type="application/json" id="[\w-]+">(.*?)</script>', page, re.S)
    assert len(blocks) == 3 and not any(c in b for b in blocks for c in "<>&")
    assert _tags(page)["workload"] == evil
    import html

    assert evil in html.unescape(json.dumps(json.loads(blocks[1])))  # the titles name it (as Plotly text), intact

    class Scripts(HTMLParser):
        n = 0

        def handle_starttag(self, tag, attrs):
            self.n += tag == "script"

    p = Scripts()
    p.feed(page)
    assert p.n == 5


def _strings(x):
    if isinstance(x, str):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _strings(v)
    elif isinstance(x, list):
        for v in x:
            yield from _strings(v)


def test_a_run_supplied_string_in_a_figure_is_text_never_a_plotly_tag_or_mathtext(cli, tmp_path):
    """The model id holds a link, an image, bold, a line break and mathtext: every string of every figure holds no
    tag but the figures' own line breaks (Plotly draws <a href>, <b>, <br> in titles, legends, categories and
    hover text), the title reads back as the name on one line; the PNGs are drawn (a malformed $...$ pair made
    matplotlib raise: a traceback, no report)."""
    import html

    evil = '<a href="http://evil.example">x</a><img src=x onerror=alert(1)><b>b</b>\nline <br> $\\frac{1}{$ $y$'
    d = _serve_folder(cli, tmp_path / "out", evil)
    rc, _, err = cli("report", d)
    assert rc == 0, err
    page = (d / "report.html").read_text()
    figs = json.loads(re.search(r'<script type="application/json" id="opmap-figures">(.*?)</script>', page,
                                re.S).group(1))
    for name, fig in figs.items():
        for s in _strings(fig):
            if s.startswith("%{"):  # a hovertemplate: the figure's own
                continue
            assert "<" not in s.replace("<br>", ""), (name, s)
    title = figs["serve_cdf"]["layout"]["title"]["text"]
    assert html.unescape(title).startswith("serving latency CDFs: " + evil.replace("\n", " ") + " on ")
    assert (d / "report_serve_cdf.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
