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


def _u_of(a, b):
    return sum(1.0 if x > y else 0.5 if x == y else 0.0 for x in a for y in b)


@pytest.mark.parametrize("n, critical", [(10, 23), (20, 127)])
def test_mann_whitney_agrees_with_the_tabled_critical_values(n, critical):
    # Tabled two-sided alpha = 0.05 critical values of U for n_a = n_b = n (e.g. Siegel & Castellan table J;
    # 23 for 10, 127 for 20): U <= critical rejects, U = critical + 1 does not. Build samples with a given U
    # (each a-value placed above c_i of the b-values, sum c_i = U) and check the normal approximation agrees.
    b = [float(j) for j in range(n)]
    for u, rejects in ((critical, True), (critical + 1, False)):
        c = [min(n, max(0, u - n * i)) for i in range(n)]  # greedy counts summing to u
        a = [ci - 0.5 + 0.01 * i for i, ci in enumerate(c)]  # distinct values: no ties
        assert _u_of(a, b) == u
        got, p = mann_whitney(a, b)
        assert got == u and (p < 0.05) == rejects, (u, p)


def _kernel_run(rng, slow_kernel=None, factor=1.2, n=20, nk=4, **node_extra):
    nodes = [{"id": i, "op": "aten.mm.default", "module": f"l{i}", "layer_type": "mlp" if i < 2 else "attention",
              "flops": 1.0, **node_extra} for i in range(nk)]
    kernels, lat = [], [0.0] * n
    for i in range(nk):
        xs = [rng.gauss(1e-3, 0.03e-3) * (factor if i == slow_kernel else 1.0) for _ in range(n)]
        kernels.append({"anchor": i, "nodes": [i], "predicted_s": 1e-3, "measured_s": sorted(xs)[n // 2],
                        "measured_samples_s": xs, "traffic_bytes": 1.0, "memory_stall_s": 0.1e-3})
        lat = [x + y for x, y in zip(lat, xs)]
    return {"nodes": nodes, "kernels": kernels, "samples": {"latency_s": lat}}


def test_per_kernel_verdicts_find_only_the_injected_kernel(tmp_path):
    path = tmp_path / "runs.duckdb"
    rng = random.Random(3)
    a = record("profile", _kernel_run(rng), _tags(), path)
    b = record("profile", _kernel_run(rng), _tags(), path)
    c = record("profile", _kernel_run(rng, slow_kernel=3, factor=1.5), _tags(), path)
    same = compare(a, b, path)
    assert same["verdict"] == "no significant change"
    assert {k["verdict"] for k in same["kernels"]} == {"no significant change"}
    assert {v["verdict"] for v in same["layer_types"].values()} == {"no significant change"}
    r = compare(a, c, path)
    assert r["matched_by"] == {"node identity": 4} and r["verdict"] == "regression"
    verdicts = {k["a_idx"]: k["verdict"] for k in r["kernels"]}
    assert verdicts == {0: "no significant change", 1: "no significant change", 2: "no significant change",
                        3: "regression"}
    assert r["layer_types"]["attention"]["verdict"] == "regression"
    assert r["layer_types"]["mlp"]["verdict"] == "no significant change"
    k3 = r["kernels"][0]
    assert k3["a_idx"] == 3 and k3["effect"] == pytest.approx(0.5, abs=0.05) and k3["stall_delta"] is not None


def test_kernels_match_by_signature_then_by_module_where_graphs_differ(tmp_path):
    from opmap.store.compare import _match

    def k(idx, ids, name, sig):
        return {"idx": idx, "node_ids": ids, "name": name, "signature": sig}

    ka = [k(0, "0", "mm@a", "mm(f32[2, 4])"), k(1, "1", "mm@b", "mm(f32[4, 4])"), k(2, "2", "relu@c", "relu(f32[8])")]
    # b: one node inserted in front (ids shift), b's mm at a new shape, a kernel of its own
    kb = [k(0, "0", "add@z", "add(f32[1])"), k(1, "1", "mm@a", "mm(f32[2, 4])"), k(2, "2", "mm@b", "mm(f32[4, 8])"),
          k(3, "3", "relu@c", "relu(f32[8])")]
    pairs, unmatched, how = _match(ka, kb)
    got = {(x["idx"], y["idx"]): h for (x, y), h in zip(pairs, how)}
    assert got == {(0, 1): "op signature", (2, 3): "op signature", (1, 2): "op at module"}
    assert unmatched == [{"side": "b", "idx": 0, "name": "add@z"}]
