"""The 2026 model families from their published config.json (issue 38): gpt-oss (sinks, alternating sliding / full
attention, experts with biases), DeepSeek-V3 / R1 (multi-head latent attention), Llama 4 Scout (llama4_text), Qwen3
and Qwen3-MoE. Each: its KV bytes per token by the formula of its paper or model card, its parameter count against
the model card's total (a formula of the config beside it), and a prefill analysis at the real widths on a few
layers."""

from __future__ import annotations

import copy
import json

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from hf_family_configs import (  # noqa: E402
    DEEPSEEK_R1,
    FAMILIES,
    GPT_OSS_120B,
    LLAMA4_MAVERICK,
    LLAMA4_SCOUT,
    QWEN3_8B,
    QWEN3_30B_A3B,
    shallow,
)
from opmap.hardware import get_hardware  # noqa: E402
from opmap.ops import active_experts  # noqa: E402
from opmap.phases.step import analyze_phase, capture_phase  # noqa: E402
from opmap.workloads import load_workload  # noqa: E402
from opmap.workloads.hf_geometry import hf_geometry  # noqa: E402
from opmap.workloads.phases import PhaseSpec, check_phase, phase_workload  # noqa: E402

BF16 = 2


def write(tmp_path, d: dict) -> str:
    p = tmp_path / f"{d['model_type']}-{d['num_hidden_layers']}.json"
    p.write_text(json.dumps(d))
    return str(p)


