"""The run store: round trip, the runs JSON contract, concurrent writers, a killed writer, filters."""

from __future__ import annotations

import json
import multiprocessing as mp

import pytest

duckdb = pytest.importorskip("duckdb")

from opmap.errors import OpmapError  # noqa: E402
from opmap.store import list_runs, record, show_run  # noqa: E402
from opmap.tags import Tags  # noqa: E402

PAYLOAD = {"assumptions": {"workload": "w", "hardware": "h100-sxm", "dtype": "bf16", "batch": 1, "seq": 8},
           "kernels": [{"anchor": 0, "nodes": [0], "predicted_s": 1e-3, "traffic_bytes": 10.0, "bound": "memory"}],
           "nodes": [{"id": 0, "op": "aten.mm.default", "module": "fc", "layer_type": "mlp", "flops": 2.0}],
           "layer_types": {"mlp": {"predicted_s": 1e-3, "share_of_time": 1.0}},
           "samples": {"latency_s": [1.0, 1.1, 0.9]}}


def _tags(**kw):
    return Tags("analysis", **{"workload": "w", "hardware": "h100-sxm", "phase": "prefill", "precision": "bf16", **kw})


def test_round_trip_and_the_json_contract(tmp_path):
    path = tmp_path / "runs.duckdb"
    rid = record("analyze", PAYLOAD, _tags(batch=1), path)
    runs = list_runs(path=path)
    assert [r["id"] for r in runs] == [rid]
    r = runs[0]
    assert set(r) == {"id", "kind", "time_utc", "tags"} and r["kind"] == "analyze"
    assert r["tags"]["workload"] == "w" and "command" in r["tags"] and "opmap_version" in r["tags"]
    shown = show_run(rid, path)
    assert shown.kernels == 1 and shown.samples == 3 and "nodes" not in shown.payload
    import duckdb

    con = duckdb.connect(str(path), read_only=True)
    assert con.execute("SELECT name, layer_type, flops FROM kernels").fetchall() == [("aten.mm.default@fc", "mlp", 2.0)]
    assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("2",)


def test_where_filters_and_bad_tags(tmp_path):
    path = tmp_path / "runs.duckdb"
    record("analyze", PAYLOAD, _tags(batch=1), path)
    record("analyze", PAYLOAD, _tags(batch=8), path)
    assert [r["tags"]["batch"] for r in list_runs({"batch": "8"}, path)] == [8]
    with pytest.raises(OpmapError, match="unknown tag colour"):
        list_runs({"colour": "red"}, path)
    with pytest.raises(OpmapError, match="no run 'nope'"):
        show_run("nope", path)


def _writer(path: str, i: int) -> None:
    from pathlib import Path

    record("analyze", PAYLOAD, _tags(batch=i), Path(path))


