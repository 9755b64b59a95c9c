"""analysis.json's ``assumptions`` block: everything an analysis assumed, with its provenance (the device and its
rates, the precision policy, the fusion and tiling policies, the time model in words, the capture's notes, the
versions). opmap.analyze builds it once per analysis (``build_assumptions``); the phases add their own keys.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import torch

from opmap import __version__
from opmap.graph import OpGraph
from opmap.hardware.spec import HardwareSpec
from opmap.precision import Precision
from opmap.predict import TRANSCENDENTAL_SLOTS
from opmap.record import record
from opmap.workloads.load import position_limit
from opmap.workloads.zoo import Workload


def _rate(hw: HardwareSpec, prec: Precision) -> dict[str, Any]:
    """The matrix rate the time model runs at, with its provenance: a measured achievable figure, another
    format's measured fraction of peak, else the peak; on a power-limited card past its power window, the blend
    of boost and sustained rates (``precision.power_limited``)."""
    v = hw.achievable_matrix_flops_per_s.get(prec.matrix)
    own = v is not None and bool(v.value) and prec.rate_basis == f"{v.kind} achievable {prec.matrix} rate"
    out = {"value": prec.matrix_rate_flops_per_s, "kind": v.kind if own else "derived",
           "basis": prec.rate_basis, "source": v.source if own else prec.rate_basis,
           "of_peak": prec.matrix_rate_flops_per_s / prec.matrix_peak_flops_per_s,
           "power_state": "power-limited" if prec.sustained else "boost"}
    if prec.sustained:
        out["kind"] = "derived"
    if prec.rate_basis.startswith("dense peak"):
        out.update(kind="dense peak",
                   source=f"no measured sustained {prec.matrix} rate for {hw.name}: the dense peak stands for it")
    if hw.power_window_s is not None:
        out["power_window_s"] = hw.power_window_s
    return out



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


def build_assumptions(workload: Workload, hw: HardwareSpec, prec: Precision, graph: OpGraph,
                      overrides: Sequence[tuple[str, str]], fusion: str = "eager",
                      evidence: str = "") -> dict[str, Any]:
    mp = hw.matrix_peak_flops_per_s[prec.matrix]
    return {
        "workload": workload.name,
        "hardware": hw.name,
        "hardware_display_name": hw.display_name,
        "dtype": prec.requested,
        "matrix_dtype": prec.matrix,
        "precision_note": prec.note,
        "weights_dtype": prec.policy["weights"], "activations_dtype": prec.policy["activations"],
        "accumulate_dtype": prec.policy["accumulate"],
        "precision_policy": prec.policy,
        "precision_evidence": evidence,
        "batch": workload.batch,
        "seq": workload.seq,
        "position_limit": None if (pos := position_limit(workload)) is None else asdict(pos),  # opmap.workloads.load
        "capture_device": graph.device,
        "mode": "training step" if any(n.args.get("phase") == "backward" for n in graph.nodes) else "inference",
        "fusion_policy": FUSION_TEXT.get(fusion, fusion),
        "tiling": ("GEMM / conv tile search against shared memory per compute unit, tile and wave quantization"
                   if hw.device_type != "cpu" and hw.sram_per_unit_bytes else
                   "none (CPU: the BLAS library blocks for the caches; measured shape curves stand for it)"
                   if hw.device_type == "cpu" else "none (the device lists no shared memory per compute unit)"),
        "matrix_peak_flops_per_s": {"value": mp.value, "kind": mp.kind, "source": mp.source},
        "matrix_rate_flops_per_s": _rate(hw, prec),
        "vector_peak_flops_per_s": prec.vector_peak_flops_per_s,
        "memory_bandwidth_bytes_per_s": record(hw.fields["memory_bandwidth_bytes_per_s"]),
        "memory_rate_bytes_per_s": {"value": hw.memory_rate_bytes_per_s, "basis": hw.memory_rate_basis},
        # achievable figures the catalog lacks for this device: those run on datasheet figures (empty: like for like)
        "datasheet_only": list(hw.datasheet_only),
        "launch_overhead_s": record(hw.fields["launch_overhead_s"]),
        "transcendental_slots": TRANSCENDENTAL_SLOTS,
        "time_model": time_model_line(hw),
        "attention_kernel": (f"{hw.calibration['attention_kernel']}: fused attention from its measured rows in the "
                             "catalog (--attention-kernel picks another)" if hw.calibration.get("attention_kernel")
                             else "no measured kernel: flash tiles on the device's peaks"),
        **({"attention_dropout": attention_dropout_line(hw)} if _drops_scores(graph) else {}),
        "layer_type_overrides": [f"{p}={t}" for p, t in overrides],
        "workload_notes": list(workload.assumptions),
        "capture_notes": list(graph.notes),
        "torch_version": torch.__version__,
        "opmap_version": __version__,
        "python_version": platform.python_version(),
    }
