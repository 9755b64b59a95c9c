"""gpt-oss's attention with sinks as one fused attention call per layer (opmap.workloads.hf_sinks): exactly
transformers' own eager GptOssAttention on real CPU tensors (prefill over sliding and full layers, a decode step
against a cache), captured as one SDPA node per layer with no repeat_kv copies, its FLOPs by the formula."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from hf_family_configs import GPT_OSS_20B, GPT_OSS_120B, shallow  # noqa: E402
from opmap.hardware import get_hardware  # noqa: E402
from opmap.phases.runtime import get_runtime  # noqa: E402
from opmap.phases.step import analyze_phase, capture_phase  # noqa: E402
from opmap.workloads import load_workload  # noqa: E402
from opmap.workloads.phases import PhaseSpec, check_phase, phase_workload  # noqa: E402

SDPA = "aten.scaled_dot_product_attention.default"
BF16 = 2
# the published gpt-oss-120b config at small widths: 4 query heads over 2 KV heads of 16, a 4-token window on the
# first (sliding) layer, the second full; every other field as published (biases, sinks, experts with biases)
TINY = {**shallow(GPT_OSS_120B, 2), "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "intermediate_size": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
        "experts_per_token": 2, "vocab_size": 128, "pad_token_id": 127, "eos_token_id": 126,
        "sliding_window": 4}


def write(tmp_path, d: dict) -> str:
    p = tmp_path / f"{d['model_type']}-{d['num_hidden_layers']}.json"
    p.write_text(json.dumps(d))
    return str(p)


def _pair(tmp_path):
    """(opmap's build of TINY on CPU, transformers' eager build with the same weights), sinks drawn at random
    (transformers initialises them to zero-mean noise; a scale of 2 makes the sink take a visible share)."""
    from transformers import AutoModelForCausalLM

    w = load_workload(write(tmp_path, TINY), 2, 10, "fp32", "cpu")
    ours = w.module
    torch.manual_seed(0)
    with torch.no_grad():
        for m in ours.modules():
            if hasattr(m, "sinks"):
                m.sinks.normal_(0.0, 2.0)
    ref = AutoModelForCausalLM.from_config(copy.deepcopy(ours.config), attn_implementation="eager")
    ref.load_state_dict(ours.state_dict())
    assert ref.config._attn_implementation == "eager" and ours.config._attn_implementation != "eager"
    return ours.eval(), ref.eval()


def _attention_outputs(model, *args, **kwargs) -> list[torch.Tensor]:
    """Each GptOssAttention's output (after o_proj) in one forward."""
    outs: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _i, o: outs.append(o[0])) for m in model.modules()
             if type(m).__name__ == "GptOssAttention"]
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    return outs


def test_sink_attention_equals_transformers_eager_attention(tmp_path):
    """Prefill of 10 tokens (past the 4-token window of the sliding layer) and then one decode step against the
    cache each model filled: every layer's attention output matches transformers' eager GptOssAttention, and the
    sinks matter (zeroing them changes the output: the test would see a sink-less attention)."""
    from transformers import DynamicCache

    ours, ref = _pair(tmp_path)
    ids = torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(1))
    got, want = _attention_outputs(ours, ids, use_cache=False), _attention_outputs(ref, ids, use_cache=False)
    assert len(got) == len(want) == 2
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e)
    c_ours, c_ref = DynamicCache(config=ours.config), DynamicCache(config=ref.config)
    _attention_outputs(ours, ids, cache=c_ours, use_cache=True)
    _attention_outputs(ref, ids, cache=c_ref, use_cache=True)
    new = torch.randint(0, 128, (2, 1), generator=torch.Generator().manual_seed(2))
    pos = torch.full((2, 1), 10)
    got = _attention_outputs(ours, new, cache=c_ours, position_ids=pos, use_cache=True)
    want = _attention_outputs(ref, new, cache=c_ref, position_ids=pos, use_cache=True)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e)
    with torch.no_grad():
        for m in ours.modules():
            if hasattr(m, "sinks"):
                m.sinks.zero_()
    assert not torch.allclose(_attention_outputs(ours, ids, use_cache=False)[1],
                              _attention_outputs(ref, ids, use_cache=False)[1])


