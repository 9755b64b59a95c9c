"""A mixed step's price (opmap.serve.cost.mixed_s): prompt chunks and decodes in one iteration."""

from __future__ import annotations

import pytest

from opmap.serve.cost import TableCost, mixed_s


def test_a_mixed_step_keeps_what_the_decodes_cost_beyond_their_tokens_pass():
    """Prefill P(t) = 1 ms a token (a pass of t tokens); a decode step of n sequences holding K tokens 5 ms + 2 ms a
    sequence (their attention at no KV and their logits, which a prompt's pass of n tokens does not pay) + 1 us a
    KV token. 100 prompt tokens with 10 decodes at 1000 KV tokens: the decodes' step, 5 + 20 + 1 = 26 ms, plus the
    prompt's marginal pass P(110) - P(10) = 100 ms: 126 ms. (One pass of all 110 tokens plus the KV read, 111 ms,
    priced the decodes' 20 ms of attention and logits as 10 tokens' 10 ms.)"""
    rows = [[0.005 + 0.002 * n, 0.005 + 0.002 * n + 1.0] for n in (1, 10, 100)]
    cost = TableCost([0, 1000], [0.0, 1.0], [1, 10, 100], [0, 1e6], rows)
    assert mixed_s(cost, 100, 1, 10, 1000) == pytest.approx(0.126)
    assert mixed_s(cost, 0, 0, 10, 1000) == pytest.approx(0.026)  # decodes alone: their step
    assert mixed_s(cost, 100, 1, 0, 0) == pytest.approx(0.100)  # a prompt alone: its pass


def test_a_mixed_step_is_never_under_one_pass_of_all_its_tokens():
    """A pass that grows faster than its tokens (P(100) = 10 ms, P(200) = 100 ms: attention's quadratic part) and
    decodes that cost 1 ms whatever their count: 100 prompt tokens with 100 decodes at no KV take at least one pass
    of all 200 tokens, 100 ms, though the decodes' step plus the prompt's marginal pass comes to 1 + 90 = 91 ms."""
    cost = TableCost([0, 100, 200], [0.0, 0.010, 0.100], [1, 100], [0, 1e6], [[0.001, 0.001], [0.001, 0.001]])
    assert mixed_s(cost, 100, 1, 100, 0) == pytest.approx(0.100)
