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

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from opmap.costs.base import OpCost
from opmap.errors import OpmapError
from opmap.graph import Node
from opmap.hardware.curves import Curves
from opmap.hardware.spec import HardwareSpec
from opmap.mapping.fusion import FusionPlan, Kernel
from opmap.mapping.tilers import NoTile, TileChoice, choose_tile
from opmap.mapping.tiling import Tile
from opmap.ops import CONV_OPS, COPY_OPS, GEMM_OPS
from opmap.precision import Precision
from opmap.predict import attention_exposed_s
from opmap.roofline import Bound, Roofline, roofline


@dataclass(frozen=True)
class KernelResult:
    kernel: Kernel
    time: Roofline  # the kernel's terms, predicted time, bound and limiter
    traffic_bytes: float
    tile: Tile | None
    runner_up: Tile | None
    format: str
    layout: str
    why: str
    moe: Any = None  # opmap.mapping.moe_measured.MeasuredMoe: a MoE layer's kernel priced off a measured grid

    @property
    def predicted_s(self) -> float:
        return self.time.predicted_s

    @property
    def bound(self) -> Bound:
        return self.time.bound

    def to_dict(self) -> dict[str, Any]:
        """A computed shape: the kernel's, tile's and time's fields merged into one row (and on the hot path)."""
        k, t = self.kernel, self.tile
        terms = {key: v for key, v in self.time.to_dict().items() if key not in ("bound", "limiter")}
        return {
            "id": k.id, "nodes": k.nodes, "kernel_class": k.kernel_class, "anchor": k.anchor,
            "tile": t.to_dict() if t else None, "runner_up_tile": self.runner_up.to_dict() if self.runner_up else None,
            "sram_bytes": t.sram_bytes if t else None, "tiles": t.tiles if t else None,
            "waves": t.waves if t else None, "tile_efficiency": t.tile_efficiency if t else None,
            "wave_efficiency": t.wave_efficiency if t else None,
            "feed_efficiency": t.feed_efficiency if t else None, "format": self.format, "layout": self.layout,
            "min_bytes": k.min_bytes, "eager_bytes": k.eager_bytes, "traffic_bytes": self.traffic_bytes,
            **terms, "bound": self.bound, "why": self.why,
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
                curves: Curves, node_prec: Sequence[Precision] | None = None) -> list[KernelResult]:
    """The kernels of ``plan`` with their tiles, formats and times. ``node_prec``: a precision per node where they
    differ (fp8 training: the Linear GEMMs fp8, the rest bf16); a kernel runs at its anchor's.

    A kernel's row is a pure function of its nodes' costs and predictions, its bytes, its class, its anchor's
    place and operand layout and its precision (``_signature``): each distinct one is mapped once and the kernels
    that repeat it (58 MoE layers x 256 experts of DeepSeek-R1) take its row with their own kernel."""
    out = []
    tiles: dict[tuple[OpCost, int], Any] = {}  # (anchor cost, precision) -> its tile choice: a pure function of them
    rows: dict[tuple, KernelResult] = {}
    for k in plan.kernels:
        kp = node_prec[k.anchor] if node_prec is not None else prec
        key = _signature(k, nodes[k.anchor], costs, preds, kp)
        r = rows.get(key)
        if r is None:
            ac = costs[k.anchor]
            choice = tiles.get((ac, id(kp)))
            if choice is None:
                choice = tiles[(ac, id(kp))] = choose_tile(ac, hw, kp, curves)
            r = rows[key] = _map_kernel(k, nodes[k.anchor], costs, preds, hw, kp, curves, choice)
        elif r.kernel is not k:
            r = _with_kernel(r, k)
        out.append(r)
    return out


def _signature(k: Kernel, anchor: Node, costs, preds, kp: Precision) -> tuple:
    """What ``_map_kernel`` reads of a kernel: its class, bytes, anchor's place among its nodes, each node's cost
    and prediction (the objects: cost_graph and analyze share one per distinct node, and a value is never
    mutated), the anchor's operand layout (op, shapes, strides, parameter or not) and the precision."""
    return (k.kernel_class, k.min_bytes, k.eager_bytes, k.nodes.index(k.anchor), id(kp),
            tuple([(id(costs[m]), id(preds[m])) for m in k.nodes]),
            anchor.op, anchor.input_names, tuple([(t.shape, t.stride, t.param is None) for t in anchor.inputs]),
            tuple([(t.shape, t.stride) for t in anchor.outputs]))