def _prefill(tmp_path, d, batch, seq):
    spec = PhaseSpec("prefill")
    w = phase_workload(write(tmp_path, d), spec, batch, seq, "bf16")
    h = get_hardware("b200")
    rt = get_runtime(h, "engine")
    return w, analyze_phase(capture_phase(w, spec), w, h, "bf16", spec, fusion=rt.fusion, runtime=rt).analysis


def test_prefill_is_one_sdpa_per_layer_with_window_limited_flops(tmp_path):
    """gpt-oss-20b's widths on two layers (sliding, full), 2 sequences of 512 tokens: one SDPA node per layer,
    reading Q (64 heads), K and V (8 KV heads) and the 64 sink logits, no mask, no repeat_kv copy (no 5-D expand of
    K / V to the query heads, no clone in attention). FLOPs (a multiply-add 2, QK^T and PV 2 x head_dim each per
    pair; causal counting the computed pairs, the convention of opmap.costs.attention): 2 x 2 x B x H x pairs x 64
    with pairs S (S + 1) / 2 on the full layer and, on the sliding one, W (W + 1) / 2 + (S - W) W for W = 128."""
    b, s, h, kvh, d, w = 2, 512, 64, 8, 64, 128
    wl, a = _prefill(tmp_path, shallow(GPT_OSS_20B, 2), b, s)
    notes = " ".join(wl.assumptions)
    assert "attention with sinks" in notes and "no repeat_kv copies" in notes
    assert "so a sliding layer's attention counts at most 128 keys per query" in notes
    att = [r for r in a.results if r.node.op == SDPA]
    assert len(att) == 2
    pairs = (w * (w + 1) // 2 + (s - w) * w, s * (s + 1) // 2)  # sliding first (layer_types)
    for r, p in zip(att, pairs):
        assert r.node.input_names == ("query", "key", "value", "sinks")
        assert r.node.args["window"] == (w if p != pairs[1] else None)
        assert r.cost.matrix_flops == 2 * 2 * b * h * p * d
        assert r.cost.bytes_read == (b * h * s * d + 2 * b * kvh * s * d) * BF16
        assert r.cost.param_bytes_read == h * BF16
    in_attn = [r.node for r in a.results if "self_attn" in (r.node.module or "")]
    assert not [n for n in in_attn if any(len(t.shape) == 5 for t in n.outputs)]  # repeat_kv's expand
    assert not [n for n in in_attn if "clone" in n.op or "softmax" in n.op or n.op == "aten.matmul.default"]


def test_decode_reads_each_layer_cache_once_with_window(tmp_path):
    """Decode at batch 4 against 1,500 tokens: one SDPA node per layer over the cache (the sliding layer its 128
    tokens, the full one all 1,500), FLOPs 2 x 2 x B x H x kv x 64, and the KV bytes the step reads per token and
    layer 2 x 8 x 64 x 2 B (K and V of 8 KV heads at bf16: the gpt-oss model card)."""
    b, kv, h, d = 4, 1500, 64, 64
    path = write(tmp_path, shallow(GPT_OSS_20B, 2))
    hw = get_hardware("b200")
    rt = get_runtime(hw, "engine")
    spec = replace(check_phase(PhaseSpec("decode", kv), path, b), kv_write=rt.kv_write)
    w = phase_workload(path, spec, b, None, "bf16")
    a = analyze_phase(capture_phase(w, spec), w, hw, "bf16", spec, fusion=rt.fusion, runtime=rt).analysis
    att = [r for r in a.results if r.node.op == SDPA]
    assert [r.node.input("key").shape[-2] for r in att] == [128, kv]
    for r, held in zip(att, (128, kv)):
        assert r.cost.matrix_flops == 2 * 2 * b * h * held * d and r.cost.skipped_flops == 0
    assert a.phase_figures.floor.kv_cache_read_bytes == 2 * 8 * 64 * BF16 * (128 + kv) * b
