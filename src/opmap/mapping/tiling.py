"""GEMM tiling on a GPU-like device: search (BM, BN, BK, stages) legal for the device, keep the best.

For C[M,N] = A[M,K] @ B[K,N] (batch of them), element size e bytes at the matrix dtype:

- SRAM per thread block = stages * (BM*BK + BK*BN) * e; legal when it fits the device's shared memory per
  compute unit, and the fp32 accumulator BM*BN*4 bytes fits half the register file (REGISTER_FILE_BYTES * ACCUMULATOR_SHARE);
- split-K S (1 to 16, each slice at least two BK steps): tiles = batch * ceil(M/BM) * ceil(N/BN) * S;
  waves = ceil(tiles / compute units); the S fp32 partial sums are written and read back (2*S*M*N*4 bytes);
- tile-quantization efficiency = M*N / (ceil(M/BM)*BM * ceil(N/BN)*BN) (the padded edge tiles' waste);
- wave-quantization efficiency = tiles / (waves * compute units) (the idle units of the last wave);
- device-memory traffic with reuse: A is re-read once per column of tiles (ceil(N/BN) times) and B once per
  row of tiles (ceil(M/BM) times), unless the operand fits in half the L2, when it is read once; C is
  written once;
- time = max(2*M*N*K / (peak * tile eff * wave eff), traffic / bandwidth). Ties go to the deeper pipeline
  (more stages hide more memory latency), then to the larger tile.

The matrix engines' operand alignment: K a multiple of 16 bytes worth of elements (8 at 2 bytes, 16 at 1
byte), else the kernel pads K and the sheet says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

from opmap.errors import OpmapError

BM_CHOICES = (16, 32, 64, 128, 256)
BN_CHOICES = (32, 64, 128, 256)
SPLIT_K = (1, 2, 4, 8, 16)  # K split across thread blocks when M x N alone cannot fill the device
BK_CHOICES = (32, 64, 128)
STAGES = (2, 3, 4, 5)
REGISTER_FILE_BYTES = 65536 * 4  # per SM: 64K 32-bit registers (NVIDIA Ampere / Hopper SM)
ACCUMULATOR_SHARE = 0.5  # the fp32 accumulators may take half the registers; the rest hold addresses, operands
ELEM_BYTES = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}


@dataclass(frozen=True)
class Tile:
    bm: int
    bn: int
    bk: int
    stages: int
    sram_bytes: float
    tiles: int
    waves: int
    tile_efficiency: float
    wave_efficiency: float
    traffic_bytes: float
    compute_s: float
    memory_s: float
    k_padded: int
    split_k: int = 1

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s)

    def to_dict(self) -> dict:
        return {"m": self.bm, "n": self.bn, "k": self.bk, "stages": self.stages, "split_k": self.split_k}

    def label(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk}/{self.stages}" + (f" split-K {self.split_k}" if self.split_k > 1 else "")


def tile_candidates(batch: int, m: int, n: int, k: int, dtype: str, *, sram_per_unit: float, units: int,
                    l2_bytes: float, peak_flops_per_s: float, bandwidth_bytes_per_s: float,
                    out_dtype_bytes: float | None = None, b_elem_bytes: float | None = None) -> list[Tile]:
    """Every legal candidate, best first. Raises OpmapError naming the limit when none is legal."""
    e = ELEM_BYTES.get(dtype, 2)
    out_e = out_dtype_bytes if out_dtype_bytes is not None else max(e, 2)
    align = max(1, int(16 / e))
    k_pad = math.ceil(k / align) * align
    flops = 2.0 * batch * m * n * k
    # b_elem_bytes: B stored narrower than the compute format (int4 weight-only: dequantized in the kernel)
    a_bytes, b_bytes, c_bytes = m * k_pad * e, k_pad * n * (b_elem_bytes or e), m * n * out_e
    out = []
    smallest = None
    for bm, bn, bk, st, sk in product(BM_CHOICES, BN_CHOICES, BK_CHOICES, STAGES, SPLIT_K):
        sram = st * (bm * bk + bk * bn) * e
        if smallest is None or sram < smallest[0]:
            smallest = (sram, bm, bn, bk, st)
        if sram > sram_per_unit or bm * bn * 4 > ACCUMULATOR_SHARE * REGISTER_FILE_BYTES:
            continue
        if sk > 1 and k_pad / sk < 2 * bk:  # each slice keeps at least two K steps
            continue
        tm, tn = math.ceil(m / bm), math.ceil(n / bn)
        tiles = batch * tm * tn * sk
        waves = math.ceil(tiles / units)
        tile_eff = (m * n) / (tm * bm * tn * bn)
        wave_eff = tiles / (waves * units)
        a_reads = 1 if a_bytes <= l2_bytes / 2 else tn
        b_reads = 1 if b_bytes <= l2_bytes / 2 else tm
        partials = 2 * sk * m * n * 4 if sk > 1 else 0  # fp32 partial sums written, then read to reduce
        traffic = batch * (a_bytes * a_reads + b_bytes * b_reads + c_bytes + partials)
        compute = flops * (k_pad / k) / (peak_flops_per_s * tile_eff * wave_eff)
        out.append(Tile(bm, bn, bk, st, sram, tiles, waves, tile_eff, wave_eff, traffic, compute,
                        traffic / bandwidth_bytes_per_s, k_pad, sk))
    if not out:
        sram, bm, bn, bk, st = smallest
        raise OpmapError(f"no legal GEMM tile: the smallest ({bm}x{bn}x{bk}, {st} stages) needs "
                         f"{sram / 1024:.0f} KB of shared memory, the device has {sram_per_unit / 1024:.0f} KB")
    return sorted(out, key=lambda t: (round(t.time_s, 15), t.split_k, -t.stages, -(t.bm * t.bn), -t.bk))
