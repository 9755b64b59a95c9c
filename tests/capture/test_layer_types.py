"""The layer-type rule (see opmap.capture.layer_types): module stack innermost first, then the op."""

from __future__ import annotations

import pytest

from opmap.capture import LAYER_TYPES, classify, parse_overrides
from opmap.errors import OpmapError


@pytest.mark.parametrize("stack,kind,expected", [
    ([("h.3", "GPT2Block"), ("h.3.attn", "CausalSelfAttention"), ("h.3.attn.c_attn", "Linear")], "other",
     "attention"),
    ([("h.3", "GPT2Block"), ("h.3.mlp", "GPT2MLP"), ("h.3.mlp.c_fc", "Linear")], "other", "mlp"),
    ([("h.3", "GPT2Block"), ("h.3.ln_1", "LayerNorm")], "other", "norm"),
    ([("lm_head", "Linear")], "other", "head"),
    ([("fc", "Linear")], "other", "head"),
    ([("wte", "Embedding")], "data_movement", "embedding"),
    ([("layer1.0", "Bottleneck"), ("layer1.0.conv2", "Conv2d")], "other", "conv"),
    ([("layer1.0", "Bottleneck"), ("layer1.0.bn2", "BatchNorm2d")], "other", "norm"),
    ([("maxpool", "MaxPool2d")], "other", "pooling"),
    ([("pooler", "BertPooler"), ("pooler.dense", "Linear")], "other", "head"),
    ([("layers.0.mlp", "SparseMoeBlock"), ("layers.0.mlp.gate", "Linear")], "other", "moe_router"),
    ([("layers.0.mlp", "SparseMoeBlock"), ("layers.0.mlp.experts", "ModuleList"),
      ("layers.0.mlp.experts.3", "Expert"), ("layers.0.mlp.experts.3.up_proj", "Linear")], "other", "moe_expert"),
    ([("layers.0.mlp", "LlamaMLP"), ("layers.0.mlp.gate_proj", "Linear")], "other", "mlp"),
    # Qwen3-MoE's family name holds "Moe": its attention and norms are attention and norm, its block the router's
    ([("model", "Qwen3MoeModel"), ("model.layers.0", "Qwen3MoeDecoderLayer"),
      ("model.layers.0.self_attn", "Qwen3MoeAttention"), ("model.layers.0.self_attn.q_proj", "Linear")], "other",
     "attention"),
    ([("model.layers.0", "Qwen3MoeDecoderLayer"), ("model.layers.0.input_layernorm", "Qwen3MoeRMSNorm")], "other",
     "norm"),
    ([("model.layers.0.mlp", "Qwen3MoeSparseMoeBlock"), ("model.layers.0.mlp.gate", "Qwen3MoeTopKRouter")], "other",
     "moe_router"),
    ([("model.layers.0.mlp", "DeepseekV3MoE"), ("model.layers.0.mlp.gate", "DeepseekV3TopkRouter")], "other",
     "moe_router"),
    ([("h.3", "GPT2Block")], "elementwise", "elementwise"),  # residual add: no module decides
    ([], "data_movement", "data_movement"),
])
def test_rule(stack, kind, expected):
    assert expected in LAYER_TYPES
    assert classify(stack, kind) == expected


def test_overrides_win_and_match_globs():
    ov = parse_overrides(["h.*.attn.c_proj=mlp", "lm_head=other"])
    assert classify([("h.2.attn", "CausalSelfAttention"), ("h.2.attn.c_proj", "Linear")], "other", ov) == "mlp"
    assert classify([("h.2.attn", "CausalSelfAttention"), ("h.2.attn.c_attn", "Linear")], "other", ov) == \
        "attention"
    assert classify([("lm_head", "Linear")], "other", ov) == "other"


@pytest.mark.parametrize("bad", ["attn", "=mlp", "h.*=fancy"])
def test_bad_override(bad):
    with pytest.raises(OpmapError, match="PATTERN=TYPE"):
        parse_overrides([bad])


def test_unmatched_overrides_are_named():
    from opmap.capture import unmatched_overrides

    paths = ["h.0.attn.c_attn", "h.0.mlp.c_fc", "lm_head"]
    assert unmatched_overrides((("h.*.attn.*", "attention"), ("h.*.ffn.*", "mlp"), ("lm_head", "lm_head")),
                               paths) == ["h.*.ffn.*=mlp"]
