"""Extract NVIDIA's measured decode (generation) attention times from the aiconfigurator-core wheel into catalog files.

NVIDIA's aiconfigurator (github.com/ai-dynamo/aiconfigurator, Apache-2.0) ships, per GPU and serving framework, the
time of one decode attention call measured on the device:
``aiconfigurator_core/systems/data/<gpu>/attention/<framework>/<version>/generation_attention_perf.parquet``,
columns batch_size, isl, num_heads, num_key_value_heads, head_dim, window_size, kv_cache_dtype, step, latency (ms).
What is timed (the collector, collector/trtllm/collect_attn.py, ``run_attention_torch``): TensorRT-LLM's attention
op (``create_attention(backend "TRTLLM")``, ``attn.forward(fused qkv, ...)``) captured in a CUDA graph and replayed
(10 warm-up, 6 timed, CUDA events), one layer, tp 1 (the heads given are the heads on the GPU: a tensor-parallel
model's heads / tp), one new token per sequence (isl 1) against ``step`` cached tokens per sequence in a paged
cache of 64-token blocks (so each query attends to step + 1 keys), RoPE (gpt-neox, rotary dim 128) and the
attention sinks (head_dim 64, as gpt-oss) given, ``window_size`` the sliding window (0: none), bf16 activations,
the KV cache bf16 or fp8. So the timed call is the whole attention op: the QKV preprocessing (RoPE on Q and K and
the new token's K and V written to the cache) and the decode attention kernel (XQA / MMHA); no projection.

This script reads the TensorRT-LLM tables (kernel source torch_flow) and writes
``src/opmap/hardware/catalog/<device>.attn.json``: per KV format and head configuration (query heads, KV heads,
head dim, window) the batch axis, the KV-length axis (step + 1) and the latency in microseconds, batch-major.
opmap prices RoPE and the KV-cache write in the QKV projection's epilogue (opmap.mapping.fusion, ``engine``), so
their bytes come out of each time here (``preprocess_bytes`` at the catalog's achievable memory rate; never more
than half the time). A point the table leaves out (the largest batches at the longest KV) is filled from its
nearest measured point's efficiency (measured time over the roofline, opmap.hardware.attention_grid.roofline_s, a
window capping the keys attended) times its own roofline, and counted in the file. Kept: head dims 64 and 128, 8 or
more query heads (the decoders opmap serves), both KV formats.

Run: see benchmarks/reference/_aiconfigurator.py (`python benchmarks/reference/aiconfigurator_attention.py /tmp/aic/x`).
"""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path

from _aiconfigurator import WHEEL, run  # beside this script (its folder is sys.path[0])

VERSION = "1.3.0rc20"
# opmap device -> aiconfigurator system (the TensorRT-LLM tables of the serving rows they are checked against)
DEVICES = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm", "gb200": "gb200"}
KV_FORMATS = {"bf16": ("bfloat16", 2.0), "fp8": ("fp8", 1.0)}  # opmap KV format -> (table kv_cache_dtype, bytes)
HEAD_DIMS = (64, 128)
MIN_HEADS = 8
ACT_BYTES = 2.0  # bf16 activations: Q, the new K / V and the output


def preprocess_bytes(batch: int, heads: int, kv_heads: int, head_dim: int, kv_bytes: float) -> float:
    """Bytes the QKV preprocessing moves per call: the fused QKV read (bf16), Q written back with RoPE applied, and
    the new token's K and V written to the cache (``kv_bytes`` each element)."""
    qkv = (heads + 2 * kv_heads) * head_dim * ACT_BYTES
    return batch * (qkv + heads * head_dim * ACT_BYTES + 2 * kv_heads * head_dim * kv_bytes)


@functools.cache
def _rates(device: str) -> tuple[float, float]:
    from opmap.hardware import get_hardware
    from opmap.precision import matrix_rate

    hw = get_hardware(device)
    return hw.memory_rate_bytes_per_s, matrix_rate(hw, "bf16")[0]


def _config(rows: list[tuple[int, int, float]], cfg: tuple[int, int, int, int], kv_bytes: float,
            device: str) -> dict:
    """One head configuration's filled batch x KV grid (us), the preprocessing taken out."""
    from opmap.hardware.attention_grid import roofline_s

    h, hkv, d, w = cfg
    mem, mat = _rates(device)
    grid = {}
    for b, step, ms in rows:
        t = ms * 1e-3
        grid[b, step + 1] = max(t - preprocess_bytes(b, h, hkv, d, kv_bytes) / mem, 0.5 * t)
    bs, kvs = sorted({b for b, _ in grid}), sorted({k for _, k in grid})

    def eff(b, k):
        return grid[b, k] / roofline_s(b, min(k, w) if w else k, h, hkv, d, kv_bytes, mem, mat)

    out, filled = [], 0
    for b in bs:
        for k in kvs:
            v = grid.get((b, k))
            if v is None:  # the nearest measured point in log2 (batch, KV): its efficiency, this point's roofline
                nb, nk = min(grid, key=lambda p: (math.log2(p[0] / b) ** 2 + math.log2(p[1] / k) ** 2, p))
                v = eff(nb, nk) * roofline_s(b, min(k, w) if w else k, h, hkv, d, kv_bytes, mem, mat)
                filled += 1
            out.append(float(f"{v * 1e6:.4g}"))
    return {"batch": bs, "kv": kvs, "latency_us": out, "filled": filled}


def extract(root: Path, device: str) -> dict:
    import duckdb

    rel = f"aiconfigurator_core/systems/data/{DEVICES[device]}/attention/trtllm/{VERSION}/" \
          "generation_attention_perf.parquet"
    path = root / rel
    if not path.exists():
        raise SystemExit(f"no {rel} under {root} (unpack the wheel there; see the docstring)")
    tables = []
    for fmt, (table_dtype, kv_bytes) in KV_FORMATS.items():
        rows = duckdb.sql(
            f"select num_heads, num_key_value_heads, head_dim, window_size, batch_size, step, latency from '{path}' "
            f"where kernel_source = 'torch_flow' and kv_cache_dtype = '{table_dtype}' and isl = 1 and beam_width = 1 "
            f"and latency > 0 and head_dim in {HEAD_DIMS} and num_heads >= {MIN_HEADS} order by all").fetchall()
        by: dict[tuple[int, int, int, int], list] = {}
        for h, hkv, d, w, b, step, lat in rows:
            by.setdefault((int(h), int(hkv), int(d), int(w)), []).append((int(b), int(step), float(lat)))
        for (h, hkv, d, w), pts in sorted(by.items()):
            tables.append({"kv_dtype": fmt, "heads": h, "kv_heads": hkv, "head_dim": d, "window": w,
                           **_config(pts, (h, hkv, d, w), kv_bytes, device)})
    return {"source": f"{WHEEL}, {rel}: NVIDIA's measured time of TensorRT-LLM {VERSION}'s decode attention op on "
                      "the device (one layer, the heads on one GPU, one new token per sequence against kv - 1 cached "
                      "tokens, CUDA graph replay; RoPE and the KV-cache write inside the timed call, taken out here "
                      "at the catalog's achievable memory rate), latency in us; extracted by "
                      "benchmarks/reference/aiconfigurator_attention.py",
            "framework": f"trtllm {VERSION}", "preprocess_removed": True, "tables": tables}


def main() -> int:
    return run(__doc__, DEVICES, extract, "attn", lambda d: (f"{len(d['tables'])} head configurations, "
                   f"{sum(t['filled'] for t in d['tables'])} points filled"))


if __name__ == "__main__":
    sys.exit(main())
