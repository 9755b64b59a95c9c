"""Per-node prediction: the terms of the roofline time model (roofline.py) at each node's shape and precision.

Per node (mapping/kernels.py combines them per fused kernel)::

    matrix_s = matrix FLOPs / matrix rate for this problem shape at the compute precision
    vector_s = vector FLOPs / vector peak + transcendental ops / transcendental rate
    memory_s = minimum bytes / bandwidth at this transfer size
    predicted_s = max(matrix_s, vector_s, memory_s) + launch overhead

With a calibrated profile (``opmap calibrate``, hardware/curves.py) the matrix rate comes from the measured
curve of the op's family (GEMM, conv as implicit GEMM, fused attention) at its shape, the bandwidth from
the measured copy curve at the kernel's size (so cache-resident kernels run at cache bandwidth), the
transcendental rate is measured, softmax / norms / pooling / reductions run at their family's measured
rate, and on a CPU each view op costs its measured host dispatch time (eager PyTorch runs every view
through the dispatcher). Without one (a catalog device) the matrix rate is the achievable rate the
catalog lists (a published measurement of what the matrix units sustain under a long GEMM), else the
dense datasheet peak; the bandwidth is the datasheet figure, and a transcendental takes
TRANSCENDENTAL_SLOTS vector slots.

The time, bound and limiter come from roofline.roofline: ``compute`` (matrix or vector; ``limiter`` says
which), ``memory``, or ``overhead`` where the launch overhead exceeds all three.
Views and allocations cost nothing (no kernel runs; bound ``view`` or ``alloc``). An op with no cost rule
gets the launch overhead and the bound ``uncounted``, so it shows in every total instead of vanishing.
"""

from __future__ import annotations

from opmap.costs.base import OpCost
from opmap.hardware.curves import Curves
from opmap.hardware.spec import HardwareSpec
from opmap.precision import Precision
from opmap.roofline import Bound, Roofline, no_kernel, roofline, uncounted

# A transcendental takes this many vector-op slots: NVIDIA SMs issue 16 SFU ops per clock beside 128 FP32
# lanes (Hopper / Ampere SM diagrams), CPUs evaluate exp/tanh as ~10-20-instruction polynomials. 4 is a
# middle value; calibration (opmap calibrate) replaces it with a measured rate.
TRANSCENDENTAL_SLOTS = 4.0
# Fused attention on a GPU: the softmax of a block sits between its two GEMMs (S = Q K^T, then P V). FlashAttention-3
# overlaps one warpgroup's softmax with another's GEMMs (ping-pong), which hides part of it: the FA3 paper (Shah et al.
# 2024, section 3.1) notes that at head dim 128 the exponentials alone take half the matmul cycle time. Half of the
# shorter term stays exposed: the one value fitted here, on FA3's H100 forward at head dim 128, sequence 16k
# (benchmarks/gpu_reference.py; the other head dims and lengths are held out).
ATTENTION_SOFTMAX_EXPOSED = 0.5


def attention_exposed_s(cost: OpCost, hw: HardwareSpec, matrix_s: float, vector_s: float) -> float:
    """The part of a fused attention kernel's compute that its schedule cannot overlap (GPU, uncalibrated)."""
    if hw.device_type != "gpu" or cost.problem is None or not cost.problem.family.attention:
        return 0.0
    return ATTENTION_SOFTMAX_EXPOSED * min(matrix_s, vector_s)

# A node's prediction is a Roofline value: terms, time, bound and limiter (roofline.py).
Prediction = Roofline


NO_CURVES = Curves()


def predict_cost(cost: OpCost, hw: HardwareSpec, prec: Precision, curves: Curves = NO_CURVES) -> Prediction:
    """The node's terms at its shape and precision on ``hw`` (``curves`` where calibrated), through the roofline."""
    if not cost.kernel:
        host = curves.view_overhead_s if hw.device_type == "cpu" else 0.0
        return no_kernel(Bound.VIEW if cost.is_view else Bound.ALLOC, host)
    overhead = hw.launch_overhead_s
    if not cost.counted:
        return uncounted(overhead)
    # a weight-only format (int4, fp8 on a card without fp8 engines) runs another kernel than the one measured, and
    # reads narrower weights than the measured time includes: the curve stays out of it
    rate = curves.matrix_rate(cost.problem, prec.matrix) if cost.matrix_flops and \
        not prec.format_policy.weight_only else None
    if rate and prec.sustained:  # a shape measured at boost clocks runs no faster than the power limit sustains
        rate = min(rate, prec.matrix_rate_flops_per_s)
    if rate:  # a measured attention kernel that drops scores: its measured dropout factor on top
        rate /= curves.dropout_slowdown(cost.problem)
    matrix_s = cost.matrix_flops / (rate or prec.matrix_rate_flops_per_s)
    kind_rate = curves.vector_kinds.get(cost.vector_kind) if cost.vector_kind else None
    calibrated = bool(kind_rate or curves.transcendental_per_s)
    if kind_rate:  # measured on this family's own op: its transcendentals are inside the rate
        vector_s = cost.vector_flops / kind_rate
    elif curves.transcendental_per_s:
        vector_s = (cost.vector_flops / prec.vector_peak_flops_per_s
                    + cost.transcendental_flops / curves.transcendental_per_s)
    elif cost.problem is not None and cost.problem.family.attention and hw.transcendental_ops_per_s:
        # fused attention: the softmax runs in fp32 registers, its exponentials on the special-function units
        vector_s = (cost.vector_flops / float(hw.vector_peak_flops_per_s["fp32"].value)
                    + cost.transcendental_flops / hw.transcendental_ops_per_s)
    else:
        vector_s = (cost.vector_flops + TRANSCENDENTAL_SLOTS * cost.transcendental_flops) / prec.vector_peak_flops_per_s
    nbytes = cost.bytes  # parameters at their stored format (analyze.stored_weights)
    memory_s = nbytes / (curves.bandwidth(nbytes) or hw.memory_rate_bytes_per_s)
    # on a CPU fresh output pages fault in on first touch (calibrated; 0 without a curve): the faulting thread
    # stalls, so that time adds to the op's instead of overlapping its compute
    fresh = curves.fresh_page_s(cost.allocated_bytes) if hw.device_type == "cpu" else 0.0
    # a measured attention rate already holds the softmax the schedule leaves exposed
    exposed = attention_exposed_s(cost, hw, matrix_s, vector_s) if not calibrated and not rate else 0.0
    return roofline(matrix_s, vector_s, memory_s + fresh, overhead, serial_memory_s=fresh, exposed_s=exposed)


def ridge_point(prec: Precision, hw: HardwareSpec) -> float:
    """FLOPs per byte above which a matrix kernel is compute-bound on this device and precision."""
    return prec.matrix_peak_flops_per_s / hw.memory_bandwidth_bytes_per_s


def mfu(matrix_flops: float, latency_s: float, prec: Precision) -> float:
    """Model FLOPs utilisation: matrix FLOPs / (latency x dense matrix peak)."""
    return matrix_flops / (latency_s * prec.matrix_peak_flops_per_s) if latency_s > 0 else 0.0
