"""Hardware TOML read from text (opmap.hardware.spec.parse_spec_toml): every number finite and in its range.

Before: NaN / zero / inf rates were accepted (TOML spells nan and inf; 1e400 reads as inf) and printed as
`nan ns` or `0 s` downstream; a negative fraction of a compute unit, a flag of 2, a bool value passed too."""

from __future__ import annotations

import re

import pytest

from opmap.errors import OpmapError
from opmap.hardware.spec import CATALOG_DIR, parse_spec_toml

# the H100 SXM file without its [calibration] (its measured GEMM grid), which the tests below write their own of
GOOD = (CATALOG_DIR / "h100-sxm.toml").read_text().split("\n[calibration]")[0]


def _with(table: str, value: str) -> str:
    """The H100 SXM file with ``value`` written as the value of ``[table]`` (the first ``value =`` under it)."""
    start = GOOD.index(f"[{table}]\n")
    line = re.compile(r"^value = .*$", re.M).search(GOOD, start)
    assert line is not None
    return GOOD[:line.start()] + f"value = {value}" + GOOD[line.end():]


def _refused(text: str | bytes) -> str:
    with pytest.raises(OpmapError) as e:
        parse_spec_toml(text, "dev.toml")
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_the_catalog_file_parses_from_text():
    spec = parse_spec_toml(GOOD.encode(), "h100-sxm.toml")
    assert spec.name == "h100-sxm" and spec.memory_bandwidth_bytes_per_s == 3.35e12


@pytest.mark.parametrize("value,got", [
    ("nan", "nan"), ("inf", "inf"), ("-inf", "-inf"), ("1e400", "inf"), ("0", "0"), ("0.0", "0"),
    ("-314", "-314"), ("true", "true"), ('"3.35e12"', "'3.35e12'"),
])
def test_a_rate_must_be_finite_and_positive(value, got):
    msg = _refused(_with("memory_bandwidth_bytes_per_s", value))
    assert msg == f"dev.toml: memory_bandwidth_bytes_per_s.value must be a number > 0 (got {got})"


@pytest.mark.parametrize("table", ["matrix_peak_flops_per_s.bf16", "vector_peak_flops_per_s.fp32",
                                   "launch_overhead_s", "tdp_w", "scale_up_latency_s"])
def test_peaks_times_and_powers_refuse_nan_and_zero(table):
    for value in ("nan", "0"):
        assert f"{table}.value must be a number > 0" in _refused(_with(table, value))


@pytest.mark.parametrize("table,value,expected", [
    ("compute_units", "131.5", "compute_units.value must be an integer >= 1 (got 131.5)"),
    ("compute_units", "0", "compute_units.value must be an integer >= 1 (got 0)"),
    ("devices_per_node", "-8", "devices_per_node.value must be an integer >= 1 (got -8)"),
    ("in_switch_reduction", "2", "in_switch_reduction.value must be an integer from 0 to 1 (got 2)"),
    ("sparsity_factor", "0.5", "sparsity_factor.value must be a number >= 1 (got 0.5)"),
])
def test_counts_flags_and_factors_have_their_own_ranges(table, value, expected):
    assert _refused(_with(table, value)).endswith(expected)


def test_a_flag_of_zero_is_a_value():
    spec = parse_spec_toml(_with("in_switch_reduction", "0"))
    assert spec.in_switch_reduction is False


def test_binary_and_broken_text_are_one_line():
    assert _refused(b"\x89PNG\r\n\x1a\n\xff\xfe") == ("cannot read hardware file dev.toml: not UTF-8 text (byte 0); "
                                                       "expected a TOML file")
    assert _refused("name = \n").startswith("cannot read hardware file dev.toml: Invalid value")


@pytest.mark.parametrize("text", ["b = " + "[" * 600 + "1" + "]" * 600,
                                  "b = " + "{c = " * 600 + "1" + "}" * 600])
def test_deep_nesting_is_one_line_not_a_recursion_error(text):
    """tomllib recurses once per nested array or inline table: 600 levels raised RecursionError (a traceback)."""
    assert _refused(text) == ("cannot read hardware file dev.toml: arrays or tables nested too deep; expected a "
                              "TOML file like the catalog's (tables of value, kind, source)")


def test_wrong_types_in_text_fields_are_refused():
    assert _refused(GOOD.replace('device_type = "gpu"', 'device_type = 1')) == (
        "dev.toml: device_type 1 is not one of gpu, cpu, tpu, accelerator")
    assert _refused(GOOD.replace('value = "switch"', "value = 1", 1)).endswith(
        "scale_up_topology: value 1 is not one of switch, full_mesh, torus, pcie, bridge_pairs")


CAL = """
[calibration]
view_overhead_s = 1e-6
[[calibration.matmul]]
m = 256
n = 256
k = 256
dtype = "fp32"
flops_per_s = {rate}
[[calibration.bandwidth]]
kind = "copy"
bytes = {nbytes}
bytes_per_s = 1e10
"""


@pytest.mark.parametrize("rate,nbytes,expected", [
    ("nan", "1048576", "calibration.matmul[0].flops_per_s must be a finite number (got nan)"),
    ("-1e11", "1048576", "calibration.matmul[0].flops_per_s must be a number >= 0 (got -1e+11)"),
    ("1e11", "0", "calibration.bandwidth[0].bytes must be an integer >= 1 (got 0)"),
    ("1e11", '"big"', "calibration.bandwidth[0].bytes must be an integer >= 1 (got 'big')"),
])
def test_calibration_curves_are_checked_on_load(rate, nbytes, expected):
    """A local profile's curves are built lazily, deep in a prediction: a bad row must fail at load instead."""
    assert _refused(GOOD + CAL.format(rate=rate, nbytes=nbytes)).endswith(expected)


def test_calibration_row_without_its_rate():
    text = GOOD + CAL.format(rate="1e11", nbytes="1").replace("flops_per_s = 1e11\n", "")
    assert "calibration.matmul[0]: missing flops_per_s" in _refused(text)
