"""Measured efficiency curves from a calibration, as the time model reads them.

A calibrated hardware profile carries, under ``[calibration]``, rates measured at many problem shapes:
GEMMs in the layout ``nn.Linear`` runs (``x @ W.T``), convolutions as implicit GEMMs, fused attention,
bandwidth over transfer sizes. ``Curves`` turns them into lookups:

- ``matrix_rate(problem, dtype)``: per family (``gemm``: x @ W.T; ``gemm_ta``: the left operand a
  transposed view, as in MLP-Mixer's token mixing; ``gemm_wgrad``: a weight gradient, x.T @ dy, falling back
  to gemm_ta; ``conv``; ``conv_bwd``: convolution_backward;
  ``attention``), inverse-distance weighting (power 2) over the 4 nearest measured shapes in log2 (m, n, k)
  space; an exact hit returns that shape's rate; outside the grid the nearest shapes decide (no extrapolated
  growth). A batched GEMM is looked up as (batch * m, n, k). A catalog device may instead carry a whole measured
  grid (``gemm_grid``: a JSON file beside its TOML, per format the M, N and K axes and the time at every point):
  there the rate is interpolated trilinearly in log2 shape and log rate between the 8 surrounding points,
  clamped to the grid's edges. A GEMM at least as large in m, n and k as its
  format's measured ceiling (calibrate: one large square GEMM per format, timed interleaved) runs at least at
  that ceiling's rate: the dispatched kernel's sustained rate, not a blend of the smaller shapes around it.
- ``decode_attention``: a catalog device's measured decode attention times per head configuration
  (``attention_grid``: a JSON file beside its TOML; opmap.hardware.attention_grid), which price a one-query
  fused attention call (opmap.mapping.tilers' flash_attention).
- ``dropout_slowdown(problem)``: how much longer the selected attention kernel runs when it drops scores (a
  training call with ``dropout_p`` above 0) than its measured no-dropout rows say: the ``attention_dropout`` row
  naming that kernel (``{ kernel = "cudnn", factor = 1.03 }``, time with dropout over time without, measured the
  two interleaved; a row naming no kernel where none does), 1 where none is measured (the dropout then costs
  nothing on a measured curve; the analysis says so).
- ``bandwidth(nbytes)``: piecewise-linear in log2(size) over the copy curve, with the dispatch overhead
  taken out of each measured point (the time model adds it back once per kernel); the last point holds
  beyond the grid.
- ``transcendental_per_s``: evaluations per second of exp / tanh / erf, measured, replacing the assumed
  TRANSCENDENTAL_SLOTS; ``vector_kinds``: per vector family (softmax, layer_norm, batch_norm, pool,
  reduce) the cost rule's FLOPs per second measured on a representative op, transcendentals included in
  the time (max pooling with indices, for one, runs far below the pointwise rate on CPUs);
  ``view_overhead_s``: the host cost of one view op (eager dispatch on the CPU).

A catalog device without a calibration has no curves: the time model uses its datasheet peaks.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from opmap.errors import OpmapError
from opmap.hardware.attention_grid import GRID_NAME as ATTENTION_GRID_NAME
from opmap.hardware.attention_grid import AttentionGrid, load_attention_grid
from opmap.hardware.comm_grid import COMM_NAME
from opmap.hardware.grid_file import CATALOG_DIR, check_grid_name, name_pattern, read_tables
from opmap.hardware.moe_grid import MOE_GRID_NAME
from opmap.ops import MatrixFamily, MatrixProblem
from opmap.validate import finite_number, shown

NEAREST = 4
# Plausibility ceilings of a device's rates (a hardware TOML, a calibration's rows): a finite value far past any
# device is a typo (a peak of 1e308 priced a TTFT of 5.654e+293 ms without a word). The fastest devices published:
# NVIDIA GB300 about 15 PFLOP/s dense fp4 (a GPU), Cerebras WSE-3 125 PFLOP/s and 21 PB/s of on-wafer SRAM (a
# wafer); the ceilings sit 8x and 5x above the wafer. The floors are slower than any device memory or link (a
# MB/s) or any processor opmap could map a network onto (a MFLOP/s); the catalog's smallest are 3e12 and 3e9.
MAX_FLOPS_PER_S = 1e18
MAX_BYTES_PER_S = 1e17
MIN_FLOPS_PER_S = MIN_BYTES_PER_S = 1e6
# A fused attention kernel's time with dropout over without: published factors are 1.03 to 1.8 (NeMo, Megatron-Core
# 2024); past 100 the figure is a typo, not a kernel
MAX_DROPOUT_FACTOR = 100.0
GRID_DIR = CATALOG_DIR  # where a catalog device's gemm_grid file lives
GRID_NAME = name_pattern("gemm.json")
KERNEL_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")


def attention_kernels(cal: dict[str, Any]) -> tuple[str, ...]:
    """The attention kernels a calibration's rows name (``kernel = "cudnn"``, ``"fa2"``, ...), sorted."""
    return tuple(sorted({r["kernel"] for r in cal.get("attention", []) if isinstance(r, dict) and
                         isinstance(r.get("kernel"), str)}))


