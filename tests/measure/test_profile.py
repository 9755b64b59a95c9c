"""The profile pipeline end to end on a tiny CPU model, and `opmap profile` on the command line."""

from __future__ import annotations

import json

import pytest
import torch

from opmap.calibrate import to_toml
from opmap.cli import main
from opmap.hardware.match import match_datasheet
from opmap.hardware.spec import spec_from_dict
from opmap.measure import run_profile
from opmap.record import record
from opmap.workloads.zoo import Workload

TINY = '''
import torch
from torch import nn

class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(64, 256)
        self.act = nn.GELU()
        self.norm = nn.LayerNorm(256)
        self.down = nn.Linear(256, 64)

    def forward(self, x):
        return x + self.down(self.norm(self.act(self.up(x))))

def tiny():
    return Tiny(), (torch.randn(32, 64),)
'''

PEAK = 50e9


def _spec_dict():
    v = lambda x: {"value": x, "kind": "measured", "source": "test profile"}  # noqa: E731
    return {"name": "testcpu", "display_name": "test cpu", "vendor": "test", "device_type": "cpu",
            "matrix_peak_flops_per_s": {"fp32": v(PEAK)}, "vector_peak_flops_per_s": {"fp32": v(5e9)},
            "memory_bytes": v(8e9), "memory_bandwidth_bytes_per_s": v(10e9), "launch_overhead_s": v(3e-6)}


@pytest.fixture(scope="module")
def prof(tmp_path_factory):
    from opmap.workloads import load_workload

    d = tmp_path_factory.mktemp("tiny")
    (d / "tiny.py").write_text(TINY)
    w = load_workload(f"{d / 'tiny.py'}:tiny", dtype="fp32", device="cpu")
    return run_profile(w, spec_from_dict(_spec_dict(), "test"), "fp32", "cpu", warmup=1, iters=5, profile_iters=2)


def test_every_kernel_is_measured_and_joined(prof):
    d = prof.to_dict()
    assert d["kind"] == "profile" and d["profiler"]["coverage"] == 1.0
    kernels = [n for n in d["nodes"] if n["bound"] not in ("view", "alloc")]
    assert kernels and all(n["measured"] is not None for n in kernels)
    for n in kernels:
        m = n["measured"]
        assert m["measured_s"] > 0
        assert m["predicted_over_measured"] == pytest.approx(n["predicted_s"] / m["measured_s"])
        assert m["achieved_flops_per_s"] == pytest.approx(n["flops"] / m["measured_s"])
        assert m["compute_busy_s"] + m["memory_stall_s"] + m["other_s"] == pytest.approx(m["measured_s"])
        assert min(m["compute_busy_s"], m["memory_stall_s"], m["other_s"]) >= 0


def test_mfu_is_the_stated_formula(prof):
    d = prof.to_dict()
    # matrix FLOPs by hand: up 2*32*64*256, down 2*32*256*64
    flops = 2 * 32 * 64 * 256 * 2
    assert d["mfu"]["model_matrix_flops"] == flops
    p50 = d["latency"]["p50_s"]
    assert d["mfu"]["calibrated"]["mfu"] == pytest.approx(flops / (p50 * PEAK))
    assert d["mfu"]["datasheet"]["mfu"] is None and "datasheet" in d["mfu"]["datasheet"]["why"]
    assert "p50 latency" in d["mfu"]["formula"]
    # profile.json's mfu block in its order: a peak's figures, its MFU, the reason where there is none
    assert list(d["mfu"]) == ["formula", "model_matrix_flops", "latency_s", "dtype", "calibrated", "datasheet", "hfu"]
    assert list(d["mfu"]["calibrated"]) == ["peak_flops_per_s", "kind", "source", "mfu"]
    assert list(d["mfu"]["datasheet"]) == ["mfu", "why"] and list(d["mfu"]["hfu"]) == ["mfu", "why"]


