"""opmap memo on every run kind, by run id and by output folder: real runs of plan, sweep, serve and fit."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("duckdb")


def test_memo_of_every_kind_by_run_id_and_by_folder(tmp_path, cli, refused):
    # the memo crashed on fit, plan and sweep runs (their assumptions are a list, not a dict); each kind now gets
    # the findings its result supports
    from opmap.report.text import md

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
        # the Markdown on stdout is memo.md line for line: table rows past the terminal's width are not cut
        assert (tmp_path / f"memo-{kind}" / "memo.md").read_text() in out, kind
        body = json.loads((tmp_path / f"memo-{kind}" / "memo.json").read_text())
        assert body["kind"] == kind and body["findings"] and body["pitfalls"]
        assert all(f["owner"] in ("ML compiler", "runtime", "performance modelling") for f in body["findings"])
        rc, out, err = cli("memo", tmp_path / kind)
        assert rc == 0 and needle in out and f"the {kind} output in {md(tmp_path / kind)}" in out, (kind, err)
    refused("memo", tmp_path / "nowhere", needle="no folder")
    (tmp_path / "empty").mkdir()
    refused("memo", tmp_path / "empty", needle="nothing to read in")


# a model id as a server or an import could give it: new lines (a heading), a link, an image with a script, a bare
# URL and a www. name (GitHub links both), an OSC 8 hyperlink, a clear screen, emphasis and a table cell border
EVIL = ("m\n# Pwned\n[link](http://evil.example) <img src=x onerror=alert(1)> www.evil.example "
        "\x1b]8;;http://evil\x1b\\x\x1b[2J*b*_i_ | c")
# the same name as text: line breaks as spaces, the escape sequences gone (report.text.clean), the rest verbatim
SHOWN = "m # Pwned [link](http://evil.example) <img src=x onerror=alert(1)> www.evil.example x*b*_i_ | c"


def test_a_run_supplied_string_is_markdown_text_in_the_memo_and_plain_text_in_the_terminal(tmp_path, cli):
    """memo.md rendered by a CommonMark renderer (tables on) holds the model id as its text: one heading of the
    memo's own, no link, no image, no HTML, the table's six cells per row; the terminal gets no escape byte."""
    markdown_it = pytest.importorskip("markdown_it")
    store = tmp_path / "runs.duckdb"
    rc, _, err = cli("serve", EVIL, "--service-time", "fixed:10", "--arrival", "poisson:5", "--requests", "50",
                     "--policy", "none", "--store", store)
    assert rc == 0, err
    rid = json.loads(cli("runs", "list", "--json", "--store", store)[1])[0]["id"]
    rc, out, err = cli("memo", rid, "--store", store, "--out", tmp_path / "m")
    assert rc == 0, err
    assert "\x1b" not in out + err and "\x9b" not in out + err  # no clear screen, no hyperlink, no colour
    text = (tmp_path / "m" / "memo.md").read_text()
    assert text.splitlines()[0] == "# Closure memo: " + text.splitlines()[0].split(": ", 1)[1]
    assert [x for x in text.splitlines() if x.startswith("#")] == [text.splitlines()[0], "## Findings",
                                                                     "## Pitfall checks"]
    page = markdown_it.MarkdownIt("commonmark").enable("table").render(text)
    assert "<a " not in page and "<img" not in page and "onerror=alert(1)>" not in page
    assert page.count("<h1>") == 1 and page.count("<h2>") == 2
    import html

    h1 = page.split("<h1>")[1].split("</h1>")[0]
    assert html.unescape(h1) == f"Closure memo: {SHOWN} on h100-sxm (serve, bf16)"
    rows = page.split("<tbody>")[1].split("</tbody>")[0].split("<tr>")[1:]
    assert rows and all(r.count("<td>") == 6 for r in rows)
    assert "http://" not in text and "www.evil" not in text  # GitHub's autolinks: not formed in the source