def selected_attention_kernel(cal: dict[str, Any]) -> str | None:
    """The attention kernel whose rows price fused attention: ``attention_kernel`` where set, else None (every
    row counts: a calibration measures the one kernel its machine dispatches)."""
    k = cal.get("attention_kernel")
    return k if isinstance(k, str) else None


@dataclass(frozen=True)
class AttentionDropout:
    """A measured ``attention_dropout`` row of a calibration: the attention kernel's time with dropout over its time
    without (``factor``), and where that was measured (``source``; empty where the row names none)."""

    factor: float
    source: str = ""


def attention_dropout_row(cal: dict[str, Any]) -> AttentionDropout | None:
    """The ``attention_dropout`` row that prices the calibration's attention kernel: the one naming the selected
    kernel, else the one naming none (a calibration's own measurement of the one kernel its machine runs); None
    where none is measured."""
    kernel = selected_attention_kernel(cal)
    rows = [r for r in cal.get("attention_dropout", []) if isinstance(r, dict)]
    row = next((r for r in rows if kernel is not None and r.get("kernel") == kernel),
               next((r for r in rows if "kernel" not in r), None))
    return None if row is None else AttentionDropout(float(row["factor"]), str(row.get("source") or ""))


def attention_dropout_factor(cal: dict[str, Any]) -> float | None:
    """The measured time-with-dropout over time-without of the attention kernel the calibration prices (its
    ``attention_dropout_row``); None where none is measured."""
    row = attention_dropout_row(cal)
    return row.factor if row is not None else None

# The rows of a calibration's curves: table -> (shape keys, integers >= 1; text keys; rate key, finite >= 0)
ROWS: dict[str, tuple[tuple[str, ...], tuple[str, ...], str]] = {
    "matmul": (("m", "n", "k"), ("dtype",), "flops_per_s"),
    "conv": (("m", "n", "k"), ("dtype",), "flops_per_s"),
    "attention": (("sq", "sk", "d"), ("dtype",), "flops_per_s"),
    "bandwidth": (("bytes",), ("kind",), "bytes_per_s"),
}


