"""The platform trade curve of a fit matrix (fit.json): per workload, each platform as a point of p99 end-to-end
latency (x) against output tokens per second at the SLO (y), its marker's area growing with the energy per token
and its colour the catalog's software-stack risk; the Pareto front (no other platform both faster and higher in
throughput) joined by a line; platforms struck out by a constraint drawn hollow, with the reason in the legend.
Drawn with matplotlib (the ``report`` extra) into PNG bytes; without it, nothing is drawn and the caller says so.
"""

from __future__ import annotations

import importlib.util
import io
from typing import Any

from opmap.report.figures import png_metadata
from opmap.report.text import mpl_text

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
    if not have_matplotlib():
        return None
    cells = [c for c in fit["cells"] if c.get("throughput_at_slo") and c.get("latency_p99_s") is not None]
    if not cells:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    models = [m for m in fit["models"] if any(c["model"] == m for c in cells)]
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(1, len(models), figsize=(6.2 * len(models), 4.6), squeeze=False)
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
            label = f"{c['hardware']} x{c['devices']}"
            if c.get("energy_per_token_j"):
                label += f", {c['energy_per_token_j']:.3g} J/tok"
            if struck:
                label += " (struck: " + c["excluded_reason"][:48] + ")"
            ax.annotate(mpl_text(label), (c["latency_p99_s"], c["throughput_at_slo"]), textcoords="offset points",
                        xytext=(6, 4), fontsize=7)
        if len(front) > 1:
            ax.plot([c["latency_p99_s"] for c in front], [c["throughput_at_slo"] for c in front], "--",
                    color="#424242", linewidth=1, zorder=2)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.margins(0.15)
        ax.set_xlabel("p99 end-to-end latency at the SLO rate (s)")
        ax.set_ylabel("output tokens/s at the SLO")
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
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata=png_metadata())
    plt.close(fig)
    return buf.getvalue()