def test_latency_stall_energy_and_tags(prof):
    d = prof.to_dict()
    lat = d["latency"]
    assert lat["n"] == 5 and lat["min_s"] <= lat["p50_s"] <= lat["p95_s"] <= lat["p99_s"] <= lat["max_s"]
    for _lt, s in d["stall_fraction"]["layer_types"].items():
        assert s["compute_busy"] + s["memory_stall"] + s["other"] == pytest.approx(1.0)
    assert "roofline-estimated" in d["stall_fraction"]["method"]
    assert d["energy"]["joules"] is None or d["energy"]["joules"] > 0
    assert d["energy"]["method"]
    assert d["tags"]["tags_version"] == 1 and d["tags"]["workload"] == "tiny.py:tiny"
    total = sum(s["measured"]["measured_s"] for s in d["layer_types"].values() if s["measured"])
    assert total == pytest.approx(prof.attribution.attributed_s, rel=0.5)


def test_bad_iteration_counts_are_refused():
    from opmap.errors import OpmapError

    w = Workload("x", torch.nn.Linear(2, 2), (torch.ones(1, 2),), 1, None)
    with pytest.raises(OpmapError, match="iterations must be positive"):
        run_profile(w, spec_from_dict(_spec_dict(), "t"), "fp32", "cpu", iters=0)
    with pytest.raises(OpmapError, match="accepted: cpu, cuda"):
        run_profile(w, spec_from_dict(_spec_dict(), "t"), "fp32", "meta")
    with pytest.raises(OpmapError, match="profile runs torch dtypes"):
        run_profile(w, spec_from_dict(_spec_dict(), "t"), "int8", "cpu")


def test_datasheet_matching_of_cuda_names():
    assert match_datasheet("NVIDIA H200") == "h200"
    assert match_datasheet("NVIDIA H100 80GB HBM3") == "h100-sxm"
    assert match_datasheet("NVIDIA H100 PCIe") == "h100-pcie"
    assert match_datasheet("NVIDIA A100-SXM4-80GB") == "a100-sxm-80gb"
    assert match_datasheet("NVIDIA L4") == "l4" and match_datasheet("NVIDIA L40S") == "l40s"
    assert match_datasheet("AMD EPYC") is None


