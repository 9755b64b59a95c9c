"""Extract NVIDIA's measured GEMM timings from the aiconfigurator-core wheel into catalog curve files.

NVIDIA's aiconfigurator (github.com/ai-dynamo/aiconfigurator, Apache-2.0) ships, per GPU and serving framework, the
time of one GEMM ``x @ W.T`` ([M, K] x [N, K]^T) measured on the device at a grid of shapes (M 1-32768, N and K
128-65536): ``aiconfigurator_core/systems/data/<gpu>/gemm/<framework>/<version>/gemm_perf.parquet``, columns
gemm_dtype, m, n, k, latency (ms). This script reads the TensorRT-LLM tables (the framework of the serving rows
they are checked against) and writes ``src/opmap/hardware/catalog/<device>.gemm.json``: per opmap format, the grid
axes and the latency in microseconds, M-major (then N, then K). Grid points missing from the table are filled from
their nearest measured neighbours in log2 shape and counted in the file.

Run: see benchmarks/reference/_aiconfigurator.py (`python benchmarks/reference/aiconfigurator_gemm.py /tmp/aic/x`).
"""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path

from _aiconfigurator import WHEEL, run  # beside this script (its folder is sys.path[0])

# opmap device -> (aiconfigurator system, framework directory, version, {opmap format: table gemm_dtype})
DEVICES = {
    "h100-sxm": ("h100_sxm", "trtllm", "1.3.0rc20", {"bf16": "bfloat16", "fp8": "fp8"}),
    "h200": ("h200_sxm", "trtllm", "1.3.0rc20", {"bf16": "bfloat16", "fp8": "fp8"}),
    "a100-sxm-80gb": ("a100_sxm", "trtllm", "1.0.0", {"bf16": "bfloat16"}),
    "l40s": ("l40s", "trtllm", "1.3.0rc20", {"bf16": "bfloat16", "fp8": "fp8"}),
    "b200": ("b200_sxm", "trtllm", "1.3.0rc20", {"bf16": "bfloat16", "fp8": "fp8", "nvfp4": "nvfp4"}),
    # the GB200 NVL72's Blackwell GPU, measured on its own (the table's device column: 'NVIDIA GB200')
    "gb200": ("gb200", "trtllm", "1.3.0rc20", {"bf16": "bfloat16", "fp8": "fp8", "nvfp4": "nvfp4"}),
}
# The grid kept: every measured N and K from 128 up, and the M values that are not a tile boundary's +1 probe (the
# table measures M = 2^j and 2^j + 1 to see the tile step; interpolation between neighbours 1 apart adds nothing)
MIN_NK = 128
# Above N or K = 16384 the tables hold times that no device can run: H100 fp8 at 32768 x 65536 x 65536 reads 2594
# TFLOP/s against its 1979 dense peak (bf16 1421 against 989; A100 bf16 1421 against 312), so those points are left
# out; a larger GEMM reads the 16384 edge, where the rates have levelled off. A point above the dense peak anywhere
# else is dropped too (and refilled from its neighbours).
MAX_NK = 16384
# dense datasheet peaks (the catalog's matrix_peak_flops_per_s), TFLOP/s
PEAK = {("h100-sxm", "bf16"): 989.4, ("h100-sxm", "fp8"): 1978.9, ("h200", "bf16"): 989.4, ("h200", "fp8"): 1978.9,
        ("a100-sxm-80gb", "bf16"): 312.0, ("l40s", "bf16"): 366.5, ("l40s", "fp8"): 733.0, ("b200", "bf16"): 2250.0,
        ("b200", "fp8"): 4500.0, ("b200", "nvfp4"): 9000.0, ("gb200", "bf16"): 2500.0, ("gb200", "fp8"): 5000.0,
        ("gb200", "nvfp4"): 10000.0}
# Bytes per element of the activation's quantization inside a quantized row's timed call (the collector's
# Linear.forward takes a bf16 x and quantizes it before the GEMM): fp8 reads 2 and writes 1; nvfp4
# (torch.ops.trtllm.fp4_quantize, an e4m3 scale per 16 elements) reads 2 and writes 0.5 + 1/16
QUANT_BYTES = {"fp8": 3.0, "nvfp4": 2.0 + 0.5 + 1.0 / 16}


def _fill(grid: dict, axes: tuple[list[int], list[int], list[int]]) -> tuple[list[float], int]:
    """Latencies over the full grid, M-major; a missing point from its 4 nearest measured points in log2 shape,
    inverse-distance weighted (in log latency)."""
    pts = [(math.log2(m), math.log2(n), math.log2(k), math.log(v)) for (m, n, k), v in grid.items()]
    out, filled = [], 0
    for m in axes[0]:
        for n in axes[1]:
            for k in axes[2]:
                v = grid.get((m, n, k))
                if v is None:
                    q = (math.log2(m), math.log2(n), math.log2(k))
                    near = sorted((math.dist(q, p[:3]), p[3]) for p in pts)[:4]
                    w = [1 / d ** 2 for d, _ in near]
                    v = math.exp(sum(wi * y for wi, (_, y) in zip(w, near)) / sum(w))
                    filled += 1
                out.append(float(f"{v:.4g}"))
    return out, filled


