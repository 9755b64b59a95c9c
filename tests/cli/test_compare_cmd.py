"""opmap compare: exit 0 without a regression, 1 with one, 2 on bad input."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("duckdb")

from opmap.store import record  # noqa: E402
from opmap.tags import Tags  # noqa: E402


def _run(path, scale, seed, command):
    rng = random.Random(seed)
    lat = [rng.gauss(10e-3, 0.2e-3) * scale for _ in range(20)]
    body = {"nodes": [{"id": 0, "op": "aten.mm.default", "module": "fc", "layer_type": "mlp"}],
            "kernels": [{"anchor": 0, "nodes": [0], "predicted_s": 1e-3, "measured_s": 1e-3 * scale}],
            "samples": {"latency_s": lat}}
    tags = Tags("analysis", workload="m", hardware="local", precision="fp32", phase="prefill", graph_hash="g",
                command=command)
    return record("profile", body, tags, path)


def test_exit_codes(tmp_path, cli, refused):
    # three runs a side (each side its own command: the repeats measure the noise between runs)
    store = tmp_path / "runs.duckdb"
    a, b, c = ([_run(store, scale, 10 * i + j, f"opmap profile {name}/m.py:m") for j in range(3)]
               for i, (name, scale) in enumerate((("main", 1.0), ("copy", 1.0), ("branch", 1.25))))
    rc, out, _ = cli("compare", a[0], b[0], "--store", store)
    assert rc == 0 and "no significant change" in out
    rc, out, _ = cli("compare", a[0], c[0], "--store", store)
    assert rc == 1 and "regression" in out
    refused("compare", a[0], "nope", "--store", store, needle="no run 'nope'")


SLEEPY = ("import os, time, torch\n"
          "class M(torch.nn.Module):\n"
          "    def __init__(self):\n"
          "        super().__init__()\n"
          "        self.fc = torch.nn.Linear(16, 16)\n"
          "    def forward(self, x):\n"
          "        if x.device.type == 'cpu':  # the real run, not the capture on meta\n"
          "            time.sleep(0.002 * (1 + float(os.environ.get('SLOWDOWN', '0'))))\n"
          "        return self.fc(x)\n"
          "def sleepy():\n"
          "    return M(), (torch.randn(2, 16),)\n")


def test_lone_real_profile_runs_are_inconclusive_with_their_change_shown(tmp_path, cli, monkeypatch):
    # three real opmap profile runs of one model (a 2 ms sleep in its forward makes the latency steady); the
    # third quadruples the sleep (8 ms: a change a loaded host's scheduling delays,
    # a few ms, cannot hide). Too few runs to measure the noise between runs (issue 35: two lone profiles of the
    # same MLP were once called a regression): inconclusive, exit 0, the change shown and the --rerun that
    # measures the noise named (tests/cli/test_compare_cmd.py::test_rerun_... catches the stall once measured)
    import json

    f = tmp_path / "sleepy.py"
    f.write_text(SLEEPY)
    store = tmp_path / "runs.duckdb"
    args = ("profile", f"{f}:sleepy", "--hardware", "h100-sxm", "--iters", "15", "--profile-iters", "2",
            "--warmup", "2", "--rows", "1", "--store", store)
    for slow in ("0", "0", "3"):
        monkeypatch.setenv("SLOWDOWN", slow)
        rc, _, err = cli(*args)
        assert rc == 0, err
    rc, out, _ = cli("runs", "list", "--json", "--store", store)
    a, b, c = (r["id"] for r in json.loads(out))
    rc, out, _ = cli("compare", a, b, "--min-effect", "0.2", "--store", store)
    line = " ".join(out.split())
    # in-process runs record no `opmap profile` command to re-run (the subprocess test below has them): the hint
    # is to record repeats
    assert rc == 0 and "inconclusive: noise not measured" in line and "profile each side 3 or more times" in line
    rc, out, _ = cli("compare", a, c, "--store", store, "--json")
    r = json.loads(out)
    # n_a: the 15 samples less the warm-up outliers the rule drops (at most half)
    assert rc == 0 and r["verdict"] == "inconclusive" and r["effect"] > 0.5 and 8 <= r["test"]["n_a"] <= 15


def test_production_shape_check_is_printed_recorded_and_read_by_the_memo(tmp_path, cli, refused):
    store = tmp_path / "runs.duckdb"
    tags = {"hardware": "h100-sxm", "precision": "bf16", "phase": "prefill"}

    def body(intensity_flops, t):  # one GEMM of 1e6 bytes at the given FLOPs (intensity = FLOPs / 1e6)
        return {"nodes": [{"id": 0, "op": "aten.mm.default", "module": "fc", "layer_type": "mlp",
                           "flops": intensity_flops}],
                "kernels": [{"anchor": 0, "nodes": [0], "predicted_s": t, "traffic_bytes": 1e6, "bound": "compute"}]}

    s = record("analyze", body(1e9, 1e-4), Tags("analysis", **tags, workload="gemm.py:g"), store)  # 1000 FLOP/B
    p = record("analyze", body(3e9, 1e-4), Tags("analysis", **tags, workload="m"), store)  # 3000 FLOP/B: beyond x2
    rc, out, _ = cli("compare", s, "--production", p, "--store", store)
    assert rc == 0 and "does not carry over" in out and "recorded as run" in out
    rc, out, _ = cli("memo", s, "--store", store)
    assert rc == 0 and "flag: shape check" in out and "gemm does not carry over" in out
    refused("compare", s, "--store", store, needle="one run with --production")


def _steady(path, level, command, n=20):
    """A stored profile run of steady steps at ``level`` seconds (each 0.1% above the last), on one host."""
    body = {"nodes": [{"id": 0, "op": "aten.mm.default", "module": "fc", "layer_type": "mlp"}],
            "kernels": [{"anchor": 0, "nodes": [0], "predicted_s": 1e-3, "measured_s": level}],
            "samples": {"latency_s": [level * (1 + 0.001 * i) for i in range(n)]},
            "tags": {"device_name": "AMD EPYC", "device": "cpu", "threads": 2, "host": "ci-1"}}
    tags = Tags("analysis", workload="m", hardware="local", precision="fp32", phase="prefill", graph_hash="g",
                command=command)
    return record("profile", body, tags, path)


def test_a_change_within_the_hosts_noise_is_not_significant(tmp_path, cli):
    # three runs of the baseline at 200, 210 and 190 ms measure the noise between runs; B at 216 ms is +8.2% on
    # their geometric mean and significant within the runs (p < 0.05), above --min-effect 5%, but not above the
    # floor: exit 0, and the line says why. Floor by hand: s = stdev of the three logs (2 dof; B alone adds
    # none), t(0.995, 2) = 9.925, floor = exp(9.925 x s x sqrt(1/3 + 1/1)) - 1
    import json
    import math
    import statistics

    store = tmp_path / "runs.duckdb"
    a = [_steady(store, x, "opmap profile main/m.py:m") for x in (0.200, 0.210, 0.190)]
    b = _steady(store, 0.216, "opmap profile branch/m.py:m")
    s = statistics.stdev(math.log(x) for x in (0.200, 0.210, 0.190))
    floor = math.expm1(9.925 * s * math.sqrt(1 / 3 + 1))
    rc, out, _ = cli("compare", a[0], b, "--store", store)
    assert rc == 0 and f"not significant at this host's noise ({floor:.1%})" in out, out
    assert "AMD EPYC (cpu, 2 threads) on ci-1" in out and "warm-up rule" in out
    rc, out, _ = cli("compare", a[0], b, "--store", store, "--json")
    r = json.loads(out)
    geo = math.exp(statistics.fmean(math.log(x) for x in (0.200, 0.210, 0.190)))
    assert r["effect"] == pytest.approx(0.216 / geo - 1) and r["test"]["p"] < 0.05
    assert r["noise"]["noise"] == pytest.approx(floor) and r["noise"]["runs_a"] == a


def test_one_run_a_side_is_inconclusive_not_a_regression(tmp_path, cli):
    # issue 35: two single profiles of the same MLP were called a regression (exit 1) in one of two tries on a
    # quiet host: one run a side measures no noise between runs, and the 15% floor assumed for it sat under this
    # host's (up to ~29% between processes). One run a side 20% apart: inconclusive, exit 0 (the contract: 1 only
    # for a regression), and the line says the noise is not measured and how to measure it
    import json

    store = tmp_path / "runs.duckdb"
    a = _steady(store, 0.200, "opmap profile main/m.py:m")
    b = _steady(store, 0.240, "opmap profile branch/m.py:m")
    rc, out, _ = cli("compare", a, b, "--store", store)
    assert rc == 0 and "inconclusive: noise not measured: +20.0%" in out, out
    assert f"opmap compare {a} {b} --rerun 4" in " ".join(out.split())
    rc, out, _ = cli("compare", a, b, "--store", store, "--json")
    r = json.loads(out)
    assert r["verdict"] == "inconclusive" and r["effect"] == pytest.approx(0.2) and r["test"]["p"] < 1e-6
    assert not r["noise"]["measured"] and r["noise"]["noise"] is None and (r["noise"]["n_a"], r["noise"]["n_b"]) == (
        1, 1)


def test_three_runs_a_side_measure_the_floor_and_a_20pct_shift_is_a_regression(tmp_path, cli):
    # three runs a side, 2% apart within each side (levels 0.98, 1.00, 1.02), B 20% above A: the floor is
    # measured. By hand: s = the pooled sd of the log levels (3 + 3 runs, 4 dof; 2.0%), t(0.995, 4) = 4.604
    # (NIST 1.3.6.7.2), floor = exp(4.604 x s x sqrt(1/3 + 1/3)) - 1 = 7.8%; the shift, exp(mean log B - mean
    # log A) - 1 = 20%, exceeds it: a regression, exit 1
    import json
    import math
    import statistics

    store = tmp_path / "runs.duckdb"
    levels = (0.98, 1.00, 1.02)
    a = [_steady(store, 0.200 * x, "opmap profile main/m.py:m") for x in levels]
    b = [_steady(store, 0.240 * x, "opmap profile branch/m.py:m") for x in levels]
    logs = [math.log(x) for x in levels]
    s = math.sqrt(2 * sum((x - statistics.fmean(logs)) ** 2 for x in logs) / 4)
    floor = math.expm1(4.604 * s * math.sqrt(2 / 3))
    rc, out, _ = cli("compare", a[0], b[0], "--store", store, "--json")
    r = json.loads(out)
    assert rc == 1 and r["verdict"] == "regression" and r["effect"] == pytest.approx(0.2)
    assert r["noise"]["measured"] and r["noise"]["dof"] == 4 and r["noise"]["noise"] == pytest.approx(floor)
    assert sorted(r["noise"]["runs_a"]) == sorted(a) and sorted(r["noise"]["runs_b"]) == sorted(b)
    rc, out, _ = cli("compare", a[0], b[0], "--store", store)
    assert rc == 1 and "regression: +20.0% (A's 3 runs against B's 3" in out


MODEL = ("import time, torch\n"
         "class M(torch.nn.Module):\n"
         "    def __init__(self):\n"
         "        super().__init__()\n"
         "        self.fc = torch.nn.Linear(16, 16)\n"
         "    def forward(self, x):\n"
         "        if x.device.type == 'cpu':  # the real run, not the capture on meta\n"
         "            time.sleep({step_s})\n"
         "        return self.fc(x)\n"
         "def m():\n"
         "    return M(), (torch.randn(2, 16),)\n")


def test_rerun_measures_the_noise_and_catches_a_stall_in_real_runs(tmp_path, cli, monkeypatch):
    # the --rerun machinery with real processes, scaled down for CI time: a 20 ms step (a sleep) in main/, the same
    # code in copy/, and a 10 ms stall added in branch/ (+50%). Each is profiled once by `opmap profile` in its own
    # process; compare --rerun 1 runs A's and B's recorded commands once more each, interleaved: 2 runs a side, the
    # floor measured (2 dof, t = 9.92: a loaded 2-core host's 1-2% spread between runs makes a 10-20% floor, so
    # the issue's +20% is checked with more runs in tests/store/test_compare.py, and here the stall is +50%)
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[2] / "src")
    monkeypatch.setenv("PYTHONPATH", src)  # the re-runs are processes of the tree under test
    store = tmp_path / "runs.duckdb"
    ids = {}
    for name, step in (("main", 0.020), ("copy", 0.020), ("branch", 0.030)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "m.py").write_text(MODEL.format(step_s=step))
        p = subprocess.run([sys.executable, "-m", "opmap.cli", "profile", f"{tmp_path / name / 'm.py'}:m",
                            "--hardware", "h100-sxm", "--iters", "8", "--profile-iters", "1", "--warmup", "1",
                            "--rows", "1", "--store", str(store), "--out", str(tmp_path / f"{name}-out")],
                           capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}, timeout=300)
        assert p.returncode == 0, p.stderr
        ids[name] = p.stdout.split("recorded as run ")[1].split()[0]
    rc, out, err = cli("compare", ids["main"], ids["branch"], "--rerun", "1", "--store", store, "--json")
    r = json.loads(out)
    assert rc == 1 and r["verdict"] == "regression", (out, err)
    assert r["noise"]["measured"] and r["noise"]["dof"] == 2 and len(r["noise"]["runs_b"]) == 2
    assert 0.3 < r["effect"] < 0.8  # 10 ms on ~20 ms
    rc, out, _ = cli("compare", ids["main"], ids["copy"], "--rerun", "1", "--store", store, "--json")
    r = json.loads(out)
    # main's side now holds its earlier re-run too (the same command, code and host): 3 runs against 2
    assert rc == 0 and r["verdict"] == "no significant change" and len(r["noise"]["runs_a"]) == 3
    assert abs(r["effect"]) < 0.15
    # the output folders of the first runs compare as the run ids do, but a folder has no repeats: inconclusive,
    # and the way to measure the noise named (no --rerun of a folder)
    rc, out, _ = cli("compare", tmp_path / "main-out", tmp_path / "branch-out", "--store", store)
    line = " ".join(out.split())
    assert rc == 0 and "inconclusive: noise not measured" in line and "profile each side 3 or more times" in line
    rc, out, _ = cli("compare", ids["main"], ids["branch"], "--store", store)  # stored runs with their commands
    line = " ".join(out.split())
    assert rc == 1 and "regression" in line  # the re-runs above are their repeats now
    rc, out, _ = cli("memo", tmp_path / "main-out")
    from opmap.report.text import md

    assert rc == 0 and f"the profile output in {md(tmp_path / 'main-out')}" in out  # as Markdown text


def test_names_from_the_runs_are_printed_as_text(tmp_path, cli):
    """A layer type holding unbalanced markup, an OSC 8 link and a clear screen, a module name holding markup and
    a clear screen (a user's model names both): before, rich read the layer type as markup and raised (a
    traceback); now both print literally, with no escape byte."""
    import json

    lt = "ml[/b]p\x1b]8;;http://evil\x1b\\L\x1b[2J"
    for d, t in (("a", 1e-3), ("b", 2e-3)):
        (tmp_path / d).mkdir()
        (tmp_path / d / "analysis.json").write_text(json.dumps({
            "assumptions": {"workload": "w", "hardware": "h100-sxm", "dtype": "bf16", "batch": 1, "seq": 8},
            "kernels": [{"anchor": 0, "nodes": [0], "predicted_s": t, "bound": "memory", "layer_type": lt}],
            "nodes": [{"id": 0, "op": "aten.mm.default", "module": "fc[red]\x1b[2Jz", "layer_type": lt,
                       "flops": 2.0}],
            "layer_types": {lt: {"predicted_s": t, "share_of_time": 1.0, "bound": "memory"}}}))
    rc, out, err = cli("compare", tmp_path / "a", tmp_path / "b", "--no-store")
    assert rc in (0, 1) and "Traceback" not in out + err, err
    assert "\x1b" not in out + err and "ml[/b]pL" in out and "aten.mm.default@fc[red]z" in out


@pytest.mark.parametrize("model", ["gpt2", "config.json"])
def test_a_fused_run_is_judged_on_its_total_with_every_kernel(tmp_path, cli, model):
    # issue 35: `analyze gpt2` against `analyze gpt2 --fusion compiler` said "no change: +0.1%" with 37 kernels
    # unmatched, while the runs' totals were 1.21 and 0.976 ms. Each run's total is what analyze recorded for it
    # (kernel_time_s: every kernel it priced); the verdict is their change, the unmatched kernels counted
    import json

    if model == "config.json":  # a Hugging Face config as a user brings it
        pytest.importorskip("transformers")
        model = tmp_path / "config.json"
        model.write_text(json.dumps({"model_type": "llama", "vocab_size": 128, "hidden_size": 64,
                                     "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                                     "num_key_value_heads": 2}))
    store = tmp_path / "runs.duckdb"
    ids = []
    for fusion in ("eager", "compiler"):
        rc, out, err = cli("analyze", model, "--seq", "32", "--fusion", fusion, "--rows", "1", "--store", store)
        assert rc == 0, err
        ids.append(out.split("recorded as run ")[1].split()[0])
    totals = []
    for i in ids:
        rc, out, _ = cli("runs", "show", i, "--json", "--store", store)
        totals.append(json.loads(out)["payload"]["totals"]["kernel_time_s"])
    rc, out, _ = cli("compare", *ids, "--json", "--store", store)
    r = json.loads(out)
    assert rc == 0 and r["effect"] == pytest.approx(totals[1] / totals[0] - 1) and r["effect"] < -0.05
    assert r["totals"]["a_s"] == pytest.approx(totals[0]) and r["totals"]["b_s"] == pytest.approx(totals[1])
    assert r["verdict"] == "predicted change" and r["totals"]["only_a"]["kernels"] > 0
    rc, out, _ = cli("compare", *ids, "--store", store)
    only = r["totals"]["only_a"]["kernels"]
    assert f"{only} kernels only in A" in out and f"({totals[1] / totals[0] - 1:+.1%}" in out, out
