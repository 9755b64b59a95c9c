"""The run store under failure: a writer SIGKILLed mid-ingest, a store of an older or newer schema, no duckdb."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

duckdb = pytest.importorskip("duckdb")

from opmap.errors import OpmapError  # noqa: E402
from opmap.store import list_runs, record, show_run  # noqa: E402
from opmap.tags import Tags  # noqa: E402

N_KERNELS = 4000


def _payload(n: int) -> dict:
    return {"nodes": [{"id": i, "op": "aten.mm.default", "module": f"l{i}", "layer_type": "mlp", "flops": 1.0}
                      for i in range(n)],
            "kernels": [{"anchor": i, "nodes": [i], "predicted_s": 1e-6} for i in range(n)],
            "samples": {"latency_s": [1.0] * 50}}


def _tags(**kw):
    return Tags("analysis", **{"workload": "w", "hardware": "h100-sxm", "phase": "prefill", "precision": "bf16", **kw})


WRITER = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_durability import _payload, _tags, N_KERNELS
from opmap.store import record
print("ready", flush=True)
i = 0
while True:
    record("analyze", _payload(N_KERNELS), _tags(batch=1000 + i), Path({path!r}))
    i += 1
"""


def test_a_writer_killed_mid_ingest_leaves_every_committed_run_whole(tmp_path):
    path = tmp_path / "runs.duckdb"
    earlier = [record("analyze", _payload(10), _tags(batch=b), path) for b in (1, 2)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.Popen([sys.executable, "-c", WRITER.format(tests=str(Path(__file__).parent), path=str(path))],
                         stdout=subprocess.PIPE, env=env)
    assert p.stdout.readline().strip() == b"ready"
    # let it commit a few big runs, then kill it wherever it is (spooling, inside an ingest transaction, deleting)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not list(path.with_name(path.name + ".spool").glob("*.json")):
        time.sleep(0.01)
    time.sleep(0.7)
    p.send_signal(signal.SIGKILL)
    p.wait(10)
    later = record("analyze", _payload(10), _tags(batch=3), path)  # the next writer: recovers, ingests leftovers
    runs = list_runs(path=path)
    ids = [r["id"] for r in runs]
    assert set(earlier + [later]) <= set(ids) and len(ids) == len(set(ids))
    con = duckdb.connect(str(path), read_only=True)
    counts = dict(con.execute("SELECT run_id, count(*) FROM kernels GROUP BY run_id").fetchall())
    samples = dict(con.execute("SELECT run_id, count(*) FROM samples GROUP BY run_id").fetchall())
    con.close()
    for r in runs:  # every run in the store is whole: all its kernel and sample rows, or the run is absent
        n = N_KERNELS if r["tags"]["batch"] >= 1000 else 10
        assert counts.get(r["id"]) == n and samples.get(r["id"]) == 50, r["id"]
    assert len(ids) >= 4  # the killed writer committed at least one big run first


def test_an_older_store_is_migrated_and_a_newer_one_refused(tmp_path):
    path = tmp_path / "runs.duckdb"
    con = duckdb.connect(str(path))  # a schema-1 store as opmap wrote it before
    con.execute("CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR); INSERT INTO meta VALUES "
                "('schema_version', '1'); CREATE TABLE kernels (run_id VARCHAR, idx INTEGER, name VARCHAR, "
                "layer_type VARCHAR, predicted_s DOUBLE, measured_s DOUBLE, flops DOUBLE, bytes DOUBLE, bound VARCHAR);"
                "CREATE TABLE layer_types (run_id VARCHAR, layer_type VARCHAR, predicted_s DOUBLE, "
                "measured_s DOUBLE, share DOUBLE)")
    con.close()
    rid = record("analyze", _payload(3), _tags(), path)
    assert show_run(rid, path).kernels == 3
    con = duckdb.connect(str(path))
    assert con.execute("SELECT value FROM meta").fetchone() == ("2",)
    assert con.execute("SELECT count(signature) FROM kernels").fetchone() == (0,)  # no shapes in this payload
    con.execute("UPDATE meta SET value = '99'")
    con.close()
    with pytest.raises(OpmapError, match="schema version 99, newer than this opmap's 2"):
        list_runs(path=path)


def test_without_duckdb_recording_is_skipped_and_runs_says_how_to_install(tmp_path, monkeypatch, capsys):
    from opmap.cli import main

    monkeypatch.setitem(sys.modules, "duckdb", None)  # import duckdb now raises ImportError
    assert main(["analyze", "gpt2", "--seq", "8", "--rows", "1", "--store", str(tmp_path / "r.duckdb")]) == 0
    out, err = capsys.readouterr()
    assert "run not recorded: the run store needs duckdb" in out and "Traceback" not in out + err
    assert main(["runs", "list", "--store", str(tmp_path / "r.duckdb")]) == 2
    out, err = capsys.readouterr()
    assert "pip install 'opmap[store]'" in err and len(err.strip().splitlines()) == 1


def test_a_full_disk_at_the_spool_write_keeps_the_result_names_the_failure_and_leaves_no_temp_file(
        tmp_path, monkeypatch, capsys):
    """ENOSPC on the spool entry's write (the open succeeds, as on a full disk): the command's figures are printed
    and its status is 0, the failure is one line, and no temporary file is left behind (there was one per run)."""
    import errno

    from opmap.cli import main

    store = tmp_path / "runs.duckdb"
    spool = tmp_path / "runs.duckdb.spool"
    real_fdopen = os.fdopen

    class _Full:
        def __init__(self, f):
            self._f = f

        def write(self, _data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name):
            return getattr(self._f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._f.close()

    def fdopen(fd, *a, **kw):
        f = real_fdopen(fd, *a, **kw)
        target = os.readlink(f"/proc/self/fd/{fd}")
        return _Full(f) if str(spool) in target and target.endswith(".tmp") else f

    monkeypatch.setattr(os, "fdopen", fdopen)
    args = ["serve", "gpt2", "--service-time", "fixed:10", "--arrival", "poisson:5", "--requests", "50",
            "--policy", "none", "--store", str(store)]
    for _ in range(3):
        assert main(args) == 0
        out, err = capsys.readouterr()
        assert "p99" in out and "MLPerf-style validity" in out  # the run's figures, printed
        notes = [x for x in out.splitlines() if "not recorded" in x]
        assert len(notes) == 1 and "No space left on device" in notes[0] and "spool" in notes[0], out
        assert "Traceback" not in out + err
    assert [p.name for p in spool.rglob("*")] == []  # no 0-byte temporary entry per failed run
    monkeypatch.setattr(os, "fdopen", real_fdopen)  # space back: the next run is recorded
    assert main(args) == 0 and "recorded as run" in capsys.readouterr().out
    assert len(list_runs(path=store)) == 1
