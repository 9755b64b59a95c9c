"""An MoE layer's experts as one grouped GEMM per expert weight under the engine fusion (opmap.mapping.fusion,
opmap.mapping.kernels._grouped), as TensorRT-LLM's and vLLM's fused MoE run them; eager keeps the captured loop's
kernel per expert. Checked on Qwen3-30B-A3B cut to 2 layers (Hugging Face config, stacked experts) and the zoo's
Mixtral 8x7B (a ModuleList of experts), each against the formula from its config: per layer and expert weight one
kernel; its FLOPs every routed token's 2 x in x out; its bytes every expert's weights once."""

from __future__ import annotations

import json

import pytest

from opmap.mapping.fusion import expert_gemm_key

pytest.importorskip("transformers")

from test_expert_parallel import decode  # noqa: E402  (the decode step of a model at h200, bf16, a runtime)

from hf_family_configs import QWEN3_30B_A3B, shallow  # noqa: E402

BATCH, KV = 64, 256


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    path = tmp_path_factory.mktemp("q") / "config.json"
    path.write_text(json.dumps(shallow(QWEN3_30B_A3B, 2)))
    return {rt: decode(str(path), BATCH, KV, rt) for rt in ("engine", "eager")}


def _grouped(a):
    return [k for k in a.kernel_results if k.kernel.grouped > 1]


def test_qwen3_moe_experts_are_one_grouped_gemm_per_weight_and_layer(qwen):
    """128 experts, top 8, hidden 2048, expert FFN 768 (transformers 5 stacks gate_up_proj [E, 2 x 768, 2048] and
    down_proj [E, 2048, 768]): 2 layers x 2 weights = 4 grouped kernels; each layer routes 64 x 8 tokens, so the
    gate-up group computes 2 x 512 x 2048 x 1536 FLOPs and reads the 128 experts' 2048 x 1536 bf16 weights."""
    c = QWEN3_30B_A3B
    e, h, f, k = c["num_experts"], c["hidden_size"], c["moe_intermediate_size"], c["num_experts_per_tok"]
    g = _grouped(qwen["engine"])
    nodes = qwen["engine"].graph.nodes
    assert len(g) == 2 * 2 and len({x.kernel.grouped for x in g}) == 1 and e // 2 < g[0].kernel.grouped <= e
    up = [x for x in g if nodes[x.kernel.anchor].inputs[1].shape[-1] == 2 * f]
    assert len(up) == 2
    costs = {r.node.id: r.cost for r in qwen["engine"].results}
    gemms = [m for m in up[0].kernel.nodes if costs[m].matrix_flops > 0]
    ran = len(gemms)  # the experts the balanced routing hit
    assert sum(nodes[m].inputs[0].shape[0] for m in gemms) == BATCH * k  # every routed token once
    assert sum(costs[m].matrix_flops for m in gemms) == 2 * BATCH * k * h * 2 * f
    assert up[0].traffic_bytes >= ran * h * 2 * f * 2  # every expert's weights that ran, bf16, once
    assert up[0].traffic_bytes < ran * h * 2 * f * 2 * 1.05  # plus the routed tokens' activations, a few percent
    assert f"grouped GEMM of {ran} experts" in up[0].why
    # eager runs the captured loop: one GEMM kernel per expert
    assert not _grouped(qwen["eager"])
    assert len(qwen["eager"].kernel_results) > len(qwen["engine"].kernel_results) + 2 * 2 * (e - 1)


def test_mixtral_modulelist_experts_group_by_weight():
    """Mixtral's experts are a ModuleList (experts.N.w1 / w2 / w3): grouped per weight name and layer, 32 layers
    x 3 weights (w1 and w3 may be merged as siblings first: each group then holds the 8 experts' GEMMs)."""
    a = decode("mixtral-8x7b", BATCH, KV)
    g = _grouped(a)
    assert g and all(x.kernel.grouped == 8 for x in g)
    keys = {expert_gemm_key(a.graph.nodes[x.kernel.anchor]) for x in g}
    assert len(keys) == len(g) and len(g) in (32 * 2, 32 * 3)
