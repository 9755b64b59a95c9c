"""A decoder's stack as a prefix and a repeating period (opmap.serve.layer_period): found on the published configs of
DeepSeek-R1, gpt-oss-20b and Llama 4 Scout / Maverick (tests/hf_family_configs.py) at their full depth, each
expectation derived from the config's own fields; the captures it asks for keep every layer's kind; each layer of the
model maps to a block of the long capture with its signature, the tail included."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from opmap.serve.layer_period import Stack, find_period, layer_signatures
from opmap.serve.resolve import Resolved

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hf_family_configs import DEEPSEEK_R1, GPT_OSS_20B, LLAMA4_MAVERICK, LLAMA4_SCOUT  # noqa: E402


def _unit(xs: list) -> int:
    """The length of the shortest block that ``xs`` repeats from its start."""
    return next(k for k in range(1, len(xs) + 1) if all(xs[i] == xs[i % k] for i in range(len(xs))))


def _expected(name: str, cfg: dict) -> tuple[int, int]:
    """(p, q) from the config's fields, as transformers builds the layers."""
    L = cfg["num_hidden_layers"]
    if name == "deepseek-r1":
        # DeepseekV3DecoderLayer: a MoE MLP on layer i >= first_k_dense_replace (every moe_layer_freq-th), dense below;
        # every layer the same MLA attention
        return cfg["first_k_dense_replace"], cfg["moe_layer_freq"]
    if name == "gpt-oss-20b":  # one attention kind a layer, layer_types repeating from layer 0
        return 0, _unit(cfg["layer_types"])
    # Llama 4: the rope / NoPE pattern of no_rope_layers (a NoPE global layer every 4th), and a MoE feed-forward on
    # the layers of moe_layers, else every interleave_moe_layer_step-th from step - 1 (Llama4TextConfig)
    step = cfg["interleave_moe_layer_step"]
    moe = cfg.get("moe_layers") or list(range(step - 1, L, step))
    kinds = [i in moe for i in range(L)]
    return 0, math.lcm(_unit(cfg["no_rope_layers"]), _unit(kinds))


@pytest.fixture(scope="module", params=["deepseek-r1", "gpt-oss-20b", "llama-4-scout", "llama-4-maverick"])
def model(request, tmp_path_factory):
    cfg = {"deepseek-r1": DEEPSEEK_R1, "gpt-oss-20b": GPT_OSS_20B, "llama-4-scout": LLAMA4_SCOUT,
           "llama-4-maverick": LLAMA4_MAVERICK}[request.param]
    p = tmp_path_factory.mktemp(request.param) / "config.json"
    p.write_text(json.dumps(cfg))
    return request.param, cfg, Resolved.build(str(p), "bf16")


def test_the_period_of_each_published_stack(model):
    """R1: 3 dense layers, then MoE layers (p 3, q 1: captures of 4 and 5 layers for 61); gpt-oss-20b: sliding and
    full layers in turn (p 0, q 2: 2 and 4 of 24); Llama 4 Scout: a NoPE global layer every 4th, every layer MoE
    (p 0, q 4: 4 and 8 of 48); Maverick: the same and MoE every 2nd (lcm(4, 2) = 4)."""
    name, cfg, r = model
    p, q = _expected(name, cfg)
    assert (r.prefix, r.period) == (p, q)
    assert r.uneven  # not one layer repeated
    st, why = r.stack()
    L = cfg["num_hidden_layers"]
    r_ = (L - p) % q
    assert not why and (st.short, st.long) == (p + q + r_, p + 2 * q + r_) and st.long < L


def test_the_captures_keep_each_layers_kind(model):
    """Cut to the short and the long capture (Resolved.set_layers: the first n layers, the config's per-layer lists
    cut with them), each layer has the signature it has in the whole model."""
    _, _, r = model
    w, parent, attr, blocks = r._module_parts()
    whole = layer_signatures(r.config, blocks, w.geometry)
    st, _ = r.stack()
    for n in (st.short, st.long):
        r.set_layers(n)
        cut = list(getattr(parent, attr))
        assert len(cut) == n == r.config.num_hidden_layers
        assert layer_signatures(r.config, cut, r.workload.geometry) == whole[:n]
    r.set_layers(len(blocks))


@pytest.mark.parametrize("kinds,pq", [("a" * 10, (0, 1)), ("ddd" + "m" * 58, (3, 1)), ("sf" * 12, (0, 2)),
                                      ("aaab" * 3 + "a", (0, 4)), ("x" + "aaab" * 3 + "aa", (1, 4)),
                                      ("abcdef", None)])
def test_each_layer_maps_to_a_block_of_its_kind(kinds, pq):
    """Every layer's block in the long capture (the model's first ``long`` layers) has the layer's signature: the
    prefix as itself, the period's layers as the second period's, the tail (the period's first r layers) as the
    capture's tail. A stack that never repeats asks for more layers than it has."""
    p, q = find_period(list(kinds))
    st = Stack(len(kinds), p, q)
    if pq is None:
        assert st.long >= len(kinds)
        return
    assert (p, q) == pq and st.long < len(kinds)
    assert st.prefix + st.repeats * st.period + st.tail == len(kinds)
    for i, k in enumerate(kinds):
        assert st.block(i) < st.long and kinds[st.block(i)] == k, i


def test_describe_names_what_differs():
    """What differs among the layers' signatures, by part: shapes, the config's per-layer entries and the modules'
    settings that differ (keys of one value throughout left out), attention; one signature throughout: nothing."""
    from opmap.serve.layer_period import describe

    dense = ((("mlp.w", (8, 4)),), (("attn.window", None), ("attn.scale", 0.5)), (("layer_types", "full"),), "a")
    moe = ((("mlp.experts", (4, 8, 4)),), (("attn.window", None), ("attn.scale", 0.5)), (("layer_types", "full"),),
           "a")
    slide = ((("mlp.w", (8, 4)),), (("attn.window", 128), ("attn.scale", 0.5)), (("layer_types", "sliding"),), "w")
    assert describe([dense] * 5) == ""
    assert describe([dense] * 3 + [moe] * 58) == "layers of different shapes (a MoE with dense layers, or mixed blocks)"
    assert describe([slide, dense] * 12) == ("per-layer config entries layer_types; per-layer settings attn.window; "
                                             "attention that differs by layer")
