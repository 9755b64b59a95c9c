"""benchmarks/gpu_measure.py's attention-dropout rows, run on the CPU at a tiny shape (the GPU run sizes them for an
H100): every backend gives a row, timed at both dropout rates or with the error it raised, and the FLOPs beside each
row are the causal forward + backward count (3.5 x 2 b h s^2 d: the forward's two products over the causal half,
2.5x that backward)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_measure  # noqa: E402


def test_dropout_rows_time_each_backend_at_both_rates_on_cpu():
    rows = gpu_measure.dropout_rows(torch.device("cpu"), shapes=[(1, 2, 64, 16)], backends=("MATH", "FLASH_ATTENTION"),
                                    dtype=torch.float32)
    assert [r["backend"] for r in rows] == ["MATH", "FLASH_ATTENTION"]
    math_row = rows[0]
    assert "error" not in math_row  # the math path runs dropout anywhere
    assert math_row["p0_s"] > 0 and math_row["p01_s"] > 0
    assert math.isclose(math_row["dropout_ratio"], math_row["p01_s"] / math_row["p0_s"])
    assert math_row["causal_flops_fwd_bwd"] == 3.5 * 2 * 1 * 2 * 64 * 64 * 16
    assert all(("error" in r) != ("p0_s" in r) for r in rows)


def test_dropout_shapes_are_the_runs_in_question():
    # Megatron-Core weak scaling 1.7B on one GPU: 16 heads of 128 at sequence 4096; NeMo GPT3-5B: 32 of 128 at 2048,
    # microbatch 4
    assert (2, 16, 4096, 128) in gpu_measure.DROPOUT_SHAPES and (4, 32, 2048, 128) in gpu_measure.DROPOUT_SHAPES
    assert "MATH" in gpu_measure.DROPOUT_BACKENDS and "CUDNN_ATTENTION" in gpu_measure.DROPOUT_BACKENDS
