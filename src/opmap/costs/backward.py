"""Backward-pass ops of a training step (``opmap profile --train``, ``capture(train=True)``).

Matrix work follows the forward op it differentiates, as torch.utils.flop_counter counts it:
convolution_backward costs one forward convolution per gradient it computes (input, weight), and the
fused attention backward five GEMMs of the forward's size (recomputed scores, dP, dV, dQ, dK: 2.5x the
forward's two). Vector work per element, by the formula each op evaluates, counted as the forward rules count
(opmap.costs.pointwise: each add, subtract, multiply, divide, compare or select one vector FLOP, a product of
constants folded, each exp / erf / tanh one transcendental op; the formulas are PyTorch's kernels,
aten/src/ATen/native/cpu/Activation.cpp, BinaryOpsKernel.cpp, SoftMaxKernel.cpp):

- activations, per gradient element (``ACTIVATION_BACKWARD``): threshold_backward (ReLU) 1 (a select);
  gelu_backward, erf form, dy (cdf + x pdf) with cdf = 0.5 (1 + erf(x / sqrt 2)), pdf = c exp(-x^2 / 2):
  9 + erf and exp; tanh form (``GELU_TANH_BACKWARD``): 17 + tanh; silu_backward dy s (1 + x (1 - s)) with
  s = sigmoid(x): 7 + exp; sigmoid_backward dy (1 - y) y and tanh_backward dy (1 - y^2) (from the saved
  output y): 3; hardtanh_backward (ReLU6 too) (x <= lo or x >= hi) ? 0 : dy: 4; leaky_relu_backward
  x > 0 ? dy : dy slope: 3; elu_backward (ELU, SELU, CELU) x <= 0 ? dy a b exp(x b) : dy s: 7 + exp (from the
  saved output, x <= 0 ? dy b (y + a) : dy s: 6); softplus_backward z = exp(b x), b x > t ? dy : dy z / (z + 1):
  6 + exp; hardswish_backward x < -3 ? 0 : x <= 3 ? dy (x / 3 + 0.5) : dy: 7; hardsigmoid_backward
  -3 < x < 3 ? dy / 6 : 0: 5; log_sigmoid_backward dy (m - sign z / (1 + z)), z = exp(-|x|): 9 + exp;
  glu_backward, per gradient element (half the input), da = dy s, db = dy a s (1 - s), s = sigmoid(b): 7 + exp;
- native_layer_norm_backward: 10 per element (recompute x-hat, the two row reductions, the input-gradient
  combination, the weight / bias gradient accumulations); native_group_norm_backward the same per element (its
  forward is layer norm's over each group); _fused_rms_norm_backward: 6 for the input gradient,
  r (dy w) - x r^3 mean(dy w x) (dy w, its product with x, the row sum, x times the row's coefficient, r times
  dy w, the subtraction) + 3 for the weight gradient (x r, times dy, the accumulation); native_batch_norm_backward: 8;
- _softmax_backward_data: y (dy - sum(dy y)): 4 (a product, its row sum, the subtraction, the product with y);
  _log_softmax_backward_data: dy - exp(y) sum(dy): 3 + exp; embedding_dense_backward and max-pool backward: 1
  (a scatter-add of each gradient element); select / slice backward: a copy. Cross-entropy's nll_loss and
  mse_loss, forward and backward: opmap.costs.loss.

RoPE, RMSNorm written as tensor math, the residual adds and the loss's mean run backward as the pointwise,
reduction and view ops their forward uses (counted by those rules).

Bytes are the usual minimum: each input read once, each output written once.
"""

from __future__ import annotations

from opmap.costs.attention import DROPOUT_BWD_OPS_PER_SCORE, dropout_p
from opmap.costs.base import OpCost, io_cost, prod, rule
from opmap.graph import Node
from opmap.ops import MatrixFamily, MatrixProblem, causal_pairs


@rule("threshold_backward")
def threshold_backward_cost(node: Node) -> OpCost:
    return io_cost(node, vector_flops=float(node.inputs[0].numel))


# (vector FLOPs, transcendental ops) per element of the gradient (the module docstring's formulas)
ACTIVATION_BACKWARD: dict[str, tuple[float, float]] = {
    "gelu_backward": (9, 2), "silu_backward": (7, 1), "sigmoid_backward": (3, 0), "tanh_backward": (3, 0),
    "hardtanh_backward": (4, 0), "leaky_relu_backward": (3, 0), "elu_backward": (7, 1),
    "softplus_backward": (6, 1), "hardswish_backward": (7, 0), "hardsigmoid_backward": (5, 0),
    "log_sigmoid_backward": (9, 1), "glu_backward": (7, 1),
}
GELU_TANH_BACKWARD = (17.0, 1.0)
ELU_FROM_RESULT_BACKWARD = (6.0, 0.0)


def activation_backward_weights(node: Node) -> tuple[float, float]:
    """(vector, transcendental) per gradient element: the op's formula, its variant read from the arguments."""
    if node.packet == "gelu_backward" and node.args.get("approximate") == "tanh":
        return GELU_TANH_BACKWARD
    if node.packet == "elu_backward" and node.args.get("is_result"):
        return ELU_FROM_RESULT_BACKWARD
    return ACTIVATION_BACKWARD[node.packet]


