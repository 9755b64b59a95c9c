"""Tilers: one per kind of kernel and device, registered by decorator; each returns a tile or a reason.

A tiler says whether it applies to a kernel's anchor (its matrix problem on this device) and, when it
does, searches tiles (tiling.py) and returns a ``TileChoice``: the best tile and the runner-up, and, where
the tile model gives the time (a GPU, a catalog CPU), the anchor's tiled compute time and operand traffic
replacing the per-node figures. A search with no legal tile returns a ``NoTile`` whose reason names the
limit in numbers ("needs 6.14 kB of shared memory, the device has 4.1 kB"; decimal units, as everywhere).

Registered, in the order they are tried:

- ``gpu_gemm``: GEMM and conv (as implicit GEMM) on a device that lists shared memory per compute unit;
- ``cpu_blocking``: the same problems on a CPU (cache blocking against L1 / L2 per core and the LLC); a
  calibrated CPU keeps its measured shape curve for the time and shows the blocking beside it;
- ``flash_attention``: fused attention on a GPU-like device (flash tiles; flash-decoding at <= 16 queries); a
  decode call (one query per sequence, up to 16: a speculative verify) on a device with a measured decode attention
  grid takes its time from the grid (``TileChoice.measured_s``), the tile shown for its traffic; on a device with
  no tile search (its catalog lists no compute units) the grid prices it all the same, with no tile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from opmap.costs.base import OpCost
from opmap.errors import OpmapError
from opmap.hardware.attention_grid import DecodeTime, HeadConfig
from opmap.hardware.curves import Curves
from opmap.hardware.spec import HardwareSpec
from opmap.mapping.tiling import DECODE_MAX_Q, Tile, attention_candidates, best_tiles, cpu_tile_candidates
from opmap.ops import MatrixFamily
from opmap.precision import Precision, format_bytes


@dataclass(frozen=True)
class TileChoice:
    tile: Tile | None  # None: a measured time on a device with no tile search (``measured_s``)
    runner_up: Tile | None
    compute_s: float | None  # the anchor's matrix time under this tile (None: keep the per-node figure)
    traffic_bytes: float | None  # the anchor's device-memory traffic under this tile (None: keep)
    note: str = ""  # appended to the kernel row's why
    # the anchor's whole time measured (a device's decode attention grid), launch included: its memory term
    measured_s: float | None = None


@dataclass(frozen=True)
class NoTile:
    reason: str  # appended to the kernel row's why


Tiler = Callable[[OpCost, HardwareSpec, Precision, Curves], "TileChoice | NoTile"]
Applies = Callable[[OpCost, HardwareSpec], bool]
TILERS: list[tuple[str, Applies, Tiler]] = []


def tiler(name: str, applies: Applies) -> Callable[[Tiler], Tiler]:
    """Register ``fn`` as the tiler for the kernels ``applies`` accepts."""

    def deco(fn: Tiler) -> Tiler:
        if any(n == name for n, _, _ in TILERS):
            raise ValueError(f"two tilers named {name}")
        TILERS.append((name, applies, fn))
        return fn

    return deco


def choose_tile(anchor: OpCost, hw: HardwareSpec, prec: Precision, curves: Curves) -> TileChoice | NoTile | None:
    """The first registered tiler that applies to the kernel's anchor, or None when none does."""
    if anchor.problem is None or not anchor.matrix_flops:
        return None
    for _, applies, fn in TILERS:
        if applies(anchor, hw):
            return fn(anchor, hw, prec, curves)
    if anchor.problem.family.attention:  # a device with no tile search (no compute units listed): its grid still
        measured = _decode_grid(anchor, hw, prec, curves)
        if measured is not None:
            return TileChoice(None, None, None, None, measured.note, measured.seconds)
    return None


def _reps(c: OpCost) -> float:
    """GEMMs per problem: convolution_backward runs one forward-sized implicit GEMM per gradient it makes."""
    return c.matrix_flops / c.problem.flops


