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
    assert "fp8" not in s.achievable_matrix_flops_per_s  # the MI300X's measurements are not carried over
    assert s.datasheet_only == ("achievable_memory_bandwidth_bytes_per_s",)


def test_xgmi_mesh_as_the_mi300x_platform(specs):
    tier = specs["mi325x"].interconnect.tiers[0]
    assert tier.devices == 8 and tier.topology.value == "full_mesh" and tier.directions == 2
    assert tier.bandwidth.value == pytest.approx(7 * 128e9)
    assert len(specs["mi325x"].interconnect.tiers) == 1  # no NIC per GPU named by AMD: no scale-out tier guessed
