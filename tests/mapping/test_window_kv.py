"""A sliding-window model's KV cache, heads and causality as its config says them, not as its capture shows them:
transformers gives a windowed Mistral's SDPA an explicit banded mask, with K and V repeated to the query heads and
no causal flag (opmap.geometry.layer_specs reads the layers off the workload's config instead)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from opmap.analyze import analyze  # noqa: E402
from opmap.hardware.spec import get_hardware  # noqa: E402
from opmap.mapping.context import KVShape, kv_shape  # noqa: E402
from opmap.mapping.roles import infer_roles  # noqa: E402
from opmap.workloads import load_workload  # noqa: E402

V, H, F, L, NH, KV, P, W, S = 128, 64, 96, 2, 4, 2, 256, 8, 16  # ..., heads, KV heads, positions, window, seq
HD = H // NH  # 16


def _mistral(tmp_path, window):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "mistral", "vocab_size": V, "hidden_size": H, "intermediate_size": F,
                             "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": KV,
                             "max_position_embeddings": P, "tie_word_embeddings": False, "sliding_window": window}))
    return analyze(load_workload(str(p), seq=S), get_hardware("h100-sxm"), "fp32")


@pytest.mark.parametrize("window, tokens", [(W, W), (None, S)])
def test_a_sliding_window_model_keeps_its_kv_cache(tmp_path, window, tokens):
    """The KV cache at seq 16: 2 (K, V) x 2 layers x 2 KV heads x 16 x 4 B (fp32) x the tokens each layer holds:
    min(16, 8) = 8 with the window (4,096 B), 16 without (8,192 B) (vLLM, Kwon et al. 2023, sec. 3). Read off the
    windowed capture it was 0 B (no causal call), the KV heads 4 and the attention not causal."""
    a = _mistral(tmp_path, window)
    assert a.memory.kv_cache_bytes == 2 * L * KV * HD * 4 * tokens
    # context parallelism's ring carries one layer's K and V of the whole sequence (16 tokens): 2 x 2 x 16 x 4 x 16
    assert kv_shape(a.graph) == KVShape(2 * KV * HD * 4 * S, KV, True)
    g = infer_roles(a.graph).geometry
    assert (g.heads, g.kv_heads, g.head_dim) == (NH, KV, HD)
