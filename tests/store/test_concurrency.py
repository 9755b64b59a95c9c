"""The run store under load and damage, with real processes: 8 `opmap runs list` readers and 2 writers for 20
rounds each beside a writer that is SIGKILLed; then a 0-byte store, a store of random bytes, a disk-full first
ingest, a poisoned spool entry and a poisoned import. Every reader and writer succeeds and no run is lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

duckdb = pytest.importorskip("duckdb")

import opmap  # noqa: E402
from opmap.tags import Tags  # noqa: E402

SRC = str(Path(opmap.__file__).resolve().parents[1])  # the tree under test, for the subprocesses
ROUNDS = 20
READERS = 8
WRITERS = 2

COMMON = """
import json, sys, time, io, contextlib
from pathlib import Path
store, go = Path(sys.argv[1]), Path(sys.argv[2])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.005)
"""
# a reader: `opmap runs list --json` (the CLI's own entry point) ROUNDS times in this process
READER = COMMON + """
from opmap.cli import main
seen = 0
for i in range({rounds}):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["runs", "list", "--json", "--store", str(store)])
    if rc != 0:
        sys.exit(f"round {{i}}: exit {{rc}}: {{err.getvalue().strip()}}")
    n = len(json.loads(out.getvalue()))
    if n < seen:
        sys.exit(f"round {{i}}: {{n}} runs after {{seen}}")
    seen = n
"""
# a writer: ROUNDS runs, every other one ingested at once (the rest left in the spool for the next reader)
WRITER = COMMON + """
from opmap.store import record
from opmap.tags import Tags
w = int(sys.argv[3])
payload = {{"assumptions": {{"workload": "w", "hardware": "h100-sxm", "dtype": "bf16", "batch": 1, "seq": 8}},
           "kernels": [{{"op": "mm", "predicted_s": 1e-6, "flops": 2.0}}] * 50, "samples": {{"latency_s": [1.0] * 20}}}}
for i in range({rounds}):
    record("analyze", payload, Tags("analysis", workload="w", batch=1000 * w + i), store, ingest=i % 2 == 0)
"""
# the writer that is killed: big runs, each ingested, its id printed once record has returned
VICTIM = COMMON + """
from opmap.store import record
from opmap.tags import Tags
payload = {{"kernels": [{{"op": "mm", "predicted_s": 1e-6, "flops": 2.0}}] * 500}}
i = 0
while True:
    print(record("analyze", payload, Tags("analysis", workload="victim", batch=1 + i), store), flush=True)
    i += 1
