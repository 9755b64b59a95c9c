"""The AMD Instinct MI355X catalog entry (issue 37) against the figures printed beside it."""

import pytest

import opmap.errors
import opmap.hardware
from opmap.hardware.spec import CATALOG_DIR, load_spec_file


@pytest.fixture(scope="module")
def s():
    return opmap.hardware.catalog()["mi355x"]


def test_dense_peaks_are_amds_formula(s):
    # 2400 MHz x 512 FMA per matrix core per clock x 2 x 1024 matrix cores = 2516.6 TFLOPS (AMD: 2.5 PFLOPS)
    bf16 = 2400e6 * 512 * 2 * 1024
    assert s.matrix_peak_flops_per_s["bf16"].value == pytest.approx(bf16, rel=1e-4)
    assert s.matrix_peak_flops_per_s["fp16"].value == s.matrix_peak_flops_per_s["bf16"].value
    assert s.matrix_peak_flops_per_s["fp8"].value == pytest.approx(2 * bf16, rel=1e-4)  # AMD: 5.0 PFLOPS
    assert s.matrix_peak_flops_per_s["int8"].value == s.matrix_peak_flops_per_s["fp8"].value
    # ISSCC 2026: 8,192 FP8 FLOP per CU per clock on 256 CUs at 2.4 GHz
    assert s.matrix_peak_flops_per_s["fp8"].value == pytest.approx(256 * 8192 * 2.4e9, rel=1e-4)
    assert all(v.kind == "datasheet_dense" for v in s.matrix_peak_flops_per_s.values())


def test_sparse_is_twice_dense_as_amd_prints(s):
    assert s.fields["sparsity_factor"].value == 2
    for fmt in ("bf16", "fp16", "fp8", "int8"):
        sparse = s.sparse_matrix_peak_flops_per_s[fmt]
        assert sparse.kind == "datasheet_sparse"
        assert sparse.value == pytest.approx(2 * s.matrix_peak_flops_per_s[fmt].value)
    assert s.sparse_matrix_peak_flops_per_s["fp8"].value == pytest.approx(10066.4e12)  # AMD: 10.1 PFLOPS


def test_no_tf32_and_vector_rates(s):
    assert "tf32" not in s.matrix_peak_flops_per_s  # AMD prints no TF32 figure for the MI355X
    assert s.vector_peak_flops_per_s["fp32"].value == pytest.approx(157.3e12)
    assert s.vector_peak_flops_per_s["fp64"].value == pytest.approx(256 * 128 * 2.4e9, rel=1e-3)  # 78.6


def test_memory_clock_power_and_caches(s):
    f = {k: v.value for k, v in s.fields.items()}
    assert f["memory_bytes"] == 288 * 2**30
    assert f["memory_bandwidth_bytes_per_s"] == 8e12
    assert f["compute_units"] == 256 and f["clock_hz"] == 2.4e9 and f["tdp_w"] == 1400
    assert f["sram_per_unit_bytes"] == 160 * 2**10 and f["l2_bytes"] == 256 * 2**20
    assert "achievable_memory_bandwidth_bytes_per_s" not in f  # none published: left out, not guessed
    mamf = s.achievable_matrix_flops_per_s["bf16"]
    assert mamf.kind == "measured" and mamf.value == pytest.approx(1565.0e12)


def test_scale_up_is_seven_infinity_fabric_links_of_153_6(s):
    tier = s.interconnect.tiers[0]
    assert tier.devices == 8 and tier.topology.value == "full_mesh" and tier.in_network_reduction.value == 0
    assert tier.directions == 2 and tier.bandwidth.value == pytest.approx(7 * 153.6e9)
    assert s.interconnect.tiers[1].bandwidth.value == 400e9 / 8  # one 400G NIC per GPU


def test_fp4_fp6_peaks_are_catalog_keys_and_an_unknown_format_is_refused(s, tmp_path):
    # AMD MI355X: MXFP4 / MXFP6 10.1 PFLOPS dense (2 x the 5033.2 TFLOPS fp8), MXFP8 at the fp8 rate (issue 37)
    assert "MXFP4 10.1" in s.notes and "MXFP6 10.1" in s.notes
    p = s.matrix_peak_flops_per_s
    assert p["mxfp4"].value == p["mxfp6"].value == pytest.approx(10066.4e12) and p["mxfp8"].value == p["fp8"].value
    text = (CATALOG_DIR / "mi355x.toml").read_text()
    bad = tmp_path / "x.toml"
    bad.write_text(text.replace("[matrix_peak_flops_per_s.fp8]", '[matrix_peak_flops_per_s.fp3]\nvalue = 1.00664e16\n'
                                'kind = "datasheet_dense"\nsource = "x"\n\n[matrix_peak_flops_per_s.fp8]', 1))
    with pytest.raises(opmap.errors.OpmapError, match="fp3"):
        load_spec_file(bad)
