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


def test_trn2_matches_the_neuron_architecture_pages(specs):
    s = specs["trn2"]
    m = s.matrix_peak_flops_per_s
    # trainium2.rst: 1,299 FP8, 667 BF16/FP16/TF32, 181 FP32 TFLOPS per chip (dense); 96 GiB at 2.9 TB/s
    assert m["fp8"].value == 1299e12 and m["bf16"].value == m["fp16"].value == m["tf32"].value == 667e12
    assert m["fp32"].value == 181e12
    # trn2-arch.rst's instance table agrees: 16 chips = 20 PFLOPS FP8, 10 BF16, 2.9 FP32, 46.4 TB/s
    assert 16 * m["fp8"].value == pytest.approx(20e15, rel=0.04)
    assert 16 * m["bf16"].value == pytest.approx(10e15, rel=0.07)
    assert 16 * m["fp32"].value == pytest.approx(2.9e15, rel=0.01)
    assert s.memory_bytes == 96 * 2**30
    assert 16 * s.memory_bandwidth_bytes_per_s == pytest.approx(46.4e12)
    # the one published sparse figure (2,563) is not a single factor over the dense rates: kept out of the tables
    assert not s.sparse_matrix_peak_flops_per_s and "2,563" in s.notes
    assert s.compute_units == 8 and not s.tiled  # no SRAM field: no GPU tile search on a systolic array
    # scale-up: 16 on a 4x4 torus at 1,024 GB/s, 64 in an UltraServer at 256 GB/s, then EFA 3.2 Tb/s per 16 chips
    inst, ultra, efa = s.interconnect.tiers
    assert (inst.devices, inst.topology_name, inst.bandwidth.value) == (16, "torus", 1024e9)
    assert (ultra.devices, ultra.bandwidth.value) == (64, 256e9)
    assert inst.bandwidth.value + ultra.bandwidth.value == 1280e9  # trainium2.rst: NeuronLink-v3 1.28 TB/s per chip
    assert efa.any_size and efa.bytes_per_s == pytest.approx(3200e9 / 8 / 16)
    assert s.tdp_w is None and s.idle_power_w is None and s.software_risk == "high"
    assert set(s.datasheet_only) == {"achievable_matrix_flops_per_s", "achievable_memory_bandwidth_bytes_per_s"}


def test_tpu_v7_matches_the_tpu7x_page(specs):
    s = specs["tpu-v7"]
    m = s.matrix_peak_flops_per_s
    # TPU7x page: BF16 2307, FP8 4614 TFLOPs per chip (FP8 = 2 x BF16, new with Ironwood); 192 GiB at 7380 GB/s
    assert m["bf16"].value == 2307e12 and m["fp8"].value == 2 * m["bf16"].value
    assert set(m) == {"bf16", "fp8"}  # nothing else published
    assert s.memory_bytes == 192 * 2**30 and s.memory_bandwidth_bytes_per_s == 7380e9
    assert s.compute_units == 2
    # 9,216-chip pod on ICI at 1200 GB/s bidirectional (600 a direction), DCN 100 Gb/s per chip
    ici, dcn = s.interconnect.tiers
    assert ici.devices == 9216 and ici.bytes_per_s == pytest.approx(600e9)
    assert ici.topology.kind == "assumed"  # the page's table gives no topology
    assert dcn.bytes_per_s == pytest.approx(100e9 / 8)
    assert s.tdp_w is None and s.idle_power_w is None
    assert set(s.datasheet_only) == {"achievable_matrix_flops_per_s", "achievable_memory_bandwidth_bytes_per_s"}


def test_the_tpus_step_up_as_published(specs):
    # the TPU7x page's comparison table: v6e 918 / TPU7x 2307 BF16; HBM 1638 / 7380 GB/s; ICI 800 / 1200 GB/s
    v6e, v7 = specs["tpu-v6e"], specs["tpu-v7"]
    assert v6e.memory_bandwidth_bytes_per_s == 1638e9 and v6e.matrix_peak_flops_per_s["fp8"].value == 918e12
    assert v6e.interconnect.tiers[0].bandwidth.value == 800e9 and v7.interconnect.tiers[0].bandwidth.value == 1200e9