def test_cli_profile_writes_the_set(tmp_path, capsys):
    (tmp_path / "tiny.py").write_text(TINY)
    hw = tmp_path / "hw.toml"
    hw.write_text(to_toml(_spec_dict()))
    out = tmp_path / "out"
    rc = main(["profile", f"{tmp_path / 'tiny.py'}:tiny", "--hardware", str(hw), "--iters", "3",
               "--profile-iters", "1", "--warmup", "1", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "p50" in text and "MFU" in text and "memory-stall" in text
    names = sorted(p.name for p in out.iterdir())
    assert names == ["profile.json", "sheet.csv", "sheet.md", "torch_trace.json", "trace.json"]
    d = json.loads((out / "profile.json").read_text())
    assert d["schema_version"] == 1 and d["latency"]["n"] == 3
    trace = json.loads((out / "trace.json").read_text())
    tids = {e.get("tid") for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {1, 2} <= tids and trace["otherData"]["opmap_tags"]["run_id"] == d["tags"]["run_id"]
    raw = json.loads((out / "torch_trace.json").read_text())
    assert raw["otherData"]["opmap_tags"]["workload"] == "tiny.py:tiny"
    header = (out / "sheet.csv").read_text().splitlines()[0]
    assert "measured_s" in header and "predicted_over_measured" in header


@pytest.mark.parametrize("argv, needle", [
    (["profile", "gpt2", "--device", "meta"], "accepted: cpu, cuda"),
    (["profile", "no-such-model", "--hardware", "h100-sxm"], "unknown model"),
    (["profile", "gpt2", "--hardware", "nope"], "unknown hardware"),
])
def test_cli_profile_bad_input(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_training_step_profile(tmp_path):
    from opmap.workloads import load_workload

    (tmp_path / "tiny.py").write_text(TINY)
    w = load_workload(f"{tmp_path / 'tiny.py'}:tiny", dtype="fp32", device="cpu")
    p = run_profile(w, spec_from_dict(_spec_dict(), "test"), "fp32", "cpu", warmup=1, iters=3, profile_iters=2,
                    train=True)
    d = p.to_dict()
    assert d["latency"]["mode"].startswith("training step") and d["tags"]["mode"] == "train"
    assert d["assumptions"]["mode"] == "training step"
    back = [n for n in d["nodes"] if n["args"].get("phase") == "backward" and n["bound"] not in ("view", "alloc")]
    assert back and sum(1 for n in back if n["measured"]) >= 0.9 * len(back)
    # forward + backward GEMMs: the forward's two, then grad input and grad weight of each (the first
    # layer's input needs no gradient): 2 + 2 + 1 GEMMs of 2*32*64*256
    assert d["mfu"]["model_matrix_flops"] == pytest.approx(5 * 2 * 32 * 64 * 256)


def test_calibration_check_compares_with_the_profile(prof):
    from opmap.calibrate import calibration_check

    # the test profile has no calibration: nothing to compare
    assert prof.to_dict()["calibration_check"] is None
    d = {**_spec_dict(), "calibration": {"device": "cpu", "matmul": [
        {"m": 256, "n": 256, "k": 256, "dtype": "fp32", "layout": "nt", "flops_per_s": 1e18}]}}
    chk = calibration_check(spec_from_dict(d, "t"), torch.device("cpu"))
    # a calibrated rate no CPU reaches (the plausibility ceiling, hardware.curves.MAX_FLOPS_PER_S; a CPU's fp32
    # GEMM is under 1e13 FLOP/s): the check reads far below 1 and says so
    assert chk.ratio < 1e-4 and chk.within_tolerance is False and "256x256x256" in chk.what
    # profile.json's calibration_check: ratio = now / calibrated, the tolerance beside it
    d = record(chk)
    assert d["ratio"] == d["now_flops_per_s"] / 1e18 and d["within_tolerance"] is False and d["tolerance"] == 0.10


def test_an_impossible_mfu_is_warned_and_is_the_formula():
    """A peak far under what the run reaches (a hardware profile that is not this device's): MFU = matrix FLOPs /
    (p50 x peak) is past 1 and a warning says it cannot be, with what it suggests; so does a predicted / measured
    ratio past 3x. The figure printed is the formula's, from the run's own FLOPs, time and peak."""
    from opmap.measure.profile import RATIO_LIMIT
    from opmap.workloads import load_workload

    slow = _spec_dict()
    slow["matrix_peak_flops_per_s"]["fp32"]["value"] = 1e6  # 1 MFLOP/s: any CPU beats it
    with open_tiny() as target:
        w = load_workload(target, dtype="fp32", device="cpu")
        p = run_profile(w, spec_from_dict(slow, "slow"), "fp32", "cpu", warmup=1, iters=3, profile_iters=1)
    d = p.to_dict()
    m = d["mfu"]["calibrated"]
    flops = 2 * 2 * 32 * 64 * 256  # the two GEMMs of Tiny: 2 x M x N x K each
    assert d["mfu"]["model_matrix_flops"] == pytest.approx(flops)
    assert m["mfu"] == pytest.approx(flops / (d["latency"]["p50_s"] * 1e6)) and m["mfu"] > 1
    ratio = d["accuracy"]["predicted_over_measured"]
    assert any(x.startswith(f"MFU {m['mfu']:.0%} of the calibrated peak") and "impossible" in x for x in d["warnings"])
    assert any("beyond 3x either way" in x for x in d["warnings"]) == (not 1 / RATIO_LIMIT <= ratio <= RATIO_LIMIT)


def open_tiny():
    import contextlib
    import tempfile
    from pathlib import Path

    @contextlib.contextmanager
    def made():
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "tiny.py").write_text(TINY)
            yield f"{Path(d) / 'tiny.py'}:tiny"

    return made()


FLAGS = '''
import torch

class Flags(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.seen = set()

    def forward(self, x):
        self.seen.add((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
        return self.lin(x)

def flags():
    return Flags(), (torch.randn(4, 8),)
'''


@pytest.mark.parametrize("dtype, tf32", [("fp32", False), ("tf32", True)])
def test_the_run_uses_tf32_exactly_when_the_dtype_priced_is_tf32(tmp_path, dtype, tf32):
    """torch's defaults: matmuls in fp32, cuDNN convolutions in TF32 (torch docs, "TensorFloat-32 (TF32) on Ampere
    (and later) devices"). The measured run sets both to the dtype priced while it runs, then restores them."""
    from opmap.workloads import load_workload

    (tmp_path / "flags.py").write_text(FLAGS)
    spec = _spec_dict()
    spec["matrix_peak_flops_per_s"]["tf32"] = spec["matrix_peak_flops_per_s"]["fp32"]
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    w = load_workload(f"{tmp_path / 'flags.py'}:flags", dtype=dtype, device="cpu")
    run_profile(w, spec_from_dict(spec, "test"), dtype, "cpu", warmup=0, iters=1, profile_iters=1)
    assert w.module.seen == {(tf32, tf32)}  # the capture, warm-up, timed and profiled iterations alike
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


# Tiny's parameters: up 64 x 256 + 256, LayerNorm 2 x 256, down 256 x 64 + 64
TINY_PARAMS = 64 * 256 + 256 + 2 * 256 + 256 * 64 + 64
ADAMW_UPDATE_OPS = {"lerp_", "addcmul_", "addcdiv_"}  # torch.optim.AdamW's per-parameter update


@pytest.mark.parametrize("optimizer, state_per_param, name", [(None, 8, "AdamW"), ("sgd", 0, "SGD")])
def test_a_training_profile_measures_the_optimizer_it_predicts(tmp_path, optimizer, state_per_param, name):
    """`profile --train` predicted an AdamW step (figures and memory) and measured an SGD loop. The measured step
    runs the update the prediction prices: AdamW by default, two fp32 states (the moments m and v, Loshchilov &
    Hutter 2019, Algorithm 2; torch.optim.AdamW's exp_avg and exp_avg_sq) per fp32 parameter, 8 B, held in the run
    as predicted; every optimizer kernel priced is timed in the run; the optimizer is named."""
    from opmap.workloads import load_workload

    (tmp_path / "tiny.py").write_text(TINY)
    w = load_workload(f"{tmp_path / 'tiny.py'}:tiny", dtype="fp32", device="cpu")
    p = run_profile(w, spec_from_dict(_spec_dict(), "test"), "fp32", "cpu", warmup=1, iters=2, profile_iters=1,
                    train=True, **({"optimizer": optimizer} if optimizer else {}))
    d = p.to_dict()
    assert d["optimizer"]["predicted_state_bytes"] == d["optimizer"]["measured_state_bytes"] \
        == state_per_param * TINY_PARAMS
    assert d["memory"]["per_device"]["optimizer_bytes"] == state_per_param * TINY_PARAMS
    assert f"{name} update" in d["latency"]["mode"] and d["phase"]["optimizer"] == (optimizer or "adamw")
    opt = [n for n in d["nodes"] if n["args"].get("phase") == "optimizer" and n["bound"] not in ("view", "alloc")]
    assert opt and all(n["measured"] is not None for n in opt)
    ops = {n["op"].split(".")[1] for n in opt}  # aten.lerp_.Scalar -> lerp_
    assert (ADAMW_UPDATE_OPS <= ops) == (name == "AdamW"), ops
