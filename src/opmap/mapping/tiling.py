"""GEMM tiling on a GPU-like device: search (BM, BN, BK, stages, split-K) legal for the device, keep the best.

For C[M,N] = A[M,K] @ B[K,N] (batch of them), element size e bytes at the operand format:

- SRAM per thread block = stages * (BM*BK + BK*BN) * e; legal when it fits the device's shared memory per
  compute unit, the fp32 accumulator BM*BN*4 bytes fits half the register file (REGISTER_FILE_BYTES *
  ACCUMULATOR_SHARE), and BM is at least the matrix instruction's row count (``min_bm``: Hopper's and
  Blackwell's warpgroup MMA is m64; Ampere / Ada mma.sync and CDNA MFMA take m16);
- split-K S (1 to 16, each slice at least two BK steps): tiles = batch * ceil(M/BM) * ceil(N/BN) * S;
  waves = ceil(tiles / compute units); the S fp32 partial sums are written and read back (2*S*M*N*4 bytes)
  after the K loop, so their time adds to the compute time instead of overlapping it;
- tile-quantization efficiency = M*N / (ceil(M/BM)*BM * ceil(N/BN)*BN) (the padded edge tiles' waste);
- wave-quantization efficiency = tiles / (waves * compute units) (the idle units of the last wave);
- operand-feed efficiency (``feed_efficiency``): each K step writes (BM + BN) x BK operands into shared
  memory and reads them back into the matrix units for BM x BN x BK multiply-adds, so at a shared-memory
  bandwidth of S bytes per second per unit and a matrix rate of F multiply-adds per second per unit the
  tile is fed at min(1, h * S / (2 * F * e)) with h = BM*BN / (BM + BN). A small tile starves the tensor
  cores (A100 fp16: h >= 32 feeds them, a 16x32 tile reaches 0.33); without the bandwidth in the hardware
  spec the efficiency is 1 and the tile's why says so;
- device-memory traffic with reuse (``operand_traffic``): both operands in half the L2 are read once;
  otherwise a wave's tiles walk K in lockstep, so the L2 only holds the K slices in flight and each A and B
  panel of the wave comes from DRAM once per wave; without room even for those, A is re-read once per column
  of tiles and B once per row; C is written once;
- time = max(2*M*N*K / (rate * tile eff * wave eff * feed eff), traffic / bandwidth), where ``rate`` is the
  achievable matrix rate (a published or measured sustained figure; the dense datasheet peak where none is
  known). Ties go to fewer split-K slices, the deeper pipeline, then the larger tile.

The matrix engines' operand alignment: K a multiple of 16 bytes worth of elements (8 at 2 bytes, 16 at 1
byte), else the kernel pads K and the sheet says so.
"""

from __future__ import annotations

import functools
import heapq
import math
from dataclasses import dataclass
from itertools import product

from opmap.errors import OpmapError
from opmap.formats import get_format
from opmap.ops import causal_pairs
from opmap.precision import format_bytes

BM_CHOICES = (16, 32, 64, 128, 256)
BN_CHOICES = (32, 64, 128, 256)
SPLIT_K = (1, 2, 4, 8, 16)  # K split across thread blocks when M x N alone cannot fill the device
BK_CHOICES = (32, 64, 128)
STAGES = (2, 3, 4, 5)
REGISTER_FILE_BYTES = 65536 * 4  # per SM: 64K 32-bit registers (NVIDIA Ampere / Hopper SM)
ACCUMULATOR_SHARE = 0.5  # the fp32 accumulators may take half the registers; the rest hold addresses, operands


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
    feed_efficiency: float = 1.0  # shared-memory operand feed of the matrix units (1: fully fed, or not modelled)
    stream_k: bool = False  # K-loop iterations spread evenly over the units (Stream-K), not whole tiles per wave

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s)

    def to_dict(self) -> dict:
        return {"m": self.bm, "n": self.bn, "k": self.bk, "stages": self.stages, "split_k": self.split_k,
                "schedule": "stream-k" if self.stream_k else "data-parallel"}

    def label(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk}/{self.stages}" + (f" split-K {self.split_k}" if self.split_k > 1 else "")


