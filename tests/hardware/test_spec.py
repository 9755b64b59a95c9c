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
    assert msg == f"dev.toml: memory_bandwidth_bytes_per_s.value must be a number from 1000000 to 1e+17 B/s (got {got})"


@pytest.mark.parametrize("table", ["matrix_peak_flops_per_s.bf16", "vector_peak_flops_per_s.fp32",
                                   "launch_overhead_s", "tdp_w", "interconnect.tier.latency_s"])
def test_peaks_times_and_powers_refuse_nan_and_zero(table):
    where = table.replace("interconnect.tier.", "interconnect.tier[0].")  # the first tier's table
    for value in ("nan", "0"):
        assert f"{where}.value must be a number " in _refused(_with(table, value))


# A finite value far past any device was accepted and priced: a bf16 peak of 1e308 FLOP/s, a launch of a day.
# Each field's ceiling (spec.FIELD_RULES, curves.MAX_FLOPS_PER_S / MAX_BYTES_PER_S) sits above the fastest part
# published: GB300 15 PFLOP/s dense fp4, Cerebras WSE-3 125 PFLOP/s and 21 PB/s on the wafer.
@pytest.mark.parametrize("table,value,expected", [
    ("matrix_peak_flops_per_s.bf16", "1e308",
     "matrix_peak_flops_per_s.bf16.value must be a number from 1000000 to 1e+18 FLOP/s (got 1e+308)"),
    ("matrix_peak_flops_per_s.bf16", "1e-300",
     "matrix_peak_flops_per_s.bf16.value must be a number from 1000000 to 1e+18 FLOP/s (got 1e-300)"),
    ("vector_peak_flops_per_s.fp32", "2e18",
     "vector_peak_flops_per_s.fp32.value must be a number from 1000000 to 1e+18 FLOP/s (got 2e+18)"),
    ("memory_bandwidth_bytes_per_s", "3.35e30",
     "memory_bandwidth_bytes_per_s.value must be a number from 1000000 to 1e+17 B/s (got 3.35e+30)"),
    ("memory_bytes", "8e300", "memory_bytes.value must be a number > 0 and <= 1e+16 B (got 8e+300)"),
    ("launch_overhead_s", "86400", "launch_overhead_s.value must be a number > 0 and <= 1 s (got 86400)"),
    ("interconnect.tier.latency_s", "1e10",
     "interconnect.tier[0].latency_s.value must be a number > 0 and <= 1 s (got 1e+10)"),
    ("tdp_w", "7e8", "tdp_w.value must be a number > 0 and <= 1000000 W (got 7e+08)"),
    ("clock_hz", "1.98e15", "clock_hz.value must be a number from 1000000 to 100000000000 Hz (got 1.98e+15)"),
    ("compute_units", "132000000", "compute_units.value must be an integer from 1 to 10000000 (got 132000000)"),
    ("interconnect.tier.size", "1e9",
     "interconnect.tier[0].size.value must be an integer from 1 to 1000000 (got 1e+09)"),
])
def test_a_value_past_any_device_is_refused(table, value, expected):
    assert _refused(_with(table, value)).endswith(expected)


def test_every_scalar_field_has_a_ceiling():
    from opmap.hardware.spec import FIELD_RULES, SCALAR_FIELDS

    assert set(FIELD_RULES) == set(SCALAR_FIELDS)
    assert all(rule.hi is not None for rule in FIELD_RULES.values())


def test_the_catalog_is_inside_its_ceilings():
    """The ceilings sit above every real device: the whole catalog still loads."""
    from opmap.hardware.spec import catalog

    assert len(catalog()) >= 16


@pytest.mark.parametrize("table,value,expected", [
    ("compute_units", "131.5", "compute_units.value must be an integer from 1 to 10000000 (got 131.5)"),
    ("compute_units", "0", "compute_units.value must be an integer from 1 to 10000000 (got 0)"),
    ("interconnect.tier.size", "-8", "interconnect.tier[0].size.value must be an integer from 1 to 1000000 (got -8)"),
    ("interconnect.tier.in_network_reduction", "2",
     "interconnect.tier[0].in_network_reduction.value must be an integer from 0 to 1 (got 2)"),
    ("sparsity_factor", "0.5", "sparsity_factor.value must be a number from 1 to 16 (got 0.5)"),
])
def test_counts_flags_and_factors_have_their_own_ranges(table, value, expected):
    assert _refused(_with(table, value)).endswith(expected)


