"""A fusion plan file read from text (opmap.mapping.fusion_plan.parse_fusion_plan): node ids are JSON integers,
nothing coerced; a bad file is one line. (A plan file through plan_fusion: tests/mapping/test_fusion.py.)"""

from __future__ import annotations

import pytest

from opmap.errors import OpmapError
from opmap.mapping.fusion_plan import parse_fusion_plan


@pytest.mark.parametrize("node,got", [("true", "true"), ('"1"', "'1'"), ("1.9", "1.9"), ("1e400", "inf"),
                                      ("NaN", "nan"), ("-1", "-1"), ("null", "null")])
def test_plan_node_ids_must_be_integers(node, got):
    with pytest.raises(OpmapError) as e:
        parse_fusion_plan('{"kernels": [[0], [2, ' + node + "]]}", "p.json")
    assert str(e.value) == f"fusion plan p.json: kernels[1][1] (a node id) must be an integer >= 0 (got {got})"


@pytest.mark.parametrize("text,expected", [
    ("[[1, 2]]", 'fusion plan p.json: no "kernels" list at the top level'),
    ('{"kernels": {"a": 1}}', 'fusion plan p.json: no "kernels" list at the top level'),
    ('{"kernels": [3]}', "fusion plan p.json: kernels[0] must be a list of node ids (got 3)"),
    (b"\x89PNG\xff\xfe\x00", "cannot read fusion plan p.json: expected JSON"),
    ("[" * 100_000, "cannot read fusion plan p.json: expected JSON"),  # nesting past the recursion limit
])
def test_plan_shape_is_checked_in_one_line(text, expected):
    with pytest.raises(OpmapError) as e:
        parse_fusion_plan(text, "p.json")
    assert str(e.value).startswith(expected) and "\n" not in str(e.value)


def test_parse_fusion_plan_returns_the_kernels():
    assert parse_fusion_plan(b'{"kernels": [[3, 4], [7.0]]}') == [[3, 4], [7]]
