"""Drift: is the device still in the state it was calibrated in? Re-time one calibrated GEMM now."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from opmap.hardware.spec import HardwareSpec
from opmap.timing import time_op

DRIFT_TOLERANCE = 0.10  # beyond this, the device is not in the state it was calibrated in: say so


@dataclass(frozen=True)
class DriftCheck:
    """One calibrated GEMM (``what``) re-timed now: its calibrated and its present rate, FLOP/s, and their ratio
    (now over calibrated), within ``tolerance`` of 1 or not. Its record is profile.json's ``calibration_check``."""

    RECORD: ClassVar[tuple[str, ...]] = ("what", "calibrated_flops_per_s", "now_flops_per_s", "ratio",
                                         "within_tolerance", "tolerance")
    what: str
    calibrated_flops_per_s: float
    now_flops_per_s: float
    tolerance: float = DRIFT_TOLERANCE

    @property
    def ratio(self) -> float:
        return self.now_flops_per_s / self.calibrated_flops_per_s

    @property
    def within_tolerance(self) -> bool:
        return abs(self.ratio - 1.0) <= self.tolerance


def calibration_check(hw: HardwareSpec, dev: torch.device) -> DriftCheck | None:
    """Re-time one calibrated GEMM (the one nearest 1024^3 in log2 m, n, k, in nn.Linear's layout) now, beside
    the profile's figure: a loaded or throttled device shows as a ratio away from 1, which explains a
    prediction that drifted with it. None for a profile without a calibration, or for a calibration of
    another device."""
    cal = hw.calibration or {}
    if not str(cal.get("device", "")).startswith(dev.type):
        return None
    rows = [r for r in cal.get("matmul", []) if r.get("layout", "nt") == "nt" and r["dtype"] == "fp32"]
    if not rows:
        return None
    r = min(rows, key=lambda r: sum(abs(math.log2(r[x]) - 10) for x in ("m", "n", "k")))
    a = torch.randn(r["m"], r["k"], device=dev, dtype=torch.float32)
    w = torch.randn(r["n"], r["k"], device=dev, dtype=torch.float32)
    with torch.no_grad():
        s = time_op(lambda: torch.mm(a, w.t()), dev, repeats=5, min_time_s=0.01)
    return DriftCheck(f"matmul fp32 {r['m']}x{r['n']}x{r['k']} (x @ W.T)", r["flops_per_s"],
                      2.0 * r["m"] * r["n"] * r["k"] / s.median_s)