@functools.cache
def _memory_rate(device: str) -> float:
    from opmap.hardware import get_hardware

    return get_hardware(device).memory_rate_bytes_per_s


@functools.cache
def _achievable(device: str, fmt: str) -> float:
    from opmap.hardware import get_hardware
    from opmap.precision import matrix_rate

    return matrix_rate(get_hardware(device), fmt)[0]


def quantization_s(device: str, m: int, k: int, fmt: str = "fp8") -> float:
    """The activation's quantization inside a quantized row's timed call (the torch flow quantizes x before the
    GEMM: fp8 with its static per-tensor scale, M x K bf16 read and M x K fp8 written, 3 bytes an element; nvfp4 with
    fp4_quantize, 2.5625: QUANT_BYTES), at the device's achievable memory rate (the catalog's). Engines fuse that
    cast into the norm or activation before the GEMM, and opmap prices it there (and Transformer Engine's casts as
    kernels of their own), so it comes out of the table."""
    return QUANT_BYTES[fmt] * m * k / _memory_rate(device)


def extract(root: Path, device: str) -> dict:
    import duckdb

    system, fw, ver, formats = DEVICES[device]
    rel = f"aiconfigurator_core/systems/data/{system}/gemm/{fw}/{ver}/gemm_perf.parquet"
    path = root / rel
    if not path.exists():
        raise SystemExit(f"no {rel} under {root} (unpack the wheel there; see the docstring)")
    tables = {}
    for fmt, gd in formats.items():
        rows = duckdb.sql(f"select m, n, k, latency from '{path}' where gemm_dtype = '{gd}' and latency > 0 "
                          f"and n between {MIN_NK} and {MAX_NK} and k between {MIN_NK} and {MAX_NK}").fetchall()
        grid = {(int(m), int(n), int(k)): float(lat) * 1e3 for m, n, k, lat in rows
                if 2 * m * n * k / (lat * 1e-3) <= PEAK[device, fmt] * 1e12}
        dropped = len(rows) - len(grid)
        if fmt in QUANT_BYTES:
            # the activation's quantization out, but a GEMM never faster than the device's achievable rate (the
            # catalog's best measured shape, or its derivation): where the activation sits in L2 (the L40S has 96
            # MB) the cast is cheaper than a pass over DRAM, and the estimate would overshoot
            best = _achievable(device, fmt)
            grid = {(m, n, k): min(v, max(v - quantization_s(device, m, k, fmt) * 1e6, 2 * m * n * k / best * 1e6))
                    for (m, n, k), v in grid.items()}
        ms = sorted({m for m, _, _ in grid if (m - 1) & (m - 2) != 0 or m <= 2 or m % 2 == 0})
        ms = [m for m in ms if m <= 2 or m % 2 == 0]
        ns = sorted({n for _, n, _ in grid})
        ks = sorted({k for _, _, k in grid})
        lat, filled = _fill({key: v for key, v in grid.items() if key[0] in ms}, (ms, ns, ks))
        tables[fmt] = {"table_dtype": gd, "quantization_removed": fmt in QUANT_BYTES, "m": ms, "n": ns, "k": ks,
                       "latency_us": lat, "filled": filled,
                       "dropped_above_peak": dropped}
    return {"source": f"{WHEEL}, {rel}: NVIDIA's measured time of one GEMM x @ W.T on the device "
                      f"({fw} {ver}, kernel source torch_flow; fp8: per-tensor scaled, the activation's "
                      "quantization inside the timed call, taken out here: 3 M K bytes at the catalog's achievable "
                      "memory rate" + ("; nvfp4: e2m1 with an e4m3 scale per 16, the activation's fp4_quantize "
                                       "taken out the same way, 2.5625 M K bytes" if "nvfp4" in formats else "")
                      + "), latency in us",
            "framework": f"{fw} {ver}", "tables": tables,
            # the tables time bfloat16; FP16 and BF16 tensor-core peaks are one figure on Ampere and Hopper (NVIDIA
            # A100 / H100 datasheets), so fp16 GEMMs read the bf16 table
            "aliases": {"fp16": "bf16"}}


def main() -> int:
    return run(__doc__, DEVICES, extract, "gemm", lambda d: ("(M, N, K, filled, dropped above peak) per format "
                   + str({f: (len(t["m"]), len(t["n"]), len(t["k"]), t["filled"], t["dropped_above_peak"])
                          for f, t in d["tables"].items()})))


if __name__ == "__main__":
    sys.exit(main())