@rule(*ACTIVATION_BACKWARD)
def activation_backward_cost(node: Node) -> OpCost:
    """Per element of the incoming gradient (``grad_output``, the op's first input); reads it and the saved input
    or output once, writes the input gradient."""
    v, t = activation_backward_weights(node)
    n = float(node.inputs[0].numel)
    return io_cost(node, vector_flops=v * n, transcendental_flops=t * n)


@rule("native_layer_norm_backward")
def layer_norm_backward_cost(node: Node) -> OpCost:
    return io_cost(node, vector_flops=10.0 * node.inputs[0].numel)


@rule("native_batch_norm_backward", "cudnn_batch_norm_backward", "miopen_batch_norm_backward")
def batch_norm_backward_cost(node: Node) -> OpCost:
    return io_cost(node, vector_flops=8.0 * node.inputs[0].numel)


@rule("native_group_norm_backward")
def group_norm_backward_cost(node: Node) -> OpCost:
    return io_cost(node, vector_flops=10.0 * node.inputs[0].numel)


@rule("_fused_rms_norm_backward")
def rms_norm_backward_cost(node: Node) -> OpCost:
    """6 per element for the input gradient, 3 more where the weight gradient is asked for (output_mask)."""
    mask = node.args.get("output_mask") or [True, True]
    weight = len(mask) > 1 and bool(mask[1]) and any(n == "weight" for n in node.input_names)
    return io_cost(node, vector_flops=(6.0 + (3.0 if weight else 0.0)) * node.inputs[0].numel)


@rule("_softmax_backward_data")
def softmax_backward_cost(node: Node) -> OpCost:
    return io_cost(node, vector_flops=4.0 * node.inputs[0].numel)


@rule("_log_softmax_backward_data")
def log_softmax_backward_cost(node: Node) -> OpCost:
    n = float(node.inputs[0].numel)
    return io_cost(node, vector_flops=3.0 * n, transcendental_flops=n)


@rule("embedding_dense_backward", "max_pool2d_with_indices_backward", "max_pool3d_with_indices_backward",
      "avg_pool2d_backward", "_adaptive_avg_pool2d_backward")
def scatter_backward_cost(node: Node) -> OpCost:
    return io_cost(node, vector_flops=float(node.inputs[0].numel))


@rule("select_backward", "slice_backward", "index_select_backward", "expand_backward")
def copy_backward_cost(node: Node) -> OpCost:
    return io_cost(node)


@rule("convolution_backward")
def convolution_backward_cost(node: Node) -> OpCost:
    """grad_output (N, Cout, *out), input, weight (Cout, Cin/g, *k); output_mask picks the gradients."""
    go, x, w = node.input("grad_output"), node.input("input"), node.input("weight")
    mask = node.args.get("output_mask") or [True, True, True]
    transposed = bool(node.args.get("transposed", False))
    n = go.shape[0]
    fwd_mac = n * prod((x if transposed else go).shape[2:]) * prod(w.shape)
    grads = int(bool(mask[0])) + int(bool(mask[1]))
    bias = float(go.numel) if len(mask) > 2 and mask[2] else 0.0
    groups = int(node.args.get("groups", 1) or 1)
    gm, gn, gk = n * prod(go.shape[2:]), w.shape[0] // groups, prod(w.shape[1:])
    return io_cost(node, matrix_flops=2.0 * fwd_mac * grads, macs=float(fwd_mac * grads), vector_flops=bias,
                   problem=MatrixProblem(MatrixFamily.CONV_BWD, groups, int(gm), int(gn), int(gk)))


SDPA_BACKWARD = ("_scaled_dot_product_flash_attention_for_cpu_backward", "_scaled_dot_product_flash_attention_backward",
                 "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_cudnn_attention_backward",
                 "_flash_attention_backward", "_efficient_attention_backward",
                 "_scaled_dot_product_fused_attention_overrideable_backward")


@rule(*SDPA_BACKWARD)
def sdpa_backward_cost(node: Node) -> OpCost:
    q, k, v = node.input("query"), node.input("key"), node.input("value")
    if node.packet in ("_flash_attention_backward", "_efficient_attention_backward"):  # (B, S, H, D)
        b, sq, h, d = q.shape
        sk, dv = k.shape[1], v.shape[3]
    else:
        *lead, h, sq, d = q.shape
        b = prod(lead)
        sk, dv = k.shape[-2], v.shape[-1]
    causal = bool(node.args.get("is_causal")) or node.args.get("custom_mask_type") in (1, 2)
    pairs = causal_pairs(sq, sk) if causal else sq * sk
    # 5 GEMMs over the pairs: S = QK^T (d), dP = dO V^T (dv), dV = P^T dO (dv), dQ = dS K (d), dK = dS^T Q (d)
    mac = b * h * pairs * (3 * d + 2 * dv)
    written = sum(t.nbytes for t in node.outputs if len(t.shape) == 4)
    drop = dropout_p(node) > 0.0  # the forward's mask drawn again (opmap.costs.attention)
    per_score = 4 + (DROPOUT_BWD_OPS_PER_SCORE if drop else 0)
    return io_cost(node, written=written, matrix_flops=2.0 * mac, macs=float(mac),
                   vector_flops=float(b * h * pairs * per_score), transcendental_flops=float(b * h * pairs),
                   problem=MatrixProblem(MatrixFamily.ATTENTION_BWD_CAUSAL if causal else MatrixFamily.ATTENTION_BWD,
                                         int(b * h), int(sq), int(sk), int(d), dropout=drop))