def test_concurrent_writers_all_land(tmp_path):
    # six processes finishing at once: each spools its run, then waits its turn for the lock
    path = tmp_path / "runs.duckdb"
    ctx = mp.get_context("spawn")
    ps = [ctx.Process(target=_writer, args=(str(path), i)) for i in range(6)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(60)
        assert p.exitcode == 0
    assert sorted(r["tags"]["batch"] for r in list_runs(path=path)) == list(range(6))


def test_a_killed_writer_loses_nothing_earlier(tmp_path):
    path = tmp_path / "runs.duckdb"
    first = record("analyze", PAYLOAD, _tags(batch=1), path)
    spool = path.with_name(path.name + ".spool")
    # killed before its os.replace: a half-written temporary file, never ingested
    (spool / ".20990101T000000-dead.tmp").write_text('{"id": "half')
    # killed after its os.replace, before the ingest: a complete spool file, ingested by the next writer
    waiting = {"id": "20990101T000000-wait", "kind": "analyze", "time_utc": "2099-01-01T00:00:00+00:00",
               "tags": _tags(batch=2).to_dict(), "payload": {}, "rows": {}}
    (spool / "20990101T000000-wait.json").write_text(json.dumps(waiting))
    # killed between the commit and the delete: a spool file of a run already in the store, not ingested twice
    (spool / f"{first}.json").write_text(json.dumps({**waiting, "id": first}))
    third = record("analyze", PAYLOAD, _tags(batch=3), path)
    ids = [r["id"] for r in list_runs(path=path)]
    assert sorted(ids) == sorted([first, "20990101T000000-wait", third])
    assert not list(spool.glob("*.json"))


def test_parquet_export_and_import_round_trip(tmp_path):
    from opmap.store.transfer import export_parquet, import_path

    a = tmp_path / "a.duckdb"
    ids = {record("analyze", PAYLOAD, _tags(batch=b), a) for b in (1, 2)}
    files = export_parquet(tmp_path / "pq", a)
    assert {f.name for f in files} == {"meta.parquet", "runs.parquet", "kernels.parquet", "layer_types.parquet",
                                      "samples.parquet"}
    b = tmp_path / "b.duckdb"
    assert import_path(tmp_path / "pq", b) == (2, 0)
    assert import_path(tmp_path / "pq", b) == (0, 2)  # each run once
    assert {r["id"] for r in list_runs(path=b)} == ids
    assert show_run(sorted(ids)[0], b).samples == 3


def test_importing_a_profile_json_keeps_its_samples_once(tmp_path):
    from opmap.store.transfer import import_path

    body = {**PAYLOAD, "kind": "profile", "latency": {"p50_s": 1.0, "samples_s": [1.0, 1.2, 0.8, 1.1]}}
    body.pop("samples")
    f = tmp_path / "profile.json"
    f.write_text(json.dumps(body))
    path = tmp_path / "runs.duckdb"
    assert import_path(f, path) == (1, 0) and import_path(f, path) == (0, 1)
    (run,) = list_runs(path=path)
    assert run["kind"] == "profile" and show_run(run["id"], path).samples == 4
    with pytest.raises(OpmapError, match="nothing to import"):
        import_path(tmp_path / "empty-dir-that-is-missing", path)


GOOD = {"assumptions": {"workload": "w", "hardware": "h100-sxm", "dtype": "bf16", "batch": 1, "seq": 8},
        "kernels": [{"anchor": 0, "nodes": [0], "predicted_s": 1e-3}], "nodes": [{"id": 0, "op": "aten.mm.default"}]}


@pytest.mark.parametrize("bad, field", [
    ({}, "non-empty JSON object"),
    ([GOOD], "non-empty JSON object"),
    ({**GOOD, "assumptions": {**GOOD["assumptions"], "batch": "abc"}}, "assumptions.batch"),
    ({**GOOD, "assumptions": {**GOOD["assumptions"], "batch": True}}, "assumptions.batch"),
    ({**GOOD, "assumptions": {"hardware": "h100-sxm"}}, "assumptions.workload"),
    ({**GOOD, "kernels": [{"predicted_s": float("nan")}]}, "predicted_s"),
    ({**GOOD, "kernels": [{"predicted_s": -1.0}]}, "kernels[0].predicted_s"),
    ({**GOOD, "kernels": "many"}, "run.kernels"),
    ({**GOOD, "nodes": [{"id": 0, "inputs": [{"shape": [2, -1]}]}]}, "nodes[0].inputs[0].shape"),
    ({**GOOD, "latency": {"samples_s": [1.0, "x"]}}, "latency.samples_s"),
    ({**GOOD, "kind": "nonsense"}, "kind"),
    ({"kind": "sweep"}, "points"),
    # JSON's "\ud800" parses to a lone surrogate, which DuckDB cannot store: refused here, not after "imported"
    ({**GOOD, "assumptions": {**GOOD["assumptions"], "workload": "w\ud800"}}, "assumptions.workload"),
    ({**GOOD, "assumptions": {**GOOD["assumptions"], "batch": 2 ** 63}}, "assumptions.batch"),  # BIGINT column
    ({**GOOD, "totals": {"matrix_flops": 10 ** 400}}, "totals.matrix_flops"),  # a JSON integer no float holds
])
def test_validate_run_names_the_bad_field_in_one_line_and_touches_no_store(bad, field, tmp_path, monkeypatch):
    from opmap.store import validate_run

    monkeypatch.setenv("OPMAP_STORE", str(tmp_path / "runs.duckdb"))
    validate_run(GOOD)  # the good run passes
    with pytest.raises(OpmapError) as e:
        validate_run(bad)
    assert field in str(e.value) and len(str(e.value).splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_a_malformed_run_is_refused_before_anything_is_written(tmp_path):
    path = tmp_path / "runs.duckdb"
    with pytest.raises(OpmapError, match="tags.batch"):
        record("analyze", PAYLOAD, _tags(batch="abc"), path)
    assert not path.exists() and not list(path.with_name(path.name + ".spool").glob("*.json"))


def test_writes_never_go_through_a_symlink(tmp_path):
    from opmap.store.transfer import export_parquet

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    path = tmp_path / "runs.duckdb"
    path.with_name(path.name + ".spool").symlink_to(elsewhere)  # a spool that points somewhere else
    with pytest.raises(OpmapError, match="symlink"):
        record("analyze", PAYLOAD, _tags(), path)
    assert list(elsewhere.iterdir()) == []
    good = tmp_path / "good.duckdb"
    record("analyze", PAYLOAD, _tags(), good)
    (tmp_path / "out").symlink_to(elsewhere)  # an export folder that is a link
    with pytest.raises(OpmapError, match="symlink"):
        export_parquet(tmp_path / "out", good)
    assert list(elsewhere.iterdir()) == []


def test_an_import_is_all_or_nothing(tmp_path):
    from opmap.store.transfer import import_path

    path = tmp_path / "runs.duckdb"
    for name, body in (("a", GOOD), ("b", {**GOOD, "kernels": [{"measured_s": float("inf")}]})):
        (tmp_path / "in" / name).mkdir(parents=True)
        (tmp_path / "in" / name / "profile.json").write_text(json.dumps(body))
    with pytest.raises(OpmapError, match=r"b/profile.json.*nothing imported"):
        import_path(tmp_path / "in", path)
    assert not path.exists() and not list(path.with_name(path.name + ".spool").glob("*.json"))


def test_a_commands_run_with_an_infinite_figure_is_still_recorded(tmp_path):
    # a command's own result may hold inf (an overloaded queue's wait); DuckDB's JSON keeps it: not refused
    path = tmp_path / "runs.duckdb"
    rid = record("serve", {"latency": {"p99_s": float("inf")}}, _tags(), path)
    assert show_run(rid, path).payload["latency"]["p99_s"] == float("inf")


@pytest.mark.parametrize("tags, says", [
    ({"workload": "model-\udcff"}, "tags.workload: holds a lone surrogate"),  # a file name's undecodable byte
    ({"hardware": 2 ** 130}, "tags.hardware: an integer of 131 bits is too large"),  # DuckDB binds 128 bits
])
def test_a_run_with_a_value_duckdb_cannot_bind_is_refused_before_anything_is_written(tmp_path, tags, says):
    # it used to be spooled ("recorded as run ..."), then quarantined at the next read
    path = tmp_path / "runs.duckdb"
    with pytest.raises(OpmapError, match=says):
        record("analyze", PAYLOAD, _tags(**tags), path)
    assert not path.exists() and not list(path.with_name(path.name + ".spool").glob("*.json"))


def test_an_export_with_a_row_its_table_cannot_hold_imports_nothing(tmp_path):
    from opmap.store.transfer import export_parquet, import_path

    a = tmp_path / "a.duckdb"
    record("analyze", PAYLOAD, _tags(), a)
    export_parquet(tmp_path / "pq", a)
    kernels = tmp_path / "pq" / "kernels.parquet"
    con = duckdb.connect()  # the kernel index past the INTEGER column's 2**31 - 1, as a hand-edited export
    con.execute(f"COPY (SELECT * REPLACE (idx::BIGINT + 2147483648 AS idx) FROM read_parquet('{kernels}')) "
                f"TO '{tmp_path / 'k.parquet'}' (FORMAT parquet)")
    con.close()
    (tmp_path / "k.parquet").replace(kernels)
    b = tmp_path / "b.duckdb"
    with pytest.raises(OpmapError, match=r"does not fit a 32-bit integer.*nothing imported"):
        import_path(tmp_path / "pq", b)
    assert not b.exists() and not list(b.with_name(b.name + ".spool").rglob("*.json"))


MAX_STRING = 65536  # the stated limit on a string inside an imported run (SECURITY.md, store.validate)


def test_an_import_is_capped_in_file_size_and_string_length(tmp_path):
    """A run file past the JSON limit is refused from its size (not read), and a string past MAX_STRING anywhere
    in a run (a 50 MB note took 37 s and 1.1 GB to import) is refused naming its field: nothing imported."""
    from opmap.safeio import LIMIT_JSON_BYTES
    from opmap.store.transfer import import_path

    path = tmp_path / "runs.duckdb"
    big = tmp_path / "big" / "analysis.json"
    big.parent.mkdir()
    with open(big, "wb") as f:  # sparse: a valid start, then zeros up to one byte past the limit
        f.write(json.dumps(GOOD).encode())
        f.truncate(LIMIT_JSON_BYTES + 1)
    with pytest.raises(OpmapError, match=r"over the 64 MiB opmap reads for it.*nothing imported"):
        import_path(big, path)
    for n in (MAX_STRING + 1, 50_000_000):
        f = tmp_path / f"s{n}" / "analysis.json"
        f.parent.mkdir()
        f.write_text(json.dumps({**GOOD, "assumptions": {**GOOD["assumptions"], "note": "x" * n}}))
        with pytest.raises(OpmapError, match=rf"assumptions.note: a string of {n:,} characters.*nothing imported"):
            import_path(f.parent, path)
    ok = tmp_path / "ok" / "analysis.json"  # a string of the limit itself is a run like any other
    ok.parent.mkdir()
    ok.write_text(json.dumps({**GOOD, "assumptions": {**GOOD["assumptions"], "note": "x" * MAX_STRING}}))
    assert not path.exists() and import_path(ok, path) == (1, 0)


def test_an_exports_table_file_past_its_limit_or_a_link_is_refused_before_duckdb_reads_it(tmp_path):
    from opmap.store.transfer import LIMIT_PARQUET_BYTES, export_parquet, import_path

    a = tmp_path / "a.duckdb"
    record("analyze", PAYLOAD, _tags(), a)
    export_parquet(tmp_path / "pq", a)
    kernels = tmp_path / "pq" / "kernels.parquet"
    kernels.unlink()
    kernels.symlink_to("/dev/zero")
    b = tmp_path / "b.duckdb"
    with pytest.raises(OpmapError, match=r"kernels.parquet is not a regular file.*nothing imported"):
        import_path(tmp_path / "pq", b)
    kernels.unlink()
    with open(kernels, "wb") as f:
        f.truncate(LIMIT_PARQUET_BYTES + 1)  # sparse
    with pytest.raises(OpmapError, match=r"kernels.parquet is 1024.0 MiB, over the 1024 MiB.*nothing imported"):
        import_path(tmp_path / "pq", b)
    assert not b.exists()


def test_a_spool_entry_with_an_escape_in_its_name_is_named_visibly(tmp_path, capsys):
    path = tmp_path / "runs.duckdb"
    record("analyze", PAYLOAD, _tags(), path)
    spool = path.with_name(path.name + ".spool")
    (spool / "x\x1b]8;;evil\x1b\\y\x1b[2J.json").write_text("{}")  # left there by hand, not by opmap
    capsys.readouterr()
    assert len(list_runs(path=path)) == 1
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\x1b]8;;evil\\x1b\\\\y\\x1b[2J.json" in err and "not a valid run" in err
