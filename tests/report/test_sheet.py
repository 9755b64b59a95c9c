"""The analysis sheet: files written as a set with ordinary permissions; the assumption lines."""

from __future__ import annotations

import os
import stat

from opmap.report.sheet import assumption_lines, write_set


def test_written_files_are_readable_by_others_modulo_umask(tmp_path):
    old = os.umask(0o022)
    try:
        paths = write_set(tmp_path / "out", {"a.json": "{}\n", "b.csv": "x\n"})
    finally:
        os.umask(old)
    for p in paths:
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, (p, oct(p.stat().st_mode))
    old = os.umask(0o077)
    try:
        paths = write_set(tmp_path / "private", {"a.json": "{}\n"})
    finally:
        os.umask(old)
    assert stat.S_IMODE(paths[0].stat().st_mode) == 0o600


def test_kernel_table_names_the_anchor_module(analysis_of):
    import io

    from rich.console import Console

    from opmap.report.sheet import print_report

    a = analysis_of("gpt2", 1, 8)
    buf = io.StringIO()
    print_report(a, Console(file=buf, width=400), rows=0)
    text = buf.getvalue()
    kernels = text[text.index("Kernels ("):text.index("Operators:")]
    header = next(x for x in kernels.splitlines() if "┃" in x and " ops " in x)
    assert [c.strip() for c in header.strip("┃│ ").split("┃")][:3] == ["id", "ops", "module"], header
    lm = next(k for k in a.kernel_results if a.results[k.kernel.anchor].node.module == "h.3.attn.c_attn")
    row = next(x for x in kernels.splitlines() if x.strip("│ ").startswith(f"{lm.kernel.id} "))
    assert "h.3.attn.c_attn" in row, row



def test_assumption_lines_render_the_hardware_values(analysis_of):
    a = analysis_of("gpt2", 1, 32, "bf16", "h100-sxm")
    hw_line = next(line for line in assumption_lines(a) if line.startswith("hardware "))
    # H100 SXM datasheet: 989.4 TFLOP/s dense bf16, 3.35 TB/s; Bekman's measured sustained 794.5 TFLOP/s
    assert "matrix peak 989 TFLOP/s" in hw_line and "bandwidth 3.35 TB/s" in hw_line
    assert "run at 794 TFLOP/s (80% of peak, measured)" in hw_line
    assert "{" not in hw_line


def test_si_names_a_figure_that_is_not_finite():
    """si(inf, 's') rendered 'inf s' and si(nan, 'B/s') 'nan B/s', read as values; each is now named."""
    from opmap.report.sheet import si

    assert si(float("inf"), "s") == "not finite (inf)"
    assert si(float("-inf"), "tok/s") == "not finite (-inf)"
    assert si(float("nan"), "B/s") == "not finite (nan)"
    assert si(38.66e9, "FLOP/s") == "38.7 GFLOP/s" and si(2.5e-6, "s") == "2.5 µs"


def test_a_long_table_prints_plain_lines_with_every_row(analysis_of, monkeypatch):
    """Past RICH_ROWS rows the sheet prints fixed-width lines (a rich Table of R1's 64,936 kernels took minutes):
    every kernel and operator still gets its line, the header names the columns, and a module name that carries
    markup or a terminal escape prints as inert text."""
    import io

    from rich.console import Console

    import opmap.report.sheet as sheet

    a = analysis_of("gpt2", 1, 8)
    monkeypatch.setattr(sheet, "RICH_ROWS", 3)
    buf = io.StringIO()
    sheet.print_report(a, Console(file=buf, width=400), rows=0)
    text = buf.getvalue()
    kernels = text[text.index("Kernels ("):text.index("Operators:")].splitlines()
    assert kernels[1].split()[:3] == ["id", "ops", "module"]
    assert len(kernels) == 2 + len(a.kernel_results)
    ops = text[text.index("Operators:"):text.index("Layer types")].splitlines()
    assert len(ops) == 2 + sum(1 for r in a.results if r.cost.kernel)
    lm = next(k for k in a.kernel_results if a.results[k.kernel.anchor].node.module == "h.3.attn.c_attn")
    row = next(x for x in kernels if x.split()[0] == str(lm.kernel.id))
    assert row.split()[2] == "h.3.attn.c_attn", row
    # columns line up: every row's id ends where the header's "id" column ends (right-justified)
    ends = {x.index(x.split()[0]) + len(x.split()[0]) for x in kernels[1:]}
    assert len(ends) == 1, ends

    buf = io.StringIO()
    sheet.print_rows(Console(file=buf, width=80), "t", ("id", "module"), {"id"},
                     [("1", "[bold]x\x1b[31m"), ("22", "y")] * 3)
    lines = buf.getvalue().splitlines()
    assert lines[2] == " 1  [bold]x" and lines[3] == "22  y", lines
    # a cell past PAD_MAX characters runs on in its own row and widens no other: columns stay at most 60 wide
    buf = io.StringIO()
    sheet.print_rows(Console(file=buf), "t", ("module", "bound"), set(), [("m" * 100, "a"), ("n", "b")] * 2)
    lines = buf.getvalue().splitlines()
    assert lines[2] == "m" * 100 + "  a" and lines[3] == "n" + " " * 59 + "  b", lines
