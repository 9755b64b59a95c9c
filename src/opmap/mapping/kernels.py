"""Kernels with their tile, format, layout, bytes and predicted time: the rows of the mapping sheet.

A kernel's prediction combines its nodes' per-node terms (predict.py):
``max(sum of matrix times, sum of vector times, kernel bytes / bandwidth) + one launch overhead``, where the
kernel bytes are the fused boundary traffic (fusion.py). A GEMM-like kernel (GEMM, or conv as implicit
GEMM) on a device with shared memory per compute unit gets a tile search (tiling.py): its matrix time
becomes the tiled compute time (tile and wave quantization included) and its bytes the tiled traffic plus
the epilogue's; fused attention gets flash tiles. On a CPU the search is cache blocking against L1 / L2 per
core with work balance over the cores; a catalog CPU takes its time from it, a calibrated one keeps the
measured shape curve (measurement beats the model) and shows the blocking beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from opmap.errors import OpmapError
from opmap.graph import Node
from opmap.hardware.curves import Curves
from opmap.hardware.spec import HardwareSpec
from opmap.mapping.fusion import FusionPlan, Kernel
from opmap.mapping.tiling import Tile, attention_candidates, cpu_tile_candidates, tile_candidates
from opmap.ops import CONV_OPS, COPY_OPS, GEMM_OPS
from opmap.precision import Precision, format_bytes


@dataclass(frozen=True)
class KernelResult:
    kernel: Kernel
    matrix_s: float
    vector_s: float
    memory_s: float
    overhead_s: float
    predicted_s: float
    bound: str
    traffic_bytes: float
    tile: Tile | None
    runner_up: Tile | None
    format: str
    layout: str
    why: str

    def to_dict(self) -> dict[str, Any]:
        k, t = self.kernel, self.tile
        return {
            "id": k.id, "nodes": k.nodes, "kernel_class": k.kernel_class, "anchor": k.anchor,
            "tile": t.to_dict() if t else None, "runner_up_tile": self.runner_up.to_dict() if self.runner_up else None,
            "sram_bytes": t.sram_bytes if t else None, "tiles": t.tiles if t else None,
            "waves": t.waves if t else None, "tile_efficiency": t.tile_efficiency if t else None,
            "wave_efficiency": t.wave_efficiency if t else None, "format": self.format, "layout": self.layout,
            "min_bytes": k.min_bytes, "eager_bytes": k.eager_bytes, "traffic_bytes": self.traffic_bytes,
            "matrix_s": self.matrix_s, "vector_s": self.vector_s, "memory_s": self.memory_s,
            "overhead_s": self.overhead_s, "predicted_s": self.predicted_s, "bound": self.bound, "why": self.why,
        }


def layout_of(node: Node) -> str:
    """Data layout of the anchor's operands, from their strides."""
    ins = [t for t in node.inputs if len(t.shape) >= 2]
    if not ins:
        return "contiguous"
    if node.packet in CONV_OPS:
        x = ins[0]
        cl = len(x.stride) == 4 and x.stride[1] == 1 and x.shape[1] > 1
        return "channels_last (NHWC)" if cl else "NCHW"
    if node.packet in GEMM_OPS:
        a, b = (node.input("mat1"), node.input("mat2")) if node.packet == "addmm" else (ins[0], ins[-1])
        if a is None or b is None:
            return "row-major"
        def major(t):
            st = t.stride[-2:]
            return "T" if st[0] == 1 and t.shape[-1] > 1 else "N"
        return f"A {major(a)}, B {major(b)}" + (" (x @ W.T)" if major(b) == "T" and b.param else "")
    strided = any(not _contiguous(t.shape, t.stride) for t in ins)
    return "strided input" if strided else "contiguous"


def _order(t) -> str:
    if len(t.shape) == 4 and t.stride[1] == 1 and t.shape[1] > 1:
        return "NHWC"
    return "NCHW" if len(t.shape) == 4 and _contiguous(t.shape, t.stride) else (
        "contiguous" if _contiguous(t.shape, t.stride) else "strided")


