"""Cost rules against hand formulas, one family at a time (small real or meta tensors)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from opmap.capture import capture
from opmap.costs import RULES, cost_graph, cost_node, uncounted
from opmap.graph import Node, TensorMeta


class Fn(nn.Module):
    def __init__(self, fn, *mods):
        super().__init__()
        self.fn = fn
        self.mods = nn.ModuleList(mods)

    def forward(self, *xs):
        return self.fn(*xs)


def costs_of(fn, *xs, mods=()):
    g = capture(Fn(fn, *mods), xs)
    return [(n, c) for n, c in zip(g.nodes, cost_graph(g)) if c.kernel]


def only(fn, *xs, mods=()):
    nc = costs_of(fn, *xs, mods=mods)
    assert len(nc) == 1, [n.op for n, _ in nc]
    return nc[0]


M = torch.device("meta")


def test_mm_addmm_bmm_formulas():
    a, b = torch.empty(64, 32, device=M), torch.empty(32, 48, device=M)
    n, c = only(torch.mm, a, b)
    assert c.matrix_flops == 2 * 64 * 32 * 48 and c.macs == 64 * 32 * 48
    assert c.bytes == (64 * 32 + 32 * 48 + 64 * 48) * 4  # each input once, output once
    bias = torch.empty(48, device=M)
    n, c = only(torch.addmm, bias, a, b)
    assert c.matrix_flops == 2 * 64 * 32 * 48 and c.vector_flops == 64 * 48
    x, y = torch.empty(3, 8, 16, device=M), torch.empty(3, 16, 4, device=M)
    n, c = only(torch.bmm, x, y)
    assert c.matrix_flops == 2 * 3 * 8 * 16 * 4


def test_conv_formula_with_groups_stride_dilation_and_transposed():
    # out = floor((32 + 2*1 - 2*(3-1) - 1)/2) + 1 = 15
    conv = nn.Conv2d(8, 12, 3, stride=2, padding=1, dilation=2, groups=4, device=M)
    x = torch.empty(2, 8, 32, 32, device=M)
    n, c = only(lambda x: conv(x), x, mods=(conv,))
    ho = (32 + 2 - 2 * 2 - 1) // 2 + 1
    assert n.outputs[0].shape == (2, 12, ho, ho)
    assert c.matrix_flops == 2 * 2 * 12 * ho * ho * (8 // 4) * 9
    assert c.vector_flops == 2 * 12 * ho * ho  # bias
    assert c.param_bytes_read == (12 * 2 * 9 + 12) * 4
    tconv = nn.ConvTranspose1d(6, 4, 5, stride=3, device=M)
    x = torch.empty(2, 6, 10, device=M)
    n, c = only(lambda x: tconv(x), x, mods=(tconv,))
    assert c.matrix_flops == 2 * 2 * 6 * 10 * 4 * 5  # each input pixel scatters Cout*k products


def test_pointwise_weights():
    x = torch.empty(10, 20, device=M)
    _, c = only(lambda x: F.gelu(x, approximate="tanh"), x)
    assert (c.vector_flops, c.transcendental_flops) == (7 * 200, 200)
    _, c = only(F.gelu, x)
    assert (c.vector_flops, c.transcendental_flops) == (4 * 200, 200)
    _, c = only(F.silu, x)
    assert (c.vector_flops, c.transcendental_flops) == (3 * 200, 200)
    _, c = only(lambda x: x.pow(2), x)
    assert (c.vector_flops, c.transcendental_flops) == (200, 0)
    y = torch.empty(20, device=M)
    n, c = only(torch.add, x, y)  # broadcast: y is read once, 20 elements
    assert c.vector_flops == 200 and c.bytes == (200 + 20 + 200) * 4


def test_softmax_and_norms():
    x = torch.empty(4, 16, 32, device=M)
    _, c = only(lambda x: torch.softmax(x, -1), x)
    assert (c.vector_flops, c.transcendental_flops) == (4 * 2048, 2048)
    ln = nn.LayerNorm(32, device=M)
    _, c = only(lambda x: ln(x), x, mods=(ln,))
    assert c.vector_flops == 7 * 2048 and c.transcendental_flops == 4 * 16  # one rsqrt per row
    assert c.param_bytes_read == 2 * 32 * 4
    bn = nn.BatchNorm2d(16, device=M).eval()
    img = torch.empty(2, 16, 8, 8, device=M)
    _, c = only(lambda x: bn(x), img, mods=(bn,))
    assert c.vector_flops == 4 * 2 * 16 * 64 and c.bytes_written == 2 * 16 * 64 * 4


def test_embedding_reads_only_the_rows_it_touches():
    emb = nn.Embedding(50000, 64, device=M)
    idx = torch.zeros(2, 10, dtype=torch.long, device=M)
    n, c = only(lambda i: emb(i), idx, mods=(emb,))
    assert c.param_bytes_read == 20 * 64 * 4  # 20 rows, not the 50000-row table
    assert c.bytes_read == 20 * 8 and c.bytes_written == 20 * 64 * 4


def test_einsum_rule_matches_equivalent_bmm():
    node = Node(0, "aten.einsum.default", "", "", "other",
                inputs=(TensorMeta((3, 8, 16), "float32", (128, 16, 1)), TensorMeta((3, 16, 4), "float32", (64, 4, 1))),
                outputs=(TensorMeta((3, 8, 4), "float32", (32, 4, 1)),), input_names=("tensors[0]", "tensors[1]"),
                args={"equation": "bij,bjk->bik"})
    assert cost_node(node).matrix_flops == 2 * 3 * 8 * 16 * 4
    ell = Node(0, "aten.einsum.default", "", "", "other", inputs=node.inputs, outputs=node.outputs,
               input_names=node.input_names, args={"equation": "...ij,...jk->...ik"})
    assert cost_node(ell).matrix_flops == 2 * 3 * 8 * 16 * 4


def test_views_cost_nothing_and_copies_move_bytes():
    x = torch.empty(4, 6, device=M)
    nc = costs_of(lambda x: x.t().contiguous(), x)
    (n, c), = nc
    assert n.op == "aten.clone.default" and c.bytes == 2 * 24 * 4 and c.flops == 0
    g = capture(Fn(lambda x: x.view(24).unsqueeze(0)), (x,))
    assert all(n.is_view for n in g.nodes)
    assert all(c.is_view and c.bytes == 0 for c in cost_graph(g))


def test_uncounted_ops_are_listed_never_silent():
    x = torch.empty(16, device=M)
    g = capture(Fn(lambda x: torch.fft.rfft(x)), (x,))
    costs = cost_graph(g)
    un = uncounted(g, costs)
    assert un and all("fft" in op for op in un)
    assert not any(c.counted for n, c in zip(g.nodes, costs) if "fft" in n.op)


def test_registry_covers_the_issue_families():
    for packet in ("mm", "addmm", "bmm", "baddbmm", "linear", "matmul", "einsum", "convolution",
                   "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                   "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention",
                   "_flash_attention_forward", "_efficient_attention_forward", "_softmax", "_log_softmax",
                   "native_layer_norm", "native_group_norm", "_native_batch_norm_legit_no_training",
                   "rms_norm", "sum", "mean", "amax", "embedding", "index_select", "gather", "scatter_add",
                   "max_pool2d_with_indices", "avg_pool2d", "_adaptive_avg_pool2d", "cat", "copy_", "clone",
                   "gelu", "silu", "tanh", "erf", "exp", "add", "mul", "where"):
        assert packet in RULES, packet


@pytest.mark.parametrize("variant,layout", [("_flash_attention_forward", "bshd"),
                                            ("_scaled_dot_product_efficient_attention", "bhsd")])
def test_cuda_variants_layouts(variant, layout):
    b, h, s, d = 2, 4, 64, 32
    shape = (b, s, h, d) if layout == "bshd" else (b, h, s, d)
    t = TensorMeta(shape, "float16", ())
    names = ("query", "key", "value")
    args = {"is_causal": True} if layout == "bhsd" else {"is_causal": True}
    node = Node(0, f"aten.{variant}.default", "", "", "attention", inputs=(t, t, t), outputs=(t,),
                input_names=names, args=args)
    c = cost_node(node)
    pairs = s * (s + 1) // 2
    assert c.matrix_flops == b * h * pairs * 4 * d
    assert c.skipped_flops == b * h * (s * s - pairs) * 4 * d


def test_costs_add_up_in_order_skipping_the_uncounted():
    """OpCost.sum: the counted costs' fields added (a GEMM's 2*M*N*K = 2*64*64*64 matrix FLOPs and its bytes, a
    pointwise op's M*N FLOPs), an op without a rule left out, as chaining ``+`` over the counted ones gives."""
    from functools import reduce

    from opmap.costs.base import OpCost

    gemm = OpCost(matrix_flops=2 * 64**3, macs=64**3, bytes_read=64 * 64 * 2, param_bytes_read=64 * 64 * 2,
                  bytes_written=64 * 64 * 2)
    add = OpCost(vector_flops=64 * 64, bytes_read=2 * 64 * 64 * 2, bytes_written=64 * 64 * 2)
    missing = OpCost(matrix_flops=1e9, counted=False)
    t = OpCost.sum([gemm, missing, add])
    assert t.matrix_flops == 2 * 64**3 and t.vector_flops == 64 * 64 and t.macs == 64**3
    assert t.bytes == 64 * 64 * 2 * 6
    assert t.counted and t.kernel and not t.is_view
    assert t == reduce(lambda a, c: a + c if c.counted else a, [gemm, missing, add], OpCost())
    assert OpCost.sum([]) == OpCost()