def operand_traffic(tm: int, tn: int, sk: int, bm: int, bn: int, bk: int, stages: int, k: int, e: float, eb: float,
                    units: int, l2_bytes: float, a_unique: float = 1.0) -> float:
    """Device-memory bytes of A and B for one GEMM of tm x tn tiles (split-K sk), with L2 reuse.

    - Both operands fit in half the L2: each is read once.
    - Otherwise tiles run a wave at a time (W = min(tiles, units) resident), rasterised in groups of G
      tile rows (CUTLASS-style swizzle, G = sqrt(W * B panel / A panel), the G that minimises the wave's
      footprint). A wave touches G A panels (BM x K) and ceil(W / G) B panels (K x BN). Its tiles walk K
      in lockstep, so the L2 only needs the K slices in flight: ``stages`` BK-deep slices of those panels.
      When they fit in half the L2, each panel comes from DRAM once per wave that uses it.
    - When even the slices in flight exceed half the L2, A is re-read once per column of tiles and B once
      per row.

    ``a_unique``: the share of A's bytes that are distinct in memory. An implicit-GEMM convolution never
    writes the unfolded (im2col) matrix: its A tiles gather overlapping windows of the input through the
    caches, so DRAM sees the input (input bytes / im2col bytes of it), not the unfolded matrix.
    """
    a_bytes, b_bytes = tm * bm * k * e * a_unique, k * tn * bn * eb
    if a_bytes + b_bytes <= l2_bytes / 2:
        return a_bytes + b_bytes
    tiles = tm * tn * sk
    w = min(tiles, units)
    pa, pb = bm * k * e * a_unique / sk, k * bn * eb / sk  # a split-K tile reads its K slice of each panel
    g = max(1, min(tm, round(math.sqrt(w * pb / pa))))
    per_wave = g * pa + math.ceil(w / g) * pb
    in_flight = (g * bm * e + math.ceil(w / g) * bn * eb) * bk * stages
    if in_flight <= l2_bytes / 2:
        return max(a_bytes + b_bytes, math.ceil(tiles / w) * per_wave)
    return a_bytes * tn + b_bytes * tm


def feed_efficiency(bm: int, bn: int, e: float, macs_per_s_per_unit: float,
                    sram_bytes_per_s_per_unit: float | None) -> float:
    """How fully shared memory feeds the matrix units a BM x BN tile: min(1, h * S / (2 * F * e)) with
    h = BM*BN / (BM + BN) multiply-adds per operand element per K step, S the shared-memory bandwidth and F
    the multiply-add rate per unit; each operand byte is written into shared memory and read out once (2x).
    1 where the bandwidth is unknown."""
    if not sram_bytes_per_s_per_unit:
        return 1.0
    h = bm * bn / (bm + bn)
    return min(1.0, h * sram_bytes_per_s_per_unit / (2.0 * macs_per_s_per_unit * e))


@functools.lru_cache(maxsize=4096)  # repeated layers repeat their shapes
def tile_candidates(batch: int, m: int, n: int, k: int, dtype: str, *, sram_per_unit: float, units: int,
                    l2_bytes: float, peak_flops_per_s: float, bandwidth_bytes_per_s: float,
                    out_dtype_bytes: float | None = None, b_elem_bytes: float | None = None,
                    sram_bytes_per_s: float | None = None, min_bm: int = 16,
                    a_unique: float = 1.0, dense_peak_flops_per_s: float | None = None,
                    stream_k: bool = False) -> tuple[Tile, ...]:
    """Every legal candidate, best first. Raises OpmapError naming the limit when none is legal.

    ``peak_flops_per_s`` is the rate the matrix units sustain (achievable, else the dense peak);
    ``sram_bytes_per_s`` the shared-memory bandwidth per unit (None: feed not modelled), weighed against the
    ``dense_peak_flops_per_s`` (the instruction rate at the same clock; default ``peak_flops_per_s``);
    ``min_bm`` the matrix instruction's row count; ``a_unique`` see operand_traffic; ``stream_k``: the device's
    GEMM library also schedules Stream-K (a candidate beside each tile whose last wave is partial)."""
    rows = _gemm_rows(batch, m, n, k, dtype, sram_per_unit, units, l2_bytes, peak_flops_per_s, bandwidth_bytes_per_s,
                      out_dtype_bytes, b_elem_bytes, sram_bytes_per_s, min_bm, a_unique, dense_peak_flops_per_s,
                      stream_k)
    return tuple(sorted((Tile(*r) for r in rows), key=_gemm_rank))


