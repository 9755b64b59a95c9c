"""opmap.workloads.hf_geometry: a Hugging Face config's geometry equals what transformers' model shows when captured
(heads, KV heads, head dim from the attention calls, layers), and its KV bytes per token the formula."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from opmap.capture import capture  # noqa: E402
from opmap.workloads import load_workload  # noqa: E402
from opmap.workloads.hf_geometry import hf_geometry  # noqa: E402
from test_geometry import check_against_capture  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
V, H, F, L, NH, KV, P = 128, 64, 96, 2, 4, 2, 256  # vocab, hidden, FFN, layers, heads, KV heads, positions
_LIKE = dict(vocab_size=V, hidden_size=H, intermediate_size=F, num_hidden_layers=L, num_attention_heads=NH,
             num_key_value_heads=KV, max_position_embeddings=P, tie_word_embeddings=False)
GQA_KV = 2 * KV * (H // NH) * L * 4  # 2 x 2 KV heads x 16 x 2 layers x 4 B (fp32) = 512 B per token
CONFIGS = {
    "qwen2": (_LIKE, GQA_KV),
    "mistral": ({**_LIKE, "sliding_window": None}, GQA_KV),
    "mixtral": ({**_LIKE, "num_local_experts": 4, "num_experts_per_tok": 2}, GQA_KV),
    # 4 layers, head_dim 16 set apart from hidden / heads as Gemma does: 2 x 2 x 16 x 4 layers x 4 B = 1,024 B
    "gemma2": ({**_LIKE, "num_hidden_layers": 4, "head_dim": 16, "sliding_window": 8}, 2 * 2 * 16 * 4 * 4),
}


def _load(tmp_path, model_type: str, fields: dict):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": model_type, **fields}))
    return load_workload(str(p), batch=1, seq=16)


def test_tiny_llama_example():
    # examples/tiny-llama.json: 2 layers, 4 heads = 4 KV heads of 128 / 4 = 32: 2 x 4 x 32 x 2 x 4 B = 2,048 B
    w = load_workload(str(EXAMPLES / "tiny-llama.json"), seq=16)
    g = w.geometry
    assert (g.layers, g.hidden, g.vocab) == (2, 128, 2048)
    assert {(a.kind, a.n_heads, a.n_kv_heads, a.head_dim, a.window) for a in g.attention} == {("mha", 4, 4, 32, None)}
    assert g.kv_bytes_per_token(4) == 2 * 4 * 32 * 2 * 4 == 2048
    check_against_capture(g, capture(w.module, w.inputs), 4)


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_hf_family_geometry_matches_the_capture(tmp_path, model_type):
    fields, kv_per_token = CONFIGS[model_type]
    w = _load(tmp_path, model_type, fields)
    assert w.geometry.kv_bytes_per_token(4) == kv_per_token
    check_against_capture(w.geometry, capture(w.module, w.inputs), 4)


def test_hf_windows_and_experts(tmp_path):
    mistral = hf_geometry({"model_type": "mistral", **_LIKE, "sliding_window": 8})
    assert [a.window for a in mistral.attention] == [8, 8]
    # 100 tokens, each layer holds its window of 8: 512 B a token x 8 = 4,096 B
    assert mistral.kv_bytes(100, 4) == GQA_KV * 8 == 4096
    gemma = hf_geometry({"model_type": "gemma2", **CONFIGS["gemma2"][0]})
    assert [a.window for a in gemma.attention] == [8, None, 8, None]  # local first, then global, alternating
    # per layer 2 x 2 x 16 x 4 B = 256 B a token: 256 x (8 + 100 + 8 + 100) = 55,296 B
    assert gemma.kv_bytes(100, 4) == 55_296
    mixtral = hf_geometry({"model_type": "mixtral", **CONFIGS["mixtral"][0]})
    assert (mixtral.n_experts, mixtral.top_k, mixtral.expert_ffn) == (4, 2, F)
    # Qwen2: a window only with use_sliding_window, from max_window_layers up
    qwen = hf_geometry({"model_type": "qwen2", **_LIKE, "num_hidden_layers": 4, "use_sliding_window": True,
                        "sliding_window": 8, "max_window_layers": 2})
    assert [a.window for a in qwen.attention] == [None, None, 8, 8]
    assert hf_geometry({"model_type": "qwen2", **_LIKE, "sliding_window": 8}).window is None


def test_deepseek_v2_is_mla():
    # DeepSeek-V2 config.json (arXiv 2405.04434 table): 60 layers, 128 heads, kv_lora_rank 512, rope key 64;
    # MLA caches (512 + 64) x 60 = 34,560 elements per token, 69,120 B at bf16
    cfg = {"model_type": "deepseek_v2", "num_hidden_layers": 60, "hidden_size": 5120, "vocab_size": 102400,
           "num_attention_heads": 128, "num_key_value_heads": 128, "kv_lora_rank": 512, "q_lora_rank": 1536,
           "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "n_routed_experts": 160,
           "n_shared_experts": 2, "num_experts_per_tok": 6, "moe_intermediate_size": 1536,
           "intermediate_size": 12288}
    g = hf_geometry(cfg)
    assert {a.kind for a in g.attention} == {"mla"}
    assert g.kv_bytes_per_token(2) == (512 + 64) * 60 * 2 == 69_120
    assert (g.n_experts, g.shared_experts, g.top_k, g.expert_ffn) == (160, 2, 6, 1536)


def test_gpt2_config_fields():
    g = hf_geometry({"model_type": "gpt2", "vocab_size": V, "n_embd": H, "n_layer": L, "n_head": NH})
    assert (g.layers, g.hidden) == (L, H) and {(a.n_heads, a.n_kv_heads, a.head_dim) for a in g.attention} == {
        (NH, NH, H // NH)}
