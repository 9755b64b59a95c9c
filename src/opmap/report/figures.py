"""The dashboard's figures as PNGs (matplotlib, Agg backend), drawn from the same figure specs the HTML page draws
(report.chart.Figure, built by report.dashboard), so the two never disagree: scatter traces (markers, lines or
both; dash and marker symbol kept), grouped or stacked bars, and heatmaps (cells annotated with their text); log
axes and titles as the layout gives them. Plotly's HTML line breaks in titles become newlines; its entities (a run's
``<``, ``>`` and ``&``, written as entities by report.text.plotly_text) the characters again, and a ``$`` is
escaped (matplotlib would read a pair as mathtext).

Every PNG opmap draws carries the text chunk Software = "opmap VERSION" (png_metadata): ``opmap report``
knows by it a PNG it may replace (report.html.made_by_opmap)."""

from __future__ import annotations

import io

from opmap.report.chart import Bar, Figure, Heatmap, Scatter, Title

PNG_SOFTWARE = "opmap"


def png_metadata() -> dict[str, str]:
    """matplotlib's savefig metadata for opmap's PNGs: the Software text chunk names opmap and its version."""
    from opmap import __version__

    return {"Software": f"{PNG_SOFTWARE} {__version__}"}


def png_software(data: bytes) -> str | None:
    """The Software text of PNG ``data`` (its tEXt chunks before the image data), or None."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    i = 8
    while i + 8 <= len(data):
        n, kind = int.from_bytes(data[i:i + 4], "big"), data[i + 4:i + 8]
        if kind in (b"IDAT", b"IEND"):
            return None
        if kind == b"tEXt":
            key, _, value = data[i + 8:i + 8 + n].partition(b"\x00")
            if key == b"Software":
                return value.decode("latin-1")
        i += 12 + n
    return None


DASH = {"solid": "-", "dash": "--", "dot": ":", "longdash": (0, (8, 3)), "dashdot": "-."}
SYMBOL = {"circle": "o", "x": "x", "square": "s", "diamond": "D", "cross": "+"}


def _text(t: Title | str | None) -> str:
    """Plotly text as matplotlib draws it: a title's text, <br> a new line, entities decoded, $ escaped."""
    import html

    if isinstance(t, Title):
        t = t.text
    return html.unescape(str(t or "").replace("<br>", "\n")).replace("$", "\\$")


def _label(t: str | None) -> str | None:
    return None if t is None else _text(t)


def _scatter(ax, t: Scatter) -> None:
    pairs = [(x, y) for x, y in zip(t.x, t.y) if x is not None and y is not None]
    if not pairs:
        return
    xs, ys = zip(*pairs)
    colour = (t.marker.color if t.marker else None) or (t.line.color if t.line else None)
    ax.plot(xs, ys, linestyle=DASH.get(t.line.dash if t.line else "solid", "-") if "lines" in t.mode else "none",
            marker=SYMBOL.get(t.marker.symbol if t.marker else "circle", "o") if "markers" in t.mode else None,
            color=colour, label=_label(t.name), markersize=5, linewidth=1.2)


def _bars(ax, traces: list[Bar], stacked: bool) -> None:
    cats: list[str] = []
    for t in traces:
        cats += [str(c) for c in t.x if str(c) not in cats]
    width = 0.8 if stacked else 0.8 / max(1, len(traces))
    bottom = [0.0] * len(cats)
    for i, t in enumerate(traces):
        vals = dict(zip((str(c) for c in t.x), t.y))
        ys = [vals.get(c) or 0.0 for c in cats]
        pos = [j + (0 if stacked else (i - (len(traces) - 1) / 2) * width) for j in range(len(cats))]
        ax.bar(pos, ys, width=width, bottom=bottom if stacked else None, label=_label(t.name))
        if stacked:
            bottom = [b + y for b, y in zip(bottom, ys)]
    ax.set_xticks(range(len(cats)), [_text(c) for c in cats], rotation=30, ha="right")


def _heatmap(fig, ax, t: Heatmap) -> None:
    import numpy as np

    z = np.array([[np.nan if v is None else v for v in row] for row in t.z], dtype=float)
    im = ax.imshow(z, aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(t.x)), [_text(x) for x in t.x], rotation=30, ha="right")
    ax.set_yticks(range(len(t.y)), [_text(y) for y in t.y])
    for i, row in enumerate(t.text):
        for j, s in enumerate(row):
            ax.text(j, i, _text(s)[:40], ha="center", va="center", fontsize=7, color="white" if np.isnan(z[i, j])
                    or z[i, j] < np.nanmean(z) else "black")
    fig.colorbar(im, ax=ax, label=_text(t.colorbar.title))


def png_bytes(figure: Figure, width_in: float = 8.0, height_in: float = 4.8, dpi: int = 100) -> bytes:
    """One figure (report.chart.Figure) drawn with matplotlib, as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layout = figure.layout
    fig, ax = plt.subplots(figsize=(width_in, height_in))
    try:
        bars = [t for t in figure.data if isinstance(t, Bar)]
        if bars:
            _bars(ax, bars, layout.barmode == "stack")
        for t in figure.data:
            if isinstance(t, Scatter):
                _scatter(ax, t)
            elif isinstance(t, Heatmap):
                _heatmap(fig, ax, t)
        for a, setter_scale, setter_label in ((layout.xaxis, ax.set_xscale, ax.set_xlabel),
                                              (layout.yaxis, ax.set_yscale, ax.set_ylabel)):
            if a.type == "log":
                setter_scale("log")
            setter_label(_text(a.title))
        if layout.yaxis.range:
            ax.set_ylim(*layout.yaxis.range)
        ax.set_title(_text(layout.title), fontsize=10)
        if any(t.name for t in figure.data if not isinstance(t, Heatmap)):
            ax.legend(fontsize=7, loc="best")
        ax.grid(True, which="major", alpha=0.3)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi, metadata=png_metadata())
    finally:
        plt.close(fig)
    return buf.getvalue()