def _finite_everywhere(x: Any, where: str) -> None:
    if isinstance(x, float):
        finite_number(x, where)
    elif isinstance(x, dict):
        for k, v in x.items():
            _finite_everywhere(v, f"{where}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            _finite_everywhere(v, f"{where}[{i}]")


def check_calibration(cal: dict[str, Any], where: str = "calibration") -> None:
    """Refuse a ``[calibration]`` table the curves cannot be built from, in one line naming the field: a row
    without its shape, dtype or rate, a shape that is not a positive integer, a rate that is negative, NaN or
    infinite (any float in the table must be finite)."""
    _finite_everywhere(cal, where)
    for table, (dims, texts, rate) in ROWS.items():
        rows = cal.get(table, [])
        if not isinstance(rows, list):
            raise OpmapError(f"{where}.{table} must be an array of tables (got {shown(rows)})")
        for i, r in enumerate(rows):
            at = f"{where}.{table}[{i}]"
            if not isinstance(r, dict):
                raise OpmapError(f"{at} must be a table (got {shown(r)})")
            for k in (*dims, *texts, rate):
                if k not in r:
                    raise OpmapError(f"{at}: missing {k} (a row needs {', '.join((*dims, *texts, rate))})")
            for k in dims:
                finite_number(r[k], f"{at}.{k}", lo=1, integer=True)
            for k in texts:
                if not isinstance(r[k], str):
                    raise OpmapError(f"{at}.{k} must be a string (got {shown(r[k])})")
            # a copy's time is bytes / rate: a zero rate means nothing there; elsewhere 0 marks a failed shape
            bw = table == "bandwidth"
            finite_number(r[rate], f"{at}.{rate}", lo=0, lo_open=bw, hi=MAX_BYTES_PER_S if bw else MAX_FLOPS_PER_S,
                          unit="B/s" if bw else "FLOP/s")
    for key in ("vector_rates", "vector_kinds"):
        rates = cal.get(key, {})
        if not isinstance(rates, dict):
            raise OpmapError(f"{where}.{key} must be a table (got {shown(rates)})")
        for k, v in rates.items():
            finite_number(v, f"{where}.{key}.{k}", lo=0, hi=MAX_FLOPS_PER_S)
    for key, pattern, example in (("gemm_grid", GRID_NAME, "h100-sxm.gemm.json"),
                                  ("attention_grid", ATTENTION_GRID_NAME, "b200.attn.json"),
                                  ("moe_grid", MOE_GRID_NAME, "b200.moe.json"),
                                  ("comm_grid", COMM_NAME, "h100-sxm.comm.json")):
        if key in cal:
            check_grid_name(cal[key], key, pattern, example, where)
    if "view_overhead_s" in cal:
        finite_number(cal["view_overhead_s"], f"{where}.view_overhead_s", lo=0, hi=1, unit="s")
    for i, r in enumerate(cal.get("attention", [])):
        if "kernel" in r and not (isinstance(r["kernel"], str) and KERNEL_NAME.fullmatch(r["kernel"])):
            raise OpmapError(f"{where}.attention[{i}].kernel must name a kernel in lower case, such as 'cudnn' or "
                             f"'fa2' (got {shown(r['kernel'])})")
    rows = cal.get("attention_dropout", [])
    if not isinstance(rows, list):
        raise OpmapError(f"{where}.attention_dropout must be an array of tables (got {shown(rows)})")
    for i, r in enumerate(rows):
        at = f"{where}.attention_dropout[{i}]"
        if not isinstance(r, dict) or "factor" not in r:
            raise OpmapError(f"{at} must be a table with a factor (time with dropout over time without) and the "
                             f"kernel it was measured on (got {shown(r)})")
        finite_number(r["factor"], f"{at}.factor", lo=1, hi=MAX_DROPOUT_FACTOR)
        if "kernel" in r and r["kernel"] not in attention_kernels(cal):
            raise OpmapError(f"{at}.kernel {shown(r['kernel'])} names no measured attention rows; accepted: "
                             f"{', '.join(attention_kernels(cal)) or 'none (no row names a kernel)'}")
        if any(q.get("kernel") == r.get("kernel") for q in rows[:i] if isinstance(q, dict)):
            raise OpmapError(f"{at}: a second row for kernel {shown(r.get('kernel', '(none named)'))}; one row a "
                             "kernel")
    if "attention_kernel" in cal:
        k, named = cal["attention_kernel"], attention_kernels(cal)
        if k not in named:
            raise OpmapError(f"{where}.attention_kernel {shown(k)} names no measured attention rows; accepted: "
                             f"{', '.join(named) or 'none (no row names a kernel)'}")


@dataclass(frozen=True)
class RateTable:
    points: tuple[tuple[float, float, float, float], ...]  # log2 m, log2 n, log2 k, rate
    ceiling: tuple[int, int, int, float] | None = None  # m, n, k, rate of the format's ceiling shape

    @staticmethod
    def build(rows: list[tuple[int, int, int, float]]) -> RateTable:
        return RateTable(tuple((math.log2(max(m, 1)), math.log2(max(n, 1)), math.log2(max(k, 1)), r)
                               for m, n, k, r in rows if r > 0))

    @property
    def size(self) -> int:
        return len(self.points)

    def rate(self, m: int, n: int, k: int) -> float | None:
        if not self.points:
            return None
        c = self.ceiling
        ceiling = c[3] if c is not None and m >= c[0] and n >= c[1] and k >= c[2] else 0.0
        q = (math.log2(max(m, 1)), math.log2(max(n, 1)), math.log2(max(k, 1)))
        dist = sorted((math.dist(q, p[:3]), p[3]) for p in self.points)[:NEAREST]
        if dist[0][0] < 1e-9:
            return max(dist[0][1], ceiling)
        w = [1.0 / d ** 2 for d, _ in dist]
        return max(sum(wi * r for wi, (_, r) in zip(w, dist)) / sum(w), ceiling)


@dataclass(frozen=True)
class GridTable:
    """Rates measured at every point of an M x N x K grid: log2 axes, log rates M-major (then N, then K)."""

    axes: tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]
    log_rates: tuple[float, ...]

    @property
    def size(self) -> int:
        return len(self.log_rates)

    def rate(self, m: int, n: int, k: int) -> float:
        idx, frac = [], []
        for ax, v in zip(self.axes, (m, n, k)):
            x = min(max(math.log2(max(v, 1)), ax[0]), ax[-1])
            i = min(max(bisect.bisect_right(ax, x) - 1, 0), len(ax) - 2) if len(ax) > 1 else 0
            idx.append(i)
            frac.append((x - ax[i]) / (ax[i + 1] - ax[i]) if len(ax) > 1 else 0.0)
        nn, nk = len(self.axes[1]), len(self.axes[2])
        acc = 0.0
        for dm in (0, 1):
            wm = frac[0] if dm else 1.0 - frac[0]
            if not wm:
                continue
            for dn in (0, 1):
                wn = wm * (frac[1] if dn else 1.0 - frac[1])
                if not wn:
                    continue
                base = ((idx[0] + dm) * nn + idx[1] + dn) * nk + idx[2]
                lo = self.log_rates[base]
                acc += wn * (lo + frac[2] * (self.log_rates[base + 1] - lo) if frac[2] else lo)
        return math.exp(acc)


