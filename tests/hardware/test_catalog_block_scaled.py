"""The block-scaled formats' rates per device (issue 37): nvfp4 / mxfp4 / mxfp6 / mxfp8 dense peaks as catalog keys,
each from the vendor's published figure written beside it; devices without an fp4 engine list none."""

from __future__ import annotations

import pytest

from opmap.hardware import get_hardware

# (device, format) -> dense FLOP/s, from the datasheets (sparse figures halved where the table prints sparse ones)
PEAKS = {
    # NVIDIA HGX B200, individual GPU: FP4 Tensor Core 18 PFLOPS sparse; FP8/FP6 9 PFLOPS sparse
    ("b200", "nvfp4"): 18e15 / 2, ("b200", "mxfp4"): 18e15 / 2, ("b200", "mxfp6"): 9e15 / 2,
    ("b200", "mxfp8"): 9e15 / 2,
    # NVIDIA HGX B300: FP4 108 PFLOPS dense for 8 GPUs; FP8/FP6 72 PFLOPS sparse for 8
    ("b300", "nvfp4"): 108e15 / 8, ("b300", "mxfp4"): 108e15 / 8, ("b300", "mxfp6"): 72e15 / 8 / 2,
    ("b300", "mxfp8"): 72e15 / 8 / 2,
    # NVIDIA GB200 NVL72, individual GPU: FP4 20 PFLOPS sparse; FP8/FP6 10 PFLOPS sparse
    ("gb200", "nvfp4"): 20e15 / 2, ("gb200", "mxfp4"): 20e15 / 2, ("gb200", "mxfp6"): 10e15 / 2,
    ("gb200", "mxfp8"): 10e15 / 2,
    # NVIDIA GB300 NVL72: FP4 1,080 PFLOPS dense for 72 GPUs (Blackwell Ultra blog: 15 PFLOPS dense NVFP4); FP8/FP6
    # 720 PFLOPS sparse for 72
    ("gb300", "nvfp4"): 1080e15 / 72, ("gb300", "mxfp4"): 1080e15 / 72, ("gb300", "mxfp6"): 720e15 / 72 / 2,
    ("gb300", "mxfp8"): 720e15 / 72 / 2,
    # RTX PRO 6000 Blackwell Server Edition: FP4 4 PFLOPS, FP8 2 PFLOPS, both read as sparse (RTX convention)
    ("rtx-pro-6000", "nvfp4"): 4e15 / 2, ("rtx-pro-6000", "mxfp4"): 4e15 / 2, ("rtx-pro-6000", "mxfp6"): 2e15 / 2,
    ("rtx-pro-6000", "mxfp8"): 2e15 / 2,
    # AMD MI355X: 256 CUs x 8192 FP8 FLOP per CU per clock x 2.4 GHz = 5033.2 TFLOPS; MXFP6 / MXFP4 twice that
    ("mi355x", "mxfp4"): 2 * 256 * 8192 * 2.4e9, ("mi355x", "mxfp6"): 2 * 256 * 8192 * 2.4e9,
    ("mi355x", "mxfp8"): 256 * 8192 * 2.4e9,
    # AMD MI350X: the same silicon at 2.2 GHz
    ("mi350x", "mxfp4"): 2 * 256 * 8192 * 2.2e9, ("mi350x", "mxfp6"): 2 * 256 * 8192 * 2.2e9,
    ("mi350x", "mxfp8"): 256 * 8192 * 2.2e9,
}
BLOCK = ("nvfp4", "mxfp8", "mxfp6", "mxfp4")


@pytest.mark.parametrize("device, fmt", sorted(PEAKS))
def test_block_scaled_peaks_are_the_datasheets(device, fmt):
    v = get_hardware(device).matrix_peak_flops_per_s[fmt]
    assert v.value == pytest.approx(PEAKS[device, fmt], rel=1e-4)
    assert v.kind in ("datasheet_dense", "derived") and v.source


@pytest.mark.parametrize("device", ["b200", "b300", "gb200", "gb300", "rtx-pro-6000"])
def test_blackwell_runs_mxfp6_and_mxfp8_at_the_fp8_rate(device):
    """tcgen05.mma kind::mxf8f6f4 (and sm_120's mma.sync block_scale): the datasheets' 'FP8/FP6' row."""
    p = get_hardware(device).matrix_peak_flops_per_s
    assert p["mxfp6"].value == p["mxfp8"].value == p["fp8"].value
    assert p["nvfp4"].value == p["mxfp4"].value > p["fp8"].value


@pytest.mark.parametrize("device", ["mi355x", "mi350x"])
def test_cdna4_runs_mx_fp4_and_fp6_at_twice_fp8_and_no_nvfp4(device):
    p = get_hardware(device).matrix_peak_flops_per_s
    assert p["mxfp4"].value == p["mxfp6"].value == pytest.approx(2 * p["fp8"].value, rel=1e-4)
    assert p["mxfp8"].value == p["fp8"].value and "nvfp4" not in p


@pytest.mark.parametrize("device", ["h100-sxm", "h200", "h200-nvl", "a100-sxm-80gb", "l4", "l40s", "mi300x", "mi325x",
                                    "tpu-v6e", "tpu-v7", "trn2"])
def test_devices_without_a_block_scaled_engine_list_none(device):
    assert not set(BLOCK) & set(get_hardware(device).matrix_peak_flops_per_s)
