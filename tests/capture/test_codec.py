"""The capture cache's graph codec: a captured graph round-trips exactly; data it did not write is refused."""

from __future__ import annotations

import copy
import json

import pytest

from opmap.capture import capture
from opmap.capture.codec import BadEntry, decode_graph, encode_graph
from opmap.workloads import build_zoo


def _through_json(g):
    """``g`` encoded, written as JSON text, parsed and decoded: what a cache hit does."""
    return decode_graph(json.loads(json.dumps(encode_graph(g))))


@pytest.fixture(scope="module")
def gpt2_graphs():
    """gpt2 at batch 2, seq 16 on meta: the forward and a training step (backward and optimizer nodes)."""
    w = build_zoo("gpt2", 2, 16, "bf16")
    return capture(w.module, w.inputs), capture(w.module, w.inputs, train=True)


def test_a_captured_graph_round_trips_node_for_node(gpt2_graphs):
    for g in gpt2_graphs:
        back = _through_json(g)
        assert back == g  # every node (op, module, layer type, tensors, args, flags), params, inputs, notes
        assert [n.args for n in back.nodes] == [n.args for n in g.nodes]
        assert [list(n.args) for n in back.nodes] == [list(n.args) for n in g.nodes]  # the order too
        assert back.param_sizes == g.param_sizes and len(back.param_sizes) > 0
    train = gpt2_graphs[1]
    assert {n.args.get("phase") for n in _through_json(train).nodes} >= {"backward", "optimizer"}


def _bad(enc, mutate):
    d = copy.deepcopy(enc)
    mutate(d)
    with pytest.raises(BadEntry):
        decode_graph(json.loads(json.dumps(d)))


@pytest.mark.parametrize("mutate", [
    lambda d: d["tensors"][0][0].append("7"),  # a shape of strings
    lambda d: d["tensors"][0][0].append(-1),  # a negative size
    lambda d: d["tensors"][0].__setitem__(1, True),  # a bool where a string index goes
    lambda d: d["tensors"][0].__setitem__(1, d["strings"].index("aten.embedding.default")),  # not a dtype
    lambda d: d["nodes"][3][4].append(-1),  # a negative tensor index (Python would wrap it)
    lambda d: d["nodes"][3][4].append(len(d["tensors"])),  # past the end
    lambda d: d["nodes"][3].__setitem__(0, 1.0),  # a float index
    lambda d: d["nodes"][3].__setitem__(7, ["not", "a", "dict"]),  # args
    lambda d: d["nodes"][3].__setitem__(8, 1),  # is_view as an int
    lambda d: d["nodes"][3].pop(),  # a short row
    lambda d: d["nodes"][3][5].pop(),  # an input without its name
    lambda d: d["tensors"].append([[2], d["tensors"][0][1], [1], len(d["nodes"]) - 1, None])
    or d["nodes"][0][4].append(len(d["tensors"]) - 1),  # node 0 reads the last node's output
    lambda d: d.__setitem__("param_bytes", float("nan")),
    lambda d: d.__setitem__("params", "124M"),
    lambda d: d["param_sizes"].append(["wte.weight"]),
    lambda d: d.__setitem__("strings", [*d["strings"], 3]),
    lambda d: d.pop("nodes"),
])
def test_data_it_did_not_write_is_refused(gpt2_graphs, mutate):
    _bad(encode_graph(gpt2_graphs[0]), mutate)


def test_refused_input_that_is_not_a_graph():
    for d in (None, [], "graph", {"strings": []}):
        with pytest.raises(BadEntry):
            decode_graph(d)
