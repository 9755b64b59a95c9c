"""Issue 37's cloud accelerators (tpu-v6e, trn2, tpu-v7): the catalog's values against the published figures
written beside each check."""

from __future__ import annotations

import pytest

from opmap.hardware import catalog


@pytest.fixture(scope="module")
def specs():
    return catalog()


def test_tpu_v6e_matches_the_cloud_tpu_page(specs):
    s = specs["tpu-v6e"]
    # Cloud TPU v6e page: 918 TFLOPs bf16, 1836 TOPs int8 (2x), HBM 32 GB (binary), 1638 GBps
    assert s.matrix_peak_flops_per_s["bf16"].value == 918e12
    assert s.matrix_peak_flops_per_s["int8"].value == 2 * s.matrix_peak_flops_per_s["bf16"].value
    # TPU7x page's comparison table: v6e FP8 918 TFLOPs, the bf16 rate
    assert s.matrix_peak_flops_per_s["fp8"].value == s.matrix_peak_flops_per_s["bf16"].value
    assert s.memory_bytes == 32 * 2**30
    assert s.memory_bandwidth_bytes_per_s == 1638e9
    assert all(v.kind == "datasheet_dense" for v in s.matrix_peak_flops_per_s.values())
    assert not s.sparse_matrix_peak_flops_per_s and s.sparsity_factor is None  # no structured sparsity
    # 256-chip pod on a 2D torus; ICI 800 GBps bidirectional per chip = 400 GB/s a direction
    ici = s.interconnect.tiers[0]
    assert ici.devices == 256 and ici.topology_name == "torus"
    assert ici.bytes_per_s == pytest.approx(400e9)
    # DCN: 4 x 200 Gbps NICs per 8-chip host = 100 Gb/s per chip
    assert s.interconnect.tiers[-1].bytes_per_s == pytest.approx(4 * 200e9 / 8 / 8)
    # nothing published: no TDP, no idle draw, no measured rate (datasheet only, and said so)
    assert s.tdp_w is None and s.idle_power_w is None
    assert set(s.datasheet_only) == {"achievable_matrix_flops_per_s", "achievable_memory_bandwidth_bytes_per_s"}
    assert "datasheet only" in s.notes
