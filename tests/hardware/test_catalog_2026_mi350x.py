"""The AMD Instinct MI350X catalog entry (issue 37) against the figures printed beside it: the MI355X's silicon
at 2200 instead of 2400 MHz."""

import pytest

import opmap.hardware


@pytest.fixture(scope="module")
def specs():
    return opmap.hardware.catalog()


def test_dense_peaks_are_the_mi355x_scaled_by_the_clock(specs):
    s, big = specs["mi350x"], specs["mi355x"]
    bf16 = 2200e6 * 512 * 2 * 1024  # huggingface.co/hardware/mi350x: 2306.9 TFLOPS
    assert s.matrix_peak_flops_per_s["bf16"].value == pytest.approx(bf16, rel=1e-4)
    assert s.matrix_peak_flops_per_s["fp8"].value == pytest.approx(2 * bf16, rel=1e-4)
    for fmt in ("fp64", "fp32", "bf16", "fp16", "fp8", "int8"):
        assert s.matrix_peak_flops_per_s[fmt].value == pytest.approx(
            big.matrix_peak_flops_per_s[fmt].value * 2.2 / 2.4, rel=2e-3), fmt
    assert s.vector_peak_flops_per_s["fp32"].value == pytest.approx(144.2e12)  # Bekman note 22
    assert s.matrix_peak_flops_per_s["fp64"].kind == "derived"  # no printed MI350X FP64 figure cited


def test_sparse_is_twice_dense(specs):
    s = specs["mi350x"]
    for fmt in ("bf16", "fp16", "fp8", "int8"):
        dense = s.matrix_peak_flops_per_s[fmt].value
        assert s.sparse_matrix_peak_flops_per_s[fmt].value == pytest.approx(2 * dense, rel=1e-4)


def test_same_memory_and_fabric_as_the_mi355x_less_power(specs):
    s, big = specs["mi350x"], specs["mi355x"]
    f = {k: v.value for k, v in s.fields.items()}
    assert f["memory_bytes"] == 288 * 2**30 and f["memory_bandwidth_bytes_per_s"] == 8e12
    assert f["clock_hz"] == 2.2e9 and f["tdp_w"] == 1000 and f["compute_units"] == 256
    assert s.interconnect.tiers[0].bandwidth.value == big.interconnect.tiers[0].bandwidth.value == 7 * 153.6e9
    # no published MI350X measurement: the bf16 rate is the MI355X's measured fraction of peak, marked an estimate
    est, meas = s.achievable_matrix_flops_per_s["bf16"], big.achievable_matrix_flops_per_s["bf16"]
    assert est.kind == "estimate" and meas.kind == "measured"
    # every MI355X-measured format carries over as the same fraction of this device's (clock-scaled) dense peak
    for fmt in ("bf16", "fp8", "mxfp4", "mxfp6"):
        est, meas = s.achievable_matrix_flops_per_s[fmt], big.achievable_matrix_flops_per_s[fmt]
        assert est.kind == "estimate" and meas.kind == "measured", fmt
        assert est.value / s.matrix_peak_flops_per_s[fmt].value == pytest.approx(
            meas.value / big.matrix_peak_flops_per_s[fmt].value, rel=1e-3), fmt
    # the same HBM3E memory system: the MI355X's measured streaming rate, marked derived
    key = "achievable_memory_bandwidth_bytes_per_s"
    bw, big_bw = s.fields[key], big.fields[key]
    assert bw.kind == "derived" and big_bw.kind == "measured" and bw.value == big_bw.value
    assert s.datasheet_only == ()
