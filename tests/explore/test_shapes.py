"""Shape families: a graph written from four captures equals the graph captured at that value."""

from __future__ import annotations

import pytest
import torch

from opmap.capture import capture
from opmap.costs import cost_graph
from opmap.explore.shapes import NotAFamily, ShapeFamily, _ints, _skeleton
from opmap.workloads import build_zoo


def _cap(name: str, batch: int, seq: int):
    w = build_zoo(name, batch, seq, "bf16")
    return capture(w.module, w.inputs)


@pytest.mark.parametrize("name", ["gpt2", "llama-3-8b"])
def test_batch_family_writes_the_graph_a_capture_would(name):
    fam = ShapeFamily(lambda b: _cap(name, b, 32), [1, 2, 3, 4])
    assert fam.captures == 4
    written, real = fam.graph_at(9), _cap(name, 9, 32)
    assert _skeleton(written) == _skeleton(real) and _ints(written) == _ints(real)
    assert sum(c.flops for c in cost_graph(written)) == sum(c.flops for c in cost_graph(real))


def test_sequence_family_covers_the_square_terms():
    # unfused attention scores are (b, a, s, s) with strides in s^2: degree 2 in the sequence, fitted exactly
    from opmap.workloads.gpt2 import GPT2, GPT2Config

    def cap(s: int):
        with torch.device("meta"):
            m = GPT2(GPT2Config(vocab_size=64, block_size=512, n_layer=2, n_head=2, n_embd=32, attention="unfused"))
            x = torch.zeros(2, s, dtype=torch.long)
        return capture(m, (x,))

    fam = ShapeFamily(cap, [8, 16, 24, 32])
    written, real = fam.graph_at(200), cap(200)
    assert _ints(written) == _ints(real)
    scores = [n for n in written.nodes if n.op == "aten.baddbmm.default"]
    assert scores and scores[0].outputs[0].shape == (2 * 2, 200, 200)


def test_a_graph_that_changes_with_the_value_is_refused():
    class Branchy(torch.nn.Module):
        def forward(self, x):
            return x.relu() if x.shape[0] % 2 else x.sigmoid()  # the operator depends on the batch

    def cap(b: int):
        with torch.device("meta"):
            return capture(Branchy(), (torch.empty(b, 8),))

    with pytest.raises(NotAFamily, match="not the graph"):
        ShapeFamily(cap, [1, 2, 3, 4])

    class Cubic(torch.nn.Module):
        def forward(self, x):
            n = x.shape[0]
            return x.new_zeros(n * n * n)  # degree 3: the fourth capture disagrees with the quadratic fit

    def cap3(b: int):
        with torch.device("meta"):
            return capture(Cubic(), (torch.empty(b, 8),))

    with pytest.raises(NotAFamily, match="not polynomial"):
        ShapeFamily(cap3, [1, 2, 3, 4])
