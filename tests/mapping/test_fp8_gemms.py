"""Which GEMMs of a training step run in fp8 (opmap.mapping.fp8) and the casts added for them, on GPT-2's captured
training step: 12 blocks of 4 Linear layers (attention c_attn, c_proj; MLP c_fc, c_proj), the tied LM head."""

from __future__ import annotations

import functools

import torch

from opmap.costs import cost_graph
from opmap.mapping.fp8 import CAST_OP, SCALE_OP, fp8_operand_bytes, plan_fp8_training
from opmap.phases.step import capture_phase
from opmap.workloads.phases import PhaseSpec, phase_workload


@functools.cache
def _graph():
    spec = PhaseSpec("train")
    with torch.device("meta"):
        w = phase_workload("gpt2", spec, 1, 64, "bf16", "meta")
    return capture_phase(w, spec)


def test_linear_gemms_fp8_the_head_and_attention_not():
    g = _graph()
    p = plan_fp8_training(g)
    fp8 = [g.nodes[i] for i in p.fp8_nodes]
    assert len(fp8) == 12 * 4 * 3  # fprop, dgrad, wgrad of each Linear
    assert {n.module.split(".")[-1] for n in fp8} == {"c_attn", "c_proj", "c_fc"}
    assert not any(n.module == "lm_head" or "attention" in n.op for n in fp8)
    assert any(x.startswith("LM head") for x in p.bf16_matrix)
    assert any(x.startswith("attention core") for x in p.bf16_matrix)
    added = p.graph.nodes[len(g.nodes):]
    assert [n.id for n in added] == list(range(len(g.nodes), len(p.graph.nodes)))  # appended, ids in order
    assert sum(n.op == CAST_OP for n in added) == 12 * (4 + 4 + 4) == p.casts
    assert [n.op for n in added].count(SCALE_OP) == 1
    assert p.graph.params == g.params  # the model is unchanged


def test_fp8_gemms_read_one_byte_operands():
    g = _graph()
    p = plan_fp8_training(g)
    costs = cost_graph(p.graph)
    half = fp8_operand_bytes(costs, p.fp8_nodes)
    for i, (c, h) in enumerate(zip(costs, half)):
        if i in p.fp8_nodes:
            assert (h.bytes_read, h.param_bytes_read, h.bytes_written) == (
                c.bytes_read / 2, c.param_bytes_read / 2, c.bytes_written)
        else:
            assert h is c
