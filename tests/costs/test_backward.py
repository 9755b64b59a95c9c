"""Backward cost rules against hand formulas: each op is captured from a tiny training step on meta (so the packet
name and the arguments are what torch really records) and its FLOPs and bytes checked against the formula written
beside it. Counting convention (opmap.costs.pointwise): each add, subtract, multiply, divide, compare or select is
one vector FLOP, a product of constants is folded, each exp / erf / tanh / log1p is one transcendental op. Then:
every zoo model's training step is counted whole (``uncounted`` empty)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from opmap.capture import capture
from opmap.costs import cost_graph, cost_node, uncounted
from opmap.graph import Node, TensorMeta
from opmap.workloads import MODELS, build_zoo

M = torch.device("meta")
R, C = 4, 8  # the activation's shape: rows x features
N = R * C  # gradient elements
F32 = 4  # bytes per fp32 element


class Step(nn.Module):
    """A linear layer (so the activation's input needs a gradient) followed by ``fn``."""

    def __init__(self, fn, *mods):
        super().__init__()
        self.lin = nn.Linear(C, C, device=M)
        self.fn = fn
        self.mods = nn.ModuleList(mods)

    def forward(self, x, *rest):
        # a trailing unit dim: the training loss stays the mean stand-in (a [rows, classes] output would take
        # cross-entropy, whose own log-softmax backward would sit beside the op's), so the backward nodes are the op's
        return self.fn(self.lin(x), *rest).unsqueeze(-1)


def backward_node(fn, *rest, mods=(), packet: str):
    """The (node, cost) of the one backward node of ``packet`` in a training step of ``fn`` after a linear layer."""
    g = capture(Step(fn, *mods), (torch.empty(R, C, device=M), *rest), train=True)
    found = [(n, c) for n, c in zip(g.nodes, cost_graph(g)) if n.packet == packet]
    assert len(found) == 1, [n.op for n in g.nodes]
    n, c = found[0]
    assert c.counted
    return n, c


def minimum_bytes(n: Node) -> float:
    """Each input read once, each output written once (all fp32 here)."""
    return sum(t.nbytes for t in n.inputs) + sum(t.nbytes for t in n.outputs)


# (forward, backward packet, vector per gradient element, transcendental per gradient element), each by its formula
ACTIVATIONS = [
    # s = sigmoid(x) = 1 / (1 + exp(-x)): add, div + exp; dy * s * (1 + x * (1 - s)): sub, mul, add, mul, mul
    (F.silu, "silu_backward", 2 + 5, 1),
    # dy * (1 - y) * y from the saved output: sub, mul, mul
    (torch.sigmoid, "sigmoid_backward", 3, 0),
    # dy * (1 - y * y) from the saved output: mul, sub, mul
    (torch.tanh, "tanh_backward", 3, 0),
    # (x <= lo || x >= hi) ? 0 : dy: two compares, an or, a select (ReLU6 is hardtanh(0, 6))
    (F.relu6, "hardtanh_backward", 4, 0),
    (F.hardtanh, "hardtanh_backward", 4, 0),
    # x > 0 ? dy : dy * slope: compare, mul, select
    (F.leaky_relu, "leaky_relu_backward", 3, 0),
    # x <= 0 ? dy * b * a * exp(x * b) : dy * s: compare, mul (x b), exp, two muls (dy b a), mul, mul (dy s), select
    (F.elu, "elu_backward", 7, 1),
    (F.selu, "elu_backward", 7, 1),
    # z = exp(b x); b x > t ? dy : dy * z / (z + 1): mul, exp, compare, add, mul, div, select
    (F.softplus, "softplus_backward", 6, 1),
    # x < -3 ? 0 : x <= 3 ? dy * (x / 3 + 0.5) : dy: two compares, div, add, mul, two selects
    (F.hardswish, "hardswish_backward", 7, 0),
    # -3 < x < 3 ? dy / 6 : 0: two compares, and, mul, select
    (F.hardsigmoid, "hardsigmoid_backward", 5, 0),
    # z = exp(-|x|); dy * (m - sign * z / (1 + z)): compare, two selects (m, sign), abs, exp, add, div, mul, sub, mul
    (F.logsigmoid, "log_sigmoid_backward", 9, 1),
    # erf form: cdf = 0.5 (1 + erf(x / sqrt 2)): mul, add, mul + erf; pdf = c exp(-x^2 / 2): mul, mul, mul + exp;
    # dy * (cdf + x * pdf): mul, add, mul
    (F.gelu, "gelu_backward", 3 + 3 + 3, 2),
    # tanh form (PyTorch's GeluBackward): x^2, x^3 (2); inner = b (x + k x^3) (3); tanh; left = x / 2 (1);
    # right = 1 + t (1); left' = right / 2 (1); 1 - t^2 (2); inner' = b (1 + 3k x^2) (3); right' = left (1 - t^2)
    # inner' (2); dy (left' + right') (2)
    (lambda x: F.gelu(x, approximate="tanh"), "gelu_backward", 2 + 3 + 1 + 1 + 1 + 2 + 3 + 2 + 2, 1),
]


@pytest.mark.parametrize("fn,packet,vec,trans", ACTIVATIONS, ids=[f"{p}-{i}" for i, (_, p, _, _) in
                                                                 enumerate(ACTIVATIONS)])
def test_activation_backward(fn, packet, vec, trans):
    n, c = backward_node(fn, packet=packet)
    assert (c.vector_flops, c.transcendental_flops, c.matrix_flops) == (vec * N, trans * N, 0)
    assert c.bytes == minimum_bytes(n)


def test_elu_backward_from_its_result_needs_no_exp():
    """In-place ELU saves its output: x <= 0 ? dy * b * (y + a) : dy * s: compare, add, two muls, mul, select."""
    n, c = backward_node(lambda x: F.elu(x.clone(), inplace=True), packet="elu_backward")
    assert n.args["is_result"] is True
    assert (c.vector_flops, c.transcendental_flops) == (6 * N, 0)


def test_glu_backward_counts_per_gradient_element():
    """glu halves the input: the gradient has R x C/2 elements; da = dy s (1), db = dy a s (1 - s) (sub and three
    muls: 4), s = sigmoid(b) (add, div + exp: 2 + 1)."""
    n, c = backward_node(F.glu, packet="glu_backward")
    half = R * C // 2
    assert n.inputs[0].numel == half
    assert (c.vector_flops, c.transcendental_flops) == ((1 + 4 + 2) * half, half)
    assert c.bytes == minimum_bytes(n)  # dy (R x C/2) and the input (R x C) read, the input gradient written


def test_softmax_and_log_softmax_backward():
    """softmax: dx = y (dy - sum(dy y)): mul, row sum, sub, mul (4). log_softmax: dx = dy - exp(y) sum(dy): row sum,
    exp, mul, sub (3 + exp)."""
    n, c = backward_node(lambda x: F.softmax(x, -1), packet="_softmax_backward_data")
    assert (c.vector_flops, c.transcendental_flops) == (4 * N, 0) and c.bytes == minimum_bytes(n)
    n, c = backward_node(lambda x: F.log_softmax(x, -1), packet="_log_softmax_backward_data")
    assert (c.vector_flops, c.transcendental_flops) == (3 * N, N) and c.bytes == minimum_bytes(n)


def test_norm_backwards():
    """layer norm backward: 10 per element (x-hat recomputed: sub, mul; dy w; two row sums; x-hat times a row
    coefficient; the input-gradient combination: sub, sub, mul; and the weight / bias accumulations folded in the
    same count); group norm backward counts layer norm's 10 per element over each group."""
    ln = nn.LayerNorm(C, device=M)
    n, c = backward_node(lambda x: ln(x), mods=(ln,), packet="native_layer_norm_backward")
    assert c.vector_flops == 10 * N and c.transcendental_flops == 0
    gn = nn.GroupNorm(2, C, device=M)
    n, c = backward_node(lambda x: gn(x.reshape(R, C, 1)), mods=(gn,), packet="native_group_norm_backward")
    assert c.vector_flops == 10 * N and c.bytes == minimum_bytes(n)


def _rms_backward_node(weight: bool) -> Node:
    """aten._fused_rms_norm_backward as CUDA records it (meta decomposes RMSNorm into pointwise math):
    (grad_out, input, normalized_shape, rstd, weight, output_mask)."""
    x = TensorMeta((R, C), "float32", (C, 1))
    ins = [x, x, TensorMeta((R, 1), "float32", (1, 1))] + ([TensorMeta((C,), "float32", (1,), param="w")]
                                                           if weight else [])
    names = ("grad_out", "input", "rstd") + (("weight",) if weight else ())
    outs = (x,) + ((TensorMeta((C,), "float32", (1,)),) if weight else ())
    return Node(0, "aten._fused_rms_norm_backward.default", "", "", "other", inputs=tuple(ins), outputs=outs,
                input_names=names, args={"normalized_shape": [C], "output_mask": [True, weight]})


def test_rms_norm_backward():
    """dx = r (dy w) - x r^3 mean(dy w x): dy w, its product with x, the row sum, x times the row's coefficient,
    r times dy w, the subtraction (6); dw = sum over rows of dy x r: x r, times dy, the accumulation (3)."""
    c = cost_node(_rms_backward_node(weight=True))
    assert c.counted and c.vector_flops == (6 + 3) * N and c.transcendental_flops == 0
    assert c.bytes_read == (N + N + R) * F32 and c.param_bytes_read == C * F32
    assert c.bytes_written == (N + C) * F32
    assert cost_node(_rms_backward_node(weight=False)).vector_flops == 6 * N


def test_cross_entropy_forward_and_backward():
    """F.cross_entropy = log_softmax + nll_loss. nll_loss forward, per target: the ignore-index test and the
    accumulation (2); it reads the R targets (int64) and the R log-probabilities they pick, writes the loss and the
    total weight (two fp32 scalars). Backward: the (R, C) input gradient written whole; per target the test and
    -dy / total weight (2); reads dy, the targets and the total weight, not the saved input."""
    y = torch.zeros(R, dtype=torch.long, device=M)
    g = capture(Step(lambda x, t: F.cross_entropy(x, t)), (torch.empty(R, C, device=M), y), train=True)
    by = {n.packet: (n, c) for n, c in zip(g.nodes, cost_graph(g))}
    n, c = by["nll_loss_forward"]
    assert c.vector_flops == 2 * R and c.bytes_read == R * 8 + R * F32 and c.bytes_written == 2 * F32
    n, c = by["nll_loss_backward"]
    assert c.vector_flops == 2 * R
    assert c.bytes_read == F32 + R * 8 + F32 and c.bytes_written == R * C * F32
    assert not uncounted(g, cost_graph(g))


def test_nll_loss_with_class_weights():
    """With a weight per class: forward adds the weight's product and the total weight's accumulation (4 per
    target), backward the weight's product (3); each reads the R weights its targets pick."""
    w = nn.Parameter(torch.empty(C, device=M), requires_grad=False)
    y = torch.zeros(R, dtype=torch.long, device=M)
    g = capture(Step(lambda x, t: F.nll_loss(x, t, weight=w)), (torch.empty(R, C, device=M), y), train=True)
    by = {n.packet: c for n, c in zip(g.nodes, cost_graph(g))}
    assert by["nll_loss_forward"].vector_flops == 4 * R
    assert by["nll_loss_backward"].vector_flops == 3 * R
    assert by["nll_loss_forward"].bytes == R * 8 + R * F32 + R * F32 + 2 * F32


def test_mse_loss_forward_and_backward():
    """forward (x - y)^2 summed: sub, mul, add (3 per element); backward (x - y) times the scalar 2 dy / N: sub, mul
    (2 per element), reading dy, x and y and writing dx."""
    target = torch.zeros(R, C, device=M)
    g = capture(Step(lambda x, t: F.mse_loss(x, t)), (torch.empty(R, C, device=M), target), train=True)
    by = {n.packet: (n, c) for n, c in zip(g.nodes, cost_graph(g))}
    assert by["mse_loss"][1].vector_flops == 3 * N
    n, c = by["mse_loss_backward"]
    assert c.vector_flops == 2 * N and c.bytes == minimum_bytes(n)


def test_log_sigmoid_forward():
    """min(x, 0) - log1p(exp(-|x|)): abs, min, sub (3) + exp, log1p (2)."""
    g = capture(Step(F.logsigmoid), (torch.empty(R, C, device=M),), train=True)
    (c,) = [c for n, c in zip(g.nodes, cost_graph(g)) if n.packet == "log_sigmoid_forward"]
    assert (c.vector_flops, c.transcendental_flops) == (3 * N, 2 * N)


def test_embedding_backward_scatters_each_gradient_element():
    """embedding_dense_backward: one accumulation per gradient element (R indices x C features)."""
    emb = nn.Embedding(16, C, device=M)
    g = capture(nn.Sequential(emb, nn.Linear(C, C, device=M)), (torch.zeros(R, dtype=torch.long, device=M),),
                train=True)
    (c,) = [c for n, c in zip(g.nodes, cost_graph(g)) if n.packet == "embedding_dense_backward"]
    assert c.vector_flops == N


# -- every zoo model's training step is counted whole ----------------------------------------------------------

def _two_blocks(module: nn.Module) -> None:
    """Keep the first two of each run of repeated blocks (a ModuleList): the ops a training step runs do not depend
    on how many identical blocks repeat, and two keep the block-to-block edges."""
    for child in module.modules():
        for name, sub in list(child.named_children()):
            if isinstance(sub, nn.ModuleList) and len(sub) > 2:
                setattr(child, name, nn.ModuleList(list(sub)[:2]))


@pytest.mark.parametrize("model", list(MODELS))
def test_zoo_training_step_has_no_uncounted_op(model):
    """The whole step (forward, loss, backward, AdamW) of each zoo model on meta at a small shape."""
    vision = MODELS[model].kind == "vision"
    w = build_zoo(model, 2 if vision else 1, 64 if vision else 16, "bf16", "meta")
    _two_blocks(w.module)
    g = capture(w.module, w.inputs, train=True, optimizer="adamw")
    assert any(n.args.get("phase") == "backward" for n in g.nodes)
    assert uncounted(g, cost_graph(g)) == {}
