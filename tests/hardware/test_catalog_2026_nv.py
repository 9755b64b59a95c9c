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
    # no B300 streaming run is published: the GB300's measured 7.140 TB/s (same 288 GB HBM3e at 8 TB/s), derived
    bw = s.fields["achievable_memory_bandwidth_bytes_per_s"]
    assert bw.kind == "derived" and bw.value == 7.140e12 and "GB300" in bw.source
    assert set(s.datasheet_only) == {"achievable_matrix_flops_per_s"}
    assert "13.5 PFLOPS dense NVFP4" in s.notes  # fp4 recorded in the notes until the format keys exist


def test_gb200_is_the_nvl72_individual_gpu_column(specs):
    s = specs["gb200"]
    # NVIDIA GB200 NVL72, individual Blackwell GPU: FP16/BF16 5 PFLOPS, FP8/FP6 10 PFLOPS, INT8 10 POPS with sparsity
    for dtype, sparse in (("bf16", 5e15), ("fp8", 10e15), ("int8", 10e15), ("tf32", 2.5e15)):
        assert s.sparse_matrix_peak_flops_per_s[dtype].value == pytest.approx(sparse)
        assert s.matrix_peak_flops_per_s[dtype].value == pytest.approx(sparse / 2)
    # 186GB HBM3E | 8TB/s, up to 1,200 W (the HGX B200 of b200: 180 GB, 7.7 TB/s, 1,000 W)
    assert s.memory_bytes == 186 * 2**30 and s.memory_bandwidth_bytes_per_s == 8e12 and s.tdp_w == 1200
    assert s.matrix_peak_flops_per_s["bf16"].value > specs["b200"].matrix_peak_flops_per_s["bf16"].value
    # the scale-up domain is the rack: 72 GPUs on NVLink 5 at 1.8 TB/s per GPU (130 TB/s / 72), SHARP switches
    assert s.devices_per_node == 72 and s.scale_up_topology == "switch" and s.in_switch_reduction
    assert s.scale_up_bandwidth_bytes_per_s == pytest.approx(1.8e12) and 72 * 1.8e12 == pytest.approx(130e12, rel=0.01)
    assert s.scale_out_bandwidth_bytes_per_s == pytest.approx(400e9 / 8)  # ConnectX-7 400 Gb/s per GPU
    # measured GEMM rates: Azure ND GB200 v6, cuBLASLt at 16384^3: FP8 2906.9 TFLOPS, FP4 7627.6 TFLOPS
    # (Azure/AI-benchmarking-guide ND_GB200_v6_results.md): 58% and 76% of the 5 / 10 PFLOPS dense peaks
    ach = s.achievable_matrix_flops_per_s
    assert ach["fp8"].value == pytest.approx(2906.9e12) and ach["fp8"].kind == "measured"
    assert ach["nvfp4"].value == pytest.approx(7627.6e12) and ach["nvfp4"].kind == "measured"
    assert ach["fp8"].value / s.matrix_peak_flops_per_s["fp8"].value == pytest.approx(0.581, abs=1e-3)
    # KernelAgent-Oink's GB200 plot: its 'HBM peak (measured)' line at y 158.870109, the 0 / 2000 GB/s ticks at
    # y 334.546471 / 284.188151: 2000 x (334.546471 - 158.870109) / (334.546471 - 284.188151) = 6977 GB/s
    bw = s.fields["achievable_memory_bandwidth_bytes_per_s"]
    read = 2000e9 * (334.546471 - 158.870109) / (334.546471 - 284.188151)
    assert bw.kind == "measured" and bw.value == pytest.approx(read, rel=1e-4) and bw.value == pytest.approx(6.977e12)
    assert s.datasheet_only == ()


