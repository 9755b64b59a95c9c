"""The confidence label (opmap.hardware.trust): the weakest input's kind decides it, by the rule in the module's
docstring (DESIGN.md's three labels). Each case sets the kinds of a real catalog device's figures by hand and
checks the label and the input named."""

from __future__ import annotations

import dataclasses

from opmap.hardware.runtimes import stacks
from opmap.hardware.spec import get_hardware
from opmap.hardware.trust import trust
from opmap.hardware.values import Value


def _with(hw, **fields):
    return dataclasses.replace(hw, fields={**hw.fields, **fields})


def _measured_memory(hw):
    return _with(hw, achievable_memory_bandwidth_bytes_per_s=Value(3.0e12, "measured", "a stream kernel, cited"))


def test_every_input_measured_and_published_is_anchored():
    hw = _measured_memory(get_hardware("h100-sxm"))
    assert hw.achievable_matrix_flops_per_s["bf16"].kind == "measured"  # mamf-finder's 794.5 TFLOP/s
    # the engine runtime's three overheads on cuda-graphs are published measurements (runtimes.toml)
    assert {stacks()["cuda-graphs"].values[k].kind for k in ("graph_kernel_gap_s", "graph_launch_s",
                                                             "engine_step_host_s")} == {"measured"}
    t = trust(hw, "bf16", "engine", 1)
    assert t.label == "anchored"
    assert [i.name for i in t.inputs] == ["matrix rate bf16", "memory bandwidth", "graph kernel gap",
                                          "graph launch", "engine step host"]
    assert t.weakest.name == "matrix rate bf16"  # the first of equal ranks


def test_a_datasheet_memory_rate_makes_it_datasheet_and_is_named():
    hw = get_hardware("h100-sxm")
    hw = dataclasses.replace(hw, fields={k: v for k, v in hw.fields.items()
                                         if k != "achievable_memory_bandwidth_bytes_per_s"})
    t = trust(hw, "bf16", "engine", 1)
    assert t.label == "datasheet"
    assert t.weakest.name == "memory bandwidth" and t.weakest.kind == "derived"
    assert "datasheet memory bandwidth x" in t.weakest.source  # the pin rate times DRAM efficiency
    assert t.line().startswith("confidence: datasheet (weakest input: memory bandwidth, derived: ")


def test_an_assumed_launch_overhead_decides_an_eager_prediction():
    hw = _measured_memory(get_hardware("h100-sxm"))
    hw = _with(hw, launch_overhead_s=Value(4e-6, "assumed", "typical launch overhead"))
    t = trust(hw, "bf16", "eager", 1)
    assert (t.label, t.weakest.name, t.weakest.kind) == ("datasheet", "launch overhead", "assumed")


def test_a_format_without_its_own_measurement_is_derived_from_anothers_fraction():
    hw = _measured_memory(get_hardware("h100-sxm"))
    assert "fp8" in hw.matrix_peak_flops_per_s
    # neither its own achievable figure nor a measured GEMM grid (a grid is the input where there is one)
    cal = {k: v for k, v in hw.calibration.items() if k != "gemm_grid"}
    hw = dataclasses.replace(hw, achievable_matrix_flops_per_s={"bf16": hw.achievable_matrix_flops_per_s["bf16"]},
                             calibration=cal)
    t = trust(hw, "fp8", "engine", 1)
    assert t.weakest.name == "matrix rate fp8" and t.weakest.kind == "derived" and t.label == "datasheet"
    assert "fraction" in t.weakest.source


def test_a_format_the_device_lacks_is_an_assumption():
    hw = get_hardware("h100-sxm")
    t = trust(hw, "nvfp4", "engine", 1)
    assert "nvfp4" not in hw.matrix_peak_flops_per_s
    assert (t.weakest.name, t.weakest.kind, t.label) == ("matrix rate nvfp4", "assumed", "datasheet")


def test_the_links_a_group_crosses():
    hw = get_hardware("h100-sxm")
    inner = hw.interconnect.tiers[0]
    assert inner.devices == 8  # an HGX H100 board
    names = lambda g: [i.name for i in trust(hw, "bf16", "engine", g).inputs if i.name.endswith(" bandwidth")
                       and i.name != "memory bandwidth"]
    assert names(1) == []  # one device: no collective
    assert names(8) == [f"{inner.name} bandwidth"]  # inside the board
    assert names(16) == [f"{t.name} bandwidth" for t in hw.interconnect.tiers[:2]]  # the board and the network
    # NVLink's figure is the datasheet's: a tensor-parallel prediction is datasheet-labelled by it
    t = trust(_measured_memory(hw), "bf16", "engine", 8)
    assert t.label == "datasheet" and t.weakest.name == f"{inner.name} bandwidth" and t.weakest.kind == "datasheet"


def test_a_profile_measured_here_is_calibrated():
    hw = _measured_memory(get_hardware("xeon-8480"))
    measured = Value(1e12, "measured", "opmap calibrate on this host")
    hw = dataclasses.replace(hw, calibration={"device": "cpu", "fingerprint": "this host"},
                             achievable_matrix_flops_per_s={"fp32": measured},
                             fields={**hw.fields, "launch_overhead_s": Value(5e-6, "measured", "opmap calibrate"),
                                     "achievable_memory_bandwidth_bytes_per_s": measured})
    t = trust(hw, "fp32", "eager", 1)
    assert t.label == "calibrated" and {i.kind for i in t.inputs} == {"calibrated"}
    # the engine's host time is the stack's published (or assumed) figure, not measured here
    assert trust(hw, "fp32", "engine", 1).label != "calibrated"
