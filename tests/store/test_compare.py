"""opmap compare: the rank test by hand, regressions found only where injected, refusal on mismatched tags."""

from __future__ import annotations

import math
import random
import statistics

import pytest

pytest.importorskip("duckdb")

from opmap.errors import OpmapError  # noqa: E402
from opmap.record import record as record_json  # noqa: E402
from opmap.store import record  # noqa: E402
from opmap.store.compare import compare, mann_whitney  # noqa: E402
from opmap.store.source import KernelRow  # noqa: E402
from opmap.tags import Tags  # noqa: E402


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
    return Tags("analysis", **{"workload": "m", "hardware": "local", "precision": "fp32", "phase": "prefill",
                               "graph_hash": "g", **kw})


def test_a_regression_is_found_only_where_injected(tmp_path):
    # three runs a side (each side its own command): the repeats measure the noise between runs
    path = tmp_path / "runs.duckdb"
    rng = random.Random(0)

    def side(name, scale, kernel_times):  # a 20% slowdown where scale is 1.2
        return [record("profile", _profile([rng.gauss(10e-3, 0.3e-3) * scale for _ in range(30)], kernel_times),
                       _tags(command=f"opmap profile {name}/m.py:m"), path) for _ in range(3)]

    a, b, c = (side("main", 1.0, [1e-3, 2e-3])[0], side("copy", 1.0, [1e-3, 2e-3])[0],
               side("branch", 1.2, [1e-3, 2.4e-3])[0])
    assert compare(a, b, path).verdict.verdict == "no significant change"
    r = compare(a, c, path)
    v = r.verdict
    assert v.verdict == "regression" and v.test.p < 1e-6 and v.effect == pytest.approx(0.2, abs=0.03)
    assert r.kernels[0].a_idx == 1 and r.kernels[0].rel == pytest.approx(0.2)
    assert compare(c, a, path).verdict.verdict == "improvement"


def test_predicted_runs_and_mismatched_tags(tmp_path):
    path = tmp_path / "runs.duckdb"
    p = _profile([], [1e-3])
    p.pop("samples")
    a = record("analyze", p, _tags(), path)
    b = record("analyze", _profile([], [1.5e-3]) | {"samples": {}}, _tags(), path)
    r = compare(a, b, path)
    v = r.verdict
    assert v.verdict == "predicted change" and v.test is None and "no significance test" in v.note
    h = record("analyze", p, _tags(hardware="h100-sxm"), path)
    with pytest.raises(OpmapError, match=r"differ in hardware \(local vs h100-sxm\)"):
        compare(a, h, path)
    assert compare(a, h, path, force=True).forced_tags == ("hardware",)


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
    # one of four kernels 50% slower moves the run by 12.5%: below the assumed floor of two lone runs (15%), so
    # two repeats of A measure this host's noise (tight here: kernels with 3% spread over 20 iterations)
    path = tmp_path / "runs.duckdb"
    rng = random.Random(3)
    a = record("profile", _kernel_run(rng), _tags(), path)
    b = record("profile", _kernel_run(rng), _tags(), path)
    for _ in range(2):
        record("profile", _kernel_run(rng), _tags(), path)
    c = record("profile", _kernel_run(rng, slow_kernel=3, factor=1.5), _tags(), path)
    same = compare(a, b, path)
    assert same.verdict.verdict == "no significant change"
    assert {k.verdict for k in same.kernels} == {"no significant change"}
    assert {v.verdict for v in same.layer_types} == {"no significant change"}
    r = compare(a, c, path)
    assert r.matched_by == (("node identity", 4),) and r.regressed
    n = r.verdict.evidence.noise
    assert n.measured and len(n.runs_a) == 4 and n.runs_b == (c,)
    verdicts = {k.a_idx: k.verdict for k in r.kernels}
    assert verdicts == {0: "no significant change", 1: "no significant change", 2: "no significant change",
                        3: "regression"}
    lts = {lt.layer_type: lt for lt in r.layer_types}
    assert lts["attention"].verdict == "regression" and lts["mlp"].verdict == "no significant change"
    k3 = r.kernels[0]
    assert k3.a_idx == 3 and k3.test.effect == pytest.approx(0.5, abs=0.05) and k3.stall_delta is not None
    # the JSON keeps the test's figures beside the kernel's (opmap compare --json)
    d = record_json(r)
    assert d["kernels"][0]["effect"] == k3.test.effect
    # compare --json's shape, key for key as Comparison.to_dict wrote it before it was declared: a tested verdict
    assert list(d) == ["a", "b", "forced_tags", "matched_by", "times", "kernels", "unmatched", "totals",
                       "layer_types", "min_effect", "alpha", "per_kernel_test", "kernel_floor", "warmup_rule", "test",
                       "effect", "verdict", "verdict_line", "min_effect_used", "noise", "warmup", "host"]
    assert d["matched_by"] == {"node identity": 4} and list(d["layer_types"]) == [lt.layer_type for lt in r.layer_types]
    assert list(d["kernels"][0]) == [
        "a_idx", "b_idx", "name", "layer_type", "a_s", "b_s", "delta_s", "rel", "measured", "mfu_a", "mfu_b",
        "mfu_delta", "stall_a", "stall_b", "stall_delta", "bytes_a", "bytes_b", "bytes_delta", "p", "effect", "n_a",
        "n_b", "matched_by", "verdict"]
    assert list(d["layer_types"]["attention"]) == [
        "kernels", "only_a", "only_b", "a_s", "b_s", "delta_s", "rel", "measured", "mfu_delta", "stall_delta",
        "bytes_delta", "p", "effect", "n_a", "n_b", "verdict"]
    assert list(d["test"]) == ["name", "u", "p", "n_a", "n_b"]
    assert list(d["noise"]) == ["noise", "measured", "n_a", "n_b", "sd_log", "dof", "t", "rule", "minimum_effect",
                                "runs_a", "runs_b"]
    assert list(d["warmup"]) == ["rule", "dropped_a", "dropped_b"]
    assert list(d["kernel_floor"]) == ["noise", "measured", "n_a", "n_b", "sd_log", "dof", "t", "rule"]


