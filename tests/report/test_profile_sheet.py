"""The profile report: sheet.md's measured columns carry their units."""

from __future__ import annotations

from opmap.report.profile_sheet import MEASURED_COLUMNS, render_profile_markdown
from opmap.report.sheet import SHEET_COLUMNS


def test_sheet_md_rates_are_per_second(tiny_profile):
    md = render_profile_markdown(tiny_profile, tiny_profile.to_dict())
    lines = md.splitlines()
    cols = list(SHEET_COLUMNS + MEASURED_COLUMNS)
    head = lines.index("| " + " | ".join(cols) + " |")
    rows = [ln.strip("|").split(" | ") for ln in lines[head + 2:] if ln.startswith("|")]
    flops = [r[cols.index("achieved_flops_per_s")].strip() for r in rows]
    rate = [r[cols.index("achieved_bytes_per_s")].strip() for r in rows]
    measured = [r[cols.index("measured_s")].strip() for r in rows]
    assert any(flops) and all(c.endswith("FLOP/s") for c in flops if c), flops
    assert any(rate) and all(c.endswith("B/s") for c in rate if c), rate
    assert all(c.endswith("s") and not c.endswith("/s") for c in measured if c), measured


def test_negative_profiler_overhead_is_called_noise(tiny_profile):
    from opmap.report.profile_sheet import run_lines

    d = tiny_profile.to_dict()
    d["profiler"] = {**d["profiler"], "overhead": -0.031}
    line = next(x for x in run_lines(tiny_profile, d) if x.startswith("profiler:"))
    assert "overhead -3.1% against the plain loop (within noise: profiled iterations ran faster than the plain " \
           "ones)" in line
    d["profiler"]["overhead"] = 0.2
    line = next(x for x in run_lines(tiny_profile, d) if x.startswith("profiler:"))
    assert "+20.0% against the plain loop," in line and "within noise" not in line
