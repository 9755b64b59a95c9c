"""The op taxonomy: one set of pointwise ops for capture, costs and mapping; causal pairs by formula."""

from __future__ import annotations

from opmap.costs.pointwise import POINTWISE_WEIGHTS
from opmap.ops import POINTWISE_OPS, base_name, causal_pairs, end_aligned_pairs, is_pointwise, packet


def test_pointwise_taxonomy_and_cost_weights_agree():
    assert set(POINTWISE_WEIGHTS) == POINTWISE_OPS


def test_names():
    assert packet("aten.addmm.default") == "addmm"
    assert base_name("add_") == "add" and base_name("_to_copy") == "_to_copy"
    assert is_pointwise("aten.add_.Tensor") and is_pointwise("aten.gelu.default")
    assert not is_pointwise("aten.mm.default") and not is_pointwise("add")


def test_causal_pairs_by_enumeration():
    # top-left aligned causal mask: key j visible to query i when j <= i
    for sq, sk in ((4, 4), (2, 5), (5, 2), (7, 3), (1, 9)):
        assert causal_pairs(sq, sk) == sum(1 for i in range(sq) for j in range(sk) if j <= i)
    assert causal_pairs(1024, 1024) == 1024 * 1025 // 2


def test_end_aligned_pairs_by_enumeration():
    # causal aligned to the last key (query i of Sq at position Sk - Sq + i), at most W keys per query: key j
    # visible when p - W < j <= p (FlashAttention's window_size=(W - 1, 0))
    for sq, sk, w in ((4, 4, None), (1, 9, None), (3, 9, None), (5, 2, None), (10, 10, 4), (1, 9, 4), (3, 9, 2),
                      (9, 9, 20)):
        p0 = sk - sq
        assert end_aligned_pairs(sq, sk, w) == sum(
            1 for i in range(sq) for j in range(sk) if j <= p0 + i and (w is None or j > p0 + i - w))
    # gpt-oss prefill at 2,048 tokens, window 128: 128 x 129 / 2 for the first 128 queries, 128 each after
    assert end_aligned_pairs(2048, 2048, 128) == 128 * 129 // 2 + (2048 - 128) * 128
