"""The AMD Instinct MI325X catalog entry (issue 37) against the figures printed beside it: the MI300X's compute
with 256 GB of HBM3E at 6 TB/s and 1000 W."""

import pytest

import opmap.hardware


@pytest.fixture(scope="module")
def specs():
    return opmap.hardware.catalog()


def test_compute_is_the_mi300xs(specs):
    s, old = specs["mi325x"], specs["mi300x"]
    for fmt, v in old.matrix_peak_flops_per_s.items():
        assert s.matrix_peak_flops_per_s[fmt].value == v.value, fmt
    # 2100 MHz x 256 FMA per matrix core per clock x 2 x 1216 matrix cores = 1307.4 TFLOPS (Bekman)
    assert s.matrix_peak_flops_per_s["bf16"].value == pytest.approx(2100e6 * 256 * 2 * 1216, rel=1e-4)
    assert s.sparse_matrix_peak_flops_per_s["fp8"].value == pytest.approx(5229.8e12)  # datasheet "with sparsity"
    for fmt, sparse in s.sparse_matrix_peak_flops_per_s.items():
        assert sparse.value == pytest.approx(2 * s.matrix_peak_flops_per_s[fmt].value, rel=1e-4), fmt


def test_memory_power_and_measured_matmul(specs):
    s = specs["mi325x"]
    f = {k: v.value for k, v in s.fields.items()}
    assert f["memory_bytes"] == 256 * 2**30 and f["memory_bandwidth_bytes_per_s"] == 6e12
    assert f["tdp_w"] == 1000 and f["compute_units"] == 304 and f["clock_hz"] == 2.1e9
    mamf = s.achievable_matrix_flops_per_s["bf16"]
    assert mamf.kind == "measured" and mamf.value == pytest.approx(784.9e12)
    # AMD's Max-Achievable FLOPs blog, Part 2, Table 1, MI325X (hipblaslt-bench): FP16 794, FP8 1519 TFLOPs
    ach = s.achievable_matrix_flops_per_s
    assert ach["fp16"].value == 794e12 and ach["fp8"].value == 1519e12
    assert ach["fp8"].kind == ach["fp16"].kind == "measured" and "MI325X" in ach["fp8"].source
    assert ach["fp8"].value != specs["mi300x"].achievable_matrix_flops_per_s["fp8"].value  # its own, not the MI300X's
    # rocprofiler-compute's metric test: 'MI 325X: 4287.31 GB/s' of HBM traffic from its memcopy workload
    bw = s.fields["achievable_memory_bandwidth_bytes_per_s"]
    assert bw.kind == "measured" and bw.value == 4287.31e9 and s.memory_rate_bytes_per_s == 4287.31e9
    assert s.datasheet_only == ()


def test_measured_fp8_rate_prices_an_fp8_gemm(specs):
    """An fp8 GEMM on an MI325X runs at AMD's measured 1519 TFLOP/s, not the 2614.9 dense peak x bf16's fraction:
    8192^3 at 2 * 8192^3 / 1519e12 = 0.724 ms (plus the launch), compute-bound."""
    from opmap.costs.base import OpCost
    from opmap.precision import resolve_precision
    from opmap.predict import predict_cost

    s = specs["mi325x"]
    prec = resolve_precision(s, "fp8")
    assert prec.matrix_rate_flops_per_s == 1519e12 and prec.rate_basis == "measured achievable fp8 rate"
    n = 8192
    p = predict_cost(OpCost(matrix_flops=2.0 * n ** 3, bytes_read=2 * n * n, bytes_written=2 * n * n), s, prec)
    assert p.bound == "compute" and p.predicted_s == pytest.approx(2 * n ** 3 / 1519e12 + s.launch_overhead_s)


def test_xgmi_mesh_as_the_mi300x_platform(specs):
    tier = specs["mi325x"].interconnect.tiers[0]
    assert tier.devices == 8 and tier.topology.value == "full_mesh" and tier.directions == 2
    assert tier.bandwidth.value == pytest.approx(7 * 128e9)
    assert len(specs["mi325x"].interconnect.tiers) == 1  # no NIC per GPU named by AMD: no scale-out tier guessed
