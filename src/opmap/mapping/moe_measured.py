"""MoE layers priced off the device's measured MoE grid (opmap.hardware.moe_grid), where it has one for the format.

An engine runs a MoE layer's experts as one fused call (TensorRT-LLM's fused MoE: routing of the router's logits,
the activations' quantization, permute, the gate-and-up and down grouped GEMMs with the gated activation between
them, finalize). Where the catalog device carries a measured grid of that call (``[calibration] moe_grid``) with a
table for the priced format, ``price_measured_moe`` replaces, per MoE layer of the analysis:

- each grouped expert GEMM's time (opmap.mapping.kernels._grouped) by its share of the measured layer time: the
  layer's time at the captured tokens on one device (tp 1, ep 1), split over its grouped GEMMs by their FLOPs (gate
  and up 2/3, down 1/3 for a gated expert); the kernel's launch stays as the time model adds it to every kernel;
- the other kernels of the experts module (the per-expert bias adds, the gated activation, the gather, the routing
  weights' scaling and the sum of the finalize, as the captured loop runs them) by nothing: they are inside the
  measured call. The router's GEMM and its top-k / softmax kernels stay priced (the call times the routing of
  given logits, a few microseconds: a small overlap, said in the note).

Each kernel so priced carries a ``MeasuredMoe`` (its ``moe`` field): opmap.mapping.device_time reads the layer's time
again for a layout (the tokens entering the layer on one device: the captured tokens, times ep where each EP rank
brings its own, times the EP load imbalance; each expert over tp, or tp / ep where the experts spread over the tp
group), so expert and tensor parallelism are priced off the measured layouts too. A device or format without a
grid is priced as before.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from opmap.hardware.moe_grid import MoeGrid, MoeShape, Rates, load_moe_grid
from opmap.mapping.fusion import expert_gemm_key
from opmap.roofline import Bound, Limiter, Roofline, roofline

ROUTING_NOTE = ("the router's GEMM and its top-k / softmax stay priced apart (the measured call routes given logits: "
                "a few us overlap)")


@dataclass(frozen=True, eq=False)
class MeasuredMoe:
    """One kernel of a MoE layer priced off a measured grid: ``share`` of the layer's time (0: a kernel inside the
    measured call), the layer's ``shape`` at tp 1 / ep 1, the ``tokens`` entering it as captured."""

    grid: MoeGrid
    fmt: str
    shape: MoeShape
    tokens: float
    share: float
    rates: Rates

    @lru_cache(maxsize=64)  # noqa: B019 (eq=False: hashed by identity; a few layouts per kernel)
    def layer_s(self, tp: int, ep: int, ep_over_tp: bool, imbalance: float) -> float | None:
        """The layer's time on one device of a layout (module docstring); None where the grid has no table."""
        if ep > 1 and ep_over_tp:
            shape, tokens = replace(self.shape, tp=max(1, tp // ep), ep=ep), self.tokens * imbalance
        elif ep > 1:
            shape, tokens = replace(self.shape, tp=tp, ep=ep), self.tokens * ep * imbalance
        else:
            shape, tokens = replace(self.shape, tp=tp), self.tokens
        price = self.grid.layer_s(self.fmt, shape, tokens, self.rates)
        return price.seconds if price is not None else None

    def device_s(self, tp: int, ep: int, ep_over_tp: bool, imbalance: float) -> float | None:
        """This kernel's part of the layer's time on one device of the layout (without its launch)."""
        if not self.share:
            return 0.0
        t = self.layer_s(tp, ep, ep_over_tp, imbalance)
        return t * self.share if t is not None else None


def moe_grid_for(hw, fmt: str) -> MoeGrid | None:
    """The device's measured MoE grid where it has a table for ``fmt``; None otherwise."""
    name = hw.calibration.get("moe_grid") if hw.calibration else None
    if not isinstance(name, str):
        return None
    grid = load_moe_grid(name)
    return grid if fmt in grid.tables else None


def _container(node) -> str | None:
    key = expert_gemm_key(node)
    return key[0] if key is not None else None


def _members(kernels, nodes, containers: set[str]) -> dict[str, list[int]]:
    """Per experts container, the indices of the kernels inside it that are not GEMMs (the anchor's module the
    container or below it)."""
    out: dict[str, list[int]] = {}
    for j, k in enumerate(kernels):
        if str(k.kernel.kernel_class) == "matrix":
            continue
        parts = nodes[k.kernel.anchor].module.split(".")
        for n in range(len(parts), 0, -1):
            c = ".".join(parts[:n])
            if c in containers:
                out.setdefault(c, []).append(j)
                break
    return out


def price_measured_moe(kernels, nodes, costs, hw, prec, geometry) -> tuple[list, str | None]:
    """(``kernels`` with each MoE layer priced off the measured grid, a line for the assumptions; or ``kernels`` as
    they are and None where the device has no grid for the format or the model no routed experts)."""
    fmt = prec.requested
    grid = moe_grid_for(hw, fmt)
    if grid is None or geometry is None or not geometry.n_experts or not geometry.top_k:
        return list(kernels), None
    shape = MoeShape(geometry.hidden, geometry.expert_ffn or geometry.ffn, geometry.top_k, geometry.n_experts)
    rates = Rates(prec.matrix_rate_flops_per_s, hw.memory_rate_bytes_per_s, prec.format_policy.weight_bytes)
    layers: dict[str, list[int]] = {}  # experts container -> its grouped GEMM kernels' indices
    for i, k in enumerate(kernels):
        c = _container(nodes[k.kernel.anchor]) if k.kernel.grouped > 1 else None
        if c is not None:
            layers.setdefault(c, []).append(i)
    if not layers:
        return list(kernels), None
    members = _members(kernels, nodes, set(layers))
    out = list(kernels)
    notes = set()
    seen: dict[tuple[float, float], MeasuredMoe] = {}
    for c, idx in layers.items():
        flops = [sum(costs[m].matrix_flops for m in kernels[i].kernel.nodes) for i in idx]
        routed = max(sum(costs[m].problem.m * costs[m].problem.batch for m in kernels[i].kernel.nodes
                         if costs[m].problem is not None) for i in idx)
        tokens = routed / geometry.top_k
        price = grid.layer_s(fmt, shape, tokens, rates)
        if price is None or not sum(flops):
            continue
        notes.add(price.note.split(" at ")[0] if price.exact else price.note)
        def measured(share: float) -> MeasuredMoe:  # one per (tokens, share): the layers share their lookups
            key = (tokens, share)
            if key not in seen:
                seen[key] = MeasuredMoe(grid, fmt, shape, tokens, share, rates)
            return seen[key]

        for i, f in zip(idx, flops):
            out[i] = _grouped_measured(kernels[i], measured(f / sum(flops)), price.seconds, price.note)
        inside = measured(0.0)
        for j in members.get(c, ()):
            out[j] = _inside_measured(kernels[j], inside, c)
    if not notes:
        return list(kernels), None
    line = (f"MoE layers off the measured grid {grid.name} ({'; '.join(sorted(notes))}): {grid.source}; "
            + ROUTING_NOTE)
    return out, line


def _grouped_measured(k, moe: MeasuredMoe, layer_s: float, note: str):
    """A grouped expert GEMM at its share of the measured layer time (its launch as the time model adds it)."""
    t = layer_s * moe.share
    r = k.time
    time = roofline(t, min(r.vector_s, t), min(r.memory_s, t), r.overhead_s)
    why = (f"{time.bound}: {note}, this grouped GEMM {moe.share:.0%} of the layer (its FLOPs' share): "
           f"{t * 1e6:.3g} us")
    if "grouped GEMM of " in k.why:  # what the kernel is (opmap.mapping.kernels._grouped), its time now measured
        why += "; " + "grouped GEMM of " + k.why.split("grouped GEMM of ", 1)[1].split(":")[0]
    return replace(k, time=time, why=why, moe=moe)


def _inside_measured(k, moe: MeasuredMoe, container: str):
    """A kernel of the experts module inside the measured fused call: no time of its own."""
    time = Roofline(0.0, 0.0, 0.0, 0.0, 0.0, Bound.COMPUTE, Limiter.NONE)
    return replace(k, time=time, why=f"inside the measured fused MoE call of {container} (priced with its grouped "
                                     "GEMMs)", moe=moe)
