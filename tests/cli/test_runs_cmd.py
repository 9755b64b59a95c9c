"""opmap runs: analyze records a run; list --json and show --json; bad input in one line."""

from __future__ import annotations

import json

import pytest

from opmap.tags import Tags

pytest.importorskip("duckdb")


def test_analyze_records_and_runs_lists(tmp_path, cli, capsys):
    store = tmp_path / "runs.duckdb"
    rc, out, err = cli("analyze", "gpt2", "--seq", "16", "--rows", "1", "--store", store)
    assert rc == 0, err
    assert "recorded as run" in out
    rc, out, err = cli("analyze", "gpt2", "--seq", "16", "--rows", "1", "--store", store, "--no-store")
    assert rc == 0 and "recorded" not in out
    rc, out, _ = cli("runs", "list", "--json", "--store", store)
    runs = json.loads(out)
    assert len(runs) == 1 and runs[0]["tags"]["workload"] == "gpt2" and runs[0]["tags"]["seq"] == 16
    rc, out, _ = cli("runs", "show", runs[0]["id"], "--json", "--store", store)
    assert json.loads(out)["kernels"] > 0


def test_runs_refuses_bad_input(tmp_path, refused):
    store = tmp_path / "none.duckdb"
    refused("runs", "list", "--store", store, needle="no run store at")
    refused("runs", "list", "--where", "batch", needle="--where takes TAG=VALUE")


def test_memo_of_a_recorded_analysis(tmp_path, cli):
    store = tmp_path / "runs.duckdb"
    rc, _, err = cli("analyze", "gpt2", "--seq", "16", "--rows", "1", "--store", store)
    assert rc == 0, err
    rc, out, _ = cli("runs", "list", "--json", "--store", store)
    rid = json.loads(out)[0]["id"]
    rc, out, err = cli("memo", rid, "--store", store, "--out", tmp_path / "m")
    assert rc == 0, err
    md = (tmp_path / "m" / "memo.md").read_text()
    assert md.startswith("# Closure memo: gpt2") and "| finding | owner |" in md and rid in md
    assert "averages without p95 / p99: flag" in md  # a predicted run has no distribution


def test_sweeps_and_serving_runs_are_recorded(tmp_path, cli):
    store = tmp_path / "runs.duckdb"
    rc, _, err = cli("sweep", "gpt2", "--batch", "1,2", "--seq", "16", "--store", store)
    assert rc == 0, err
    rc, _, err = cli("serve", "gpt2", "--service-time", "fixed:10", "--arrival", "poisson:5", "--requests", "50",
                     "--policy", "none", "--store", store)
    assert rc == 0, err
    rc, out, _ = cli("runs", "list", "--json", "--store", store)
    kinds = [r["kind"] for r in json.loads(out)]
    assert sorted(kinds) == ["serve", "sweep"]
    rc, out, _ = cli("runs", "list", "--json", "--where", "kind=serve", "--store", store)
    assert json.loads(out)[0]["tags"]["phase"] == "serve"


def test_a_command_spools_its_run_and_the_next_reader_lands_it(tmp_path, cli):
    # the commands only spool (a JSON file renamed into place: durable, no DuckDB open on the hot path)
    store = tmp_path / "runs.duckdb"
    rc, _, err = cli("analyze", "gpt2", "--seq", "16", "--rows", "1", "--store", store)
    assert rc == 0, err
    spool = store.with_name(store.name + ".spool")
    assert len(list(spool.glob("*.json"))) == 1 and not store.exists()
    rc, out, _ = cli("runs", "list", "--json", "--store", store)
    assert rc == 0 and len(json.loads(out)) == 1 and not list(spool.glob("*.json")) and store.exists()