def test_gb300_is_the_nvl72_rack_table_over_72(specs):
    s = specs["gb300"]
    # NVIDIA GB300 NVL72: FP8/FP6 720, FP16/BF16 360, TF32 180 PFLOPS, INT8 24 POPS with sparsity, for 72 GPUs
    for dtype, rack in (("fp8", 720e15), ("bf16", 360e15), ("tf32", 180e15), ("int8", 24e15)):
        assert s.sparse_matrix_peak_flops_per_s[dtype].value == pytest.approx(rack / 72, rel=1e-4)
        assert s.matrix_peak_flops_per_s[dtype].value == pytest.approx(rack / 72 / 2, rel=1e-4)
    # Verda's per-GPU table (dense): FP8 5, BF16 2.5 PFLOPS; 8 TB/s (576 TB/s / 72); 1.4 kW (100.8 kW / 72)
    assert s.matrix_peak_flops_per_s["bf16"].value == 2.5e15 and s.matrix_peak_flops_per_s["fp8"].value == 5e15
    assert s.memory_bandwidth_bytes_per_s == pytest.approx(576e12 / 72) and s.tdp_w == pytest.approx(100.8e3 / 72)
    assert s.memory_bytes == 279 * 2**30
    # Blackwell Ultra's int8 is vestigial: below bf16 on the same part
    assert s.matrix_peak_flops_per_s["int8"].value < s.matrix_peak_flops_per_s["bf16"].value
    assert s.devices_per_node == 72 and s.scale_up_bandwidth_bytes_per_s == pytest.approx(1.8e12)
    assert s.scale_out_bandwidth_bytes_per_s == pytest.approx(800e9 / 8)  # ConnectX-8, 800 Gb/s per GPU
    # KernelAgent-Oink README: measured GB300 BF16 STREAM-like roof 7.140 TB/s (Triton triad)
    bw = s.fields["achievable_memory_bandwidth_bytes_per_s"]
    assert bw.kind == "measured" and bw.value == 7.140e12
    assert set(s.datasheet_only) == {"achievable_matrix_flops_per_s"}
    assert "15 PFLOPS\nNVFP4" in s.notes or "15 PFLOPS NVFP4" in s.notes.replace("\n", " ")


def test_h200_nvl_is_the_datasheets_nvl_column(specs):
    s, sxm = specs["h200-nvl"], specs["h200"]
    # NVIDIA H200 datasheet, H200 NVL: BF16 1,671, FP8 3,341 TFLOPS, INT8 3,341 TOPS with sparsity; dense = half
    for dtype, sparse in (("bf16", 1671e12), ("fp8", 3341e12), ("int8", 3341e12), ("tf32", 835e12)):
        assert s.sparse_matrix_peak_flops_per_s[dtype].value == pytest.approx(sparse)
        assert s.matrix_peak_flops_per_s[dtype].value == pytest.approx(sparse / 2, rel=1e-3)
    # the SXM part's memory (141 GB HBM3e, 4.8 TB/s) at 600 W instead of 700 W, and lower tensor peaks
    assert s.memory_bytes == sxm.memory_bytes and s.memory_bandwidth_bytes_per_s == sxm.memory_bandwidth_bytes_per_s
    assert s.tdp_w == 600 and s.matrix_peak_flops_per_s["bf16"].value < sxm.matrix_peak_flops_per_s["bf16"].value
    # bandwidth derived from the SXM's BabelStream Triad, marked derived; no matmul measurement: datasheet only there
    bw = s.fields["achievable_memory_bandwidth_bytes_per_s"]
    assert bw.kind == "derived" and bw.value == sxm.fields["achievable_memory_bandwidth_bytes_per_s"].value
    assert set(s.datasheet_only) == {"achievable_matrix_flops_per_s"}
    # 2- or 4-way NVLink bridge at 900 GB/s per GPU (no NVSwitch), two groups per 8-card server over PCIe Gen5
    assert s.devices_per_node == 4 and s.scale_up_topology == "full_mesh" and not s.in_switch_reduction
    assert [t.devices for t in s.interconnect.tiers] == [4, 8]


def test_rtx_pro_6000_server_edition(specs):
    s = specs["rtx-pro-6000"]
    # NVIDIA's Server Edition page: FP8 2 PFLOPS, FP16 | BF16 1 PFLOP (read as sparse), TF32 234 TFLOPS (dense)
    sparse = s.sparse_matrix_peak_flops_per_s
    assert sparse["fp8"].value == 2e15 and sparse["bf16"].value == 1e15
    assert s.matrix_peak_flops_per_s["fp8"].value == 1e15 and s.matrix_peak_flops_per_s["bf16"].value == 5e14
    assert s.matrix_peak_flops_per_s["bf16"].kind == "derived"  # the page labels neither sparse nor dense
    assert s.matrix_peak_flops_per_s["tf32"].value == 234e12
    # 1,597 GB/s (the Server Edition; the Workstation's 1,792 is not this part), 96 GiB GDDR7, 600 W
    assert s.memory_bandwidth_bytes_per_s == 1.597e12 and s.memory_bytes == 96 * 2**30 and s.tdp_w == 600
    assert s.memory_bytes >= 97887 * 2**20  # nvidia-smi on a Server Edition
    # 24,064 CUDA cores / 128 = 188 SMs; FP32 120 TFLOPS = 188 x 128 x 2 x 2.494 GHz
    assert s.compute_units == 188
    assert s.vector_peak_flops_per_s["fp32"].value == pytest.approx(188 * 128 * 2 * s.clock_hz, rel=1e-3)
    # PCIe only, no NVLink; no int8 / fp64 tensor rate published
    assert s.scale_up_topology == "pcie" and not s.in_switch_reduction
    assert "int8" not in s.matrix_peak_flops_per_s and s.software_risk == "medium"