def _axis(v: Any, where: str) -> list[int]:
    if not isinstance(v, list) or not v or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in v) \
            or any(b <= a for a, b in zip(v, v[1:])):
        raise OpmapError(f"{where} must be a non-empty list of increasing positive integers (got {shown(v)})")
    return v


@lru_cache(maxsize=16)
def load_gemm_grid(name: str) -> dict[str, GridTable]:
    """A catalog device's measured GEMM grid by format (module docstring), read once per process. Parsed, never
    executed; one line naming the problem when the file is malformed."""
    raw, tables = read_tables(GRID_DIR, name, GRID_NAME, "GEMM grid", "aiconfigurator_gemm.py or aiter_gemm.py", dict,
                              "a table per format")
    out: dict[str, GridTable] = {}
    for fmt, t in tables.items():
        at = f"GEMM grid {name}: tables.{fmt}"
        if not isinstance(t, dict):
            raise OpmapError(f"{at} must be an object (got {shown(t)})")
        m, n, k = (_axis(t.get(a), f"{at}.{a}") for a in ("m", "n", "k"))
        lat = t.get("latency_us")
        if not isinstance(lat, list) or len(lat) != len(m) * len(n) * len(k):
            raise OpmapError(f"{at}.latency_us must list {len(m) * len(n) * len(k)} times (M x N x K, M-major)")
        rates = []
        i = 0
        for mm in m:
            for nn in n:
                for kk in k:
                    finite_number(lat[i], f"{at}.latency_us[{i}]", lo=0, lo_open=True)
                    rates.append(math.log(2.0 * mm * nn * kk / (lat[i] * 1e-6)))
                    i += 1
        out[fmt] = GridTable(tuple(tuple(math.log2(x) for x in a) for a in (m, n, k)), tuple(rates))
    aliases = raw.get("aliases") or {}
    if not isinstance(aliases, dict):
        raise OpmapError(f"GEMM grid {name}: aliases must map a format to a table's (got {shown(aliases)})")
    for alias, target in aliases.items():
        if target not in out:
            raise OpmapError(f"GEMM grid {name}: alias {alias} -> {target!r} names no table")
        out[alias] = out[target]
    return out


