"""Vector-unit families: softmax / log_softmax, normalisation layers, reductions, pooling.

Per-element counts (one FLOP per add, subtract, multiply, divide, compare):

- softmax       max, subtract, sum, divide: 4 vector + 1 exp per element
- log_softmax   max, subtract, sum, subtract: 4 vector + 1 exp per element, 1 log per row
- layer / group norm  mean (1), centre (1), square (1), sum (1), scale by rstd (1), affine mul + add (2):
                7 vector per element, 1 rsqrt per normalised row (or group)
- rms norm      square (1), sum (1), scale by rstd (1), weight (1): 4 vector per element, 1 rsqrt per row
- batch norm    inference: (x - mean) * rstd * weight + bias, 4 per element, 1 rsqrt per channel;
                training adds the statistics (mean, centre, square, sum: 4 per element)
- reductions    one op per input element (sum, mean, max, min, prod, all, any, argmax); var / std 3
- pooling       one op per output element per kernel tap (max compares, avg adds + a final divide)
"""

from __future__ import annotations

import math

from opmap.costs.base import OpCost, io_cost, prod, rule
from opmap.graph import Node


def _rows(numel: int, shape: tuple[int, ...], dim) -> int:
    if not shape:
        return 1
    d = int(dim) % len(shape) if dim is not None else len(shape) - 1
    return numel // max(shape[d], 1)


@rule("_softmax", "softmax", "_safe_softmax", "special_softmax")
def softmax_cost(node: Node) -> OpCost:
    n = node.inputs[0].numel
    return io_cost(node, vector_flops=4.0 * n, transcendental_flops=float(n))


@rule("_log_softmax", "log_softmax")
def log_softmax_cost(node: Node) -> OpCost:
    x = node.inputs[0]
    rows = _rows(x.numel, x.shape, node.args.get("dim"))
    return io_cost(node, vector_flops=4.0 * x.numel, transcendental_flops=float(x.numel + rows))


def fused_adds(node: Node) -> int:
    """Residual and bias inputs a fused norm adds to its input first (onnxruntime's SkipLayerNormalization, a
    serving engine's add + norm): one add per element each; they are read once and the sum is not written."""
    return sum(1 for n in node.input_names if n in ("residual", "residual_bias"))


@rule("native_layer_norm", "layer_norm")
def layer_norm_cost(node: Node) -> OpCost:
    x = node.input("input")
    rows = x.numel // max(prod(node.args.get("normalized_shape") or x.shape[-1:]), 1)
    return io_cost(node, vector_flops=(7.0 + fused_adds(node)) * x.numel, transcendental_flops=float(rows))


@rule("native_group_norm", "group_norm")
def group_norm_cost(node: Node) -> OpCost:
    x = node.input("input")
    groups = int(node.args.get("group", node.args.get("num_groups", 1)) or 1)
    return io_cost(node, vector_flops=7.0 * x.numel, transcendental_flops=float(x.shape[0] * groups))


@rule("rms_norm", "_fused_rms_norm")
def rms_norm_cost(node: Node) -> OpCost:
    x = node.input("input")
    rows = x.numel // max(prod(node.args.get("normalized_shape") or x.shape[-1:]), 1)
    return io_cost(node, vector_flops=(4.0 + fused_adds(node)) * x.numel, transcendental_flops=float(rows))


@rule("_native_batch_norm_legit_no_training", "_native_batch_norm_legit", "native_batch_norm",
      "batch_norm", "_batch_norm_impl_index", "cudnn_batch_norm", "miopen_batch_norm",
      "_native_batch_norm_legit_functional", "instance_norm")
def batch_norm_cost(node: Node) -> OpCost:
    """Reads x, the running statistics (buffers) and affine parameters; writes y (the saved statistics
    outputs are per channel and left out)."""
    x = node.input("input")
    training = bool(node.args.get("training", False)) and "no_training" not in node.packet
    channels = x.shape[1] if len(x.shape) > 1 else 1
    return io_cost(node, written=node.outputs[0].nbytes, vector_flops=(8.0 if training else 4.0) * x.numel,
                   transcendental_flops=float(channels))