def test_import_and_export_refuse_bad_input_in_one_line(tmp_path, cli, refused):
    store = tmp_path / "runs.duckdb"
    rc, _, err = cli("analyze", "gpt2", "--seq", "16", "--rows", "1", "--store", store)
    assert rc == 0, err
    (tmp_path / "bad.json").write_text("{not json")
    refused("runs", "import", tmp_path / "bad.json", "--store", store, needle="not JSON")
    (tmp_path / "empty.json").write_text("{}")
    refused("runs", "import", tmp_path / "empty.json", "--store", store, needle="non-empty JSON object")
    (tmp_path / "pq").mkdir()
    (tmp_path / "pq" / "runs.parquet").write_bytes(b"PAR1 not really")
    refused("runs", "import", tmp_path / "pq", "--store", store, needle="not a readable opmap export")
    refused("runs", "import", tmp_path / "missing", "--store", store, needle="nothing to import")
    (tmp_path / "afile").write_text("x")
    refused("runs", "export", "--parquet", tmp_path / "afile", "--store", store, needle="exists")
    refused("runs", "export", "--parquet", tmp_path / "pq", "--store", store, needle="exists")
    refused("runs", "export", "--parquet", tmp_path / "afile" / "out", "--store", store, needle="cannot write")
    assert (tmp_path / "pq" / "runs.parquet").read_bytes() == b"PAR1 not really"  # nothing written over
    rc, out, _ = cli("runs", "list", "--json", "--store", store)
    assert rc == 0 and len(json.loads(out)) == 1  # and nothing taken


def test_runs_list_prints_tags_as_plain_text(tmp_path, cli):
    from opmap.store import record

    store = tmp_path / "runs.duckdb"
    record("analyze", {}, Tags("analysis", workload="[/oops]", hardware="[bold]h[/bold]"), store)
    rc, out, err = cli("runs", "list", "--store", store)
    assert rc == 0, err
    assert "[/oops]" in out and "[bold]h[/bold]" in out


def test_runs_list_and_show_print_tags_as_text(tmp_path, cli):
    """A run whose workload tag (serve's model name: only a label with --service-time) holds unbalanced markup,
    a clear-screen CSI and an OSC 8 hyperlink is listed and shown literally, no escape byte printed."""
    store = tmp_path / "runs.duckdb"
    evil = "m[/b]\x1b[2J\x1b]8;;http://evil\x1b\\x"
    rc, _, err = cli("serve", evil, "--service-time", "fixed:10", "--arrival", "poisson:5", "--requests", "50",
                     "--policy", "none", "--store", store)
    assert rc == 0, err
    rc, out, err = cli("runs", "list", "--store", store)
    assert rc == 0, err
    assert "\x1b" not in out + err and "m[/b]x" in out
    rid = json.loads(cli("runs", "list", "--json", "--store", store)[1])[0]["id"]
    rc, out, err = cli("runs", "show", rid, "--store", store)
    assert rc == 0, err
    assert "\x1b" not in out + err and "workload: m[/b]x" in out


def test_runs_import_refuses_text_the_store_cannot_hold_and_a_store_it_cannot_create(tmp_path, cli, refused):
    store = tmp_path / "runs.duckdb"
    f = tmp_path / "analysis.json"  # valid JSON whose workload parses to a lone surrogate
    f.write_text('{"assumptions": {"workload": "w\\ud800", "hardware": "h100-sxm"}}')
    line = refused("runs", "import", f, "--store", store, needle="assumptions.workload")
    assert "nothing imported" in line
    refused("runs", "list", "--store", store, needle="no run store at")  # nothing was written
    f.write_text('{"assumptions": {"workload": "w", "hardware": "h100-sxm"}, "kernels": [{"flops": 1'
                 + "0" * 400 + '}]}')  # an integer no float holds: it crashed the import (OverflowError)
    refused("runs", "import", f, "--store", store, needle="kernels[0].flops: an integer of 1329 bits is too large")
    f.write_text('{"assumptions": {"workload": "w", "hardware": "h100-sxm"}}')
    (tmp_path / "a-file").write_text("")
    refused("runs", "import", f, "--store", tmp_path / "a-file" / "runs.duckdb",
            needle="cannot create the folder of the run store")
