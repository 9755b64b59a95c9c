"""Fixtures for the report tests: a small profile of a tiny CPU model, measured once per module."""

from __future__ import annotations

import pytest

TINY = '''
import torch
from torch import nn

def tiny():
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)), (torch.randn(32, 64),)
'''


def spec_dict() -> dict:
    v = lambda x: {"value": x, "kind": "measured", "source": "test profile"}  # noqa: E731
    return {"name": "testcpu", "display_name": "test cpu", "vendor": "test", "device_type": "cpu",
            "matrix_peak_flops_per_s": {"fp32": v(50e9)}, "vector_peak_flops_per_s": {"fp32": v(5e9)},
            "memory_bytes": v(8e9), "memory_bandwidth_bytes_per_s": v(10e9), "launch_overhead_s": v(3e-6)}


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory):
    from opmap.hardware.spec import spec_from_dict
    from opmap.measure import run_profile
    from opmap.workloads import load_workload

    d = tmp_path_factory.mktemp("tiny")
    (d / "tiny.py").write_text(TINY)
    w = load_workload(f"{d / 'tiny.py'}:tiny", dtype="fp32", device="cpu")
    return run_profile(w, spec_from_dict(spec_dict(), "test"), "fp32", "cpu", warmup=1, iters=3, profile_iters=1)