def test_a_flag_of_zero_is_a_value():
    spec = parse_spec_toml(_with("interconnect.tier.in_network_reduction", "0"))
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
        "interconnect.tier[0].topology: value 1 is not one of switch, full_mesh, torus, pcie, bridge_pairs")


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
    ("-1e11", "1048576", "calibration.matmul[0].flops_per_s must be a number from 0 to 1e+18 FLOP/s (got -1e+11)"),
    # a rate past any device (curves.MAX_FLOPS_PER_S) was accepted and priced
    ("1e308", "1048576", "calibration.matmul[0].flops_per_s must be a number from 0 to 1e+18 FLOP/s (got 1e+308)"),
    ("1e11", "0", "calibration.bandwidth[0].bytes must be an integer >= 1 (got 0)"),
    ("1e11", '"big"', "calibration.bandwidth[0].bytes must be an integer >= 1 (got 'big')"),
])
def test_calibration_curves_are_checked_on_load(rate, nbytes, expected):
    """A local profile's curves are built lazily, deep in a prediction: a bad row must fail at load instead."""
    assert _refused(GOOD + CAL.format(rate=rate, nbytes=nbytes)).endswith(expected)


def test_calibration_row_without_its_rate():
    text = GOOD + CAL.format(rate="1e11", nbytes="1").replace("flops_per_s = 1e11\n", "")
    assert "calibration.matmul[0]: missing flops_per_s" in _refused(text)


def _spec_file(tmp_path, name="dev.toml"):
    f = tmp_path / name
    f.write_text(GOOD)
    return f


def test_a_hardware_file_linked_to_dev_zero_is_one_line(tmp_path, capsys):
    """--hardware spec.toml linked to /dev/zero read without end (MemoryError); a FIFO blocked the read. Each is
    one line and exit status 2: the target of a link the user typed must still be a bounded regular file."""
    import os

    from opmap.cli import main
    from opmap.hardware.spec import get_hardware

    link = tmp_path / "spec.toml"
    link.symlink_to("/dev/zero")
    with pytest.raises(OpmapError, match=r"hardware file .*spec.toml is a device: expected a regular file"):
        get_hardware(str(link))
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(OpmapError, match=r"fifo.toml is a FIFO: expected a regular file"):
        get_hardware(str(fifo))
    assert main(["hardware", "show", str(link)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "is a device" in err and "Traceback" not in err


def test_a_link_the_user_typed_is_followed_a_cached_profile_link_is_not(tmp_path, monkeypatch):
    """A path on the command line may be the user's own link (to a regular file); the local profile in the cache
    is a file opmap wrote, so a link there (planted by another) is refused, not followed."""
    from opmap.hardware.spec import get_hardware

    good = _spec_file(tmp_path)
    mine = tmp_path / "mine.toml"
    mine.symlink_to(good)
    assert get_hardware(str(mine)).name == "h100-sxm"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    (tmp_path / "xdg" / "opmap").mkdir(parents=True)
    (tmp_path / "xdg" / "opmap" / "local.toml").symlink_to(good)
    with pytest.raises(OpmapError, match="local.toml is a symbolic link: opmap reads only regular files there"):
        get_hardware("local")


def test_an_oversized_hardware_file_is_refused_unread(tmp_path):
    from opmap.hardware.spec import get_hardware
    from opmap.safeio import LIMIT_TOML_BYTES

    big = tmp_path / "big.toml"
    with open(big, "wb") as f:  # sparse: refused on its size, nothing read
        f.truncate(LIMIT_TOML_BYTES + 1)
    with pytest.raises(OpmapError, match=r"hardware file .*big.toml is 4.0 MiB, over the 4 MiB opmap reads for it"):
        get_hardware(str(big))
