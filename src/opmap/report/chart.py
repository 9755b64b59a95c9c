"""The dashboard's figures as typed values: a frozen Plotly figure spec (the subset of Plotly's figure schema the
dashboard draws: scatter, bar and heatmap traces, a title and two axes), built by report.dashboard, drawn by
report.html (embedded as Plotly's JSON, ``Figure.to_plotly_json``, the one place it becomes a dict) and by
report.figures (matplotlib PNGs, read from the attributes). Nothing here imports plotly: its schema's names are
kept (``mode``, ``legendgroup``, ``barmode``, ...) so the JSON is Plotly's own.

Every value a run puts in a figure's text has been through report.text.plotly_text before it is stored here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any

SIG_DIGITS = 4  # data in the page is rounded to 4 significant digits: 0.1% is below any figure's resolution


def sig(x: Any, digits: int = SIG_DIGITS) -> Any:
    """``x`` with every float rounded to ``digits`` significant digits (lists, tuples and dicts walked: a list
    back); NaN and infinities become None (JSON has neither)."""
    if isinstance(x, float):
        if not math.isfinite(x):
            return None
        return float(f"{x:.{digits - 1}e}") if x else 0.0
    if isinstance(x, dict):
        return {k: sig(v, digits) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [sig(v, digits) for v in x]
    return x


@dataclass(frozen=True)
class Title:
    """A title (of the figure, an axis or a colour bar): Plotly text, ``<br>`` a line break."""

    text: str


@dataclass(frozen=True)
class Line:
    color: str  # "#rrggbb"
    dash: str = "solid"  # Plotly's: solid, dot, dash, longdash


@dataclass(frozen=True)
class Marker:
    color: str  # "#rrggbb"
    symbol: str = "circle"  # Plotly's: circle, x, ...
    size: int | None = None  # px; None: Plotly's default


Values = tuple[float | None, ...]


@dataclass(frozen=True, kw_only=True)
class Scatter:
    """Points, lines or both (``mode``: markers, lines, lines+markers); None in x or y is a gap."""

    type: str = field(default="scatter", init=False)
    mode: str
    name: str
    legendgroup: str | None = None
    x: Values
    y: Values
    text: tuple[str, ...] | None = None  # hover text, one per point
    line: Line | None = None
    marker: Marker | None = None


@dataclass(frozen=True, kw_only=True)
class Bar:
    """One bar per category of ``x``, grouped or stacked with the figure's other bars (Layout.barmode)."""

    type: str = field(default="bar", init=False)
    name: str
    x: tuple[str, ...]
    y: Values
    text: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ColorBar:
    title: Title


@dataclass(frozen=True, kw_only=True)
class Heatmap:
    """``z[i][j]`` the value of row ``y[i]`` at column ``x[j]`` (None: no value), ``text[i][j]`` its hover text."""

    type: str = field(default="heatmap", init=False)
    x: tuple[str, ...]
    y: tuple[str, ...]
    z: tuple[Values, ...]
    text: tuple[tuple[str, ...], ...]
    colorscale: str
    colorbar: ColorBar
    hovertemplate: str


Trace = Scatter | Bar | Heatmap


@dataclass(frozen=True, kw_only=True)
class Axis:
    type: str | None = None  # "log", or None: linear
    title: Title
    range: tuple[float, float] | None = None  # None: fitted to the data


@dataclass(frozen=True)
class Layout:
    title: Title
    xaxis: Axis
    yaxis: Axis
    barmode: str | None = None  # "group" or "stack" where the figure has bars


@dataclass(frozen=True)
class Figure:
    data: tuple[Trace, ...]
    layout: Layout

    def rounded(self, digits: int = SIG_DIGITS) -> Figure:
        """This figure with every float rounded to ``digits`` significant digits (``sig``): what the page and
        the PNGs draw."""
        return _rounded(self, digits)

    def to_plotly_json(self) -> dict[str, Any]:
        """Plotly's figure JSON (``{"data": [...], "layout": {...}}``): fields in their order, unset (None) ones
        left out, tuples as lists. A bar chart's layout lists the y axis before the x axis (the key order its
        pages have always had: they stay byte-identical)."""
        lay = self.layout
        bars = any(isinstance(t, Bar) for t in self.data)
        axes = (("yaxis", lay.yaxis), ("xaxis", lay.xaxis)) if bars else (("xaxis", lay.xaxis), ("yaxis", lay.yaxis))
        layout = {"title": _plain(lay.title), **({"barmode": lay.barmode} if lay.barmode else {}),
                  **{k: _plain(a) for k, a in axes}}
        return {"data": [_plain(t) for t in self.data], "layout": layout}


def _plain(x: Any) -> Any:
    """A spec value as JSON values: a spec object its set fields in order, a tuple a list."""
    if is_dataclass(x):
        return {f.name: _plain(v) for f in fields(x) if (v := getattr(x, f.name)) is not None}
    if isinstance(x, tuple):
        return [_plain(v) for v in x]
    return x


def _rounded(x: Any, digits: int) -> Any:
    if is_dataclass(x):
        return replace(x, **{f.name: _rounded(getattr(x, f.name), digits) for f in fields(x) if f.init})
    if isinstance(x, tuple):
        return tuple(_rounded(v, digits) for v in x)
    return sig(x, digits) if isinstance(x, float) else x
