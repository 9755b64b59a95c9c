"""Extract AMD's tuned gfx950 GEMM timings from ROCm/aiter's tuned tables into the MI355X's catalog grid file.

AMD's AITER (github.com/ROCm/aiter, MIT) ships, per GEMM kernel family, the tuner's result for every shape it was
tuned at: ``aiter/configs/<table>.csv`` and, per model, ``aiter/configs/model_configs/*<table>*.csv``, columns gfx,
cu_num, M, N, K, ..., us (the fastest candidate kernel's time of one GEMM x @ W.T, [M, K] x [N, K]^T, in
microseconds). The tuners (csrc/ck_gemm_*/..._tune.py, csrc/gemm_a16w16/gemm_a16w16_tune.py for bf16) quantize the
inputs before the timed call and time the kernel alone on the device: 10 warm-up and 101 timed calls by default
(aiter/utility/mp_tuner.py, aiter/test_common.py run_perftest: torch profiler device time, the inputs rotated over up
to 101 copies so that most calls read them from memory, not cache). At run time AITER reads the
default table merged with the model tables, the fastest row per shape (aiter/jit/core.py get_config_file,
update_config_files); this script merges them the same way and keeps the rows of gfx950 with 256 CUs (cu_num: the
device's compute-unit count; gfx950 with 256 is the MI355X's and the MI350X's silicon, tuned on MI355X per AITER's
README). It writes ``src/opmap/hardware/catalog/mi355x.gemm.json`` in the format of
``aiconfigurator_gemm.py``'s grids: per opmap format the M, N and K axes and the time at every point, M-major.

The tables time model shapes, not a regular grid: each tuned (N, K) is swept over M (1-32768), and the N and K
values differ from model to model, so most points of the N x K plane were never timed. A sweep is an (N, K) timed at
MIN_POINTS or more M values; the grid's N and K axes are every sweep's, its M axis the M values in at least
MIN_M_SHARE of the sweeps. A point is the measured time where there is one; within a sweep, between two measured M,
log rate interpolated linearly in log2 M (what the grid reader does between grid points); below a sweep's smallest M
(at most HOLD_TIME_BELOW) its time held (the weight-streaming regime: the tables' t(16) / t(1) is 1.01-1.07 in the
median), above its largest M (at least HOLD_RATE_ABOVE) its rate held (t(32768) / t(16384) is 1.98 in the median);
every other point filled from the NEAR sweeps nearest in log2 (N, K) at the same M, inverse-distance weighted (power
POWER) in log rate. The file counts the measured and filled points and states the fill's error: each sweep left out
in turn and filled from the others, the median and 90th percentile of |filled / measured - 1| over its points.

Run (any clone of ROCm/aiter holding the pinned commit, bare or not; files are read with git at that commit):

    git clone --filter=blob:none https://github.com/ROCm/aiter /tmp/aiter
    PYTHONPATH=src python benchmarks/reference/aiter_gemm.py /tmp/aiter
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import io
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO / "src" / "opmap" / "hardware" / "catalog"
AITER = "ROCm/aiter"
COMMIT = "e4048607a535ace3a2b51ded31b1c8c2d45c0879"  # main, 2026-08-22
DEVICE, GFX, CU_NUM = "mi355x", "gfx950", "256"
# opmap format -> (AITER's tuned table, the row values that select the GEMM opmap prices, what it is)
FORMATS = {
    "mxfp4": ("a4w4_blockscale_tuned_gemm", {},
              "A and B MXFP4 (packed E2M1, an E8M0 scale per 1 x 32), B pre-shuffled, bf16 out: AITER's assembly "
              "f4gemm and CK kernels"),
    "fp8": ("a8w8_bpreshuffle_tuned_gemm", {"q_dtype_w": "torch.float8_e4m3fn"},
            "A and B OCP FP8 E4M3, a scale per token and per output channel, B pre-shuffled, bf16 out: CK, CK-tile "
            "and assembly kernels"),
    "bf16": ("bf16_tuned_gemm", {"dtype": "torch.bfloat16", "outdtype": "torch.bfloat16", "bias": "False",
                                 "scaleAB": "False", "bpreshuffle": "False"},
             "bf16 in and out, no bias: the fastest of hipBLASLt, AITER's assembly and Triton kernels"),
}
MIN_POINTS = 6  # an (N, K) timed at fewer M is a single model's odd shape, left out of the grid (counted)
# N or K below 256 (routers, small heads, N = 100 unaligned) run kernels 10-100x slower per FLOP than the LLM shapes
# around them (bf16 1024 x 100 x 5120: 132.7 us); the fill would spread that onto them. Such a GEMM reads the edge.
MIN_NK = 256
MIN_M_SHARE = 0.2
MAX_M = 32768
HOLD_TIME_BELOW = 32
HOLD_RATE_ABOVE = 8192
NEAR, POWER = 4, 2


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout


def table_files(root: Path, table: str) -> list[str]:
    """The files AITER merges for ``table`` (aiter/jit/core.py get_config_file): the default, then every tuned (not
    untuned) model table whose name holds the table's."""
    listed = _git(root, "ls-tree", "--name-only", COMMIT, "aiter/configs/model_configs/").split()
    models = sorted(p for p in listed if fnmatch.fnmatch(Path(p).name, f"*{table}*.csv") and "untuned" not in p)
    return [f"aiter/configs/{table}.csv", *models]