# KV bytes per token at bf16, one sequence, every layer:
# GQA: 2 (K and V) x layers x KV heads x head_dim x 2 B; MLA (DeepSeek-V2 arXiv 2405.04434 sec. 2.1.2, the V3 report):
# (kv_lora_rank 512 + qk_rope_head_dim 64) = 576 elements per token per layer.
KV_PER_TOKEN = {
    "gpt_oss": 2 * 36 * 8 * 64 * BF16,  # 73,728 B (OpenAI's gpt-oss model card: GQA, 8 KV heads of 64)
    "deepseek_v3": 61 * (512 + 64) * BF16,  # 70,272 B
    "llama4_text": 2 * 48 * 8 * 128 * BF16,  # 196,608 B
    "qwen3": 2 * 36 * 8 * 128 * BF16,  # 147,456 B
    "qwen3_moe": 2 * 48 * 4 * 128 * BF16,  # 98,304 B
    "llama4_maverick": 2 * 48 * 8 * 128 * BF16,  # 196,608 B: Scout's attention
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_kv_bytes_per_token_by_the_formula(family):
    assert hf_geometry(FAMILIES[family]).kv_bytes_per_token(BF16) == KV_PER_TOKEN[family]


def test_gpt_oss_sliding_layers_hold_their_window():
    """gpt-oss alternates sliding (128-token window) and full layers, sliding first: at 4,096 tokens 18 layers hold
    4,096 tokens and 18 hold 128, at 2 x 8 x 64 x 2 B = 2,048 B a layer-token."""
    g = hf_geometry(GPT_OSS_120B)
    assert [a.window for a in g.attention[:4]] == [128, None, 128, None]
    assert g.kv_bytes(4096, BF16) == 2048 * (18 * 4096 + 18 * 128)
    assert "18 of 36 layers slide over a 128-token window" in g.kv_text()


def _params(tmp_path, d: dict) -> int:
    w = load_workload(write(tmp_path, d), 1, 1)
    return sum(p.numel() for p in w.module.parameters())


def test_gpt_oss_120b_parameters_match_the_model_card(tmp_path):
    """OpenAI's gpt-oss model card: 116.8 B total, 5.1 B active. Per layer: q 2,880 x 4,096 + bias, k and v 2,880 x
    512 + bias, o 4,096 x 2,880 + bias, 64 sinks, router 2,880 x 128 + 128, 128 experts of gate-up 2,880 x 5,760 +
    5,760 and down 2,880 x 2,880 + 2,880, two norms; embeddings and the untied head 201,088 x 2,880 each."""
    attn = 2880 * 4096 + 4096 + 2 * (2880 * 512 + 512) + 4096 * 2880 + 2880 + 64
    expert = 2880 * 5760 + 5760 + 2880 * 2880 + 2880
    total = 2 * 201088 * 2880 + 36 * (attn + 2880 * 128 + 128 + 128 * expert + 2 * 2880) + 2880
    assert _params(tmp_path, GPT_OSS_120B) == total
    assert total == pytest.approx(116.8e9, rel=0.002)
    active = 201088 * 2880 + 36 * (attn + 2880 * 128 + 4 * expert)  # the head, attention, 4 experts a layer
    assert active == pytest.approx(5.1e9, rel=0.01)


def test_llama4_maverick_parameters_match_the_model_card(tmp_path):
    """Meta's Llama 4 model card: Maverick 400 B total, 17 B active. Per layer: q and o 5,120 x 5,120, k and v 5,120 x
    1,024, two norms; the 24 odd layers MoE (interleave_moe_layer_step 2) of 128 routed experts and a shared one,
    each 3 x 5,120 x 8,192, and a router 5,120 x 128; the 24 even layers a dense MLP of 3 x 5,120 x 16,384;
    embeddings and the untied head 202,048 x 5,120 each."""
    attn = 2 * 5120 * 5120 + 2 * 5120 * 1024
    expert = 3 * 5120 * 8192
    total = (2 * 202048 * 5120 + 48 * (attn + 2 * 5120) + 24 * (129 * expert + 5120 * 128) + 24 * 3 * 5120 * 16384
             + 5120)
    assert _params(tmp_path, LLAMA4_MAVERICK) == total
    assert total == pytest.approx(400e9, rel=0.005)
    active = 2 * 202048 * 5120 + 48 * attn + 24 * 2 * expert + 24 * 3 * 5120 * 16384  # 1 routed + the shared
    assert active == pytest.approx(17e9, rel=0.02)


def test_deepseek_v3_parameters_match_the_report(tmp_path):
    """DeepSeek-V3 technical report (arXiv 2412.19437): 671 B total, 37 B active (the multi-token-prediction module
    not counted, nor built by transformers). Per layer MLA: q_a 7,168 x 1,536, its norm, q_b 1,536 x 128 x 192,
    kv_a 7,168 x 576, its norm 512, kv_b 512 x 128 x 256, o 16,384 x 7,168; 3 dense MLPs 3 x 7,168 x 18,432, 58
    MoE layers of 256 experts and a shared one of 3 x 7,168 x 2,048 and a router 256 x 7,168 (its 256
    score-correction biases a buffer in transformers, not a parameter)."""
    attn = 7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256 + 128 * 128 * 7168
    expert = 3 * 7168 * 2048
    moe = 257 * expert + 256 * 7168
    total = 2 * 129280 * 7168 + 61 * (attn + 2 * 7168) + 3 * 3 * 7168 * 18432 + 58 * moe + 7168
    assert _params(tmp_path, DEEPSEEK_R1) == total
    assert total == pytest.approx(671e9, rel=0.002)
    active = 129280 * 7168 + 61 * attn + 3 * 3 * 7168 * 18432 + 58 * 9 * expert  # 8 routed + 1 shared
    assert active == pytest.approx(37e9, rel=0.02)


def test_qwen3_parameters_match_the_model_cards(tmp_path):
    """Qwen3-8B (model card: 8.2 B) and Qwen3-30B-A3B (30.5 B total, 3.3 B active): q H x heads x 128, k and v
    H x KV heads x 128, o, q and k norms of 128, two norms; an MLP of 3 H F, or 128 experts of 3 H x 768 and a
    router H x 128; untied embeddings and head 151,936 x H."""
    def attn(h, heads, kv):
        return 2 * h * heads * 128 + 2 * h * kv * 128 + 2 * 128 + 2 * h

    dense = 2 * 151936 * 4096 + 36 * (attn(4096, 32, 8) + 3 * 4096 * 12288) + 4096
    assert _params(tmp_path, QWEN3_8B) == dense
    assert dense == pytest.approx(8.2e9, rel=0.005)
    moe = 2 * 151936 * 2048 + 48 * (attn(2048, 32, 4) + 128 * 3 * 2048 * 768 + 2048 * 128) + 2048
    assert _params(tmp_path, QWEN3_30B_A3B) == moe
    assert moe == pytest.approx(30.5e9, rel=0.005)
    active = 2 * 151936 * 2048 + 48 * (attn(2048, 32, 4) + 8 * 3 * 2048 * 768 + 2048 * 128)
    assert active == pytest.approx(3.3e9, rel=0.02)


def test_llama4_scout_parameters_and_its_published_config(tmp_path):
    """Llama 4 Scout's text model (Meta's model card: 109 B total with the vision encoder, 17 B active): per layer q
    and o 5,120 x 5,120, k and v 5,120 x 1,024, 16 experts of gate-up 5,120 x 16,384 and down 8,192 x 5,120, a
    shared expert 3 x 5,120 x 8,192, a router 5,120 x 16, two norms (the QK norm has no weights); untied embeddings
    and head 202,048 x 5,120. The published attn_temperature_tuning 4 is read as true (transformers 5 takes a bool)."""
    expert = 5120 * 16384 + 8192 * 5120
    layer = 2 * 5120 * 5120 + 2 * 5120 * 1024 + 16 * expert + expert + 5120 * 16 + 2 * 5120
    total = 2 * 202048 * 5120 + 48 * layer + 5120
    assert _params(tmp_path, LLAMA4_SCOUT) == total
    assert total == pytest.approx(109e9, rel=0.02)  # the rest of the 109 B is the vision encoder


def _prefill(path: str, seq: int):
    spec = check_phase(PhaseSpec("prefill"), path, 1)
    w = phase_workload(path, spec, 1, seq, "bf16")
    return w, analyze_phase(capture_phase(w, spec), w, get_hardware("h100-sxm"), "bf16", spec).analysis


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_prefill_of_each_family_at_real_widths(tmp_path, family):
    """Two layers at the published widths, 64 tokens: the analysis runs, and the memory line states the KV bytes per
    token of those two layers by the formula (MLA's latent named)."""
    layers = 2
    w, a = _prefill(write(tmp_path, shallow(FAMILIES[family], layers)), 64)
    per_token = KV_PER_TOKEN[family] * layers // FAMILIES[family]["num_hidden_layers"]
    mem = a.memory
    assert f"KV cache {per_token:g} B per token" in " ".join(mem.assumptions)
    assert mem.kv_cache_bytes == per_token * 64
    if family == "deepseek_v3":
        assert "MLA: 2 layers x (latent 512 + RoPE key 64)" in " ".join(mem.assumptions)


def test_llama4_runs_each_token_through_its_top_k_experts(tmp_path):
    """transformers' Llama 4 runs all 16 experts on every token (the issue's TypeError came from opmap's dispatch
    patched onto it with the wrong signature); opmap dispatches the top-1 choice: the rows through the experts'
    gate-up weights are the 64 tokens once a layer, over the experts 64 top-1 tokens are expected to activate."""
    w, a = _prefill(write(tmp_path, shallow(LLAMA4_SCOUT, 2)), 64)
    rows, calls = 0, 0
    for n in a.graph.nodes:
        if n.op == "aten.mm.default" and any(t.param and t.param.endswith("experts.gate_up_proj") for t in n.inputs):
            rows += n.outputs[0].shape[0]
            calls += 1
    assert rows == 2 * 64
    assert calls == 2 * active_experts(16, 1, 64)
    assert "transformers' Llama 4 runs every expert on every token" in " ".join(w.assumptions)


def test_absorbed_mla_is_transformers_attention(tmp_path):
    """On real tensors (CPU, fp32) a DeepSeek-V3 of small widths decodes the same logits with opmap's absorbed MLA
    (W_UK into the query, W_UV after attention, one latent cache) as with transformers' own attention."""
    import transformers

    from opmap.workloads.hf_mla import absorb_mla

    cfg = transformers.DeepseekV3Config(
        vocab_size=64, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
        n_group=1, topk_group=1, first_k_dense_replace=2, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=12, max_position_embeddings=64)
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    absorbed = copy.deepcopy(ref)
    assert absorb_mla(absorbed) == 2
    ids = torch.randint(0, 64, (2, 6))
    with torch.no_grad():
        outs = []
        for m in (ref, absorbed):
            cache = transformers.DynamicCache(config=cfg)
            m(input_ids=ids[:, :5], past_key_values=cache, use_cache=True)
            outs.append(m(input_ids=ids[:, 5:], past_key_values=cache, use_cache=True).logits)
    assert torch.allclose(outs[0], outs[1], atol=1e-5)
    # without a cache (a prefill of the same build) the attention is transformers' own, K and V decompressed
    with torch.no_grad():
        assert torch.equal(ref(input_ids=ids, use_cache=False).logits, absorbed(input_ids=ids, use_cache=False).logits)
