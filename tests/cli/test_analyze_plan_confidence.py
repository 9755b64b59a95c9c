"""analyze's and plan's confidence label (issue 39: "a confidence label on every predicted figure in serve, fit,
plan and analyze headers and JSON"). The label follows the kinds of the catalog figures that priced the result
(DESIGN.md: calibrated / anchored / datasheet, naming the weakest input): on an H100 SXM the fp8 and bf16 GEMMs are
priced off the measured grid h100-sxm.gemm.json and memory at the measured BabelStream rate, while eager
launches cost the catalog's *assumed* 4 us (h100-sxm.toml: launch_overhead_s, kind assumed), so an eager analysis
is "datasheet" naming the launch overhead; B300's bf16 rate is the datasheet's dense peak."""

from __future__ import annotations

import json

from opmap.cli import main
from opmap.hardware import get_hardware
from opmap.hardware.trust import matrix_input

TINY = "examples/tiny-llama.json"


def _analysis(tmp_path, name, *args):
    out = tmp_path / name
    assert main(["analyze", *map(str, args), "--no-store", "--rows", "0", "--out", str(out)]) == 0
    return json.loads((out / "analysis.json").read_text())["assumptions"]["confidence"]


def test_an_eager_analysis_names_the_assumed_launch_overhead(tmp_path, capsys):
    assert get_hardware("h100-sxm").fields["launch_overhead_s"].kind == "assumed"  # the catalog's kind
    c = _analysis(tmp_path, "hf", TINY, "--hardware", "h100-sxm", "--phase", "decode", "--kv-len", "64", "--tp", "2")
    assert c["label"] == "datasheet" and c["weakest"] == {**c["weakest"], "name": "launch overhead",
                                                          "kind": "assumed"}
    # the tp 2 group talks over NVLink: its tier is one of the inputs considered
    assert any("bandwidth" in i["name"] for i in c["inputs"] if i["name"] != "memory bandwidth")
    flat = lambda t: " ".join(t.split())  # noqa: E731 (the header wraps long lines)
    assert flat(c["line"]) in flat(capsys.readouterr().out)


def test_a_zoo_analysis_on_a_datasheet_device_names_its_peak(tmp_path):
    c = _analysis(tmp_path, "zoo", "gpt2", "--hardware", "b300", "--seq", "128", "--dtype", "bf16")
    assert c["label"] == "datasheet"
    assert (c["weakest"]["name"], c["weakest"]["kind"]) in {("matrix rate bf16", "datasheet_dense"),
                                                           ("launch overhead", "assumed")}
    assert any(i["name"] == "matrix rate bf16" and i["kind"] == "datasheet_dense" for i in c["inputs"])


def test_a_measured_gemm_grid_is_the_matrix_input():
    # the time model prices every GEMM off the grid (opmap.hardware.curves), so the label cites the grid, not one rate
    i = matrix_input(get_hardware("h100-sxm"), "fp8")
    assert i.kind == "measured" and "h100-sxm.gemm.json" in i.source
    i = matrix_input(get_hardware("b300"), "bf16")  # no grid: its datasheet peak
    assert i.kind == "datasheet_dense"


def test_plan_writes_and_prints_its_confidence(tmp_path, capsys):
    out = tmp_path / "plan"
    assert main(["plan", TINY, "--devices", "4", "--phase", "prefill", "--seq", "128", "--rows", "1", "--no-store",
                 "--out", str(out)]) == 0
    d = json.loads((out / "plan.json").read_text())
    assert list(d).index("confidence") == list(d).index("assumptions") + 1
    assert d["confidence"]["label"] in ("datasheet", "anchored", "calibrated")
    printed = " ".join(capsys.readouterr().out.split())
    assert " ".join(d["confidence"]["line"].split()) in printed
    assert d["confidence"]["line"] in (out / "plan.md").read_text()
