"""opmap compare: exit 0 without a regression, 1 with one, 2 on bad input."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("duckdb")

from opmap.store import record  # noqa: E402


def _run(path, scale, seed):
    rng = random.Random(seed)
    lat = [rng.gauss(10e-3, 0.2e-3) * scale for _ in range(20)]
    body = {"nodes": [{"id": 0, "op": "aten.mm.default", "module": "fc", "layer_type": "mlp"}],
            "kernels": [{"anchor": 0, "nodes": [0], "predicted_s": 1e-3, "measured_s": 1e-3 * scale}],
            "samples": {"latency_s": lat}}
    tags = {"workload": "m", "hardware": "local", "precision": "fp32", "phase": "prefill", "graph_hash": "g"}
    return record("profile", body, tags, path)


def test_exit_codes(tmp_path, cli, refused):
    store = tmp_path / "runs.duckdb"
    a, b, c = _run(store, 1.0, 1), _run(store, 1.0, 2), _run(store, 1.25, 3)
    rc, out, _ = cli("compare", a, b, "--store", store)
    assert rc == 0 and "no significant change" in out
    rc, out, _ = cli("compare", a, c, "--store", store)
    assert rc == 1 and "regression" in out
    refused("compare", a, "nope", "--store", store, needle="no run 'nope'")
