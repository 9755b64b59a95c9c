"""Matrix FLOPs held against torch.utils.flop_counter.FlopCounterMode, an independent implementation.

On the meta device FlopCounterMode sees SDPA decomposed into its math path (two bmm per attention), so
its total is every GEMM, conv and attention product at dense cost. opmap's matrix FLOPs plus the causal
half it skips (``skipped_flops``) must equal it exactly, model by model. opmap must also equal it with
the attention nodes left out on both sides (GEMM and conv families alone).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from opmap.capture import capture
from opmap.costs import cost_graph
from opmap.workloads import MODELS, build_zoo

SHAPES = {"gpt2": 64, "bert-base": 64, "vit-b16": 64, "resnet50": 64, "llama-3-8b": 32, "llama-3-70b": 16,
          "mixtral-8x7b": 32, "llama-2-7b": 32, "llama-2-70b": 16, "llama-3.1-405b": 8}


def flop_counter(w) -> tuple[int, dict[str, int]]:
    with FlopCounterMode(display=False) as f, torch.no_grad():
        w.module(*w.inputs)
    return f.get_total_flops(), {str(k): v for k, v in f.get_flop_counts()["Global"].items()}


@pytest.mark.parametrize("name", list(MODELS))
def test_matrix_flops_equal_flop_counter(name):
    assert set(SHAPES) == set(MODELS)
    w = build_zoo(name, 2, SHAPES[name], "fp32")
    total, by_op = flop_counter(w)
    g = capture(w.module, w.inputs)
    costs = cost_graph(g)
    ours = sum(c.matrix_flops + c.skipped_flops for c in costs)
    assert ours == total
    # GEMM and conv alone: FlopCounterMode's bmm on meta are exactly the attention products
    gemm_conv = sum(c.matrix_flops for n, c in zip(g.nodes, costs) if "attention" not in n.op)
    assert gemm_conv == total - by_op.get("aten.bmm", 0)
