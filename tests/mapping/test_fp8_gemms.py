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


def test_fp8_inference_keeps_the_lm_head_in_bf16():
    """An fp8 checkpoint as ModelOpt quantizes it (its default config disables *lm_head* and the MoE routers:
    NVIDIA/TensorRT-Model-Optimizer modelopt/torch/quantization/config.py, _default_disabled_quantizer_cfg): GPT-2's
    decode step on an H100 prices the LM head at bf16, reading its tied 50257 x 768 weight at 2 bytes an element
    (77.2 MB), and every block Linear at fp8, 1 byte an element (c_fc: 768 x 3072 weight + 3072 bias = 2.36 MB);
    on an A100 (no fp8 matrix engine: the weight-only fallback, opmap.precision) nothing is kept apart."""
    from opmap.hardware import get_hardware
    from opmap.phases.step import analyze_phase

    spec = PhaseSpec("decode", kv_len=64)
    with torch.device("meta"):
        w = phase_workload("gpt2", spec, 4, None, "fp8", "meta")
    g = capture_phase(w, spec)
    a = analyze_phase(g, w, get_hardware("h100-sxm"), "fp8", spec).analysis
    head = [r for r in a.results if r.node.module == "lm_head" and r.cost.param_bytes_read]
    assert head and head[0].cost.param_bytes_read == 50257 * 768 * 2
    assert [k.format for k in a.kernel_results if a.graph.nodes[k.kernel.anchor].module == "lm_head"] == ["bf16"]
    fc = next(r for r in a.results if r.node.module.endswith("h.0.mlp.c_fc") and r.cost.param_bytes_read)
    assert fc.cost.param_bytes_read == (768 * 3072 + 3072) * 1  # weight and bias, each at the stored 1 byte
    assert "LM head in bf16" in a.assumptions.fp8_inference
    a100 = analyze_phase(g, w, get_hardware("a100-sxm-80gb"), "fp8", spec).analysis
    assert a100.assumptions.fp8_inference is None
