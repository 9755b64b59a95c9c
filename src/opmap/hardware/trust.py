"""How far to trust a predicted figure (DESIGN.md: "every predicted figure says how far to trust it"), from the
provenance of the inputs that priced it.

A prediction rests on a few figures: the rate the matrix units run the format at, the rate device memory streams
at, the link a tensor- or expert-parallel group talks over (and the network where the group leaves its domain),
and the software stack's overheads (a launch per kernel, a graph replay, an engine's host time per step). Each is
a catalog ``Value`` with a kind (opmap.hardware.values). The label is the weakest of them:

- ``calibrated``: every input was measured on this device and stack (a profile written by ``opmap calibrate``, or
  a stack profile fitted to measured bench runs);
- ``anchored``: every input is a measurement, the device's own published ones (an achievable GEMM rate, a
  stream bandwidth, a link's busbw) and the stack's published overheads;
- ``datasheet``: some input is a datasheet peak, a figure derived from one, an estimate or an assumption.

The weakest input is named (its figure, kind and source), so a reader knows what to measure first to move the
label up. Ranks, weakest first: assumed, estimate, assessed, datasheet (and its dense / sparse peaks), derived,
measured (published), calibrated (measured here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from opmap.errors import OpmapError
from opmap.formats import get_format
from opmap.hardware.runtimes import stack_for
from opmap.hardware.spec import HardwareSpec
from opmap.precision import fallback, matrix_rate
from opmap.record import key

LABELS = ("datasheet", "anchored", "calibrated")
# weakest first: a kind's rank; datasheet figures and their derivations sit below every measurement
RANK = {"assumed": 0, "estimate": 1, "assessed": 1, "datasheet_sparse": 2, "datasheet_dense": 2, "datasheet": 2,
        "derived": 3, "measured": 4, "calibrated": 5}
# the runtime's overheads that price a step (phases/runtime.py's RUNTIMES): runtimes.toml keys, "" for the
# device's own launch overhead
RUNTIME_INPUTS = {"eager": ("",), "graphs": ("graph_kernel_gap_s", "graph_launch_s"),
                  "engine": ("graph_kernel_gap_s", "graph_launch_s", "engine_step_host_s"),
                  "engine-eager": ("", "engine_step_host_s")}


@dataclass(frozen=True)
class Input:
    """One figure a prediction rests on: what it is, its kind (``RANK``'s keys) and where it comes from."""

    name: str
    kind: str
    source: str

    @property
    def rank(self) -> int:
        return RANK.get(self.kind, 0)


@dataclass(frozen=True)
class Trust:
    """A prediction's confidence label and the input that sets it (the weakest, first in ``inputs`` order on a
    tie); ``inputs`` lists every figure considered."""

    label: str
    weakest: Input
    inputs: tuple[Input, ...]

    def line(self) -> str:
        w = self.weakest
        return f"confidence: {self.label} (weakest input: {w.name}, {w.kind}: {w.source})"

    def to_dict(self) -> dict[str, object]:
        return {"label": self.label, "weakest": {"name": self.weakest.name, "kind": self.weakest.kind,
                                                 "source": self.weakest.source},
                "inputs": [{"name": i.name, "kind": i.kind, "source": i.source} for i in self.inputs]}


@dataclass(frozen=True)
class Confidence:
    """How far to trust a result's figures, as its record writes it: the label, its weakest input, every input,
    and the label in words (``line``). Carried by fit cells, serve runs, analyses (their assumptions) and plans."""

    RECORD: ClassVar[tuple[str, ...]] = ("trust", "line")
    trust: Trust = field(metadata=key(flatten=True))

    @property
    def line(self) -> str:
        return self.trust.line()

    @property
    def label(self) -> str:
        return self.trust.label


def _calibrated(hw: HardwareSpec) -> bool:
    """A profile ``opmap calibrate`` wrote: its ``calibration`` table carries the host's fingerprint (a catalog
    device's table holds published curves, with their source, and no fingerprint)."""
    return "fingerprint" in hw.calibration


def _kind(hw: HardwareSpec, kind: str) -> str:
    return "calibrated" if kind == "measured" and _calibrated(hw) else kind


def matrix_input(hw: HardwareSpec, dtype: str) -> Input:
    """The matrix rate ``dtype`` runs at: its own measured figure, another format's measured fraction of peak
    applied to this one's dense peak (``derived``: the same fraction is an assumption), or the dense peak."""
    if dtype not in hw.matrix_peak_flops_per_s:
        # a format no catalog lists, run on another format's engine (W4A8 on the mxfp8 one, block fp8 on fp8's):
        # that engine's rate
        try:
            ran = None if get_format(dtype).catalog else next(
                (d for d in fallback(dtype) if d in hw.matrix_peak_flops_per_s), None)
        except OpmapError:
            ran = None
        if ran is None:
            return Input(f"matrix rate {dtype}", "assumed", f"{hw.name} lists no {dtype} matrix peak")
        dtype = ran
    grid = _grid_source(hw, dtype)
    if grid:  # the time model prices each GEMM off the measured grid (opmap.hardware.curves), not one rate
        return Input(f"matrix rate {dtype}", _kind(hw, "measured"), grid)
    _, basis = matrix_rate(hw, dtype)
    own = hw.achievable_matrix_flops_per_s.get(dtype)
    if own is not None and own.value:
        return Input(f"matrix rate {dtype}", _kind(hw, own.kind), own.source)
    if "fraction" in basis:
        return Input(f"matrix rate {dtype}", "derived", basis)
    peak = hw.matrix_peak_flops_per_s[dtype]
    return Input(f"matrix rate {dtype}", peak.kind, peak.source)


def _grid_source(hw: HardwareSpec, dtype: str) -> str:
    """Where ``hw``'s measured GEMM grid for ``dtype`` comes from ("" without one: no grid, or none for the
    format)."""
    name = hw.calibration.get("gemm_grid")
    if not isinstance(name, str):
        return ""
    from opmap.hardware.curves import load_gemm_grid

    try:
        if dtype not in load_gemm_grid(name):
            return ""
    except OpmapError:
        return ""
    return f"the measured GEMM grid {name}, {dtype} at every M x N x K point: {hw.calibration.get('source', name)}"


def moe_input(hw: HardwareSpec, dtype: str, line: str) -> Input:
    """The MoE layers' time where it was read off the device's measured MoE grid (opmap.mapping.moe_measured;
    ``line``: the analysis's assumption naming the grid, the shapes read and the source)."""
    return Input(f"MoE layer time {dtype}", _kind(hw, "measured"), line)


def memory_input(hw: HardwareSpec) -> Input:
    v = hw.fields.get("achievable_memory_bandwidth_bytes_per_s")
    if v is not None and v.value is not None:
        return Input("memory bandwidth", _kind(hw, v.kind), v.source)
    return Input("memory bandwidth", "derived" if hw.device_type != "cpu" else "datasheet", hw.memory_rate_basis)


def link_inputs(hw: HardwareSpec, group: int) -> tuple[Input, ...]:
    """The tiers a group of ``group`` devices talks over: the innermost tier that holds it, and every tier inside
    it (a group larger than a domain crosses the network as well as the links inside each domain)."""
    if group <= 1:
        return ()
    out = []
    for tier in hw.interconnect.tiers:
        bw = tier.bandwidth
        if bw is None or bw.value is None:
            out.append(Input(f"{tier.name} bandwidth", "assumed", f"{hw.name} gives no {tier.name} bandwidth"))
        else:
            out.append(Input(f"{tier.name} bandwidth", _kind(hw, bw.kind), bw.source))
        size = tier.devices
        if tier.any_size or size is None or group <= size:
            break
    return tuple(out)


def runtime_inputs(hw: HardwareSpec, runtime: str) -> tuple[Input, ...]:
    out = []
    for name in RUNTIME_INPUTS.get(runtime, ("",)):
        if name == "":
            v = hw.fields.get("launch_overhead_s")
            if v is not None:
                out.append(Input("launch overhead", _kind(hw, v.kind), v.source))
            continue
        v = stack_for(hw).values[name]
        out.append(Input(name.removesuffix("_s").replace("_", " "), v.kind, v.source))
    return tuple(out)


def stack_input(hw: HardwareSpec, stack) -> Input:
    """A stack profile (opmap.calibrate.stack_profile) as an input: measured here when it was fitted to runs on
    this device (``hw``'s name, or ``local`` for a calibrated profile), else an assumption carried over."""
    where = f"fitted on {len(stack.runs)} measured runs of {stack.model} on {stack.device} ({stack.source})"
    here = stack.device == hw.name or (stack.device.endswith(".toml") and _calibrated(hw)) or \
        (stack.device == "local" and _calibrated(hw))
    return Input("stack profile", "calibrated" if here else "assumed",
                 where if here else f"{where}: another device than {hw.name}")


def trust(hw: HardwareSpec, dtype: str, runtime: str = "eager", group: int = 1,
          extra: tuple[Input, ...] = (), stack=None) -> Trust:
    """The label of a prediction made on ``hw`` at ``dtype`` under ``runtime`` with collectives over ``group``
    devices; ``extra``: further inputs the caller priced with (an assumed acceptance rate), each with its kind.
    ``stack``: a stack profile fitted to measured runs of this stack on this device stands for the device's and
    the runtime's figures (its scales and host times absorb their error): the label is then calibrated unless an
    ``extra`` input is weaker."""
    if stack is not None:
        inputs = (stack_input(hw, stack), *extra)
    else:
        inputs = (matrix_input(hw, dtype), memory_input(hw), *link_inputs(hw, group), *runtime_inputs(hw, runtime),
                  *extra)
    weakest = min(inputs, key=lambda i: i.rank)  # min keeps the first of equal ranks
    if weakest.rank >= RANK["calibrated"]:
        label = "calibrated"
    elif weakest.rank >= RANK["measured"]:
        label = "anchored"
    else:
        label = "datasheet"
    return Trust(label, weakest, inputs)


def confidence(hw: HardwareSpec, dtype: str, runtime: str = "eager", group: int = 1, stack=None,
               extra: tuple[Input, ...] = ()) -> Confidence:
    """``trust`` as the Confidence a result carries."""
    return Confidence(trust(hw, dtype, runtime, group, extra, stack=stack))
