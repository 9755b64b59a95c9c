"""fp8 training's share of a training step (opmap.mapping.fp8 built it): the Linear GEMMs at the fp8 rate, the
matrix work left in bf16, and the cast kernels per microstep and per iteration, in the train figures."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from opmap.mapping.fp8 import CAST_OP, SCALE_OP
from opmap.phases.result import Fp8Split, TrainStep

if TYPE_CHECKING:
    from opmap.analyze import Analysis


def fp8_figures(a: Analysis) -> Fp8Split | None:
    """Seconds on one device of the captured step: ``gemm_s`` the fp8 GEMMs and ``bf16_matrix_s`` the matrix
    kernels left in bf16 (forward + backward, per microstep), ``cast_s`` the activation and gradient casts per
    microstep, ``weight_cast_s`` the weight casts and the amax / scale update once per iteration (inside
    ``optimizer_s``: they run once per optimizer step). None when the step is not fp8 training."""
    fp8 = a.assumptions.fp8_training
    if fp8 is None or not a.kernel_results:
        return None
    gemm = bf16 = cast = once = 0.0
    for k in a.kernel_results:
        n = a.graph.nodes[k.kernel.anchor]
        per_iteration = n.args.get("phase") == "optimizer"
        if n.op in (CAST_OP, SCALE_OP):
            if per_iteration:
                once += k.predicted_s
            else:
                cast += k.predicted_s
        elif k.kernel.kernel_class == "matrix" and not per_iteration:
            if k.format.startswith("fp8"):
                gemm += k.predicted_s
            else:
                bf16 += k.predicted_s
    text = (f"fp8 GEMMs {gemm * 1e3:.4g} ms, bf16 matrix {bf16 * 1e3:.4g} ms and casts {cast * 1e3:.4g} ms per "
            f"microstep; weight casts {once * 1e3:.3g} ms per iteration (in the optimizer step)")
    return Fp8Split(gemm, bf16, cast, once, fp8.cast_kernels, text)


def with_fp8_figures(a: Analysis, figures: TrainStep) -> TrainStep:
    """``figures`` (a train phase's) with the ``fp8`` block and its sentence added when the step is fp8 training."""
    f = fp8_figures(a)
    if f is None:
        return figures
    return replace(figures, fp8=f, text=f"{figures.text}; {f.text}")
