"""Backward-pass ops of a training step (``opmap profile --train``, ``capture(train=True)``).

Matrix work follows the forward op it differentiates, as torch.utils.flop_counter counts it:
convolution_backward costs one forward convolution per gradient it computes (input, weight), and the
fused attention backward five GEMMs of the forward's size (recomputed scores, dP, dV, dQ, dK: 2.5x the
forward's two). Vector work per element, by the formula each op evaluates:

- threshold_backward (ReLU): 1 (a select); gelu_backward (erf form): 6 ops and 2 transcendentals (exp, erf);
- native_layer_norm_backward: 10 per element (recompute x-hat, the two row reductions, the input-gradient
  combination, the weight / bias gradient accumulations); native_batch_norm_backward: 8;
- _softmax_backward_data: 3 (a product, its row sum, the subtraction); embedding_dense_backward and
  max-pool backward: 1 (a scatter-add of each gradient element); select / slice backward: a copy.

Bytes are the usual minimum: each input read once, each output written once.
"""

from __future__ import annotations

from opmap.costs.base import OpCost, io_cost, prod, rule
from opmap.graph import Node
from opmap.ops import MatrixFamily, MatrixProblem, causal_pairs


@rule("threshold_backward")
def threshold_backward_cost(node: Node) -> OpCost:
    return io_cost(node, vector_flops=float(node.inputs[0].numel))


@rule("gelu_backward")
def gelu_backward_cost(node: Node) -> OpCost:
    n = float(node.inputs[0].numel)
    return io_cost(node, vector_flops=6.0 * n, transcendental_flops=2.0 * n)


@rule("native_layer_norm_backward")
def layer_norm_backward_cost(node: Node) -> OpCost:
    return io_cost(node, vector_flops=10.0 * node.inputs[0].numel)


@rule("native_batch_norm_backward", "cudnn_batch_norm_backward", "miopen_batch_norm_backward")
def batch_norm_backward_cost(node: Node) -> OpCost:
    return io_cost(node, vector_flops=8.0 * node.inputs[0].numel)


@rule("_softmax_backward_data", "_log_softmax_backward_data")
def softmax_backward_cost(node: Node) -> OpCost:
    return io_cost(node, vector_flops=3.0 * node.inputs[0].numel)


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
    return io_cost(node, written=written, matrix_flops=2.0 * mac, macs=float(mac),
                   vector_flops=float(b * h * pairs * 4), transcendental_flops=float(b * h * pairs),
                   problem=MatrixProblem(MatrixFamily.ATTENTION_CAUSAL if causal else MatrixFamily.ATTENTION,
                                         int(b * h), int(sq), int(sk), int(d)))