_REDUCE_1 = ("sum", "mean", "amax", "amin", "max", "min", "prod", "all", "any", "argmax", "argmin",
             "nansum", "count_nonzero", "aminmax", "cumsum", "cumprod", "cummax", "cummin", "logcumsumexp",
             "linalg_vector_norm", "norm")


@rule(*_REDUCE_1)
def reduction_cost(node: Node) -> OpCost:
    """One op per input element (a norm adds a square per element and one root)."""
    n = node.inputs[0].numel
    extra_v, trans = 0.0, 0.0
    if node.packet in ("linalg_vector_norm", "norm"):
        extra_v, trans = float(n), 1.0
    if node.packet == "logcumsumexp":
        trans = 2.0 * n
    return io_cost(node, vector_flops=float(n) + extra_v, transcendental_flops=trans)


@rule("var", "std", "var_mean", "std_mean")
def variance_cost(node: Node) -> OpCost:
    """Mean, centre, square-and-sum: 3 ops per element (std adds one sqrt per output)."""
    n = node.inputs[0].numel
    trans = float(node.outputs[0].numel) if node.packet.startswith("std") else 0.0
    return io_cost(node, vector_flops=3.0 * n, transcendental_flops=trans)


@rule("logsumexp")
def logsumexp_cost(node: Node) -> OpCost:
    n = node.inputs[0].numel
    return io_cost(node, vector_flops=3.0 * n, transcendental_flops=float(n + node.outputs[0].numel))


@rule("topk", "sort", "argsort", "kthvalue", "median", "mode", "msort")
def sort_cost(node: Node) -> OpCost:
    """Comparison-based selection: n * log2(extent) compares for a sort, n * log2(k + 1) for top-k."""
    x = node.inputs[0]
    dim = node.args.get("dim", -1)
    extent = x.shape[int(dim) % len(x.shape)] if x.shape else 1
    if node.packet == "topk":
        k = int(node.args.get("k", 1))
        per = math.log2(k + 1) + 1
    else:
        per = math.log2(max(extent, 2))
    return io_cost(node, vector_flops=x.numel * per)


_POOL = ("max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices", "max_pool3d_with_indices",
         "avg_pool1d", "avg_pool2d", "avg_pool3d", "lp_pool2d")
_ADAPTIVE = ("adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d", "_adaptive_avg_pool2d",
             "_adaptive_avg_pool3d", "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d")


@rule(*_POOL)
def pool_cost(node: Node) -> OpCost:
    """Windowed pooling: one op per output element per kernel tap."""
    ks = node.args.get("kernel_size") or [1]
    out = node.outputs[0]
    taps = prod(ks) if isinstance(ks, (list, tuple)) else int(ks) ** (len(out.shape) - 2)
    return io_cost(node, written=out.nbytes + sum(t.nbytes for t in node.outputs[1:]),
                   vector_flops=float(out.numel * taps))


@rule(*_ADAPTIVE)
def adaptive_pool_cost(node: Node) -> OpCost:
    """Adaptive pooling covers the input once: one op per input element, plus a divide per output."""
    return io_cost(node, vector_flops=float(node.inputs[0].numel + node.outputs[0].numel))


@rule("_fused_adamw_", "_fused_adam_")
def fused_adam_cost(node: Node) -> OpCost:
    """One multi-tensor AdamW update over lists of weights, gradients and both moments (all fp32 here): each
    read once, the weights and moments written back in place. Per element: decoupled decay, the two moment
    updates, the bias corrections, the step (about 12 vector FLOPs) and one sqrt."""
    tensors = [t for t in node.inputs if len(t.shape) > 0]  # the 0-d step counters are host-side scalars here
    groups = 4  # params, grads, exp_avgs, exp_avg_sqs (amsgrad's max_exp_avg_sqs is empty here)
    per = len(tensors) // groups if len(tensors) >= groups else 0
    params = tensors[:per]
    elems = sum(prod(t.shape) for t in params)
    written = 3 * sum(t.nbytes for t in params)  # weights and both moments, in place
    return io_cost(node, reads=tensors[:groups * per], written=written, vector_flops=12.0 * elems,
                   transcendental_flops=float(elems))