@dataclass(frozen=True)
class Curves:
    tables: dict[tuple[MatrixFamily, str], RateTable | GridTable] = field(default_factory=dict)  # (family, dtype)
    bandwidth_points: tuple[tuple[float, float], ...] = ()  # (log2 bytes moved, bytes/s), sorted
    transcendental_per_s: float | None = None
    view_overhead_s: float = 0.0
    source: str = ""
    vector_kinds: dict[str, float] = field(default_factory=dict)  # family -> rule FLOPs per second
    # (log2 bytes, extra seconds per byte) of writing into a freshly allocated output instead of a reused one
    fresh_page_points: tuple[tuple[float, float], ...] = ()
    # the priced attention kernel's time with dropout over its time without (1: none measured)
    attention_dropout: float = 1.0
    # measured decode attention times by head configuration (a catalog device's ``attention_grid``), or None
    decode_attention: AttentionGrid | None = None

    @property
    def empty(self) -> bool:
        return not self.tables and not self.bandwidth_points

    def matrix_rate(self, problem: MatrixProblem | None, dtype: str) -> float | None:
        if problem is None:
            return None
        family = problem.family
        table = self.tables.get((family, dtype))
        up = family.parent
        while table is None and up is not None:  # a weight gradient reads gemm_ta's curve, then gemm's
            table, up = self.tables.get((up, dtype)), up.parent
        if table is None:
            return None
        batched = (MatrixFamily.GEMM, MatrixFamily.GEMM_TA, MatrixFamily.GEMM_WGRAD)
        m = problem.batch * problem.m if family in batched else problem.m
        return table.rate(m, problem.n, problem.k)

    def dropout_slowdown(self, problem: MatrixProblem | None) -> float:
        """How much longer ``problem`` runs than the measured no-dropout curves say: the attention kernel's measured
        dropout factor where the problem drops scores, else 1 (the time model divides the rate by it, after any
        power-limit cap: the cap bounds the kernel's rate, the dropout path runs on top)."""
        if problem is None or not problem.dropout or not problem.family.attention:
            return 1.0
        return self.attention_dropout

    def fresh_page_s(self, nbytes: float) -> float:
        """Extra seconds to write ``nbytes`` into a freshly allocated output (first-touch page faults), from the
        calibration's fresh-write curve: per-byte cost interpolated in log2(size), the largest point's beyond
        the grid, 0 below the smallest measured size (small blocks come back from the allocator warm)."""
        pts = self.fresh_page_points
        if not pts or nbytes <= 0:
            return 0.0
        x = math.log2(nbytes)
        if x < pts[0][0]:
            return 0.0
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            if x <= x1:
                return nbytes * (y0 + (y1 - y0) * (x - x0) / (x1 - x0))
        return nbytes * pts[-1][1]

    def bandwidth(self, nbytes: float) -> float | None:
        pts = self.bandwidth_points
        if not pts:
            return None
        x = math.log2(max(nbytes, 1.0))
        if x <= pts[0][0]:
            return pts[0][1]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            if x <= x1:
                return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        return pts[-1][1]

    @staticmethod
    def from_calibration(cal: dict[str, Any], launch_overhead_s: float) -> Curves:
        if not cal:
            return Curves()
        rows: dict[tuple[MatrixFamily, str], list] = {}
        for r in cal.get("matmul", []):
            fam = {"nt": MatrixFamily.GEMM, "tt": MatrixFamily.GEMM_TA,
                   "tn": MatrixFamily.GEMM_WGRAD}.get(r.get("layout", "nt"))
            if fam:
                rows.setdefault((fam, r["dtype"]), []).append((r["m"], r["n"], r["k"], r["flops_per_s"]))
        for r in cal.get("conv", []):
            fam = MatrixFamily.CONV_BWD if r.get("pass") == "backward" else MatrixFamily.CONV
            rows.setdefault((fam, r["dtype"]), []).append((r["m"], r["n"], r["k"], r["flops_per_s"]))
        kernel = selected_attention_kernel(cal)
        for r in cal.get("attention", []):
            if kernel is not None and r.get("kernel", kernel) != kernel:
                continue  # another kernel's measurements (opmap.hardware.with_attention_kernel picks one)
            bwd = r.get("pass") == "backward"
            fam = (MatrixFamily.ATTENTION_BWD_CAUSAL if bwd else MatrixFamily.ATTENTION_CAUSAL) if r.get("causal") \
                else (MatrixFamily.ATTENTION_BWD if bwd else MatrixFamily.ATTENTION)
            rows.setdefault((fam, r["dtype"]), []).append((r["sq"], r["sk"], r["d"], r["flops_per_s"]))
        bw = []
        for r in cal.get("bandwidth", []):
            if r["kind"] != "copy":
                continue
            moved = 2.0 * r["bytes"]
            t = moved / r["bytes_per_s"] - launch_overhead_s
            if t > 0:
                bw.append((math.log2(moved), moved / t))
        writes = {r["bytes"]: r["bytes"] / r["bytes_per_s"] for r in cal.get("bandwidth", []) if r["kind"] == "write"}
        fresh = []
        for r in cal.get("bandwidth", []):
            if r["kind"] == "fresh_write" and r["bytes"] in writes:
                # the fresh write's time beyond the reused write's and the extra allocation call's dispatch
                extra = r["bytes"] / r["bytes_per_s"] - writes[r["bytes"]] - launch_overhead_s
                fresh.append((math.log2(r["bytes"]), max(0.0, extra) / r["bytes"]))
        vec = cal.get("vector_rates", {})
        tables: dict[tuple[MatrixFamily, str], RateTable | GridTable] = {k: RateTable.build(v) for k, v in rows.items()}
        if cal.get("gemm_grid"):
            for fmt, grid in load_gemm_grid(cal["gemm_grid"]).items():
                tables.setdefault((MatrixFamily.GEMM, fmt), grid)
        for r in cal.get("matmul", []):
            key = (MatrixFamily.GEMM, r["dtype"])
            if r.get("ceiling") and r.get("layout", "nt") == "nt" and r["flops_per_s"] > 0 and \
                    isinstance(tables.get(key), RateTable):
                tables[key] = replace(tables[key], ceiling=(r["m"], r["n"], r["k"], r["flops_per_s"]))
        return Curves(tables, tuple(sorted(bw)),
                      vec.get("transcendental_per_s"), float(cal.get("view_overhead_s", 0.0)),
                      str(cal.get("fingerprint", {}).get("model", "")),
                      {k: float(v) for k, v in cal.get("vector_kinds", {}).items() if v > 0}, tuple(sorted(fresh)),
                      attention_dropout_factor(cal) or 1.0,
                      load_attention_grid(cal["attention_grid"]) if cal.get("attention_grid") else None)


