"""Fusion plans: kernel counts, bytes and launches saved by hand, legality, plan files, the zoo."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from opmap.capture import capture
from opmap.costs import cost_graph
from opmap.errors import OpmapError
from opmap.mapping import plan_fusion
from opmap.workloads import build_zoo


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.norm, self.fc2 = nn.Linear(64, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 64)

    def forward(self, x):
        return self.fc2(self.norm(self.act(self.fc1(x)) + x))


@pytest.fixture(scope="module")
def block():
    with torch.device("meta"):
        m = Block()
        x = torch.randn(8, 64)
    g = capture(m, (x,))
    return g, cost_graph(g)


def _ops(g, k):
    return [g.nodes[i].op.split(".")[1] for i in k.nodes]


def test_eager_is_one_kernel_per_op(block):
    g, c = block
    p = plan_fusion(g, c, "eager")
    assert [_ops(g, k) for k in p.kernels] == [["addmm"], ["gelu"], ["add"], ["native_layer_norm"], ["addmm"]]
    assert p.bytes_saved == 0 and p.launches_saved == 0


def test_compiler_fuses_the_gemm_epilogue_not_the_norm(block):
    g, c = block
    p = plan_fusion(g, c, "compiler")
    # GELU and the residual add are the first GEMM's epilogue; the layer norm needs whole rows of the GEMM's
    # output, so it does not join the GEMM kernel
    assert [_ops(g, k) for k in p.kernels] == [["addmm", "gelu", "add"], ["native_layer_norm"], ["addmm"]]
    assert p.launches_saved == 2 and p.eager_kernels == 5
    assert p.kernels[0].kernel_class == "matrix"
    # by hand, 8x64 fp32 = 2048 B per activation: gelu's read of the GEMM output and the GEMM's write of it,
    # add's read of gelu's output and gelu's write of it, and add's second read of x (the GEMM read x already)
    assert p.bytes_saved == 5 * 2048


def test_resnet50_compiler_counts():
    # ResNet-50: 53 conv, 53 batch norm, 49 ReLU after a norm, 16 residual adds (each followed by a ReLU),
    # max pool, mean, the classifier GEMM. Eager: 174 kernels. Compiler: each norm takes its ReLU (or
    # add + ReLU) as epilogue: 53 + 53 + 3 = 109 kernels, 49 + 16 launches saved.
    w = build_zoo("resnet50", 1, None, "fp32")
    g = capture(w.module, w.inputs)
    c = cost_graph(g)
    assert len(plan_fusion(g, c, "eager").kernels) == 174
    p = plan_fusion(g, c, "compiler")
    assert len(p.kernels) == 109 and p.launches_saved == 65
    assert p.bytes_saved > 0


def test_plan_file_groups_and_cycles(block, tmp_path):
    g, c = block
    ids = [n.id for n in g.nodes if c[n.id].kernel]
    f = tmp_path / "plan.json"
    f.write_text(json.dumps({"kernels": [ids[1:3]]}))
    p = plan_fusion(g, c, plan_file=f)
    assert len(p.kernels) == 4 and p.launches_saved == 1
    f.write_text(json.dumps({"kernels": [[ids[0], ids[2]]]}))  # addmm + add around gelu: a cycle
    with pytest.raises(OpmapError, match="cycle"):
        plan_fusion(g, c, plan_file=f)
    f.write_text("{not json")
    with pytest.raises(OpmapError, match="cannot read fusion plan"):
        plan_fusion(g, c, plan_file=f)
    with pytest.raises(OpmapError, match="accepted: eager, compiler"):
        plan_fusion(g, c, "xla")


@pytest.mark.parametrize("kind", ["link to /dev/zero", "fifo", "folder"])
def test_a_plan_file_must_be_a_bounded_regular_file(block, tmp_path, kind):
    """A plan path linked to /dev/zero read without end (MemoryError), a FIFO blocked the read. The user's own link
    is followed, but what it reaches must be a regular file of at most opmap.safeio.LIMIT_JSON_BYTES."""
    import os

    g, c = block
    f = tmp_path / "plan.json"
    if kind == "link to /dev/zero":
        f.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(f)
    else:
        f.mkdir()
    what = {"link to /dev/zero": "a device", "fifo": "a FIFO", "folder": "a folder"}[kind]
    with pytest.raises(OpmapError, match=f"fusion plan .*plan.json is {what}: expected a regular file"):
        plan_fusion(g, c, plan_file=f)
    ids = [n.id for n in g.nodes if c[n.id].kernel]
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"kernels": [ids[1:3]]}))
    mine = tmp_path / "mine.json"
    mine.symlink_to(good)  # the user's own link to a plan: read
    assert plan_fusion(g, c, plan_file=mine).launches_saved == 1


def test_gpt2_kernel_counts_by_formula():
    # Per layer, eager: ln_1, c_attn, SDPA, attn c_proj, residual add, ln_2, c_fc, gelu, mlp c_proj, residual
    # add = 10 kernels; plus arange, wte and wpe gathers, their add, ln_f, LM head = 6: 12 * 10 + 6 = 126.
    # Compiler: each residual add joins its c_proj GEMM, gelu joins c_fc: 7 a layer; the embedding add joins
    # a gather: 12 * 7 + 5 = 89, 37 launches saved.
    w = build_zoo("gpt2", 1, 32, "bf16")
    g = capture(w.module, w.inputs)
    c = cost_graph(g)
    assert len(plan_fusion(g, c, "eager").kernels) == 126
    p = plan_fusion(g, c, "compiler")
    assert len(p.kernels) == 89 and p.launches_saved == 37
    # no kernel mixes a norm into a GEMM, and SDPA stays alone
    for k in p.kernels:
        ops = _ops(g, k)
        assert not ("native_layer_norm" in ops and k.kernel_class == "matrix")
        if "scaled_dot_product_attention" in ops:
            assert ops == ["scaled_dot_product_attention"]


class HandAttention(nn.Module):
    """Attention written out: (q @ k^T) * scale, softmax, @ v (no SDPA)."""

    def forward(self, q, k, v):
        return torch.softmax((q @ k.transpose(-2, -1)) * 0.125, dim=-1) @ v


def test_hand_written_attention_fuses_into_one_kernel():
    with torch.device("meta"):
        b, h, s, d = 2, 4, 128, 64
        q, k, v = (torch.randn(b, h, s, d) for _ in range(3))
    g = capture(HandAttention(), (q, k, v))
    c = cost_graph(g)
    eager = plan_fusion(g, c, "eager")
    fused = plan_fusion(g, c, "compiler")
    attn = [k for k in fused.kernels if "_softmax" in _ops(g, k)]
    assert len(attn) == 1
    ops = _ops(g, attn[0])
    assert ops.count("bmm") == 2 and "mul" in ops
    # the scores (b*h*s*s fp32) are written and read three times in eager (bmm -> mul -> softmax -> bmm):
    # all six transfers are gone
    x = b * h * s * s * 4
    assert eager.bytes_saved == 0 and fused.bytes_saved >= 6 * x
    assert fused.bytes_saved == pytest.approx(6 * x, rel=0.05)


class TwoBranches(nn.Module):
    def forward(self, x):
        a = torch.relu(x)  # A
        b = torch.sigmoid(x)  # B
        return a + b  # D: needs A and B


def test_plan_file_kernels_run_in_execution_order(tmp_path):
    # a kernel fusing A with D cannot launch before B, whose output D reads: the plan lists B first, though
    # A (the fused kernel's first node) comes before B in the graph
    with torch.device("meta"):
        x = torch.empty(1024)
    g = capture(TwoBranches(), (x,))
    c = cost_graph(g)
    ops = ("aten.relu.default", "aten.sigmoid.default", "aten.add.Tensor")
    a, b, d = (next(n.id for n in g.nodes if n.op == op) for op in ops)
    assert a < b < d
    f = tmp_path / "plan.json"
    f.write_text(json.dumps({"kernels": [[a, d]]}))
    p = plan_fusion(g, c, plan_file=f)
    assert [k.nodes for k in p.kernels] == [(b,), (a, d)]
    assert p.group_of[b] == 0 and p.group_of[a] == p.group_of[d] == 1


def test_a_plan_file_with_true_is_not_read_as_node_1(block, tmp_path):
    """json.loads gives True, int(True) is 1: the plan fused node 1 with whatever came next."""
    g, c = block
    ids = [n.id for n in g.nodes if c[n.id].kernel]
    f = tmp_path / "plan.json"
    f.write_text('{"kernels": [[true, ' + str(ids[2]) + "]]}")
    with pytest.raises(OpmapError, match=r"kernels\[0\]\[0\] \(a node id\) must be an integer >= 0 \(got true\)"):
        plan_fusion(g, c, plan_file=f)


# -- engine: what serving engines ship as single kernels -------------------------------------------------------

def test_engine_keeps_the_residual_add_with_the_norm(block):
    g, c = block
    p = plan_fusion(g, c, "engine")
    # GELU is the first GEMM's epilogue; the residual add feeds only the layer norm, so it stays with it: one
    # fused add + norm kernel (vLLM's fused_add_rms_norm), not a GEMM epilogue
    assert [_ops(g, k) for k in p.kernels] == [["addmm", "gelu"], ["add", "native_layer_norm"], ["addmm"]]
    assert p.launches_saved == 2 and p.eager_kernels == 5
    # by hand, 8x64 fp32 = 2048 B per activation: the GEMM's write of its output and gelu's read of it; add's
    # write of its sum and the norm's read of it
    assert p.bytes_saved == 4 * 2048


class QKV(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(64, n, bias=False) for n in (64, 16, 16))

    def forward(self, x):
        return self.q(x), self.k(x), self.v(x)


def test_engine_merges_sibling_gemms_reading_one_activation():
    with torch.device("meta"):
        m, x = QKV(), torch.randn(8, 64)
    g = capture(m, (x,))
    c = cost_graph(g)
    assert len(plan_fusion(g, c, "compiler").kernels) == 3
    p = plan_fusion(g, c, "engine")
    assert [_ops(g, k) for k in p.kernels] == [["mm", "mm", "mm"]]
    # one GEMM over the concatenated weights reads x (8x64 fp32 = 2048 B) once instead of three times
    assert p.bytes_saved == 2 * 2048 and p.launches_saved == 2


def test_engine_keeps_hand_written_attention_one_kernel():
    with torch.device("meta"):
        q, k, v = (torch.randn(2, 4, 128, 64) for _ in range(3))
    g = capture(HandAttention(), (q, k, v))
    p = plan_fusion(g, cost_graph(g), "engine")
    attn = [k for k in p.kernels if "_softmax" in _ops(g, k)]
    # the scale before the softmax is not a norm's prologue: it stays in the scores kernel (flash attention)
    assert len(attn) == 1 and _ops(g, attn[0]).count("bmm") == 2 and "mul" in _ops(g, attn[0])


@pytest.fixture(scope="module")
def llama_decode():
    from opmap.phases.step import capture_phase
    from opmap.workloads.phases import PhaseSpec, check_phase, phase_workload

    spec = check_phase(PhaseSpec("decode", 1024), "llama-3-8b", 1)
    g = capture_phase(phase_workload("llama-3-8b", spec, 1, None, "bf16"), spec)
    return g, cost_graph(g)


def test_engine_llama_decode_layer_is_seven_kernels(llama_decode):
    """Counted by hand from a Llama decoder layer's ops (HF LlamaDecoderLayer, one new token):
      1. residual add + RMSNorm (add, fp32 cast, pow, mean, add eps, rsqrt, mul, bf16 cast, mul weight)
      2. QKV: q_proj, k_proj, v_proj read the same normed x -> one GEMM; RoPE on q and k (neg, cat, mul, mul,
         add each) and the two KV-cache writes (copy_) are its epilogue
      3. attention (SDPA: paged decode attention)
      4. o_proj GEMM (its residual add goes to kernel 5, as 1 for the next layer)
      5. residual add + RMSNorm (post-attention), as 1
      6. gate_proj and up_proj read the same x -> one GEMM; SiLU(gate) x up is its epilogue
      7. down_proj GEMM (its residual add opens the next layer's kernel 1)
    = 7 per layer (eager: 40; TensorRT-LLM runs the same 7, vLLM 10: separate rotary, cache write and
    silu_and_mul). Whole step: 32 x 7 + embedding + rotary cos/sin + layer 0's first norm (no residual yet) +
    lm_head = 228 (the last layer's add + norm is the final norm)."""
    from opmap.phases.train import block_of, block_prefix

    g, c = llama_decode
    eager = plan_fusion(g, c, "eager")
    p = plan_fusion(g, c, "engine")
    prefix = block_prefix(g)
    per_layer: dict[str, int] = {}
    for k in p.kernels:
        b = block_of(g.nodes[k.anchor].module, prefix)
        if b is not None:
            per_layer[b] = per_layer.get(b, 0) + 1
    assert len(per_layer) == 32 and set(per_layer.values()) == {7}
    assert len(p.kernels) == 32 * 7 + 4
    assert len(eager.kernels) == 32 * 40 + 17  # eager: the same layer is 40 aten kernels
    ops = [_ops(g, k) for k in p.kernels if block_of(g.nodes[k.anchor].module, prefix) == f"{prefix}.1"]
    assert ops[1][:3] == ["mm", "mm", "mm"] and ops[1].count("copy_") == 2 and ops[1].count("cat") == 2
    assert ops[2] == ["scaled_dot_product_attention"]
    assert ops[5] == ["mm", "silu", "mm", "mul"]
    assert ops[0][0] == "add" and "mean" in ops[0] and "rsqrt" in ops[0]


# -- library: what training frameworks run (vendor GEMMs alone, hand-written fused kernels between them) ---------

def test_library_runs_gemms_alone_and_fuses_between_them(block):
    g, c = block
    p = plan_fusion(g, c, "library")
    # GELU is not the GEMM's epilogue (Megatron's fused bias-GELU is a kernel of its own); GELU, the residual add
    # and the norm are pointwise-into-reduction: one fused kernel between the two GEMMs
    assert [_ops(g, k) for k in p.kernels] == [["addmm"], ["gelu", "add", "native_layer_norm"], ["addmm"]]
    assert p.launches_saved == 2 and p.eager_kernels == 5
    # by hand, 8x64 fp32 = 2048 B per activation: gelu's write of its output and add's read of it; add's write of
    # its sum and the norm's read of it (the GEMM's output is still written and read: no epilogue)
    assert p.bytes_saved == 4 * 2048


def test_library_merges_sibling_gemms_as_the_frameworks_define_them():
    with torch.device("meta"):
        m, x = QKV(), torch.randn(8, 64)
    g = capture(m, (x,))
    p = plan_fusion(g, cost_graph(g), "library")
    # Megatron-Core's linear_qkv: one GEMM over the concatenated weights, x (2048 B) read once
    assert [_ops(g, k) for k in p.kernels] == [["mm", "mm", "mm"]]
    assert p.bytes_saved == 2 * 2048


def test_library_llama_decode_layer_is_twelve_kernels(llama_decode):
    """Counted by hand from the same decoder layer as engine's seven, GEMMs alone:
      1. residual add + RMSNorm (as engine's 1)        2. QKV: one merged GEMM (Megatron-Core's linear_qkv)
      3. RoPE on q (x cos, rotate-half: neg, cat, x sin, add): one kernel, as Megatron-Core's fused RoPE
      4. RoPE on k, with the K-cache write (copy_) as its epilogue      5. the V-cache write (copy_ of v)
      6. attention (SDPA)                              7. o_proj GEMM
      8. residual add + RMSNorm                        9. gate_proj and up_proj: one merged GEMM
     10. SiLU   11. x up: HF computes SiLU(gate) before up(x), so by capture order the product cannot join SiLU's
         kernel (the bias-SwiGLU of Megatron-Core reads one linear_fc1 output instead)   12. down_proj GEMM"""
    from opmap.phases.train import block_of, block_prefix

    g, c = llama_decode
    p = plan_fusion(g, c, "library")
    prefix = block_prefix(g)
    ops = [_ops(g, k) for k in p.kernels if block_of(g.nodes[k.anchor].module, prefix) == f"{prefix}.1"]
    assert len(ops) == 12
    assert ops[1] == ["mm", "mm", "mm"] and ops[6] == ["mm"] and ops[8] == ["mm", "mm"] and ops[11] == ["mm"]
    assert ops[2] == ["neg", "cat", "mul", "mul", "add"] and ops[3] == ["neg", "cat", "mul", "mul", "add", "copy_"]
    assert ops[4] == ["copy_"] and ops[5] == ["scaled_dot_product_attention"]
    assert ops[0][0] == "add" and "rsqrt" in ops[0] and ops[7][0] == "add" and "rsqrt" in ops[7]
    assert ops[9:11] == [["silu"], ["mul"]]
    # no kernel holds a GEMM beside anything but its siblings
    assert all(not {"mm", "addmm"} & set(o) or set(o) <= {"mm", "addmm"} for o in map(lambda k: _ops(g, k), p.kernels))
