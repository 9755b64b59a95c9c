"""SDPA costs against the closed form, and the gap in FlopCounterMode on the CPU flash kernel."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from opmap.capture import capture
from opmap.costs import cost_node
from opmap.ops import causal_pairs


class SDPA(torch.nn.Module):
    def __init__(self, causal: bool, gqa: bool = False):
        super().__init__()
        self.causal, self.gqa = causal, gqa

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=self.gqa)


def _sdpa_node(g):
    nodes = [n for n in g.nodes if "attention" in n.op]
    assert len(nodes) == 1
    return nodes[0]


def test_gpt2_seq1024_attention_closed_form(analysis_of):
    """GPT-2 small at seq 1024: 4*B*H*S^2*Dh per layer x 12 layers = 38.65 GFLOPs of attention products
    (QK^T and PV, 2*S^2*Dh each, Vaswani et al. 2017); causal kernels compute S(S+1)/2 of the S^2 pairs."""
    a = analysis_of("gpt2", 1, 1024)
    att = [r for r in a.results if "attention" in r.node.op]
    assert len(att) == 12
    dense = 4 * 1 * 12 * 1024 * 1024 * 64 * 12
    assert dense == 38_654_705_664
    assert sum(r.cost.matrix_flops + r.cost.skipped_flops for r in att) == dense
    assert sum(r.cost.matrix_flops for r in att) == 4 * 12 * 64 * (1024 * 1025 // 2) * 12


def test_flash_for_cpu_is_zero_in_flop_counter_but_not_here():
    """torch 2.13's FlopCounterMode has no formula for _scaled_dot_product_flash_attention_for_cpu."""
    q = torch.randn(2, 4, 32, 16)
    with FlopCounterMode(display=False) as f:
        F.scaled_dot_product_attention(q, q, q)
    g = capture(SDPA(False), (q, q, q))
    n = _sdpa_node(g)
    assert n.args["backend_op"].startswith("aten._scaled_dot_product")
    closed = 2 * 2 * 4 * 32 * 32 * 16 * 2
    assert cost_node(n).matrix_flops == closed
    assert f.get_total_flops() in (0, closed)  # 0 in torch 2.13; a later torch may learn the formula


def test_causal_pairs_formula():
    # top-left aligned mask: query i sees keys 0..i
    assert causal_pairs(4, 4) == 10
    assert causal_pairs(2, 5) == 3
    assert causal_pairs(5, 2) == 1 + 2 * 4
    m = torch.ones(7, 3).tril()
    assert causal_pairs(7, 3) == int(m.sum())


def test_gqa_reads_kv_once_and_counts_query_heads():
    with torch.device("meta"):
        q = torch.empty(1, 8, 16, 32)
        k = torch.empty(1, 2, 16, 32)
    g = capture(SDPA(True, gqa=True), (q, k, k))
    c = cost_node(_sdpa_node(g))
    assert c.matrix_flops == 8 * causal_pairs(16, 16) * (2 * 32 + 2 * 32)
    # reads q (8 heads) + k + v (2 heads each), writes o (8 heads), fp32
    assert c.bytes_read == (8 * 16 * 32 + 2 * 2 * 16 * 32) * 4
    assert c.bytes_written == 8 * 16 * 32 * 4


def test_meta_sdpa_output_layout_matches_fused_kernel():
    """On meta the fused kernel does not exist; the recorded output keeps its (B, S, H, D) memory layout
    so the transpose + reshape after it is a view, as on CPU and CUDA."""
    with torch.device("meta"):
        q = torch.empty(1, 4, 16, 8)
    g = capture(SDPA(True), (q, q, q))
    out = _sdpa_node(g).outputs[0]
    cpu = F.scaled_dot_product_attention(torch.randn(1, 4, 16, 8), torch.randn(1, 4, 16, 8),
                                         torch.randn(1, 4, 16, 8), is_causal=True)
    assert out.stride == tuple(cpu.stride())


class DroppedSDPA(torch.nn.Module):
    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0, is_causal=True)


def test_attention_dropout_is_counted_forward_and_backward_and_marks_the_problem():
    """A causal training call at dropout 0.1, B 2 x H 4 x S 64 x D 32 on meta: per score the forward adds the Philox
    draw, compare and select (opmap.costs.attention: 8 integer ops) to its 5 softmax ops, the backward the draw again
    and the two masks (9) to its 4; both problems say dropout, so a measured curve takes the kernel's factor."""
    from opmap.costs.attention import DROPOUT_BWD_OPS_PER_SCORE, DROPOUT_OPS_PER_SCORE

    assert (DROPOUT_OPS_PER_SCORE, DROPOUT_BWD_OPS_PER_SCORE) == (8, 9)
    with torch.device("meta"):
        q = torch.empty(2, 4, 64, 32, requires_grad=True)
    scores = 2 * 4 * causal_pairs(64, 64)
    got = {}
    for p in (0.0, 0.1):
        g = capture(DroppedSDPA(p).train(), (q, q, q), train=True)
        fwd = next(n for n in g.nodes if n.op == "aten.scaled_dot_product_attention.default")
        bwd = next(n for n in g.nodes if n.op.endswith("_backward.default") and "attention" in n.op)
        assert bwd.args["dropout_p"] == p  # the meta backward stand-in carries the forward's probability
        got[p] = (cost_node(fwd), cost_node(bwd))
    for c in got[0.0]:
        assert not c.problem.dropout
    for c in got[0.1]:
        assert c.problem.dropout
    (f0, b0), (f1, b1) = got[0.0], got[0.1]
    assert f0.vector_flops == scores * 5 and f1.vector_flops == scores * (5 + 8)
    assert b0.vector_flops == scores * 4 and b1.vector_flops == scores * (4 + 9)
    assert f1.matrix_flops == f0.matrix_flops and b1.matrix_flops == b0.matrix_flops  # the products are the same


