"""Production-shape validation: does a synthetic run's kernel stand for the production workload's kernels?

A win measured on a synthetic slice (a bare GEMM, one attention call) carries over to production only through
the production kernels that behave like it. Both runs are read from the store, kernel by kernel; each kernel gets
a class (GEMM, convolution, attention, elementwise, else its aten op) and its arithmetic intensity (FLOPs over
the bytes the run recorded for it). A production kernel is **represented** by the synthetic run when the
synthetic run has a kernel of the same class with the same bound class and an intensity within a factor
``INTENSITY_TOLERANCE`` of its own: the same side of the ridge, in the same regime of the roofline, so a tiling,
format or fusion change that moves one moves the other.

Per class: the production kernels' count and share of the production time, the share of that time represented,
the time-weighted 10th / 50th / 90th percentile of their intensity beside the synthetic kernels' range, their
bound mix, and a verdict: ``carries over`` (at least ``CARRIES`` of the class's time represented), ``partly``
(at least ``PARTLY``), ``does not carry over``. With a synthetic comparison (runs A and B, A the one checked) the
synthetic class's change is scaled to production: the expected change of the production total is the sum over
classes of (the class's relative change on the synthetic pair) x (the represented production time) / (the
production total): Amdahl's bound on what the synthetic win can buy, and nothing for the unrepresented part.

Times are the measured ones where a run measured every kernel, else the predicted ones. Runs on different
hardware or precision are refused (a shape that is compute-bound on one device can be memory-bound on another)
unless forced.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opmap.errors import OpmapError
from opmap.ops import CONV_OPS, GEMM_OPS, POINTWISE_OPS, packet
from opmap.record import key

if TYPE_CHECKING:
    from opmap.store.comparison import Comparison

INTENSITY_TOLERANCE = 2.0  # a factor either way: within one octave of the synthetic kernel's FLOP/byte
CARRIES = 0.8
PARTLY = 0.2
MUST_MATCH = ("hardware", "precision")
_GEMM_LIKE = GEMM_OPS | {"matmul", "linear", "_scaled_mm", "addbmm", "mv", "dot"}


@dataclass(frozen=True)
class ClassCheck:
    """One kernel class: the synthetic run's kernels of it (count, bound classes, intensity range FLOP/B), the
    production run's (count, share of the production time, time-weighted p10 / p50 / p90 intensity, bound mix as
    shares of the class's time), how much of it the synthetic kernels represent, the verdict, and where a
    synthetic comparison was given, its change and what it buys in production (None: not given, and not
    written). Its record is a row of the check's ``classes``."""

    name: str = field(metadata=key("class"))
    synthetic_kernels: int
    synthetic_bound: tuple[str, ...]
    synthetic_intensity: tuple[float, float] | None
    production_kernels: int
    production_share: float
    represented_kernels: int
    represented_share_of_class: float
    represented_share_of_total: float
    production_intensity_p10_p50_p90: tuple[float | None, ...]
    production_bound_mix: tuple[tuple[str, float], ...] = field(metadata=key(mapping=True))
    verdict: str
    synthetic_change: float | None = field(default=None, metadata=key(omit="none"))
    expected_production_change: float | None = field(default=None, metadata=key(omit="none"))


@dataclass(frozen=True)
class Times:
    """Whether each run's times are "measured" or "predicted"."""

    synthetic: str
    production: str


@dataclass(frozen=True)
class ShapeCheck:
    """Does the synthetic run stand for the production run, class by class (module docstring). Its record is the
    check as ``opmap compare --production --json`` prints it and the store records it."""

    synthetic: str
    production: str
    forced_tags: tuple[str, ...]
    times: Times
    rule: str
    classes: tuple[ClassCheck, ...]
    # None: no synthetic comparison given (and not written)
    expected_production_change: float | None = field(metadata=key(omit="none"))


def kernel_class(name: str | None) -> str:
    """The class a kernel row belongs to, from its anchor op (``aten.addmm.default@h.0.mlp`` -> ``gemm``)."""
    op = packet((name or "").split("@", 1)[0])
    if op in _GEMM_LIKE:
        return "gemm"
    if op in CONV_OPS or op.startswith("conv"):
        return "conv"
    if "attention" in op:
        return "attention"
    if op.rstrip("_") in POINTWISE_OPS:
        return "elementwise"
    return op or "-"


def _rows(con, run_id: str) -> tuple[list[dict[str, Any]], str]:
    rows = con.execute("SELECT idx, name, flops, bytes, bound, predicted_s, measured_s FROM kernels "
                       "WHERE run_id = ? ORDER BY idx", [run_id]).fetchall()
    ks = [dict(zip(("idx", "name", "flops", "bytes", "bound", "predicted_s", "measured_s"), r)) for r in rows]
    measured = bool(ks) and all(k["measured_s"] is not None for k in ks)
    for k in ks:
        k["t"] = (k["measured_s"] if measured else k["predicted_s"]) or 0.0
        k["class"] = kernel_class(k["name"])
        k["intensity"] = k["flops"] / k["bytes"] if k["flops"] and k["bytes"] else None
    return ks, "measured" if measured else "predicted"