@functools.lru_cache(maxsize=4096)
def best_tiles(batch: int, m: int, n: int, k: int, dtype: str, *, sram_per_unit: float, units: int,
               l2_bytes: float, peak_flops_per_s: float, bandwidth_bytes_per_s: float,
               out_dtype_bytes: float | None = None, b_elem_bytes: float | None = None,
               sram_bytes_per_s: float | None = None, min_bm: int = 16,
               a_unique: float = 1.0, dense_peak_flops_per_s: float | None = None,
               stream_k: bool = False, count: int = 2) -> tuple[Tile, ...]:
    """``tile_candidates(...)[:count]`` (the best tile and the runner-up a kernel row shows) without making a Tile
    of every candidate: the same rows ranked by the same key (``heapq.nsmallest`` is ``sorted(...)[:count]``, ties
    in the same order), a Tile made of the first ``count`` only."""
    rows = _gemm_rows(batch, m, n, k, dtype, sram_per_unit, units, l2_bytes, peak_flops_per_s, bandwidth_bytes_per_s,
                      out_dtype_bytes, b_elem_bytes, sram_bytes_per_s, min_bm, a_unique, dense_peak_flops_per_s,
                      stream_k)
    return tuple(Tile(*r) for r in heapq.nsmallest(count, rows, key=_row_rank))


def _gemm_rank(t: Tile) -> tuple:
    """The order of GEMM tiles (module docstring): time, then fewer split-K slices, data-parallel before Stream-K,
    the deeper pipeline, the larger tile, the deeper K step."""
    return round(t.time_s, 15), t.split_k, t.stream_k, -t.stages, -(t.bm * t.bn), -t.bk


def _row_rank(r: tuple) -> tuple:
    """``_gemm_rank`` of the Tile ``r`` makes (``Tile(*r)``), read off the row: (bm, bn, bk, stages, sram, tiles,
    waves, tile eff, wave eff, traffic, compute_s, memory_s, k_padded, split_k, feed, stream_k)."""
    return round(max(r[10], r[11]), 15), r[13], r[15], -r[3], -(r[0] * r[1]), -r[2]


