"""A store file that opens but is damaged: a real DuckDB store truncated at several offsets and with a byte flipped
at a seeded set of offsets. ``runs list`` and ``runs show`` either read it as it was (the damage is in space no
query reads) or find it damaged, keep it aside and rebuild it from its journal, saying so in one line; never a
traceback, never a run lost. Without a complete journal: one line, exit status 2."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

from opmap.cli import main  # noqa: E402
from opmap.store import record  # noqa: E402
from opmap.tags import Tags  # noqa: E402

N_KERNELS = 3000  # rows enough for the kernels table to span several of DuckDB's 256 kB blocks
N_SAMPLES = 7


def _payload(n: int) -> dict:
    return {"nodes": [{"id": i, "op": "aten.mm.default", "module": f"l{i}", "layer_type": "mlp", "flops": 2.0 * i}
                      for i in range(n)],
            "kernels": [{"anchor": i, "nodes": [i], "predicted_s": 1e-6 * (i + 1)} for i in range(n)],
            "samples": {"latency_s": [1.0 + i for i in range(N_SAMPLES)]}}


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A store of three runs, every run in the journal: (folder, run ids)."""
    d = tmp_path_factory.mktemp("good")
    ids = [record("analyze", _payload(N_KERNELS), Tags("analysis", workload="w", hardware="h100-sxm", batch=b),
                  d / "runs.duckdb") for b in (1, 2, 3)]
    return d, ids


def _copy(good_dir: Path, to: Path) -> Path:
    to.mkdir()
    shutil.copy(good_dir / "runs.duckdb", to / "runs.duckdb")
    shutil.copytree(good_dir / "runs.duckdb.spool", to / "runs.duckdb.spool")
    return to / "runs.duckdb"


def _run(capsys, *args) -> tuple[int, str, list[str]]:
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, [x for x in err.splitlines() if x.strip()]


def _cases(size: int) -> list[tuple[str, int]]:
    rng = random.Random(34)
    cuts = [1, 100, 4096, 8192, 12288, size // 2, size - 4096, size - 1] + [rng.randrange(1, size) for _ in range(4)]
    flips = [10, 4096 + 10, 8192 + 10, 12288 + 100] + [rng.randrange(size) for _ in range(14)]
    return [("truncate", o) for o in cuts] + [("flip", o) for o in flips]


def _damage(f: Path, how: str, offset: int) -> None:
    if how == "truncate":
        with open(f, "r+b") as fh:
            fh.truncate(offset)
    else:
        b = bytearray(f.read_bytes())
        b[offset] ^= 0xFF
        f.write_bytes(bytes(b))


def test_a_damaged_store_is_kept_aside_and_rebuilt_from_its_journal(good, tmp_path, capsys):
    good_dir, ids = good
    size = (good_dir / "runs.duckdb").stat().st_size
    rebuilt = 0
    for how, offset in _cases(size):
        store = _copy(good_dir, tmp_path / f"{how}-{offset}")
        _damage(store, how, offset)
        damaged_size = store.stat().st_size
        warnings = []
        rc, out, err = _run(capsys, "runs", "list", "--json", "--store", store)
        assert rc == 0 and sorted(r["id"] for r in json.loads(out)) == sorted(ids), (how, offset, err)
        warnings += err
        for rid in ids:
            rc, out, err = _run(capsys, "runs", "show", rid, "--json", "--store", store)
            shown = json.loads(out) if rc == 0 else None
            assert rc == 0 and shown["kernels"] == N_KERNELS and shown["samples"] == N_SAMPLES, (how, offset, err)
            warnings += err
        kept = list(store.parent.glob("runs.duckdb.corrupt-*"))
        assert len(warnings) <= 1, (how, offset, warnings)  # found damaged once, rebuilt once, said in one line
        if warnings:
            rebuilt += 1
            assert "rebuilt from its spool" in warnings[0] and "wait in its spool" not in warnings[0]
            assert [f.stat().st_size for f in kept] == [damaged_size]  # the damaged file kept whole, not deleted
        else:
            assert kept == []
    assert rebuilt >= 15  # the seeded set reaches the header, the catalog and the tables' blocks


def test_a_damaged_store_without_a_complete_journal_is_refused_in_one_line(good, tmp_path, capsys):
    good_dir, ids = good
    size = (good_dir / "runs.duckdb").stat().st_size
    refused = 0
    for how, offset in (("truncate", 100), ("truncate", size // 2), ("truncate", size - 1), ("flip", 4096 + 10)):
        store = _copy(good_dir, tmp_path / f"{how}-{offset}")
        (store.parent / "runs.duckdb.spool" / "done" / ".complete").unlink()  # a store from before the journal
        _damage(store, how, offset)
        before = store.read_bytes()
        for args in (("runs", "list"), *(("runs", "show", rid) for rid in ids)):
            rc, out, err = _run(capsys, *args, "--store", store)
            if rc == 0:  # the damage is in blocks this command does not read
                continue
            refused += 1
            assert rc == 2 and len(err) == 1 and "not a readable DuckDB database" in err[0], (how, offset, err)
            assert "mv " in err[0] and "wait in its spool" not in err[0]
        assert store.read_bytes() == before  # left as it was, for a person
    assert refused >= 4
