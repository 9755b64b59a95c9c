"""analysis.json's ``assumptions`` block: everything an analysis assumed, with its provenance (the device and its
rates, the precision policy, the fusion and tiling policies, the time model in words, the capture's notes, the
versions), as one typed frozen value (``Assumptions``) that travels with the analysis and is recorded
(``opmap.record``) where analysis.json, profile.json or a report is written. opmap.analyze builds it once per
analysis (``build_assumptions``); the pipeline, the phases and tuning set what they add (fp8, the resolved dtype,
the tuned note, the runtime, the phase) with ``dataclasses.replace``: each is written only where set, in the field
order below (the order the keys were added in).
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from opmap import __version__
from opmap.graph import OpGraph
from opmap.hardware.spec import HardwareSpec
from opmap.hardware.trust import Confidence
from opmap.hardware.values import Value
from opmap.mapping.fp8 import Fp8Training
from opmap.precision import Precision
from opmap.predict import TRANSCENDENTAL_SLOTS
from opmap.record import key
from opmap.workloads.load import PositionLimit, position_limit
from opmap.workloads.zoo import Workload

if TYPE_CHECKING:
    from opmap.workloads.phases import PhaseSpec

_SET = key(omit="none")  # a key only some analyses carry: written where set


class StepRuntime(Protocol):
    """What the pipeline reads of the runtime a step ran under: opmap.phases.runtime.Runtime (a layer above, a frozen
    dataclass: its record is the ``runtime`` block)."""

    @property
    def name(self) -> str: ...

    @property
    def per_step_s(self) -> float: ...


@dataclass(frozen=True)
class MatrixPeak:
    """The dense matrix peak of the matrix format (the MFU denominator), with its provenance."""

    value: float | None
    kind: str
    source: str


@dataclass(frozen=True)
class MatrixRate:
    """The matrix rate the time model runs at (``_rate``), with its provenance: ``kind`` (measured achievable,
    derived, dense peak), ``basis`` and ``source`` in words, its fraction of the peak, the power state it holds in
    and, on a power-limited card, the power window (s)."""

    value: float
    kind: str
    basis: str
    source: str
    of_peak: float
    power_state: str  # "boost" | "power-limited"
    power_window_s: float | None = field(default=None, metadata=_SET)


@dataclass(frozen=True)
class MemoryRate:
    """The memory rate the time model runs at and where it comes from."""

    value: float
    basis: str


@dataclass(frozen=True, kw_only=True)
class Assumptions:
    """What one analysis assumed (module docstring); its record is analysis.json's ``assumptions`` block, its
    fields in the block's order, those after ``python_version`` (and ``attention_dropout``) only where set."""

    workload: str
    hardware: str
    hardware_display_name: str
    dtype: str  # the format priced (an alias resolved: ``dtype_requested``)
    matrix_dtype: str
    precision_note: str
    weights_dtype: str
    activations_dtype: str
    accumulate_dtype: str
    precision_policy: dict[str, str]
    precision_evidence: str
    batch: int
    seq: int | None
    position_limit: PositionLimit | None  # opmap.workloads.load
    capture_device: str
    mode: str  # "training step" | "inference"
    fusion_policy: str
    tiling: str
    matrix_peak_flops_per_s: MatrixPeak
    matrix_rate_flops_per_s: MatrixRate
    vector_peak_flops_per_s: float
    memory_bandwidth_bytes_per_s: Value
    memory_rate_bytes_per_s: MemoryRate
    # achievable figures the catalog lacks for this device: those run on datasheet figures (empty: like for like)
    datasheet_only: tuple[str, ...]
    launch_overhead_s: Value
    transcendental_slots: float
    time_model: str
    attention_kernel: str
    attention_dropout: str | None = field(default=None, metadata=_SET)  # where an attention call drops scores
    layer_type_overrides: tuple[str, ...]
    workload_notes: tuple[str, ...]
    capture_notes: tuple[str, ...]
    torch_version: str
    opmap_version: str
    python_version: str
    # set by opmap.analyze.analyze_graph: fp8 training, fp8 inference's bf16 head, an alias's resolution
    fp8_training: Fp8Training | None = field(default=None, metadata=_SET)
    fp8_inference: str | None = field(default=None, metadata=_SET)
    dtype_requested: str | None = field(default=None, metadata=_SET)
    dtype_resolution: str | None = field(default=None, metadata=_SET)
    tuned: str | None = field(default=None, metadata=_SET)  # opmap.explore.tune.tuned.tuned_analysis
    # where the MoE layers were priced off the device's measured MoE grid (opmap.mapping.moe_measured)
    moe_grid: str | None = field(default=None, metadata=_SET)
    runtime: StepRuntime | None = field(default=None, metadata=_SET)  # opmap.phases.runtime.with_runtime
    runtime_line: str | None = field(default=None, metadata=_SET)
    phase: PhaseSpec | None = field(default=None, metadata=_SET)  # opmap.phases.step.analyze_phase
    # how far to trust the figures (opmap.hardware.trust), set once laid out: opmap.phases.runtime.with_confidence
    confidence: Confidence | None = field(default=None, metadata=_SET)

    @property
    def training(self) -> bool:
        return self.mode == "training step"