def _gemm_rows(batch, m, n, k, dtype, sram_per_unit, units, l2_bytes, peak_flops_per_s, bandwidth_bytes_per_s,
               out_dtype_bytes, b_elem_bytes, sram_bytes_per_s, min_bm, a_unique, dense_peak_flops_per_s,
               stream_k) -> list[tuple]:
    """Every legal GEMM candidate as the fields of its Tile, in search order (``tile_candidates``' docstring);
    raises OpmapError naming the limit when none is legal."""
    e = format_bytes(dtype)
    out_e = out_dtype_bytes if out_dtype_bytes is not None else max(e, 2)
    align = max(1, 128 // get_format(dtype).bits)  # K padded to 16 bytes of elements (a block's scales aside)
    k_pad = math.ceil(k / align) * align
    flops = 2.0 * batch * m * n * k
    # b_elem_bytes: B stored narrower than the compute format (int4 weight-only: dequantized in the kernel)
    _a_bytes, _b_bytes, c_bytes = m * k_pad * e, k_pad * n * (b_elem_bytes or e), m * n * out_e
    out = []
    smallest = None
    macs_per_unit = (dense_peak_flops_per_s or peak_flops_per_s) / (2.0 * units)
    for bm, bn, bk, st, sk in product(BM_CHOICES, BN_CHOICES, BK_CHOICES, STAGES, SPLIT_K):
        if bm < min_bm:
            continue
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
        partials = 2 * sk * m * n * 4 if sk > 1 else 0  # fp32 partial sums written, then read to reduce
        traffic = batch * (operand_traffic(tm, tn, sk, bm, bn, bk, st, k_pad, e, b_elem_bytes or e, units, l2_bytes,
                                           a_unique) + c_bytes + partials)
        feed = feed_efficiency(bm, bn, e, macs_per_unit, sram_bytes_per_s)
        # the split-K partial sums are reduced after the K loop, serially: the matrix units wait for them
        compute = (flops * (k_pad / k) / (peak_flops_per_s * tile_eff * wave_eff * feed)
                   + batch * partials / bandwidth_bytes_per_s)
        out.append((bm, bn, bk, st, sram, tiles, waves, tile_eff, wave_eff, traffic, compute,
                    traffic / bandwidth_bytes_per_s, k_pad, sk, feed, False))
        if stream_k and sk == 1 and wave_eff < 1.0:
            # Stream-K (Osama et al., PPoPP 2023; the persistent tile schedulers of CUTLASS 3 / cuBLAS on
            # Hopper and Blackwell): the tiles' K iterations are dealt evenly to the units, so the last wave's
            # idle units vanish; where a unit's share ends inside a tile, that tile's fp32 partial accumulator
            # is written and read back (at most one per unit), serially after the K loop like split-K's partials
            iters = tiles * math.ceil(k_pad / bk)
            sk_eff = iters / (math.ceil(iters / units) * units)
            fixup = 2 * min(units, iters) * bm * bn * 4
            sk_compute = (flops * (k_pad / k) / (peak_flops_per_s * tile_eff * sk_eff * feed)
                          + batch * fixup / bandwidth_bytes_per_s)
            sk_traffic = traffic + batch * fixup
            out.append((bm, bn, bk, st, sram, tiles, waves, tile_eff, sk_eff, sk_traffic, sk_compute,
                        sk_traffic / bandwidth_bytes_per_s, k_pad, 1, feed, True))
    if not out:
        sram, bm, bn, bk, st = smallest
        raise OpmapError(f"no legal GEMM tile: the smallest ({bm}x{bn}x{bk}, {st} stages) needs "
                         f"{sram / 1e3:.3g} kB of shared memory, the device has {sram_per_unit / 1e3:.3g} kB")
    return out


BR_CHOICES = (64, 128)  # query rows per block (FlashAttention-2 uses 64 / 128 on Ampere / Hopper)
BC_CHOICES = (32, 64, 128)  # key / value rows per block
DECODE_MAX_Q = 16  # at most this many queries per head: decode, split over the KV sequence (flash-decoding)
DECODE_SPLIT = 256  # keys per split in decode


@functools.lru_cache(maxsize=4096)  # repeated layers repeat their shapes
def attention_candidates(bh: int, sq: int, sk: int, d: int, dtype: str, *, causal: bool, sram_per_unit: float,
                         units: int, l2_bytes: float, peak_flops_per_s: float,
                         bandwidth_bytes_per_s: float, pairs: int | None = None) -> tuple[Tile, ...]:
    """Flash-style attention tiles, best first. Per block of Br queries the kernel streams all (causal: the
    unmasked) K and V blocks of Bc rows through SRAM; the S x S scores stay on chip.

    SRAM = (Br*d + 2 stages * 2 * Bc*d) * e. Traffic = Q and O once + K and V: once when they fit in half
    the L2; otherwise the query blocks of a head run side by side (the grid is ordered by head) and walk its
    keys in lockstep, so the L2 holds only the K / V blocks in flight (2 stages x 2 x Bc x d per head in the
    wave) and each head's K and V come from DRAM once per wave its query blocks span (ceil(blocks / units)
    times); when not even those fit, once per query block (ceil(Sq/Br) times; causal: the unmasked share).
    Decode (Sq <= DECODE_MAX_Q): one query block, the KV sequence split in DECODE_SPLIT-key chunks across
    the compute units; the KV cache read bounds it. ``pairs``: the unmasked pairs per head where the kernel
    counts them otherwise (MatrixProblem.pairs: a sliding window); None: PyTorch's causal count, or Sq x Sk.
    """
    e = format_bytes(dtype)
    if pairs is None:
        pairs = causal_pairs(sq, sk) if causal else sq * sk
    flops = 4.0 * bh * pairs * d
    kv = 2.0 * bh * sk * d * e
    qo = 2.0 * bh * sq * d * e
    out = []
    smallest = None
    brs = (DECODE_MAX_Q,) if sq <= DECODE_MAX_Q else BR_CHOICES
    for br, bc in product(brs, BC_CHOICES):
        sram = (br * d + 2 * 2 * bc * d) * e
        if smallest is None or sram < smallest[0]:
            smallest = (sram, br, bc)
        if sram > sram_per_unit:
            continue
        tq = math.ceil(sq / br)
        splits = math.ceil(sk / DECODE_SPLIT) if sq <= DECODE_MAX_Q else 1
        tiles = bh * tq * splits
        waves = math.ceil(tiles / units)
        tile_eff = sq / (tq * br) if sq > DECODE_MAX_Q else 1.0
        wave_eff = tiles / (waves * units)
        share = pairs / (sq * sk)
        heads_in_wave = math.ceil(min(tiles, units) / (tq * splits))
        in_flight = heads_in_wave * 2 * 2 * bc * d * e
        if kv <= l2_bytes / 2 or tq == 1:
            kv_reads = 1.0
        elif in_flight <= l2_bytes / 2:
            kv_reads = float(math.ceil(tq / units))
        else:
            kv_reads = max(1.0, tq * share)
        traffic = qo + kv * kv_reads + (2 * bh * sq * splits * d * 4 if splits > 1 else 0)  # split partials
        compute = flops / (peak_flops_per_s * tile_eff * wave_eff)
        out.append(Tile(br, bc, d, 2, sram, tiles, waves, tile_eff, wave_eff, traffic, compute,
                        traffic / bandwidth_bytes_per_s, d, splits))
    if not out:
        sram, br, bc = smallest
        raise OpmapError(f"no legal attention tile: the smallest ({br} queries x {bc} keys, head dim {d}) needs "
                         f"{sram / 1e3:.3g} kB of shared memory, the device has {sram_per_unit / 1e3:.3g} kB")
    return tuple(sorted(out, key=lambda t: (round(t.time_s, 15), -(t.bm * t.bn))))


# CPU cache blocking (Goto / BLIS): an mc x kc block of A stays in a core's L2, a kc x nr micro-panel of B in
# L1, a kc x nc panel of B in the shared last-level cache; blocks of C (mc x nc) are shared out over cores.
MC_CHOICES = (16, 32, 64, 128, 256, 512)
NC_CHOICES = (64, 128, 256, 512, 1024, 2048, 4096)
KC_CHOICES = (128, 256, 384, 512)
NR = 16  # micro-kernel width: one 512-bit register of fp32 (AVX-512) or two of AVX2
L1_BYTES = 32 * 1024  # per core, where the hardware profile does not say (x86 server cores: 32-48 KiB)


@functools.lru_cache(maxsize=4096)  # repeated layers repeat their shapes
def cpu_tile_candidates(batch: int, m: int, n: int, k: int, dtype: str, *, l2_per_core: float, llc_bytes: float,
                        cores: int, peak_flops_per_s: float, bandwidth_bytes_per_s: float,
                        l1_bytes: float = L1_BYTES) -> tuple[Tile, ...]:
    """Cache-blocking candidates, best first, in the GPU tiles' columns: ``sram_bytes`` is the per-core
    footprint (A block + B micro-panel), tiles are C blocks, waves are rounds of them over the cores.

    Legal when the A block fits half the L2, the B micro-panel half the L1 and the B panel half the LLC.
    Traffic: A re-read once per column block of C (ceil(N/nc)), B once per row block (ceil(M/mc)) unless
    B fits in half the LLC (then once); C written once.
    """
    e = format_bytes(dtype)
    flops = 2.0 * batch * m * n * k
    out = []
    for mc, nc, kc in product(MC_CHOICES, NC_CHOICES, KC_CHOICES):
        a_blk, b_micro, b_panel = mc * kc * e, kc * NR * e, kc * nc * e
        if a_blk > l2_per_core / 2 or b_micro > l1_bytes / 2 or b_panel > llc_bytes / 2:
            continue
        tm, tn = math.ceil(m / mc), math.ceil(n / nc)
        tiles = batch * tm * tn
        waves = math.ceil(tiles / cores)
        tile_eff = (m * n) / (tm * mc * tn * nc)
        wave_eff = tiles / (waves * cores)
        b_reads = 1 if k * n * e <= llc_bytes / 2 else tm
        traffic = batch * (m * k * e * tn + k * n * e * b_reads + m * n * e)
        compute = flops / (peak_flops_per_s * tile_eff * wave_eff)
        out.append(Tile(mc, nc, kc, 1, a_blk + b_micro, tiles, waves, tile_eff, wave_eff, traffic, compute,
                        traffic / bandwidth_bytes_per_s, k))
    if not out:
        raise OpmapError(f"no legal CPU blocking: the smallest A block ({MC_CHOICES[0]}x{KC_CHOICES[0]}) needs "
                         f"{MC_CHOICES[0] * KC_CHOICES[0] * e / 1e3:.3g} kB, half the core's L2 is "
                         f"{l2_per_core / 2e3:.3g} kB")
    return tuple(sorted(out, key=lambda t: (round(t.time_s, 15), -(t.bm * t.bn * t.bk))))
