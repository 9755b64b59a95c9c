"""opmap compare: the rank test by hand, regressions found only where injected, refusal on mismatched tags."""

from __future__ import annotations

import math
import random

import pytest

pytest.importorskip("duckdb")

from opmap.errors import OpmapError  # noqa: E402
from opmap.store import record  # noqa: E402
from opmap.store.compare import compare, mann_whitney  # noqa: E402


def test_mann_whitney_by_hand():
    # A = 1, 2, 3 against B = 4, 5, 6: every A below every B, so U_A = R_A - 3 x 4 / 2 = 6 - 6 = 0. Mean 4.5,
    # variance 3 x 3 / 12 x 7 = 5.25 (no ties); z = (|0 - 4.5| - 0.5) / sqrt(5.25) = 1.7457; p = 2 (1 - Phi(z))
    u, p = mann_whitney([1, 2, 3], [4, 5, 6])
    assert u == 0
    z = 4.0 / math.sqrt(5.25)
    assert p == pytest.approx(2 * (1 - 0.5 * (1 + math.erf(z / math.sqrt(2)))))
    assert p == pytest.approx(0.0809, abs=5e-4)  # scipy.stats.mannwhitneyu(method="asymptotic") prints 0.0809
    # ties: A = 1, 2, 2, B = 2, 3, 4; ranks 1, 3, 3 | 3, 5, 6 -> R_A = 7, U_A = 1; tie term t = 3: 24
    u, p = mann_whitney([1, 2, 2], [2, 3, 4])
    assert u == 1
    var = 9 / 12 * (7 - 24 / 30)
    assert p == pytest.approx(2 * (1 - 0.5 * (1 + math.erf(((4.5 - 1) - 0.5) / math.sqrt(var) / math.sqrt(2)))))


def _profile(latencies, kernel_times):
    nodes = [{"id": i, "op": "aten.mm.default", "module": f"l{i}", "layer_type": "mlp", "flops": 1.0}
             for i in range(len(kernel_times))]
    kernels = [{"anchor": i, "nodes": [i], "predicted_s": t, "measured_s": t, "traffic_bytes": 1.0}
               for i, t in enumerate(kernel_times)]
    return {"nodes": nodes, "kernels": kernels, "samples": {"latency_s": latencies}}


def _tags(**kw):
    return {"workload": "m", "hardware": "local", "precision": "fp32", "phase": "prefill", "graph_hash": "g", **kw}


def test_a_regression_is_found_only_where_injected(tmp_path):
    path = tmp_path / "runs.duckdb"
    rng = random.Random(0)
    base = [rng.gauss(10e-3, 0.3e-3) for _ in range(30)]
    same = [rng.gauss(10e-3, 0.3e-3) for _ in range(30)]
    slow = [x * 1.2 for x in (rng.gauss(10e-3, 0.3e-3) for _ in range(30))]  # a 20% slowdown
    a = record("profile", _profile(base, [1e-3, 2e-3]), _tags(), path)
    b = record("profile", _profile(same, [1e-3, 2e-3]), _tags(), path)
    c = record("profile", _profile(slow, [1e-3, 2.4e-3]), _tags(), path)
    assert compare(a, b, path)["verdict"] == "no significant change"
    r = compare(a, c, path)
    assert r["verdict"] == "regression" and r["test"]["p"] < 1e-6 and r["effect"] == pytest.approx(0.2, abs=0.03)
    assert r["kernels"][0]["a_idx"] == 1 and r["kernels"][0]["rel"] == pytest.approx(0.2)
    assert compare(c, a, path)["verdict"] == "improvement"


def test_predicted_runs_and_mismatched_tags(tmp_path):
    path = tmp_path / "runs.duckdb"
    p = _profile([], [1e-3])
    p.pop("samples")
    a = record("analyze", p, _tags(), path)
    b = record("analyze", _profile([], [1.5e-3]) | {"samples": {}}, _tags(), path)
    r = compare(a, b, path)
    assert r["verdict"] == "predicted change" and r["test"] is None and "no significance test" in r["note"]
    h = record("analyze", p, _tags(hardware="h100-sxm"), path)
    with pytest.raises(OpmapError, match=r"differ in hardware \(local vs h100-sxm\)"):
        compare(a, h, path)
    assert compare(a, h, path, force=True)["forced_tags"] == ["hardware"]