def _rate(hw: HardwareSpec, prec: Precision) -> MatrixRate:
    """The matrix rate the time model runs at, with its provenance: a measured achievable figure, another
    format's measured fraction of peak, else the peak; on a power-limited card past its power window, the blend
    of boost and sustained rates (``precision.power_limited``)."""
    v = hw.achievable_matrix_flops_per_s.get(prec.matrix)
    own = v is not None and bool(v.value) and prec.rate_basis == f"{v.kind} achievable {prec.matrix} rate"
    kind = v.kind if own and not prec.sustained else "derived"
    source = v.source if own else prec.rate_basis
    if prec.rate_basis.startswith("dense peak"):
        kind = "dense peak"
        source = f"no measured sustained {prec.matrix} rate for {hw.name}: the dense peak stands for it"
    return MatrixRate(prec.matrix_rate_flops_per_s, kind, prec.rate_basis, source,
                      prec.matrix_rate_flops_per_s / prec.matrix_peak_flops_per_s,
                      "power-limited" if prec.sustained else "boost", hw.power_window_s)


def time_model_line(hw: HardwareSpec) -> str:
    curves = hw.curves
    if curves.empty:
        return "max(matrix/peak, vector/peak, bytes/bandwidth) + launch overhead, per node (datasheet peaks)"
    fams = sorted({f"{fam} {dt} ({t.size} shapes)" for (fam, dt), t in curves.tables.items()})
    bw = (f", bandwidth over {len(curves.bandwidth_points)} sizes" if curves.bandwidth_points else
          "; bandwidth: the catalog's")
    return ("max(matrix/rate at shape, vector/peak + transcendental/rate, bytes/bandwidth at size) + launch "
            f"overhead, per node; measured curves: {', '.join(fams)}{bw}"
            + (f"; views cost {curves.view_overhead_s * 1e6:.2g} us of host dispatch" if hw.device_type == "cpu"
               else ""))


FUSION_TEXT = {
    "eager": "eager: one kernel per non-view aten op; SDPA as one fused kernel",
    "compiler": "compiler: pointwise chains, GEMM / conv epilogues and reductions with their pointwise "
                "neighbours fused (legal-only, at most 16 nodes a kernel); SDPA as one fused kernel",
    "engine": "engine: compiler's fusion plus what serving engines ship: sibling GEMMs merged (QKV, gate/up), "
              "fused (residual add +) norm, RoPE and the KV-cache write in the QKV epilogue, gated activation in "
              "the gate/up epilogue, fused attention (paged decode attention)",
    "library": "library: what training frameworks run (Megatron-Core, Transformer Engine): vendor-library GEMMs "
               "alone (bias in the epilogue), sibling GEMMs merged (QKV, gate/up), hand-written fused kernels between "
               "them: (add +) norm with its casts, RoPE, (gated) activation, dropout + residual add, masked softmax; "
               "no GEMM epilogue or prologue fusion; SDPA as one fused kernel",
}


def _drops_scores(graph: OpGraph) -> bool:
    """Whether any fused attention call in the graph drops scores (training with dropout_p above 0)."""
    return any("attention" in n.op and isinstance(n.args.get("dropout_p"), (int, float)) and n.args["dropout_p"] > 0
               for n in graph.nodes)


