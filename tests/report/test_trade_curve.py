"""The fit matrix's trade curve: the Pareto front by hand, the PNG drawn whole."""

from __future__ import annotations

import struct

import pytest

from opmap.report.trade_curve import pareto, risk_level, trade_curve_png


def _cell(hw, lat, tok, excluded="", energy=0.5, risk="low (source)"):
    return {"model": "m", "hardware": hw, "devices": 1, "latency_p99_s": lat, "throughput_at_slo": tok,
            "energy_per_token_j": energy, "excluded_reason": excluded, "risk": risk}


CELLS = [
    _cell("a", 1.0, 100.0),   # on the front: the fastest
    _cell("b", 2.0, 300.0),   # on the front: more throughput for more latency
    _cell("c", 2.5, 250.0),   # dominated by b (faster and more throughput)
    _cell("d", 3.0, 300.0),   # dominated by b (same throughput, slower)
    _cell("e", 4.0, 500.0),   # on the front
    _cell("f", 0.5, 900.0, excluded="over the power budget"),  # struck out: not on the front
    _cell("g", None, None, excluded="does not fit"),
]


def test_pareto_front_by_hand():
    assert [c["hardware"] for c in pareto(CELLS)] == ["a", "b", "e"]


@pytest.mark.parametrize("risk,level", [("low (CUDA, vLLM mainline)", "low"), ({"level": "high", "source": "x"},
                                        "high"), ("not in the catalog", "unknown"), ("medium: ROCm", "medium")])
def test_risk_level(risk, level):
    assert risk_level(risk) == level


def test_png_drawn_whole():
    pytest.importorskip("matplotlib")
    from opmap.report.figures import png_software

    data = trade_curve_png({"models": ["m"], "cells": CELLS})
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", data[16:24])  # IHDR width and height
    assert (w, h) == (round(6.2 * 110), round(4.6 * 110))  # figsize (in) x dpi
    assert png_software(data).startswith("opmap ")  # known as opmap's by opmap report


def test_nothing_to_draw():
    assert trade_curve_png({"models": ["m"], "cells": [CELLS[-1]]}) is None


def test_a_name_with_mathtext_is_drawn_as_text():
    """A fit.json from a folder names its model and platforms: a malformed $...$ pair in one made matplotlib raise
    at the draw (no PNG, a traceback)."""
    pytest.importorskip("matplotlib")
    odd = "$\\frac{1}{$ x"
    cells = [{**c, "model": odd} for c in CELLS[:3]] + [_cell(odd, 1.5, 200.0, excluded="$\\sqrt{$ over budget")]
    cells[-1]["model"] = odd
    data = trade_curve_png({"models": [odd], "cells": cells})
    assert data[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_axes_name_their_units_and_no_two_labels_overlap():
    """Before: every label sat 6, 4 points from its point, so platforms at the same point (h100-sxm and h200 at
    34 ms, 1,800 tokens/s) or near it printed one over the other; and a range inside one decade showed no tick
    label on a log axis (its minor ticks were left unlabelled)."""
    pytest.importorskip("matplotlib")
    from opmap.report.trade_curve import trade_curve_figure

    cells = [_cell("h100-sxm", 0.034, 1800.0), _cell("h200", 0.034, 1800.0), _cell("a100-sxm-80gb", 0.0342, 1790.0),
             _cell("mi300x", 0.042, 1440.0), _cell("l4", 0.0341, 1795.0, excluded="over the 100 W budget")]
    fig = trade_curve_figure({"models": ["m"], "cells": cells})
    (ax,) = fig.axes
    assert ax.get_xlabel().endswith("(s)") and ax.get_ylabel().endswith("(tokens/s)")
    from matplotlib.text import Text

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [Text.get_window_extent(t, renderer) for t in ax.texts]  # the text's box, not the line to its point
    assert len(boxes) == len(cells)
    overlapping = [(ax.texts[i].get_text(), ax.texts[j].get_text()) for i in range(len(boxes))
                   for j in range(i + 1, len(boxes)) if boxes[i].overlaps(boxes[j])]
    assert not overlapping
    for axis in (ax.xaxis, ax.yaxis):
        lo, hi = sorted(axis.get_view_interval())
        shown = [axis.get_major_formatter()(v) for v in axis.get_majorticklocs() if lo <= v <= hi]
        shown += [axis.get_minor_formatter()(v) for v in axis.get_minorticklocs() if lo <= v <= hi]
        assert len([x for x in shown if x]) >= 2, shown
