"""The op taxonomy: one set of pointwise ops for capture, costs and mapping; causal pairs by formula."""

from __future__ import annotations

from opmap.costs.pointwise import POINTWISE_WEIGHTS
from opmap.ops import POINTWISE_OPS, base_name, causal_pairs, is_pointwise, packet


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