def test_kernels_match_by_signature_then_by_module_where_graphs_differ(tmp_path):
    from opmap.store.compare import _match

    def k(idx, ids, name, sig):
        return KernelRow(idx, name, None, None, None, None, ids, sig, None, None)

    ka = [k(0, "0", "mm@a", "mm(f32[2, 4])"), k(1, "1", "mm@b", "mm(f32[4, 4])"), k(2, "2", "relu@c", "relu(f32[8])")]
    # b: one node inserted in front (ids shift), b's mm at a new shape, a kernel of its own
    kb = [k(0, "0", "add@z", "add(f32[1])"), k(1, "1", "mm@a", "mm(f32[2, 4])"), k(2, "2", "mm@b", "mm(f32[4, 8])"),
          k(3, "3", "relu@c", "relu(f32[8])")]
    pairs, unmatched, how = _match(ka, kb)
    got = {(x.idx, y.idx): h for (x, y), h in zip(pairs, how)}
    assert got == {(0, 1): "op signature", (2, 3): "op signature", (1, 2): "op at module"}
    assert [(side, k.idx, k.name) for side, k in unmatched] == [("b", 0, "add@z")]


HOST = {"device_name": "AMD EPYC", "device": "cpu", "threads": 2, "host": "ci-1"}
CMD_A, CMD_B = "opmap profile main/m.py:m --iters 20", "opmap profile branch/m.py:m --iters 20"


def _step_run(rng, stall_s=0.0, n=20, host=HOST):
    """A profile of a ~200 ms step: each run's level lognormal(0, 3%) about 200 ms (the noise between runs),
    each step lognormal(0, 10%) about its run's level, plus ``stall_s``; the first step a warm-up outlier at
    x18.5 (+1750%, as the issue measured). Single same-code runs then differ by up to 9-13% over ten pairs."""
    level = 0.200 * math.exp(rng.gauss(0, 0.03))
    lat = [level * math.exp(rng.gauss(0, 0.10)) + stall_s for _ in range(n)]
    lat[0] *= 18.5
    nodes = [{"id": 0, "op": "aten.mm.default", "module": "step", "layer_type": "mlp", "flops": 1.0}]
    kernels = [{"anchor": 0, "nodes": [0], "predicted_s": 0.2, "measured_s": statistics.median(lat[-5:]),
                "measured_samples_s": lat[-5:], "traffic_bytes": 1.0}]
    return {"nodes": nodes, "kernels": kernels, "samples": {"latency_s": lat}, "tags": host}


def _pairs(path, rng, stall_s, runs, first=0):
    """Ten comparisons, each of its own workload: A and runs - 1 repeats of it, B and runs - 1 repeats."""
    out = []
    for i in range(first, first + 10):
        a = [record("profile", _step_run(rng), _tags(workload=f"m{i}", command=CMD_A), path, ingest=False)
             for _ in range(runs)]
        b = [record("profile", _step_run(rng, stall_s), _tags(workload=f"m{i}", command=CMD_B), path, ingest=False)
             for _ in range(runs)]
        out.append((a[0], b[0]))
    return [compare(a, b, path) for a, b in out]