@tiler("gpu_gemm", lambda c, hw: hw.tiled and c.problem.family.gemm_like)
def gpu_gemm(c: OpCost, hw: HardwareSpec, prec: Precision, curves: Curves) -> TileChoice | NoTile:
    p = c.problem
    # an implicit-GEMM convolution reads its input, not the unfolded im2col matrix (k x k windows overlap)
    im2col = p.batch * p.m * p.k * format_bytes(prec.operand_format)
    a_unique = min(1.0, c.bytes_read / im2col) if p.family == MatrixFamily.CONV and c.bytes_read else 1.0
    try:  # the best tile and the runner-up (tiling.tile_candidates' first two)
        cands = best_tiles(p.batch, p.m, p.n, p.k, prec.operand_format, sram_per_unit=hw.sram_per_unit_bytes,
                           units=hw.compute_units, l2_bytes=hw.l2_bytes or 0.0,
                           peak_flops_per_s=prec.matrix_rate_flops_per_s,
                           bandwidth_bytes_per_s=hw.memory_rate_bytes_per_s,
                           b_elem_bytes=prec.weight_operand_bytes, sram_bytes_per_s=hw.sram_bytes_per_s,
                           min_bm=hw.mma_min_m, a_unique=round(a_unique, 6),
                           dense_peak_flops_per_s=prec.matrix_peak_flops_per_s, stream_k=hw.stream_k_gemm)
    except OpmapError as e:
        return NoTile(f"; untiled: {e}")
    tile, reps = cands[0], _reps(c)
    if curves.matrix_rate(p, prec.matrix) is not None and not prec.format_policy.weight_only:
        # measured rates at shapes (a calibration, or published per-shape timings in the catalog): they carry what
        # the tile model leaves out (per-tile prologue and epilogue, the library's kernel choice); the tile is shown
        return TileChoice(tile, cands[1] if len(cands) > 1 else None, None, reps * tile.traffic_bytes,
                          "; time from the measured shape curve, the tile shown for its layout and traffic")
    note = f"; K {p.k} padded to {tile.k_padded} for the matrix engine's alignment" if tile.k_padded != p.k else ""
    if not hw.sram_bytes_per_s:
        note += "; operand feed not modelled (the spec lists no shared-memory bandwidth or clock)"
    if tile.stream_k:
        note += (f"; Stream-K: the K loop dealt evenly to the units ({tile.wave_efficiency:.0%} busy), "
                 f"a data-parallel last wave would have run {tile.tiles % hw.compute_units or hw.compute_units} "
                 f"of {hw.compute_units} units")
    return TileChoice(tile, cands[1] if len(cands) > 1 else None, reps * tile.compute_s, reps * tile.traffic_bytes,
                      note)


@tiler("cpu_blocking", lambda c, hw: hw.cache_blocked and c.problem.family.gemm_like)
def cpu_blocking(c: OpCost, hw: HardwareSpec, prec: Precision, curves: Curves) -> TileChoice | NoTile:
    p = c.problem
    try:
        cands = cpu_tile_candidates(p.batch, p.m, p.n, p.k, prec.matrix, l2_per_core=hw.sram_per_unit_bytes,
                                    llc_bytes=hw.l2_bytes or hw.sram_per_unit_bytes, cores=hw.compute_units,
                                    peak_flops_per_s=prec.matrix_rate_flops_per_s,
                                    bandwidth_bytes_per_s=hw.memory_rate_bytes_per_s)
    except OpmapError as e:
        return NoTile(f"; unblocked: {e}")
    tile, runner = cands[0], (cands[1] if len(cands) > 1 else None)
    if curves.empty:  # a catalog CPU: the blocking model gives the time
        reps = _reps(c)
        return TileChoice(tile, runner, reps * tile.compute_s, reps * tile.traffic_bytes)
    return TileChoice(tile, runner, None, None, "; cache blocking shown, time from the measured shape curve")