def layout_transform(node: Node) -> str:
    """'NCHW -> NHWC' when a copy changes the memory order of its tensor; '' otherwise."""
    if node.packet not in COPY_OPS or not node.inputs or not node.outputs:
        return ""
    src, dst = node.inputs[-1] if node.packet == "copy_" else node.inputs[0], node.outputs[0]
    if tuple(src.shape) != tuple(dst.shape) or tuple(src.stride) == tuple(dst.stride):
        return ""
    a, b = _order(src), _order(dst)
    return f"{a} -> {b}" if a != b else f"restride {a}"


def _contiguous(shape, stride) -> bool:
    expect = 1
    for sz, st in zip(reversed(shape), reversed(stride)):
        if sz != 1 and st != expect:
            return False
        expect *= sz
    return True


def map_kernels(plan: FusionPlan, nodes: Sequence[Node], costs, preds, hw: HardwareSpec, prec: Precision,
                curves: Curves) -> list[KernelResult]:
    gpu_like = hw.device_type != "cpu" and hw.get("sram_per_unit_bytes") and hw.get("compute_units")
    out = []
    for k in plan.kernels:
        anchor, ac = nodes[k.anchor], costs[k.anchor]
        matrix_s = sum(preds[m].matrix_s for m in k.nodes)
        vector_s = sum(preds[m].vector_s for m in k.nodes)
        param = sum(costs[m].param_bytes_read for m in k.nodes)
        traffic = k.min_bytes - param * (1.0 - prec.weight_scale)
        tile = runner = None
        why_tile = ""
        gemm_like = ("gemm", "gemm_ta", "conv", "conv_bwd")
        # GEMMs per problem: convolution_backward runs one forward-sized implicit GEMM per gradient it makes
        reps = (ac.matrix_flops / (2.0 * ac.problem[1] * ac.problem[2] * ac.problem[3] * ac.problem[4])
                if ac.problem and ac.problem[0] in gemm_like and ac.matrix_flops else 1.0)
        if gpu_like and ac.problem and ac.problem[0] in gemm_like and ac.matrix_flops:
            _, batch, m, n, kk = ac.problem
            try:
                cands = tile_candidates(batch, m, n, kk, prec.operand_format, sram_per_unit=hw.get("sram_per_unit_bytes"),
                                        units=int(hw.get("compute_units")), l2_bytes=hw.get("l2_bytes") or 0.0,
                                        peak_flops_per_s=prec.matrix_peak_flops_per_s,
                                        bandwidth_bytes_per_s=hw.memory_bandwidth_bytes_per_s,
                                        b_elem_bytes=prec.weight_operand_bytes)
                tile = cands[0]
                runner = cands[1] if len(cands) > 1 else None
                matrix_s += reps * tile.compute_s - preds[k.anchor].matrix_s
                traffic = reps * tile.traffic_bytes + max(0.0, k.min_bytes - ac.bytes)  # + the epilogue's bytes
                if tile.k_padded != kk:
                    why_tile = f"; K {kk} padded to {tile.k_padded} for the matrix engine's alignment"
            except OpmapError as e:
                why_tile = f"; untiled: {e}"
        elif (hw.device_type == "cpu" and ac.problem and ac.problem[0] in gemm_like and ac.matrix_flops
              and hw.get("sram_per_unit_bytes") and hw.get("compute_units")):
            _, batch, m, n, kk = ac.problem
            try:
                cands = cpu_tile_candidates(batch, m, n, kk, prec.matrix, l2_per_core=hw.get("sram_per_unit_bytes"),
                                            llc_bytes=hw.get("l2_bytes") or hw.get("sram_per_unit_bytes"),
                                            cores=int(hw.get("compute_units")),
                                            peak_flops_per_s=prec.matrix_peak_flops_per_s,
                                            bandwidth_bytes_per_s=hw.memory_bandwidth_bytes_per_s)
                tile, runner = cands[0], (cands[1] if len(cands) > 1 else None)
                if curves.empty:  # a catalog CPU: the blocking model gives the time
                    matrix_s += reps * tile.compute_s - preds[k.anchor].matrix_s
                    traffic = reps * tile.traffic_bytes + max(0.0, k.min_bytes - ac.bytes)
                else:
                    why_tile = "; cache blocking shown, time from the measured shape curve"
            except OpmapError as e:
                why_tile = f"; unblocked: {e}"
        elif gpu_like and ac.problem and ac.problem[0].startswith("attention") and ac.matrix_flops:
            fam, bh, sq, sk, d = ac.problem
            try:
                cands = attention_candidates(bh, sq, sk, d, prec.matrix, causal=fam.endswith("causal"),
                                             sram_per_unit=hw.get("sram_per_unit_bytes"),
                                             units=int(hw.get("compute_units")), l2_bytes=hw.get("l2_bytes") or 0.0,
                                             peak_flops_per_s=prec.matrix_peak_flops_per_s,
                                             bandwidth_bytes_per_s=hw.memory_bandwidth_bytes_per_s)
                tile = cands[0]
                runner = cands[1] if len(cands) > 1 else None
                matrix_s += tile.compute_s - preds[k.anchor].matrix_s
                traffic = tile.traffic_bytes + max(0.0, k.min_bytes - ac.bytes)
                why_tile = (f"; flash-decoding: the KV cache read bounds it, {tile.split_k} splits" if sq <= 16 else
                            f"; flash tiling {tile.bm} queries x {tile.bn} keys: K and V read "
                            f"{(tile.traffic_bytes - 2.0 * bh * sq * d * format_bytes(prec.matrix)) / (2.0 * bh * sk * d * format_bytes(prec.matrix)):.3g} times, "
                            "scores stay on chip")
            except OpmapError as e:
                why_tile = f"; untiled: {e}"
        bw = curves.bandwidth(traffic) or hw.memory_bandwidth_bytes_per_s
        memory_s = traffic / bw
        overhead = hw.launch_overhead_s
        terms = {"matrix": matrix_s, "vector": vector_s, "memory": memory_s}
        lim = max(terms, key=terms.get)
        bound = "overhead" if overhead > terms[lim] else ("compute" if lim in ("matrix", "vector") else "memory")
        if not ac.counted:
            bound = "uncounted"
        why = _why(bound, lim, terms, overhead, tile) + why_tile
        transform = layout_transform(anchor)
        if transform:
            why = f"layout transform {transform}; " + why
        if k.kernel_class == "matrix" and sum(costs[m].matrix_flops > 0 for m in k.nodes) > 1 and any(
                costs[m].vector_kind == "softmax" for m in k.nodes):
            why += "; fused attention: the scores and their softmax stay on chip"
        if len(k.nodes) > 1:
            why += f"; fuses {len(k.nodes)} nodes, saves {k.eager_bytes - k.min_bytes:.3g} B and {k.launches_saved} launches"
        fmt = prec.kernel_format(k.kernel_class)
        out.append(KernelResult(k, matrix_s, vector_s, memory_s, overhead, max(terms.values()) + overhead, bound,
                                traffic, tile, runner, fmt, layout_of(anchor), why))
    return out


def _why(bound: str, lim: str, terms: dict, overhead: float, tile: Tile | None) -> str:
    def f(x):
        return f"{x * 1e6:.3g} us"
    order = sorted(terms.items(), key=lambda kv: -kv[1])
    s = f"{bound}: {lim} {f(terms[lim])}" + "".join(f" > {n} {f(v)}" for n, v in order if n != lim)
    if bound == "overhead":
        s = f"overhead: launch {f(overhead)} > {lim} {f(terms[lim])}"
    if tile is not None:
        s += (f"; tile {tile.label()} ({tile.sram_bytes / 1024:.0f} KB SRAM), {tile.tiles} tiles in {tile.waves} "
              f"waves (tile eff {tile.tile_efficiency:.0%}, wave eff {tile.wave_efficiency:.0%})")
    return s
