"""The assumption lines head every report: values rendered, the rate the time model ran at named."""

from __future__ import annotations

from opmap.report.sheet import assumption_lines


def test_assumption_lines_render_the_hardware_values(analysis_of):
    a = analysis_of("gpt2", 1, 32, "bf16", "h100-sxm")
    hw_line = next(line for line in assumption_lines(a) if line.startswith("hardware "))
    # H100 SXM datasheet: 989.4 TFLOP/s dense bf16, 3.35 TB/s; Bekman's measured sustained 794.5 TFLOP/s
    assert "matrix peak 989 TFLOP/s" in hw_line and "bandwidth 3.35 TB/s" in hw_line
    assert "run at 794 TFLOP/s (80% of peak, measured)" in hw_line
    assert "{" not in hw_line