@tiler("flash_attention", lambda c, hw: hw.tiled and c.problem.family.attention)
def flash_attention(c: OpCost, hw: HardwareSpec, prec: Precision, curves: Curves) -> TileChoice | NoTile:
    p = c.problem
    bh, sq, sk, d = p.batch, p.m, p.n, p.k
    try:
        cands = attention_candidates(bh, sq, sk, d, prec.matrix, causal=p.family.causal,
                                     sram_per_unit=hw.sram_per_unit_bytes, units=hw.compute_units,
                                     l2_bytes=hw.l2_bytes or 0.0, peak_flops_per_s=prec.matrix_rate_flops_per_s,
                                     bandwidth_bytes_per_s=hw.memory_rate_bytes_per_s, pairs=p.pairs)
    except OpmapError as e:
        return NoTile(f"; untiled: {e}")
    tile = cands[0]
    e = format_bytes(prec.matrix)
    if sq <= DECODE_MAX_Q:
        note = f"; flash-decoding: the KV cache read bounds it, {tile.split_k} splits"
        # grouped-query attention: the query heads of a group share one query block (FlashInfer, FlashAttention's
        # pack-GQA), so each KV head is read once, not once per query head (the candidates count per query head)
        kv_per_q_head = 2.0 * bh * sk * d * e
        kv_read = c.bytes_read - bh * sq * d * e  # K and V (and a mask) as the node reads them: KV heads
        if 0 < kv_read < kv_per_q_head:
            traffic = tile.traffic_bytes - kv_per_q_head + kv_read
            tile = replace(tile, traffic_bytes=traffic, memory_s=traffic / hw.memory_rate_bytes_per_s)
            note += f", each KV head read once for its {kv_per_q_head / kv_read:.3g} query heads"
        measured = _decode_grid(c, hw, prec, curves)
        if measured is not None:
            return TileChoice(tile, cands[1] if len(cands) > 1 else None, None, tile.traffic_bytes,
                              note + measured.note + ", the tile shown for its traffic", measured.seconds)
    else:
        kv_reads = (tile.traffic_bytes - 2.0 * bh * sq * d * e) / (2.0 * bh * sk * d * e)
        note = (f"; flash tiling {tile.bm} queries x {tile.bn} keys: K and V read {kv_reads:.3g} times, "
                "scores stay on chip")
    # the tiles price one forward pass (QK^T and PV over the pairs); a backward runs 2.5x its matrix work (five
    # GEMMs over the same pairs, FlashAttention-2 section 3.2) through the same tiling
    fwd = 4.0 * bh * p.attention_pairs * d
    reps = c.matrix_flops / fwd if fwd and c.matrix_flops > fwd else 1.0
    if reps > 1.0:
        note += f"; backward: {reps:.3g}x the forward's matrix work on the same tiles"
    own = MatrixFamily.ATTENTION_BWD if p.family.backward else MatrixFamily.ATTENTION
    if any(curves.tables.get((f, prec.matrix)) is not None for f in (p.family, own)):
        # a measured pass (the catalog's published timings of the kernel the stack runs, or a calibration's): it
        # carries what the tiles leave out (the kernel's pipeline and softmax overlap, the backward's dQ
        # accumulated by atomics across key blocks and the extra on-chip traffic of five GEMMs); tile shown
        return TileChoice(tile, cands[1] if len(cands) > 1 else None, None,
                          max(tile.traffic_bytes, c.bytes) if reps > 1.0 else tile.traffic_bytes,
                          note + f"; time from the measured {'backward' if p.family.backward else 'forward'} "
                                 "curve, the tile shown for its traffic")
    # a kernel whose dropout factor is measured pays it on the tiles' time too (1 where none is)
    slow = curves.dropout_slowdown(p)
    if slow != 1.0:
        note += f"; dropout: {slow:.3g}x the kernel's measured no-dropout time"
    return TileChoice(tile, cands[1] if len(cands) > 1 else None, reps * tile.compute_s * slow,
                      max(tile.traffic_bytes, c.bytes) if reps > 1.0 else tile.traffic_bytes, note)


def _decode_grid(c: OpCost, hw: HardwareSpec, prec: Precision, curves: Curves) -> DecodeTime | None:
    """A decode fused attention call (one new token per sequence, or up to DECODE_MAX_Q: a speculative verify) priced
    off the device's measured decode attention grid (opmap.hardware.attention_grid), its note saying so; None where
    the device has no grid, the call has more queries a sequence, its heads are not known, its KV cache is neither 2
    nor 1 byte an element (the tables time bf16 and fp8 caches) or no configuration of its head dim (values as wide)
    was measured. The grid's times are the attention kernel alone: RoPE and the KV-cache write, inside the measured
    call, were taken out where the tables were extracted (opmap prices them in the QKV projection's epilogue), and
    the output projection is a GEMM of its own."""
    p, grid = c.problem, curves.decode_attention
    if grid is None or p.m > DECODE_MAX_Q or p.heads is None or p.family.backward \
            or p.heads.kv_itemsize not in (1.0, 2.0) or not grid.measures(p.k) \
            or c.matrix_flops != 4.0 * p.batch * p.attention_pairs * p.k:
        return None  # (the last: values as wide as the keys, as the tables time; MLA's are narrower)
    hd = p.heads
    want = HeadConfig("fp8" if hd.kv_itemsize == 1.0 else "bf16", hd.heads, hd.kv_heads, p.k, hd.window)
    t = grid.time_s(want, max(1, p.batch // hd.heads), p.n, hw.memory_rate_bytes_per_s,
                    prec.matrix_rate_flops_per_s, p.m)
    note = (f"; decode attention from the measured grid {grid.name} ({t.config.label()}, "
            f"{t.seconds * 1e6:.3g} us{': ' + t.note if t.note else ''})")
    return DecodeTime(t.seconds, t.config, note)
