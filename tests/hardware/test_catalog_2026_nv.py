"""Catalog entries of issue 37 (NVIDIA 2026 platforms): values against the published figures written beside them."""

from __future__ import annotations

import pytest

from opmap.hardware import catalog


@pytest.fixture(scope="module")
def specs():
    return catalog()


def test_b300_per_gpu_is_the_hgx_table_over_eight(specs):
    s = specs["b300"]
    # NVIDIA HGX B300: FP16/BF16 36 PFLOPS, FP8/FP6 72 PFLOPS, TF32 18 PFLOPS with sparsity, 8 GPUs; dense = half
    assert s.sparse_matrix_peak_flops_per_s["bf16"].value == pytest.approx(36e15 / 8)
    assert s.matrix_peak_flops_per_s["bf16"].value == pytest.approx(36e15 / 8 / 2)
    assert s.matrix_peak_flops_per_s["fp8"].value == pytest.approx(72e15 / 8 / 2)
    assert s.matrix_peak_flops_per_s["tf32"].value == pytest.approx(18e15 / 8 / 2)
    # FP64 10 TFLOPS per 8 GPUs: Blackwell Ultra cuts FP64; INT8 left out (vestigial, published figures disagree)
    assert s.matrix_peak_flops_per_s["fp64"].value == pytest.approx(10e12 / 8)
    assert "int8" not in s.matrix_peak_flops_per_s
    # Inside NVIDIA Blackwell Ultra: 8 TB/s; 270 GiB enabled of 288 GiB HBM3e
    assert s.memory_bandwidth_bytes_per_s == 8e12 and s.memory_bytes == 270 * 2**30
    # HGX: 8 GPUs on NVLink 5 at 1.8 TB/s both directions; ConnectX-8 800 Gb/s per GPU
    assert s.devices_per_node == 8 and s.scale_up_topology == "switch"
    assert s.scale_out_bandwidth_bytes_per_s == pytest.approx(800e9 / 8)
    assert set(s.datasheet_only) == {"achievable_matrix_flops_per_s", "achievable_memory_bandwidth_bytes_per_s"}
    assert "13.5 PFLOPS dense NVFP4" in s.notes  # fp4 recorded in the notes until the format keys exist
