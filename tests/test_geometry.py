"""opmap.geometry: the KV cache formulas against published figures, and each zoo model's geometry (from its spec)
against what its capture shows."""

from __future__ import annotations

import pytest

from opmap.capture import capture
from opmap.geometry import AttentionSpec, ModelGeometry, attention_kind, forward_calls, infer_geometry
from opmap.mapping.memory import kv_geometry
from opmap.workloads import load_workload


def test_attention_kind():
    assert (attention_kind(32, 32), attention_kind(32, 8), attention_kind(32, 1)) == ("mha", "gqa", "mqa")


def test_kv_bytes_per_token_gqa_is_two_kv_heads_head_dim_layers_bytes():
    # Llama 3 8B: 32 layers, 8 KV heads of 128 at bf16: 2 x 8 x 128 x 32 x 2 = 131,072 B (128 KiB) per token
    g = ModelGeometry(32, 4096, 128256, (AttentionSpec("gqa", 32, 8, 128),) * 32)
    assert g.kv_bytes_per_token(2) == 2 * 8 * 128 * 32 * 2 == 131_072


def test_kv_bytes_per_token_mla_is_latent_plus_rope_key():
    # DeepSeek-V2 (arXiv 2405.04434 sec. 2.1.3, table 1): MLA caches (d_c + d_h^R) l = (512 + 64) x 60 elements
    # per token = 4.5 d_h l with d_h 128; at bf16 69,120 B. The heads (128) do not enter.
    spec = AttentionSpec("mla", 128, 128, 192, 128, kv_lora_rank=512, qk_rope_head_dim=64)
    g = ModelGeometry(60, 5120, 102400, (spec,) * 60)
    assert g.kv_bytes_per_token(1) == (512 + 64) * 60 == 4.5 * 128 * 60
    assert g.kv_bytes_per_token(2) == 69_120


def test_sliding_window_layers_hold_at_most_the_window():
    # Gemma 2 pattern, 4 layers of 2 KV heads x 16 at 4 B, window 8 on layers 0 and 2, 100 tokens:
    # per layer 2 x 2 x 16 x 4 = 256 B a token; 256 x (8 + 100 + 8 + 100) = 55,296 B
    local, glob = AttentionSpec("gqa", 4, 2, 16, window=8), AttentionSpec("gqa", 4, 2, 16)
    g = ModelGeometry(4, 64, 128, (local, glob, local, glob))
    assert g.kv_bytes_per_token(4) == 4 * 256
    assert g.kv_bytes(100, 4) == 256 * (8 + 100 + 8 + 100) == 55_296
    assert g.kv_bytes(100, 4, batch=3) == 3 * 55_296
    assert g.window is None and ModelGeometry(2, 64, 128, (local, local)).window == 8


def test_an_encoder_holds_no_kv_cache():
    g = ModelGeometry(12, 768, 30522, (AttentionSpec("mha", 12, 12, 64, causal=False),) * 12)
    assert g.kv_bytes_per_token(4) == 0 and g.kv_bytes(128, 4) == 0


def check_against_capture(geo: ModelGeometry, graph, dtype_bytes: float) -> None:
    """The geometry equals what the capture shows: one forward attention call per layer, each with its heads,
    KV heads, head dim and causality; and kv_geometry's bytes per token the geometry's at the capture's size."""
    calls = forward_calls(graph)
    assert len(calls) == geo.layers
    for c, a in zip(calls, geo.attention):
        assert (c.spec.n_kv_heads, c.spec.head_dim, c.spec.causal) == (a.n_kv_heads, a.head_dim, a.causal)
        if c.fused:  # a kv_cache mark of an eager attention shows no query
            assert c.spec.n_heads == a.n_heads
    assert kv_geometry(graph).bytes_per_token == geo.kv_bytes_per_token(dtype_bytes)
    assert infer_geometry(graph).layers == geo.layers


@pytest.mark.parametrize("name, kv_per_token", [
    ("gpt2", 2 * 12 * 64 * 12 * 4),  # 12 layers, 12 heads of 64, fp32: 73,728 B
    ("bert-base", 0),  # bidirectional encoder: no cache
    ("llama-3-8b", 2 * 8 * 128 * 32 * 4),  # 32 layers, 8 KV heads of 128, fp32: 262,144 B
])
def test_zoo_geometry_matches_the_capture(name, kv_per_token):
    w = load_workload(name, batch=1, seq=16)
    assert w.geometry is not None and w.geometry.kv_bytes_per_token(4) == kv_per_token
    check_against_capture(w.geometry, capture(w.module, w.inputs), 4)


def test_zoo_moe_geometry():
    w = load_workload("mixtral-8x7b", seq=16)
    g = w.geometry
    # Jiang et al. 2024: 32 layers, d 4096, 32 heads over 8 KV heads of 128, 8 experts of 14336, top 2
    assert (g.layers, g.hidden, g.n_experts, g.top_k, g.expert_ffn) == (32, 4096, 8, 2, 14336)
    assert {(a.kind, a.n_heads, a.n_kv_heads, a.head_dim) for a in g.attention} == {("gqa", 32, 8, 128)}
    assert load_workload("resnet50").geometry is None
