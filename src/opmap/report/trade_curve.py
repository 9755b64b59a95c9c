"""The platform trade curve of a fit matrix (fit.json): per workload, each platform as a point of p99 end-to-end
latency (x) against output tokens per second at the SLO (y), its marker's area growing with the energy per token
and its colour the catalog's software-stack risk; the Pareto front (no other platform both faster and higher in
throughput) joined by a line; platforms struck out by a constraint drawn hollow, with the reason in the legend.
Drawn with matplotlib (the ``report`` extra) into PNG bytes; without it, nothing is drawn and the caller says so.
"""

from __future__ import annotations

import importlib.util
import io
import math
from typing import Any

from opmap.report.figures import png_metadata
from opmap.report.text import mpl_text

DPI = 110
RISK_COLOURS = {"low": "#2e7d32", "medium": "#ef6c00", "high": "#c62828"}


def risk_level(risk: Any) -> str:
    """The level of a cell's ``risk`` (a dict with ``level``, or a string starting with it); else "unknown"."""
    if isinstance(risk, dict):
        risk = risk.get("level", "")
    word = str(risk or "").split(" ", 1)[0].split(":", 1)[0].strip().lower()
    return word if word in RISK_COLOURS else "unknown"


def pareto(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cells no other cell dominates (latency no higher and throughput no lower, one of them strictly),
    among cells with a throughput and a latency and no exclusion; sorted by latency."""
    ok = [c for c in cells if c.get("throughput_at_slo") and c.get("latency_p99_s") is not None
          and not c.get("excluded_reason")]

    def dominated(c: dict[str, Any]) -> bool:
        return any(o is not c and o["latency_p99_s"] <= c["latency_p99_s"]
                   and o["throughput_at_slo"] >= c["throughput_at_slo"]
                   and (o["latency_p99_s"] < c["latency_p99_s"] or o["throughput_at_slo"] > c["throughput_at_slo"])
                   for o in ok)

    return sorted((c for c in ok if not dominated(c)), key=lambda c: c["latency_p99_s"])


def have_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def trade_curve_png(fit: dict[str, Any]) -> bytes | None:
    """The trade curve of ``fit`` (the fit.json body) as PNG bytes (written with the rest of the set by
    report.outputs.write_set), or None when matplotlib is not installed or no cell has a throughput to draw."""
    fig = trade_curve_figure(fit)
    if fig is None:
        return None
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata=png_metadata())
    plt.close(fig)
    return buf.getvalue()


def trade_curve_figure(fit: dict[str, Any]):
    """The matplotlib figure of the trade curve (see the module docstring): axes titled with their units, tick
    labels on both axes however narrow the range (a log axis within one decade has no major tick: its minor
    ticks are labelled), each point's label moved clear of every other label (``_spread``) and tied to its point
    by a thin line where moved; None without matplotlib or a cell to draw."""
    if not have_matplotlib():
        return None
    cells = [c for c in fit["cells"] if c.get("throughput_at_slo") and c.get("latency_p99_s") is not None]
    if not cells:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, NullFormatter

    models = [m for m in fit["models"] if any(c["model"] == m for c in cells)]
    fig, axes = plt.subplots(1, len(models), figsize=(6.2 * len(models), 4.6), squeeze=False, dpi=DPI)
    labels = []
    for ax, m in zip(axes[0], models, strict=True):
        mine = [c for c in cells if c["model"] == m]
        front = pareto(mine)
        e_max = max([c["energy_per_token_j"] for c in mine if c.get("energy_per_token_j")] or [1.0])
        for c in mine:
            colour = RISK_COLOURS.get(risk_level(c.get("risk")), "#757575")
            size = 40 + 400 * (c.get("energy_per_token_j") or 0.0) / e_max
            struck = bool(c.get("excluded_reason"))
            on_front = any(f is c for f in front)
            ax.scatter([c["latency_p99_s"]], [c["throughput_at_slo"]], s=size,
                       facecolors="none" if struck else colour, edgecolors="black" if on_front else colour,
                       linewidths=1.5, zorder=3)
            label = f"{c['hardware']} x{c.get('devices')}"
            if c.get("energy_per_token_j"):
                label += f", {c['energy_per_token_j']:.3g} J/tok"
            if struck:
                label += " (struck: " + c["excluded_reason"][:48] + ")"
            labels.append(ax.annotate(  # beside the marker (its area s points^2: radius sqrt(s) / 2), above it
                mpl_text(label), (c["latency_p99_s"], c["throughput_at_slo"]), textcoords="offset points",
                xytext=(size ** 0.5 / 2 + 3, 0), va="center", fontsize=7, zorder=4,
                bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.75}))
        if len(front) > 1:
            ax.plot([c["latency_p99_s"] for c in front], [c["throughput_at_slo"] for c in front], "--",
                    color="#424242", linewidth=1, zorder=2)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.margins(0.15)
        for axis, lim in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):  # plain numbers, not 10^x
            axis.set_major_formatter(FuncFormatter(_tick))
            # a range within a decade or so has one major tick or none: its minor ticks are labelled too
            axis.set_minor_formatter(FuncFormatter(_tick) if math.log10(lim[1] / lim[0]) < 1.5 else NullFormatter())
        ax.set_xlabel("p99 end-to-end latency at the SLO rate (s)")
        ax.set_ylabel("output throughput at the SLO rate (tokens/s)")
        ax.set_title(mpl_text(m))
        ax.grid(True, which="both", alpha=0.3)
    handles = [Line2D([], [], marker="o", linestyle="", color=col, label=f"software risk {lvl}")
               for lvl, col in RISK_COLOURS.items()]
    handles.append(Line2D([], [], marker="o", linestyle="", color="#757575", label="risk not in the catalog"))
    handles += [Line2D([], [], marker="o", linestyle="", markerfacecolor="none", color="#757575",
                       label="struck out by a constraint"),
                Line2D([], [], marker="o", linestyle="--", color="#424242", markerfacecolor="none",
                       markeredgecolor="black", label="Pareto front (black edge)")]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=7, frameon=False,
               title="marker area grows with energy per token (J), per workload", title_fontsize=7)
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    _spread(fig, labels)
    return fig


def _tick(v: float, _pos=None) -> str:
    """A tick's value in plain figures: 0.034, 1,800, 250,000."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _spread(fig, labels: list) -> None:
    """Move each point label down, a line at a time, until its text overlaps no label placed before it (labels
    taken top to bottom, left to right), and tie a moved label to its point with a thin line. Run once the
    layout is final: the boxes are measured as drawn (the text's own box, not the line to its point)."""
    from matplotlib.patches import FancyArrowPatch
    from matplotlib.text import Text

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()

    def box(t):
        return Text.get_window_extent(t, renderer)

    placed = []
    for t in sorted(labels, key=lambda t: (-box(t).y1, box(t).x0)):
        x, y = t.xyann
        moved = False
        for _ in range(4 * len(labels) + 1):
            if not any(box(t).expanded(1.0, 1.1).overlaps(b) for b in placed):
                break
            y -= t.get_fontsize() + 1.5
            t.xyann = (x, y)
            moved = True
        placed.append(box(t))
        if moved:  # as Annotation(arrowprops=...) makes it
            t.arrowprops = {"arrowstyle": "-", "linewidth": 0.5, "color": "#9e9e9e"}
            t._arrow_relpos = (0.0, 0.5)
            t.arrow_patch = FancyArrowPatch((0, 0), (1, 1), **t.arrowprops)
            t.arrow_patch.set_figure(fig)