def read_rows(root: Path, fmt: str) -> tuple[dict[tuple[int, int, int], float], list[str]]:
    """gfx950 / 256-CU rows of ``fmt``'s merged tables: (M, N, K) -> the fastest time in us, and the files read."""
    table, select, _ = FORMATS[fmt]
    files = table_files(root, table)
    rows: dict[tuple[int, int, int], float] = {}
    for path in files:
        for r in csv.DictReader(io.StringIO(_git(root, "show", f"{COMMIT}:{path}"))):
            if r["gfx"] != GFX or r["cu_num"] != CU_NUM or any(r.get(k) != v for k, v in select.items()):
                continue
            us = float(r["us"])
            if us > 0:  # the tuner writes -1 / 0 for a shape no kernel ran
                key = (int(r["M"]), int(r["N"]), int(r["K"]))
                rows[key] = min(us, rows.get(key, math.inf))
    return rows, files


def sweeps_of(rows: dict) -> dict[tuple[int, int], dict[int, float]]:
    """(N, K) -> {M: us} for the (N, K) timed at MIN_POINTS or more M up to MAX_M, N and K at least MIN_NK."""
    by: dict[tuple[int, int], dict[int, float]] = {}
    for (m, n, k), us in rows.items():
        if m <= MAX_M:
            by.setdefault((n, k), {})[m] = us
    return {nk: s for nk, s in by.items() if len(s) >= MIN_POINTS and min(nk) >= MIN_NK}


def m_axis(sweeps: dict) -> list[int]:
    counts: dict[int, int] = {}
    for s in sweeps.values():
        for m in s:
            counts[m] = counts.get(m, 0) + 1
    return sorted(m for m, c in counts.items() if c >= MIN_M_SHARE * len(sweeps))


def along_m(s: dict[int, float], m: int) -> float | None:
    """A sweep's time at ``m``: measured, interpolated between measured M (log rate linear in log2 M), held below
    (time) or above (rate) its measured range where the regime allows; None where the sweep cannot say."""
    if m in s:
        return s[m]
    ms = sorted(s)
    if m < ms[0]:
        return s[ms[0]] if ms[0] <= HOLD_TIME_BELOW else None
    if m > ms[-1]:
        return s[ms[-1]] * m / ms[-1] if ms[-1] >= HOLD_RATE_ABOVE else None
    hi = next(i for i, x in enumerate(ms) if x > m)
    a, b = ms[hi - 1], ms[hi]
    f = (math.log2(m) - math.log2(a)) / (math.log2(b) - math.log2(a))
    ra, rb = math.log(a / s[a]), math.log(b / s[b])
    return m / math.exp(ra + f * (rb - ra))


def idw(known: dict[tuple[int, int], float], n: int, k: int, m: int) -> float:
    """The time at (m, n, k) from the NEAR sweeps nearest in log2 (N, K) that have a time at m (``known``: (N, K)
    -> us at m), inverse-distance weighted in log rate."""
    q = (math.log2(n), math.log2(k))
    near = sorted((math.dist(q, (math.log2(a), math.log2(b))), a * b, t) for (a, b), t in known.items())[:NEAR]
    w = [1.0 / max(d, 1e-9) ** POWER for d, _, _ in near]
    log_rate = sum(wi * math.log(2.0 * m * nk / t) for wi, (_, nk, t) in zip(w, near)) / sum(w)
    return 2.0 * m * n * k / math.exp(log_rate)


def _slices(sweeps: dict, ms: list[int]) -> dict[int, dict[tuple[int, int], float]]:
    """Per M of the axis, every sweep's time there where the sweep itself says (along_m)."""
    out: dict[int, dict[tuple[int, int], float]] = {m: {} for m in ms}
    for nk, s in sweeps.items():
        for m in ms:
            t = along_m(s, m)
            if t is not None:
                out[m][nk] = t
    return out


