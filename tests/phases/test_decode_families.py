"""Decode steps of the 2026 model families from their published config.json (issue 38), at the real widths on two
layers: each runs against the cache its attention writes, and attention reads the KV bytes its paper or model card
gives per token (gpt-oss's sliding layers their 128-token window; DeepSeek's MLA its 576-element latent, decoded with
absorbed weights as SGLang, vLLM and TensorRT-LLM serve it)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

pytest.importorskip("transformers")

from hf_family_configs import DEEPSEEK_R1, FAMILIES, shallow  # noqa: E402
from opmap.errors import OpmapError  # noqa: E402
from opmap.hardware import get_hardware  # noqa: E402
from opmap.phases.runtime import get_runtime  # noqa: E402
from opmap.phases.step import analyze_phase, capture_phase  # noqa: E402
from opmap.workloads.phases import PhaseSpec, check_phase, phase_workload  # noqa: E402

BATCH, KV_LEN, LAYERS, BF16 = 8, 1024, 2, 2
# bytes one token adds to one layer's cache at bf16: K and V of each KV head, or MLA's latent + RoPE key
# (DeepSeek-V2 arXiv 2405.04434 sec. 2.1.2: 512 + 64)
PER_LAYER_TOKEN = {"gpt_oss": 2 * 8 * 64 * BF16, "deepseek_v3": (512 + 64) * BF16, "llama4_text": 2 * 8 * 128 * BF16,
                   "qwen3": 2 * 8 * 128 * BF16, "qwen3_moe": 2 * 4 * 128 * BF16,
                   "llama4_maverick": 2 * 8 * 128 * BF16}
# tokens each of the two layers holds at KV_LEN: gpt-oss's first layer slides over a 128-token window
HELD = {"gpt_oss": (128, KV_LEN)}


def decode(tmp_path, d: dict, runtime: str = "engine"):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(d))
    h = get_hardware("h100-sxm")
    rt = get_runtime(h, runtime)
    spec = replace(check_phase(PhaseSpec("decode", KV_LEN), str(path), BATCH), kv_write=rt.kv_write)
    w = phase_workload(str(path), spec, BATCH, None, "bf16")
    return w, analyze_phase(capture_phase(w, spec), w, h, "bf16", spec, fusion=rt.fusion, runtime=rt)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_decode_reads_the_cache_each_family_keeps(tmp_path, family):
    w, pa = decode(tmp_path, shallow(FAMILIES[family], LAYERS))
    a = pa.analysis
    held = HELD.get(family, (KV_LEN, KV_LEN))
    assert a.phase_figures.floor.kv_cache_read_bytes == PER_LAYER_TOKEN[family] * sum(held) * BATCH
    per_token = PER_LAYER_TOKEN[family] * LAYERS
    mem = " ".join(pa.memory.assumptions)
    assert f"KV cache {per_token:g} B per token" in mem
    assert pa.memory.kv_cache_bytes == PER_LAYER_TOKEN[family] * sum(held) * BATCH
    if family == "gpt_oss":
        assert "1 of 2 layers slide over a 128-token window" in mem


def test_mla_decodes_absorbed_over_its_latent_cache(tmp_path):
    """DeepSeek-R1 at batch 8, 1,024 tokens: each layer's cache is one (8, 1, tokens, 576) latent; attention runs
    as MQA of 128 heads over it (FlashMLA's shape: keys 576 wide, values its first 512 columns), and the fused kernel
    reads the latent once: its bytes are the query, the latent and the output, not a second 512-wide V; no
    kv_b_proj runs over the cached tokens (the absorbed weights: two bmm per layer of 128 heads)."""
    w, pa = decode(tmp_path, shallow(DEEPSEEK_R1, LAYERS))
    notes = " ".join(w.assumptions)
    assert "per token K 1 x 576 (V its first columns)" in notes and "absorbed weights" in notes
    a = pa.analysis
    sdpa = [r for r in a.results if r.node.op == "aten.scaled_dot_product_attention.default"]
    assert len(sdpa) == LAYERS
    for r in sdpa:
        q, k, v = (r.node.input(n) for n in ("query", "key", "value"))
        assert (q.shape, k.shape, v.shape) == ((BATCH, 128, 1, 576), (BATCH, 1, KV_LEN, 576), (BATCH, 1, KV_LEN, 512))
        assert r.cost.bytes_read == (BATCH * 128 * 576 + BATCH * KV_LEN * 576) * BF16
        # Q K^T over 576 and P V over 512 for each of the 128 heads and 1,024 keys
        assert r.cost.matrix_flops == 2 * BATCH * 128 * KV_LEN * (576 + 512)
    kv_b = [r for r in a.results if r.node.module.endswith("kv_b_proj")]
    assert not kv_b  # the decompression of every cached token is gone
    bmm = [r for r in a.results if r.node.op == "aten.bmm.default" and "self_attn" in r.node.module]
    assert len(bmm) == 2 * LAYERS


def test_a_gap_in_opmap_inputs_is_not_blamed_on_the_model(tmp_path, monkeypatch):
    """The issue's R1 decode died on opmap's own cache ('aten.cat ... This is an error in the model or its example
    inputs'). Whatever opmap builds wrong for a family now says so in one line, and not that the config is wrong."""
    import opmap.workloads.hf_cache as hf_cache

    real = hf_cache.cache_layout

    def wrong(*args, **kwargs):
        return tuple(hf_cache.LayerCache((*lc.key[:-3], 128, 1, 64), lc.value) for lc in real(*args, **kwargs))

    monkeypatch.setattr(hf_cache, "cache_layout", wrong)
    with pytest.raises(OpmapError) as e:
        decode(tmp_path, shallow(DEEPSEEK_R1, LAYERS))
    msg = str(e.value)
    assert "fails on the inputs opmap built" in msg and "not an error in the config" in msg
    assert "error in the model" not in msg and "\n" not in msg
