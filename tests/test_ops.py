"""The op taxonomy: one set of pointwise ops for capture, costs and mapping; causal pairs by formula."""

from __future__ import annotations

from opmap.costs.pointwise import POINTWISE_WEIGHTS
from opmap.ops import (
    POINTWISE_OPS,
    base_name,
    causal_pairs,
    chunked_keys_read,
    chunked_pairs,
    end_aligned_pairs,
    is_pointwise,
    packet,
)


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


def test_chunked_pairs_closed_form():
    # chunked local attention from position 0 over S = n C + r tokens: each of the n full chunks holds the causal
    # pairs of C tokens, C (C + 1) / 2, the last partial one r (r + 1) / 2: pairs = n C (C + 1) / 2 + r (r + 1) / 2
    c = 8192
    for s in (20000, 16384, 8192, 100, 32768 + 1):
        n, r = divmod(s, c)
        assert chunked_pairs(s, s, c) == n * c * (c + 1) // 2 + r * (r + 1) // 2
    assert chunked_pairs(20000, 20000, 8192) == 2 * 8192 * 8193 // 2 + 3616 * 3617 // 2


def test_chunked_pairs_and_keys_by_enumeration():
    # query i at absolute position p = q0 + i, keys at q0 + Sq - Sk + j: key visible when it is at or before p and in
    # p's chunk (floor(key / C) == floor(p / C)); the keys read are those some query sees
    for sq, sk, c, q0 in ((7, 7, 3, 0), (1, 5, 3, 4), (1, 4, 3, 10), (3, 6, 4, 9), (10, 10, 4, 0), (2, 9, 4, 20),
                          (5, 5, 2, 0), (4, 7, 3, 3), (1, 8, 8, 19)):
        first = q0 + sq - sk
        seen = [(i, j) for i in range(sq) for j in range(sk)
                if first + j <= q0 + i and (first + j) // c == (q0 + i) // c]
        assert chunked_pairs(sq, sk, c, q0) == len(seen)
        assert chunked_keys_read(sq, sk, c, q0) == len({j for _, j in seen})
    # a decode step at position 19,999 (20,000 tokens held after it) with C = 8192: its chunk starts at 16,384, so
    # it sees 19,999 - 16,384 + 1 = 3,616 keys of the 8,192 a sliding cache holds
    assert chunked_pairs(1, 8192, 8192, 19999) == chunked_keys_read(1, 8192, 8192, 19999) == 3616