def test_same_code_pairs_never_regress_and_a_40ms_stall_is_caught_10_of_10(tmp_path):
    # the check, 5 runs a side (repeats in the store, or --rerun 4): same code gives no regression in 10
    # pairs; a 40 ms stall in the ~200 ms step (+20%) is a regression in 10 of 10
    path = tmp_path / "runs.duckdb"
    rng = random.Random(19)
    same, stalled = _pairs(path, rng, 0.0, 5), _pairs(path, rng, 0.040, 5, first=10)
    assert [r.verdict.verdict for r in same].count("regression") == 0
    assert [r.verdict.verdict for r in stalled] == ["regression"] * 10
    for r in same + stalled:
        e, n = r.verdict.evidence, r.verdict.evidence.noise
        assert n.measured and len(n.runs_a) == 5 and len(n.runs_b) == 5 and n.dof == 8
        assert e.warmup.dropped_a == (1,) * 5  # every run's x18.5 first step, by the rule
        assert e.min_effect_used == max(0.05, n.noise) and "max(--min-effect 5.0%" in n.minimum_effect
    # the stall's effect, +40 ms on 200 ms: +20%, within the noise of five runs a side
    assert all(0.12 < r.verdict.effect < 0.28 for r in stalled)
    assert max(r.verdict.evidence.noise.noise for r in stalled) < 0.15


def test_lone_same_code_pairs_are_inconclusive_never_regressions(tmp_path):
    # without repeats the noise between runs is not measured: no verdict on an assumed floor (the 15% once assumed
    # sat under the up to ~29% issue 35 measured between processes), so every lone pair is inconclusive, those the
    # rank test and the 5% minimum effect alone would call changes included
    path = tmp_path / "runs.duckdb"
    rs = _pairs(path, random.Random(5), 0.0, 1)
    vs = [r.verdict for r in rs]
    assert [v.verdict for v in vs] == ["inconclusive"] * 10
    assert all(not v.evidence.noise.measured and v.evidence.min_effect_used == 0.05 for v in vs)
    beyond = [v for v in vs if v.test.p < 0.05 and abs(v.effect) > 0.05]
    assert beyond and all(v.line.startswith("inconclusive: noise not measured") for v in beyond)


def test_a_warmup_outlier_does_not_move_a_kernel(tmp_path):
    # --profile-iters 2: the stored kernel time is the median of two iterations, their mean; a first iteration at
    # x18.5 made it +870%. The rule drops that iteration: the kernel's time is the one left (0.202 ms)
    path = tmp_path / "runs.duckdb"

    def run(kernel_samples):
        nodes = [{"id": 0, "op": "aten.mm.default", "module": "fc", "layer_type": "mlp", "flops": 1.0}]
        kernels = [{"anchor": 0, "nodes": [0], "predicted_s": 1e-4, "measured_s": statistics.median(kernel_samples),
                    "measured_samples_s": kernel_samples, "traffic_bytes": 1.0}]
        return {"nodes": nodes, "kernels": kernels, "samples": {"latency_s": [1e-3 + 1e-6 * i for i in range(10)]}}

    a = record("profile", run([0.200e-3, 0.201e-3]), _tags(), path)
    b = record("profile", run([3.700e-3, 0.202e-3]), _tags(), path)
    k = compare(a, b, path).kernels[0]
    assert k.b_s == pytest.approx(0.202e-3) and k.a_s == pytest.approx(0.2005e-3)
    assert k.rel == pytest.approx(0.202 / 0.2005 - 1) and k.verdict == "no test"


def test_repeats_on_another_host_do_not_count_and_a_host_change_is_refused(tmp_path):
    path = tmp_path / "runs.duckdb"
    rng = random.Random(2)
    other = {**HOST, "host": "ci-2"}
    a = record("profile", _step_run(rng), _tags(command=CMD_A), path)
    for _ in range(3):
        record("profile", _step_run(rng, host=other), _tags(command=CMD_A), path)
    b = record("profile", _step_run(rng), _tags(command=CMD_B), path)
    r = compare(a, b, path)
    assert r.verdict.evidence.noise.runs_a == (a,) and not r.verdict.evidence.noise.measured
    assert r.verdict.evidence.host == "AMD EPYC (cpu, 2 threads) on ci-1"
    c = record("profile", _step_run(rng, host=other), _tags(command=CMD_B), path)
    with pytest.raises(OpmapError, match=r"differ in host \(AMD EPYC \(cpu, 2 threads\) on ci-1 vs"):
        compare(a, c, path)
    assert compare(a, c, path, force=True).forced_tags == ("host",)