def _represents(s: dict[str, Any], p: dict[str, Any]) -> bool:
    if s["class"] != p["class"] or s["bound"] != p["bound"]:
        return False
    if s["intensity"] is None or p["intensity"] is None:
        return s["intensity"] is None and p["intensity"] is None  # neither does arithmetic: same regime
    return abs(math.log(s["intensity"] / p["intensity"])) <= math.log(INTENSITY_TOLERANCE)


def _weighted_quantiles(pairs: list[tuple[float, float]], qs=(0.1, 0.5, 0.9)) -> list[float | None]:
    """Time-weighted quantiles of (value, weight) pairs: the smallest value whose cumulative weight reaches q."""
    pairs = sorted((v, w) for v, w in pairs if v is not None)
    total = sum(w for _, w in pairs)
    if not pairs or total <= 0:
        return [None for _ in qs]
    out = []
    for q in qs:
        acc = 0.0
        for v, w in pairs:
            acc += w
            if acc >= q * total - 1e-15:
                out.append(v)
                break
    return out


def production_check(synth_id: str, prod_id: str, path: Path | None = None, force: bool = False,
                     synthetic_change: dict[str, float] | None = None) -> ShapeCheck:
    """Which of the production run's kernels the synthetic run stands for, class by class (module docstring).

    ``synthetic_change``: each class's relative time change on a synthetic comparison (B over A, minus one), to
    be carried to production."""
    from opmap.store.reading import open_read, show_run

    s, p = show_run(synth_id, path), show_run(prod_id, path)
    differ = [t for t in MUST_MATCH if s.tags.get(t) != p.tags.get(t)]
    if differ and not force:
        raise OpmapError("the synthetic and production runs differ in "
                         + ", ".join(f"{t} ({s.tags.get(t)} vs {p.tags.get(t)})" for t in differ)
                         + ": a shape's regime depends on both (--force to check anyway)")
    con = open_read(path)
    try:
        sk, s_times = _rows(con, synth_id)
        pk, p_times = _rows(con, prod_id)
    finally:
        con.close()
    if not sk or not pk:
        raise OpmapError(f"run {synth_id if not sk else prod_id} has no kernel rows: record an analyze or profile "
                         "run to validate shapes against")
    p_total = sum(k["t"] for k in pk)
    by_class: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for k in pk:
        by_class[k["class"]].append(k)
    s_by_class: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for k in sk:
        s_by_class[k["class"]].append(k)
    classes = [_class_check(cls, synth, by_class.get(cls, []), p_total, synthetic_change)
               for cls, synth in sorted(s_by_class.items(), key=lambda kv: -sum(k["t"] for k in kv[1]))]
    expected = 0.0
    for c in classes:
        if c.expected_production_change is not None:
            expected += c.expected_production_change
    rule = (f"same class and bound, intensity within x{INTENSITY_TOLERANCE:g}; carries over >= {CARRIES:.0%} of the "
            f"class's production time, partly >= {PARTLY:.0%}")
    return ShapeCheck(synth_id, prod_id, tuple(differ), Times(s_times, p_times), rule, tuple(classes),
                      expected if synthetic_change is not None else None)


def _class_check(cls: str, synth: list[dict[str, Any]], prod: list[dict[str, Any]], p_total: float,
                 synthetic_change: dict[str, float] | None) -> ClassCheck:
    """One class's check: its production kernels the synthetic ones represent, and the change carried over."""
    t_cls = sum(k["t"] for k in prod)
    rep = [k for k in prod if any(_represents(x, k) for x in synth)]
    t_rep = sum(k["t"] for k in rep)
    frac = t_rep / t_cls if t_cls else 0.0
    verdict = ("not in production" if not prod else "carries over" if frac >= CARRIES else
               "partly" if frac >= PARTLY else "does not carry over")
    bounds: dict[str, float] = defaultdict(float)
    for k in prod:
        bounds[k["bound"] or "-"] += k["t"] / t_cls if t_cls else 0.0
    s_int = [k["intensity"] for k in synth if k["intensity"] is not None]
    share_of_total = t_rep / p_total if p_total else 0.0
    change = synthetic_change.get(cls) if synthetic_change is not None else None
    return ClassCheck(cls, len(synth), tuple(sorted({k["bound"] or "-" for k in synth})),
                      (min(s_int), max(s_int)) if s_int else None, len(prod), t_cls / p_total if p_total else 0.0,
                      len(rep), frac, share_of_total,
                      tuple(_weighted_quantiles([(k["intensity"], k["t"]) for k in prod])),
                      tuple(sorted(bounds.items(), key=lambda kv: -kv[1])), verdict, change,
                      None if change is None else change * share_of_total)


def class_changes(comparison: Comparison) -> dict[str, float]:
    """Each kernel class's relative time change (B over A, minus one) from a ``compare`` result's kernel pairs."""
    a: dict[str, float] = defaultdict(float)
    b: dict[str, float] = defaultdict(float)
    for k in comparison.kernels:
        c = kernel_class(k.name)
        a[c] += k.a_s or 0.0
        b[c] += k.b_s or 0.0
    return {c: b[c] / a[c] - 1 for c in a if a[c] > 0}