def _with_kernel(r: KernelResult, k: Kernel) -> KernelResult:
    """``replace(r, kernel=k)`` without the dataclass __init__ (a row copied per repeated kernel)."""
    new = object.__new__(KernelResult)
    new.__dict__.update(r.__dict__)
    new.__dict__["kernel"] = k
    return new


def _map_kernel(k: Kernel, anchor: Node, costs, preds, hw: HardwareSpec, kp: Precision, curves: Curves,
                choice) -> KernelResult:
    """One kernel's row: its tile (``choice``), traffic, roofline time, format, layout and why."""
    ac = costs[k.anchor]
    matrix_s = sum(preds[m].matrix_s for m in k.nodes)
    vector_s = sum(preds[m].vector_s for m in k.nodes)
    traffic = k.min_bytes  # parameters at their stored format (analyze.stored_weights)
    tile = runner = None
    why_tile = ""
    if isinstance(choice, NoTile):
        why_tile = choice.reason
    elif isinstance(choice, TileChoice):
        tile, runner, why_tile = choice.tile, choice.runner_up, choice.note
        if choice.compute_s is not None:
            matrix_s += choice.compute_s - preds[k.anchor].matrix_s
        if choice.traffic_bytes is not None:
            traffic = choice.traffic_bytes + max(0.0, k.min_bytes - ac.bytes)  # + the epilogue's bytes
    if k.grouped > 1:  # the experts' GEMMs as one grouped GEMM (opmap.mapping.fusion)
        matrix_s, traffic, why_tile = _grouped(k, costs, preds, kp, tile, why_tile)
    bw = curves.bandwidth(traffic) or hw.memory_rate_bytes_per_s
    # on a CPU the kernel's output (its last node's, the one a fused kernel writes out) comes from fresh
    # pages that fault in on first touch
    fresh_s = curves.fresh_page_s(costs[k.nodes[-1]].allocated_bytes) if hw.device_type == "cpu" else 0.0
    measured = isinstance(choice, TileChoice) and choice.compute_s is None  # the time from a measured curve
    exposed = attention_exposed_s(ac, hw, matrix_s, vector_s) if not curves.transcendental_per_s and \
        not measured else 0.0
    memory_s = traffic / bw + fresh_s
    if measured and choice.measured_s is not None:
        # the whole kernel measured (decode attention, timed replayed in a CUDA graph): its time less the in-graph
        # gap it was timed with, in the memory term (a decode attention call streams its KV cache), plus the
        # epilogue's bytes; the roofline adds the runtime's own launch back (eager pays its host launch on top)
        memory_s = max(0.0, choice.measured_s - _graph_gap_s(hw)) + max(0.0, k.min_bytes - ac.bytes) / bw
    r = roofline(matrix_s, vector_s, memory_s, hw.launch_overhead_s, serial_memory_s=fresh_s,
                 exposed_s=exposed)
    if not ac.counted:
        r = replace(r, bound=Bound.UNCOUNTED)
    elif isinstance(choice, TileChoice) and choice.compute_s is None and hw.device_type != "cpu" and \
            r.bound == Bound.COMPUTE and traffic / bw >= ac.matrix_flops / kp.matrix_rate_flops_per_s:
        # a measured GEMM time covers the whole kernel, its operand reads included, so it lands in the matrix
        # term; where the bytes bound it in first principles (a decode GEMV), the bottleneck is memory: the
        # kernel streams below the catalog's bandwidth, the time stays the measured one
        r = replace(r, bound=Bound.MEMORY)
        why_tile += "; bytes-bound by its arithmetic intensity (the measured time runs below the bandwidth)"
    why = _why(r, tile) + why_tile
    if fresh_s > 0.25 * r.memory_s:
        why += (f"; {fresh_s * 1e6:.3g} us of the memory time is first-touch page faults of its fresh "
                f"{costs[k.nodes[-1]].allocated_bytes / 1e6:.3g} MB output")
    transform = layout_transform(anchor)
    if transform:
        why = f"layout transform {transform}; " + why
    if k.kernel_class == "matrix" and sum(costs[m].matrix_flops > 0 for m in k.nodes) > 1 and any(
            costs[m].vector_kind == "softmax" for m in k.nodes):
        why += "; fused attention: the scores and their softmax stay on chip"
    if len(k.nodes) > 1:
        why += (f"; fuses {len(k.nodes)} nodes, saves {k.eager_bytes - k.min_bytes:.3g} B and "
                f"{k.launches_saved} launches")
    return KernelResult(k, r, traffic, tile, runner, kp.kernel_format(k.kernel_class), layout_of(anchor), why)