"""


def _start(script: str, store: Path, go: Path, *args: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", script, str(store), str(go), *args], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": SRC})
    assert p.stdout.readline().strip() == "ready", p.stderr.read()
    return p


def _count(store: Path) -> dict[str, int]:
    """Runs per workload, read straight from the DuckDB file."""
    con = duckdb.connect(str(store), read_only=True)
    try:
        return dict(con.execute("SELECT workload, count(*) FROM runs GROUP BY workload").fetchall())
    finally:
        con.close()


def _opmap(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opmap.cli", *map(str, args)], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": SRC}, timeout=120)


def test_readers_and_writers_at_once_with_a_killed_writer(tmp_path):
    from opmap.store import record

    store, go = tmp_path / "runs.duckdb", tmp_path / "go"
    record("analyze", {}, Tags("analysis", workload="seed"), store)  # the store exists before the readers start
    readers = [_start(READER.format(rounds=ROUNDS), store, go) for _ in range(READERS)]
    writers = [_start(WRITER.format(rounds=ROUNDS), store, go, str(w)) for w in range(WRITERS)]
    victim = _start(VICTIM.format(), store, go)
    go.touch()
    failures = []
    for p in readers + writers:
        _, err = p.communicate(timeout=240)
        if p.returncode != 0:
            failures.append(err.strip().splitlines()[-1] if err.strip() else f"exit {p.returncode}")
    victim.send_signal(signal.SIGKILL)  # wherever it is: spooling, inside an ingest, moving its file
    out, _ = victim.communicate(timeout=30)
    assert failures == []  # 0 crashes of 8 x 20 reads and 2 x 20 writes
    landed = out.split()
    assert all(x.startswith("20") for x in landed)  # nothing but run ids on stdout (no progress bar)
    rc = _opmap("runs", "list", "--json", "--store", store)
    assert rc.returncode == 0, rc.stderr
    ids = [r["id"] for r in json.loads(rc.stdout)]
    assert set(landed) <= set(ids) and len(ids) == len(set(ids))  # 0 runs lost, none twice
    counts = _count(store)
    assert counts["w"] == WRITERS * ROUNDS and counts["seed"] == 1 and counts["victim"] >= len(landed)
    con = duckdb.connect(str(store), read_only=True)  # every run whole: all its kernels or none of it
    per_run = con.execute("SELECT r.workload, count(k.idx) FROM runs r LEFT JOIN kernels k ON k.run_id = r.id "
                          "GROUP BY r.id, r.workload").fetchall()
    con.close()
    assert {(w, n) for w, n in per_run} <= {("seed", 0), ("w", 50), ("victim", 500)}


def _spooled(store: Path, n: int) -> list[str]:
    from opmap.store import record

    return [record("analyze", {}, Tags("analysis", workload="w", batch=b), store, ingest=False)
            for b in range(1, n + 1)]


def test_a_zero_byte_store_is_rebuilt_from_the_spool(tmp_path):
    # what a disk-full first ingest left before: runs.duckdb of 0 bytes, the runs still in the spool
    store = tmp_path / "runs.duckdb"
    ids = _spooled(store, 3)
    store.write_bytes(b"")
    rc = _opmap("runs", "list", "--json", "--store", store)
    assert rc.returncode == 0, rc.stderr
    assert sorted(r["id"] for r in json.loads(rc.stdout)) == sorted(ids)
    assert "rebuilt from its spool" in rc.stderr and store.stat().st_size > 0


def test_a_corrupt_store_is_rebuilt_from_its_journal_or_refused_in_one_line(tmp_path):
    store = tmp_path / "runs.duckdb"
    ids = _spooled(store, 4)
    assert _opmap("runs", "list", "--store", store).returncode == 0  # ingested: the runs now in the journal
    good = store.read_bytes()
    store.write_bytes(os.urandom(len(good)))  # random bytes over the whole file
    rc = _opmap("runs", "list", "--json", "--store", store)
    assert rc.returncode == 0, rc.stderr
    assert sorted(r["id"] for r in json.loads(rc.stdout)) == sorted(ids)  # 0 runs lost
    assert len(list(tmp_path.glob("runs.duckdb.corrupt-*"))) == 1  # the damaged file kept for a person
    # a store from before the journal (its runs not all in the spool): refused, with what to do
    (store.with_name(store.name + ".spool") / "done" / ".complete").unlink()
    store.write_bytes(os.urandom(len(good)))
    rc = _opmap("runs", "list", "--store", store)
    lines = rc.stderr.strip().splitlines()
    assert rc.returncode == 2 and len(lines) == 1 and str(store) in lines[0] and "mv " in lines[0], rc.stderr


DISK_FULL = """
import resource, signal, sys
from pathlib import Path
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))
from opmap.cli import main
sys.exit(main(["runs", "list", "--store", sys.argv[1]]))
"""


def test_a_disk_full_first_ingest_leaves_no_store_and_loses_no_run(tmp_path):
    store = tmp_path / "runs.duckdb"
    ids = _spooled(store, 2)
    p = subprocess.run([sys.executable, "-c", DISK_FULL, str(store)], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": SRC})
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert not store.exists() and not list(tmp_path.glob(".runs.duckdb.*"))  # no 0-byte or half-built file
    rc = _opmap("runs", "list", "--json", "--store", store)  # disk space back: the next reader builds it
    assert rc.returncode == 0, rc.stderr
    assert sorted(r["id"] for r in json.loads(rc.stdout)) == sorted(ids)


def test_a_poisoned_spool_entry_is_quarantined_and_reads_go_on(tmp_path):
    store = tmp_path / "runs.duckdb"
    ids = _spooled(store, 2)
    spool = store.with_name(store.name + ".spool")
    bad = {"id": "20990101T000000-bad", "kind": "analyze", "time_utc": "2099-01-01T00:00:00+00:00",
           "tags": {"workload": "w", "batch": "abc"}, "payload": {}, "rows": {}}
    (spool / "20990101T000000-bad.json").write_text(json.dumps(bad))  # as an older opmap's import left it
    warned = []
    for _ in range(2):  # this read and every read after it
        rc = _opmap("runs", "list", "--json", "--store", store)
        assert rc.returncode == 0, rc.stderr
        assert sorted(r["id"] for r in json.loads(rc.stdout)) == sorted(ids)
        warned.append([x for x in rc.stderr.splitlines() if "20990101T000000-bad.json" in x])
    assert len(warned[0]) == 1 and "batch" in warned[0][0] and warned[1] == []  # named once, in one line
    assert (spool / "quarantine" / "20990101T000000-bad.json").exists()


def test_a_poisoned_import_takes_nothing_and_the_store_reads_on(tmp_path):
    store = tmp_path / "runs.duckdb"
    ids = _spooled(store, 1)
    good = {"assumptions": {"workload": "w", "hardware": "h100-sxm", "dtype": "bf16", "batch": 2, "seq": 8}}
    (tmp_path / "in" / "a").mkdir(parents=True)
    (tmp_path / "in" / "b").mkdir()
    (tmp_path / "in" / "a" / "analysis.json").write_text(json.dumps(good))
    (tmp_path / "in" / "b" / "analysis.json").write_text(json.dumps(
        {"assumptions": {**good["assumptions"], "batch": "abc"}}))
    rc = _opmap("runs", "import", tmp_path / "in", "--store", store)
    lines = rc.stderr.strip().splitlines()
    assert rc.returncode == 2 and len(lines) == 1 and "b/analysis.json" in lines[0] and "batch" in lines[0]
    rc = _opmap("runs", "list", "--json", "--store", store)
    assert rc.returncode == 0 and [r["id"] for r in json.loads(rc.stdout)] == ids  # the good one not taken either
    (tmp_path / "in" / "b" / "analysis.json").unlink()
    rc = _opmap("runs", "import", tmp_path / "in", "--store", store)
    assert rc.returncode == 0 and "imported 1 run(s)" in rc.stdout, rc.stderr