def with_attention_kernel(hw, kernel: str | None):
    """``hw`` with fused attention priced off the measured rows of ``kernel`` (``cudnn``, ``fa2``, ``fa3``: the
    kernel a software stack dispatches; the catalog's ``attention_kernel`` is the device's default stack's).
    None: ``hw`` as it is. A kernel the device has no rows for is refused in one line naming those it has."""
    if kernel is None:
        return hw
    named = attention_kernels(hw.calibration)
    if kernel not in named:
        raise OpmapError(f"--attention-kernel {shown(kernel)}: {hw.name} has no measured rows for it; accepted: "
                         f"{', '.join(named) or 'none (its catalog entry names no attention kernel)'}")
    if kernel == selected_attention_kernel(hw.calibration):
        return hw
    return replace(hw, calibration={**hw.calibration, "attention_kernel": kernel})


def with_attention_dropout(hw, factor: float | None, why: str, field: str = "attention dropout factor"):
    """``hw`` with its priced attention kernel running ``factor`` times longer when it drops scores than its
    measured no-dropout rows (a software stack's own dropout path: ``why`` says where the factor comes from, and
    the analysis prints it); None: ``hw`` as it is. Refused in one line naming ``field`` unless ``factor`` is a
    finite number from 1 to MAX_DROPOUT_FACTOR."""
    if factor is None:
        return hw
    finite_number(factor, field, lo=1, hi=MAX_DROPOUT_FACTOR)
    kernel = selected_attention_kernel(hw.calibration)
    row = {"factor": float(factor), "source": why, **({"kernel": kernel} if kernel is not None else {})}
    kept = [r for r in hw.calibration.get("attention_dropout", []) if r.get("kernel") != kernel]
    return replace(hw, calibration={**hw.calibration, "attention_dropout": [*kept, row]})