SWAP_AB_M = 64  # per-expert rows below one MMA tile's M: the grouped kernel swaps the operands


def _grouped(k: Kernel, costs, preds, kp: Precision, tile: Tile | None, why: str) -> tuple[float, float, str]:
    """(matrix time, traffic, why) of a grouped GEMM: every expert's GEMM in one kernel, as engines run an MoE layer
    (TensorRT-LLM / vLLM fused MoE over CUTLASS or Triton grouped GEMMs). The group's tiles fill the device whatever
    one expert's M, so its matrix time is the group's FLOPs at the format's achievable rate and the tile efficiency
    of one expert's shape (its M padded to the tile), not the sum of each small GEMM's measured or wave-quantized
    time; its bytes are what the group reads and writes (every expert's weights once, the routed tokens)."""
    flops = sum(costs[m].matrix_flops for m in k.nodes)
    eff = tile.tile_efficiency if tile is not None and tile.tile_efficiency > 0 else 1.0
    prob = costs[k.anchor].problem
    if prob is not None and 0 < prob.m < SWAP_AB_M:
        # a few tokens an expert: the grouped kernels put them on the MMA's narrow side (swap AB, as TensorRT-LLM's
        # and vLLM's MoE GEMMs do at decode), M padded to 8 rather than to a 64-row tile
        eff = max(eff, prob.m / (8 * -(-prob.m // 8)))
    rate = kp.matrix_rate_flops_per_s
    other = sum(preds[m].matrix_s for m in k.nodes if costs[m].matrix_flops == 0)
    note = (f"; grouped GEMM of {k.grouped} experts (one kernel, as engines run an MoE layer): "
            f"{flops:.3g} FLOPs at {rate:.3g} FLOP/s x tile efficiency {eff:.2f}, its bytes once")
    return flops / (rate * eff) + other, k.min_bytes, why.split(";")[0] + note if why else note.lstrip("; ")


def _why(r: Roofline, tile: Tile | None) -> str:
    """'compute: matrix 1.2 us > memory 0.8 us > vector 0.1 us', or the launch against the largest term."""
    def f(x):
        return f"{x * 1e6:.3g} us"
    terms = {n: v for n, v in r.terms().items() if n != "interconnect" or v}
    lim = max(terms, key=terms.get)
    order = sorted(terms.items(), key=lambda kv: -kv[1])
    s = f"{r.bound}: {lim} {f(terms[lim])}" + "".join(f" > {n} {f(v)}" for n, v in order if n != lim)
    if r.bound == Bound.OVERHEAD:
        s = f"overhead: launch {f(r.overhead_s)} > {lim} {f(terms[lim])}"
    if tile is not None:
        s += (f"; tile {tile.label()} ({tile.sram_bytes / 1e3:.3g} kB SRAM), {tile.tiles} tiles in {tile.waves} "
              f"waves (tile eff {tile.tile_efficiency:.0%}, wave eff {tile.wave_efficiency:.0%}, "
              f"feed eff {tile.feed_efficiency:.0%})")
    return s


def _graph_gap_s(hw: HardwareSpec) -> float:
    """The per-kernel gap inside a replayed graph on ``hw``'s software stack (opmap.hardware.runtimes: what a kernel
    timed under CUDA graph replay pays beside its work); the device's launch overhead where its stack has none."""
    from opmap.hardware.runtimes import stack_for

    try:
        return float(stack_for(hw).values["graph_kernel_gap_s"].value)
    except (KeyError, TypeError, ValueError, AttributeError, OpmapError):
        return hw.launch_overhead_s