def fill_check(sweeps: dict) -> dict[str, float]:
    """Each sweep left out in turn, its measured points filled from the other sweeps at the same M (idw): the median
    and 90th percentile of |filled / measured - 1|."""
    ms = sorted({m for s in sweeps.values() for m in s})
    slices = _slices(sweeps, ms)
    errs = sorted(abs(idw({nk2: t for nk2, t in slices[m].items() if nk2 != nk}, *nk, m) / us - 1.0)
                  for nk, s in sweeps.items() for m, us in s.items())
    return {"median": round(statistics.median(errs), 3), "p90": round(errs[int(0.9 * len(errs))], 3),
            "points": len(errs)}


def extract(root: Path, fmt: str, peak_flops_per_s: float) -> dict:
    rows, files = read_rows(root, fmt)
    sweeps = sweeps_of(rows)
    ms = m_axis(sweeps)
    ns, ks = sorted({n for n, _ in sweeps}), sorted({k for _, k in sweeps})
    slices = _slices(sweeps, ms)
    lat, measured, along, dropped = [], 0, 0, 0
    for m in ms:
        for n in ns:
            for k in ks:
                t = sweeps.get((n, k), {}).get(m)
                if t is not None and 2.0 * m * n * k / (t * 1e-6) > peak_flops_per_s:
                    t, dropped = None, dropped + 1  # faster than the dense peak: not a time the device can run
                if t is not None:
                    measured += 1
                    lat.append(t)
                    continue
                t = slices[m].get((n, k))
                along += t is not None
                lat.append(float(f"{(t if t is not None else idw(slices[m], n, k, m)):.4g}"))
    on_grid = sum(m in ms for s in sweeps.values() for m in s)
    table, _, what = FORMATS[fmt]
    return {"table_dtype": f"{table} ({GFX}, cu_num {CU_NUM})", "kernels": what, "quantization_removed": False,
            "files": files, "m": ms, "n": ns, "k": ks, "latency_us": lat, "measured": measured,
            "filled": len(lat) - measured, "filled_along_m": along, "dropped_above_peak": dropped,
            "rows": len(rows), "rows_in_sweeps": sum(len(s) for s in sweeps.values()), "rows_on_grid": on_grid,
            "fill_check": fill_check(sweeps)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path, help=f"a clone of {AITER} holding commit {COMMIT}")
    args = ap.parse_args()
    try:
        _git(args.root, "cat-file", "-e", f"{COMMIT}^{{commit}}")
    except (subprocess.CalledProcessError, FileNotFoundError):
        raise SystemExit(f"{args.root} is no clone of {AITER} holding {COMMIT} (git clone it; see the docstring)") \
            from None
    from opmap.hardware import get_hardware

    hw = get_hardware(DEVICE)
    tables = {fmt: extract(args.root, fmt, float(hw.matrix_peak_flops_per_s[fmt].value)) for fmt in FORMATS}
    data = {"source": f"{AITER} @ {COMMIT}, aiter/configs/<table>.csv merged with model_configs/*<table>*.csv as "
                      f"AITER's runtime merges them (the fastest row per shape), rows of {GFX} with cu_num {CU_NUM}: "
                      "AMD's tuned time of one GEMM x @ W.T on the device (the fastest candidate kernel, inputs "
                      "quantized before the timed call, 101 timed runs after 10 warm-up, device time), latency in "
                      "us; model shapes swept over M, the N x K plane between them filled (see each table's "
                      "measured, filled and fill_check)",
            "framework": f"aiter {COMMIT[:8]}", "tables": tables,
            # MI355X runs FP16 and BF16 at one dense peak (2516.6 TFLOPS, the catalog); AITER tunes bf16 only
            "aliases": {"fp16": "bf16"}}
    out = CATALOG / f"{DEVICE}.gemm.json"
    out.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    for fmt, t in tables.items():
        print(f"{fmt}: M {len(t['m'])} x N {len(t['n'])} x K {len(t['k'])}, {t['measured']} measured, "
              f"{t['filled']} filled ({t['filled_along_m']} along a sweep's M), {t['dropped_above_peak']} above "
              f"peak; rows {t['rows']}, in sweeps {t['rows_in_sweeps']}, on the grid {t['rows_on_grid']}; fill check "
              f"{t['fill_check']}")
    print(f"{out.relative_to(REPO)}: {out.stat().st_size / 1e3:.0f} kB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