def attention_dropout_line(hw: HardwareSpec) -> str:
    """How the priced attention kernel's dropout is costed, in words."""
    from opmap.hardware.curves import attention_dropout_row

    cal = hw.calibration
    if not cal.get("attention"):
        return ("attention dropout: the Philox draw, compare and select counted per score on the vector unit "
                "(no measured attention kernel)")
    kernel = cal.get("attention_kernel") or "the measured attention kernel"
    row = attention_dropout_row(cal)
    if row is None:
        return (f"attention dropout: priced at {kernel}'s no-dropout rate (no time with dropout measured for "
                f"{kernel} on {hw.name})")
    return (f"attention dropout: {kernel} runs {row.factor:.3g}x its no-dropout time when it drops scores"
            + (f" ({row.source})" if row.source else ""))


def decode_attention_line(hw: HardwareSpec) -> str:
    """Where decode attention (1-16 queries a sequence: opmap.mapping.tilers' _decode_grid) is priced off the
    device's measured grid, in words ("" where the device has none)."""
    grid = hw.curves.decode_attention
    if grid is None:
        return ""
    source = hw.calibration.get("attention_grid_source") or grid.source
    return (f"; decode attention (1-16 queries a sequence, head dims {', '.join(map(str, grid.head_dims))}) from the "
            f"measured grid {grid.name} ({len(grid.tables)} head configurations x batch x KV length; another "
            f"configuration at its nearest one's efficiency): {source}")


def _tiling(hw: HardwareSpec) -> str:
    """The tiling the kernels were mapped with, in words."""
    if hw.device_type == "cpu":
        return "none (CPU: the BLAS library blocks for the caches; measured shape curves stand for it)"
    if hw.sram_per_unit_bytes:
        return "GEMM / conv tile search against shared memory per compute unit, tile and wave quantization"
    return "none (the device lists no shared memory per compute unit)"


def build_assumptions(workload: Workload, hw: HardwareSpec, prec: Precision, graph: OpGraph,
                      overrides: Sequence[tuple[str, str]], fusion: str = "eager",
                      evidence: str = "") -> Assumptions:
    mp = hw.matrix_peak_flops_per_s[prec.matrix]
    pol = prec.policy
    kernel = hw.calibration.get("attention_kernel")
    return Assumptions(
        workload=workload.name, hardware=hw.name, hardware_display_name=hw.display_name, dtype=prec.requested,
        matrix_dtype=prec.matrix, precision_note=prec.note, weights_dtype=pol["weights"],
        activations_dtype=pol["activations"], accumulate_dtype=pol["accumulate"], precision_policy=pol,
        precision_evidence=evidence, batch=workload.batch, seq=workload.seq, position_limit=position_limit(workload),
        capture_device=graph.device,
        mode="training step" if any(n.args.get("phase") == "backward" for n in graph.nodes) else "inference",
        fusion_policy=FUSION_TEXT.get(fusion, fusion), tiling=_tiling(hw),
        matrix_peak_flops_per_s=MatrixPeak(mp.value, mp.kind, mp.source), matrix_rate_flops_per_s=_rate(hw, prec),
        vector_peak_flops_per_s=prec.vector_peak_flops_per_s,
        memory_bandwidth_bytes_per_s=hw.fields["memory_bandwidth_bytes_per_s"],
        memory_rate_bytes_per_s=MemoryRate(hw.memory_rate_bytes_per_s, hw.memory_rate_basis),
        datasheet_only=tuple(hw.datasheet_only), launch_overhead_s=hw.fields["launch_overhead_s"],
        transcendental_slots=TRANSCENDENTAL_SLOTS, time_model=time_model_line(hw),
        attention_kernel=(f"{kernel}: fused attention from its measured rows in the catalog (--attention-kernel "
                          "picks another)" if kernel else "no measured kernel: flash tiles on the device's peaks")
        + decode_attention_line(hw),
        attention_dropout=attention_dropout_line(hw) if _drops_scores(graph) else None,
        layer_type_overrides=tuple(f"{p}={t}" for p, t in overrides), workload_notes=tuple(workload.assumptions),
        capture_notes=tuple(graph.notes), torch_version=torch.__version__, opmap_version=__version__,
        python_version=platform.python_version())
