"""Serve's pricer reads KV bytes per token and KV heads from the workload's geometry (opmap.geometry.ModelGeometry:
the config's or zoo spec's), cut to the layers it captures (Resolved.set_layers) and kept in the capture cache with
the graph, as ``opmap analyze`` does; not from the capture alone, which shows a sliding-window layer's SDPA masked,
its K and V repeated to the query heads and not causal."""

from __future__ import annotations

import json

import pytest

from opmap.api import cached, keep
from opmap.geometry import AttentionSpec, ModelGeometry
from opmap.graph import OpGraph
from opmap.hardware import get_hardware
from opmap.phases.runtime import get_runtime
from opmap.serve import pricer
from opmap.serve.model_cost import Resolved, model_table_cost
from opmap.serve.pricer import Pricer
from opmap.workloads.phases import PhaseSpec
from opmap.workloads.zoo import Workload

# a windowed Mistral: 2 layers, hidden 64, 4 heads, 2 KV heads, head dim 16, sliding window 8, vocab 128 (bf16)
MISTRAL = {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "hidden_size": 64,
           "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "sliding_window": 8, "vocab_size": 128, "max_position_embeddings": 4096,
           "torch_dtype": "bfloat16"}


def test_a_windowed_mistral_config_is_served_with_its_kv_cache(tmp_path):
    """K and V of every KV head per layer: 2 (K, V) x 2 layers x 2 KV heads x 16 head dim x 2 bytes (bf16) = 256 B
    per token per device at tp 1 (the window caps the tokens a layer holds, ModelGeometry.kv_bytes, not the bytes
    one token adds). Before: 0 B (the capture's SDPA is not causal), refused as "has no KV cache in its graph"."""
    p = tmp_path / "config.json"
    p.write_text(json.dumps(MISTRAL))
    c = model_table_cost(str(p), "h100-sxm", "bf16")
    assert c.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2 == 256
    assert c.memory["kv_bytes_per_token"] == 256


@pytest.mark.parametrize("tp", [1, 2])
def test_zoo_llama_3_8b_kv_bytes_per_token_per_device(tp):
    """Llama-3-8B (Meta's config: 32 layers, 8 KV heads, head dim 128, bf16): 2 x 8 x 128 x 32 x 2 = 131,072 B
    per token, its KV heads split over tp 2: half per device."""
    c = model_table_cost("llama-3-8b", "h100-sxm", "bf16", tp)
    assert c.kv_bytes_per_token == 2 * 8 * 128 * 32 * 2 / tp


def test_a_cached_pricing_keeps_the_geometry_cut_to_the_layers_captured(tmp_path, monkeypatch):
    """A pricing from the capture cache (no module built) analyses its 2-layer graphs with the zoo model's
    geometry cut to 2 layers, and prices what a fresh capture does (131,072 B per token, as above)."""
    monkeypatch.setenv("OPMAP_GRAPH_CACHE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(pricer, "_ANALYSES", {})
    first = model_table_cost("llama-3-8b", "h100-sxm", "bf16")
    pricer._ANALYSES.clear()
    hw = get_hardware("h100-sxm")
    r = Resolved.build("llama-3-8b", "bf16")
    rt = get_runtime(hw, "engine")
    p = Pricer(r, rt.apply(hw), "bf16", 1, 1, rt)
    a, _ = p._analyze(None, PhaseSpec("decode", kv_len=256, kv_write=rt.kv_write), 2, ("decode", 1, 256))
    assert r._built is None  # from the cache
    assert a.graph.geometry.layers == 2 and len(a.graph.geometry.attention) == 2
    assert a.graph.geometry.attention[0] == AttentionSpec("gqa", 32, 8, 128)
    pricer._ANALYSES.clear()
    assert model_table_cost("llama-3-8b", "h100-sxm", "bf16").to_dict() == first.to_dict()
    assert first.kv_bytes_per_token == 2 * 8 * 128 * 32 * 2


def test_the_capture_cache_keeps_a_workload_geometry(tmp_path, monkeypatch):
    """A windowed, MLA and encoder layer each come back from an entry as they went in; an entry without one
    comes back without one."""
    monkeypatch.setenv("OPMAP_GRAPH_CACHE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    g = ModelGeometry(3, 64, 128, (AttentionSpec("gqa", 4, 2, 16, window=8, sinks=4),
                                   AttentionSpec("mla", 4, 4, 16, 8, kv_lora_rank=32, qk_rope_head_dim=8),
                                   AttentionSpec("mha", 4, 4, 16, causal=False)), ffn=128, n_experts=4, top_k=2,
                      expert_ffn=32, source="test")
    for k, geo in (("a" * 32, g), ("b" * 32, None)):
        keep(k, OpGraph((), 0, 0.0, 0, (), "meta"), Workload("m", None, None, 1, 16, ("note",), geometry=geo))
        assert cached(k)[1].geometry == geo