class Sinks(torch.nn.Module):
    """Attention with a sink logit per head (opmap.capture.functions.sink_attention), a sliding window of 4."""

    def __init__(self, heads: int, window: int | None):
        super().__init__()
        self.sinks = torch.nn.Parameter(torch.zeros(heads))
        self.window = window

    def forward(self, q, k, v):
        from opmap.capture.functions import sink_attention

        return sink_attention(q, k, v, self.sinks, window=self.window)


def test_sink_attention_is_one_kernel_reading_no_mask():
    """Sink attention as the engines' kernel: Q, K and V (per KV head) and the H sink logits read, no mask; causal
    with a 4-token window over 16 tokens: the first 4 queries see 1..4 keys, the other 12 four each."""
    with torch.device("meta"):
        q, k = torch.empty(1, 8, 16, 32), torch.empty(1, 2, 16, 32)
    for window, pairs in ((4, 4 * 5 // 2 + 12 * 4), (None, 16 * 17 // 2)):
        g = capture(Sinks(8, window), (q, k, k))
        n = _sdpa_node(g)
        assert n.input_names == ("query", "key", "value", "sinks")
        c = cost_node(n)
        assert c.matrix_flops == 8 * pairs * (2 * 32 + 2 * 32)
        assert c.skipped_flops == 8 * (16 * 16 - pairs) * (2 * 32 + 2 * 32)
        assert c.bytes_read == (8 * 16 * 32 + 2 * 2 * 16 * 32) * 4  # Q, K and V, fp32: no mask
        assert c.param_bytes_read == 8 * 4  # the sink logit of each head
        assert c.problem.attention_pairs == pairs


def test_sink_attention_decode_reads_every_cached_key():
    """One new query against 40 cached keys: causal aligned to the last key, so it sees all 40 (PyTorch's
    top-left is_causal would give it one)."""
    with torch.device("meta"):
        q, k = torch.empty(2, 8, 1, 32), torch.empty(2, 2, 40, 32)
    c = cost_node(_sdpa_node(capture(Sinks(8, None), (q, k, k))))
    assert c.matrix_flops == 2 * 8 * 40 * (2 * 32 + 2 * 32) and c.skipped_flops == 0


class Chunked(torch.nn.Module):
    """Chunked local attention (opmap.capture.functions.chunked_attention) over chunks of ``chunk`` tokens, the first
    query at absolute position ``q_offset``."""

    def __init__(self, chunk: int, q_offset: int):
        super().__init__()
        self.chunk, self.q_offset = chunk, q_offset

    def forward(self, q, k, v):
        from opmap.capture.functions import chunked_attention

        return chunked_attention(q, k, v, self.chunk, self.q_offset)


def test_chunked_attention_counts_in_chunk_pairs_and_reads_in_chunk_keys():
    """Prefill of 10 tokens in chunks of 4 (Llama 4's chunked layers, at small sizes): pairs n C (C + 1) / 2 +
    r (r + 1) / 2 = 2 x 10 + 3 = 23 of the 55 causal ones, no mask read; a decode step at position 9 against 8 held
    keys (positions 2..9) sees its chunk's keys 8 and 9 only: 2 pairs, and reads K and V of those 2 of the 8."""
    with torch.device("meta"):
        q, k = torch.empty(1, 8, 10, 32), torch.empty(1, 2, 10, 32)
    n = _sdpa_node(capture(Chunked(4, 0), (q, k, k)))
    assert n.input_names == ("query", "key", "value") and n.args["chunk"] == 4
    c = cost_node(n)
    pairs = 2 * 4 * 5 // 2 + 2 * 3 // 2
    assert c.matrix_flops == 8 * pairs * (2 * 32 + 2 * 32)
    assert c.skipped_flops == 8 * (10 * 10 - pairs) * (2 * 32 + 2 * 32)
    assert c.bytes_read == (8 * 10 * 32 + 2 * 2 * 10 * 32) * 4  # Q, K and V once, fp32: every key in some chunk
    assert c.problem.attention_pairs == pairs
    with torch.device("meta"):
        q, k = torch.empty(1, 8, 1, 32), torch.empty(1, 2, 8, 32)
    c = cost_node(_sdpa_node(capture(Chunked(4, 9), (q, k, k))))
    assert c.matrix_flops == 8 * 2 * (2 * 32 + 2 * 32)
    assert c.bytes_read == (8 * 1 * 32 + 2 * 2 * 2 * 32) * 4  # Q, and K and V of the 2 keys in the query's chunk


def test_chunked_attention_equals_masked_sdpa_on_cpu():
    """On real tensors chunked_attention is SDPA under transformers' chunked mask: key j visible to query i when
    j <= i and j // C == i // C (masking_utils.chunked_overlay), here C 4 over 10 tokens."""
    from opmap.capture.functions import chunked_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 10, 8, generator=g) for _ in range(3))
    i, j = torch.arange(10).unsqueeze(-1), torch.arange(10)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=(j <= i) & (j // 4 == i // 4))
    assert torch.allclose(chunked_attention(q, k, v, 4, 0), want, atol=1e-6)
    assert not torch.allclose(want, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
