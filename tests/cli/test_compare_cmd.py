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


def test_real_profile_runs_regression_only_where_injected(tmp_path, cli, monkeypatch):
    # three real opmap profile runs of one model (a 2 ms sleep in its forward makes the latency steady); the
    # third doubles the sleep: compare finds that regression and none between the first two
    import json

    f = tmp_path / "sleepy.py"
    f.write_text(SLEEPY)
    store = tmp_path / "runs.duckdb"
    args = ("profile", f"{f}:sleepy", "--hardware", "h100-sxm", "--iters", "15", "--profile-iters", "2",
            "--warmup", "2", "--rows", "1", "--store", store)
    for slow in ("0", "0", "1"):
        monkeypatch.setenv("SLOWDOWN", slow)
        rc, _, err = cli(*args)
        assert rc == 0, err
    rc, out, _ = cli("runs", "list", "--json", "--store", store)
    a, b, c = (r["id"] for r in json.loads(out))
    rc, out, _ = cli("compare", a, b, "--min-effect", "0.2", "--store", store)
    assert rc == 0 and "no significant change" in out, out
    rc, out, _ = cli("compare", a, c, "--store", store, "--json")
    r = json.loads(out)
    assert rc == 1 and r["verdict"] == "regression" and r["effect"] > 0.5 and r["test"]["n_a"] == 15


def test_production_shape_check_is_printed_recorded_and_read_by_the_memo(tmp_path, cli, refused):
    store = tmp_path / "runs.duckdb"
    tags = {"hardware": "h100-sxm", "precision": "bf16", "phase": "prefill"}

    def body(intensity_flops, t):  # one GEMM of 1e6 bytes at the given FLOPs (intensity = FLOPs / 1e6)
        return {"nodes": [{"id": 0, "op": "aten.mm.default", "module": "fc", "layer_type": "mlp",
                           "flops": intensity_flops}],
                "kernels": [{"anchor": 0, "nodes": [0], "predicted_s": t, "traffic_bytes": 1e6, "bound": "compute"}]}

    s = record("analyze", body(1e9, 1e-4), {**tags, "workload": "gemm.py:g"}, store)  # 1000 FLOP/B
    p = record("analyze", body(3e9, 1e-4), {**tags, "workload": "m"}, store)  # 3000 FLOP/B: beyond x2
    rc, out, _ = cli("compare", s, "--production", p, "--store", store)
    assert rc == 0 and "does not carry over" in out and "recorded as run" in out
    rc, out, _ = cli("memo", s, "--store", store)
    assert rc == 0 and "flag: shape check" in out and "gemm does not carry over" in out
    refused("compare", s, "--store", store, needle="one run with --production")