def test_compare_refuses_runs_without_kernels(tmp_path):
    path = tmp_path / "runs.duckdb"
    s = record("sweep", {"points": [{"batch": 1}]}, _tags(), path)
    a = record("analyze", _profile([], [1e-3]) | {"samples": {}}, _tags(), path)
    with pytest.raises(OpmapError, match=f"{s} is a sweep run"):
        compare(a, s, path)


def _named_run(kernels):
    """An analyze payload of one node per kernel: (op, module, layer type, predicted s)."""
    nodes = [{"id": i, "op": op, "module": mod, "layer_type": lt, "flops": 1.0}
             for i, (op, mod, lt, _) in enumerate(kernels)]
    ks = [{"anchor": i, "nodes": [i], "predicted_s": t, "traffic_bytes": 1.0} for i, (*_, t) in enumerate(kernels)]
    return {"nodes": nodes, "kernels": ks}


def test_the_total_counts_every_kernel_matched_or_not(tmp_path):
    # issue 35: gpt2 eager against --fusion compiler said "no change: +0.1%" on the 89 matched kernels while the
    # runs' totals were 1.21 and 0.976 ms (-19%): the 37 GELU / add kernels the compiler fused into their GEMMs have
    # no partner in B. Here A runs fc1 3 us, gelu 2 us, fc2 3 us; B fuses the GELU into fc1 (3.1 us) and adds a
    # copy of its own (0.5 us). Totals: A 3 + 2 + 3 = 8 us, B 3.1 + 3 + 0.5 = 6.6 us: 6.6 / 8 - 1 = -17.5%
    # (the matched kernels alone: 6.1 / 6 - 1 = +1.7%, "no change")
    path = tmp_path / "runs.duckdb"
    mm, gelu, copy = "aten.mm.default", "aten.gelu.default", "aten.copy_.default"
    a = record("analyze", _named_run([(mm, "fc1", "mlp", 3e-6), (gelu, "act", "elementwise", 2e-6),
                                      (mm, "fc2", "mlp", 3e-6)]), _tags(graph_hash="eager"), path)
    b = record("analyze", _named_run([(mm, "fc1", "mlp", 3.1e-6), (mm, "fc2", "mlp", 3e-6),
                                      (copy, "out", "data_movement", 0.5e-6)]), _tags(graph_hash="fused"), path)
    r = compare(a, b, path)
    assert r.verdict.effect == pytest.approx(6.6 / 8 - 1) and r.verdict.verdict == "predicted change"
    assert "-17.5%" in r.verdict.line and "8 µs -> 6.6 µs" in r.verdict.line
    t = r.totals
    assert t.a_s == pytest.approx(8e-6) and t.b_s == pytest.approx(6.6e-6)
    assert (t.only_a.kernels, t.only_a.time_s) == (1, pytest.approx(2e-6))
    assert (t.only_b.kernels, t.only_b.time_s) == (1, pytest.approx(0.5e-6))
    # the JSON's totals: each side's kernels without a partner under only_a / only_b
    d = record_json(r)
    assert d["totals"]["only_a"] == {"kernels": 1, "time_s": pytest.approx(2e-6)}
    assert list(d["totals"]) == ["matched_a_s", "matched_b_s", "only_a", "a_s", "only_b", "b_s", "rel"]
    # an untested verdict: its note after the line, none of a tested one's blocks
    assert list(d)[-6:] == ["warmup_rule", "test", "effect", "verdict", "verdict_line", "note"] and d["test"] is None
    assert list(d["unmatched"][0]) == ["side", "idx", "name", "layer_type", "time_s"]
    assert "p" not in d["kernels"][0] and list(d["kernels"][0])[-2:] == ["matched_by", "verdict"]
    assert sorted((u.side, u.name, u.time_s) for u in r.unmatched) == [
        ("a", f"{gelu}@act", pytest.approx(2e-6)), ("b", f"{copy}@out", pytest.approx(0.5e-6))]
    # the layer types hold the kernels without a partner too: A's GELU, B's copy
    lt = {x.layer_type: x for x in r.layer_types}
    assert (lt["elementwise"].a_s, lt["elementwise"].b_s, lt["elementwise"].only_a) == (pytest.approx(2e-6), 0, 1)
    assert lt["data_movement"].b_s == pytest.approx(0.5e-6) and lt["data_movement"].rel is None
    assert lt["mlp"].a_s == pytest.approx(6e-6) and lt["mlp"].b_s == pytest.approx(6.1e-6)
