"""The dashboard's figures as PNGs (matplotlib, Agg backend), drawn from the same Plotly figure dicts the HTML
page draws (report.dashboard), so the two never disagree: scatter traces (markers, lines or both; dash and
marker symbol kept), grouped or stacked bars, and heatmaps (cells annotated with their text); log axes and
titles as the layout gives them. Plotly's HTML line breaks in titles become newlines; its entities (a run's
``<``, ``>`` and ``&``, written as entities by report.text.plotly_text) the characters again, and a ``$`` is
escaped (matplotlib would read a pair as mathtext).

Every PNG opmap draws carries the text chunk Software = "opmap VERSION" (png_metadata): ``opmap report``
knows by it a PNG it may replace (report.html.made_by_opmap)."""

from __future__ import annotations

import io
from typing import Any

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


def _text(t: Any) -> str:
    """Plotly text as matplotlib draws it: a title dict's text, <br> a new line, entities decoded, $ escaped."""
    import html

    if isinstance(t, dict):
        t = t.get("text", "")
    return html.unescape(str(t or "").replace("<br>", "\n")).replace("$", "\\$")


def _label(t: Any) -> str | None:
    return None if t is None else _text(t)


def _scatter(ax, t: dict[str, Any]) -> None:
    mode = t.get("mode", "markers")
    pairs = [(x, y) for x, y in zip(t.get("x") or [], t.get("y") or []) if x is not None and y is not None]
    if not pairs:
        return
    xs, ys = zip(*pairs)
    line, marker = t.get("line") or {}, t.get("marker") or {}
    colour = marker.get("color") or line.get("color")
    ax.plot(xs, ys, linestyle=DASH.get(line.get("dash", "solid"), "-") if "lines" in mode else "none",
            marker=SYMBOL.get(marker.get("symbol", "circle"), "o") if "markers" in mode else None,
            color=colour, label=_label(t.get("name")), markersize=5, linewidth=1.2)


def _bars(ax, traces: list[dict[str, Any]], stacked: bool) -> None:
    cats: list[str] = []
    for t in traces:
        cats += [str(c) for c in t.get("x") or [] if str(c) not in cats]
    width = 0.8 if stacked else 0.8 / max(1, len(traces))
    bottom = [0.0] * len(cats)
    for i, t in enumerate(traces):
        vals = dict(zip((str(c) for c in t.get("x") or []), t.get("y") or []))
        ys = [vals.get(c) or 0.0 for c in cats]
        pos = [j + (0 if stacked else (i - (len(traces) - 1) / 2) * width) for j in range(len(cats))]
        ax.bar(pos, ys, width=width, bottom=bottom if stacked else None, label=_label(t.get("name")))
        if stacked:
            bottom = [b + y for b, y in zip(bottom, ys)]
    ax.set_xticks(range(len(cats)), [_text(c) for c in cats], rotation=30, ha="right")


def _heatmap(fig, ax, t: dict[str, Any]) -> None:
    import numpy as np

    z = np.array([[np.nan if v is None else v for v in row] for row in t.get("z") or []], dtype=float)
    im = ax.imshow(z, aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(t.get("x") or [])), [_text(x) for x in t.get("x") or []], rotation=30, ha="right")
    ax.set_yticks(range(len(t.get("y") or [])), [_text(y) for y in t.get("y") or []])
    for i, row in enumerate(t.get("text") or []):
        for j, s in enumerate(row):
            ax.text(j, i, _text(s)[:40], ha="center", va="center", fontsize=7, color="white" if np.isnan(z[i, j])
                    or z[i, j] < np.nanmean(z) else "black")
    fig.colorbar(im, ax=ax, label=_text((t.get("colorbar") or {}).get("title")))


def png_bytes(figure: dict[str, Any], width_in: float = 8.0, height_in: float = 4.8, dpi: int = 100) -> bytes:
    """One Plotly figure dict drawn with matplotlib, as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layout = figure.get("layout") or {}
    fig, ax = plt.subplots(figsize=(width_in, height_in))
    try:
        data = figure.get("data") or []
        bars = [t for t in data if t.get("type") == "bar"]
        if bars:
            _bars(ax, bars, layout.get("barmode") == "stack")
        for t in data:
            if t.get("type", "scatter") == "scatter":
                _scatter(ax, t)
            elif t.get("type") == "heatmap":
                _heatmap(fig, ax, t)
        for axis, setter_scale, setter_label in (("xaxis", ax.set_xscale, ax.set_xlabel),
                                                 ("yaxis", ax.set_yscale, ax.set_ylabel)):
            a = layout.get(axis) or {}
            if a.get("type") == "log":
                setter_scale("log")
            setter_label(_text(a.get("title")))
        if (layout.get("yaxis") or {}).get("range"):
            ax.set_ylim(*layout["yaxis"]["range"])
        ax.set_title(_text(layout.get("title")), fontsize=10)
        if any(t.get("name") for t in data if t.get("type") != "heatmap"):
            ax.legend(fontsize=7, loc="best")
        ax.grid(True, which="major", alpha=0.3)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi, metadata=png_metadata())
    finally:
        plt.close(fig)
    return buf.getvalue()
