"""Llama 4's chunked local attention as the engines' chunked kernel (opmap.workloads.hf_chunked): exactly
transformers' masked SDPA on real CPU tensors (prefill over several chunks, a decode step against the cache), captured
as one SDPA node per chunked layer that counts only the in-chunk causal pairs and reads only the in-chunk KV."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from hf_family_configs import LLAMA4_MAVERICK, LLAMA4_SCOUT, shallow  # noqa: E402
from opmap.hardware import get_hardware  # noqa: E402
from opmap.phases.runtime import get_runtime  # noqa: E402
from opmap.phases.step import analyze_phase, capture_phase  # noqa: E402
from opmap.workloads import load_workload  # noqa: E402
from opmap.workloads.phases import PhaseSpec, check_phase, phase_workload  # noqa: E402

SDPA = "aten.scaled_dot_product_attention.default"
# the published Llama 4 Scout config at small widths and 4 layers (no_rope_layers 1, 1, 1, 0: three chunked RoPE
# layers, then a global NoPE one), chunks of 4 tokens so a 10-token prompt spans three
TINY = {**shallow(LLAMA4_SCOUT, 4), "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "intermediate_size": 32, "intermediate_size_mlp": 64, "num_local_experts": 4,
        "vocab_size": 128, "pad_token_id": 127, "eos_token_id": 126, "bos_token_id": 125, "attention_chunk_size": 4}


def write(tmp_path, d: dict) -> str:
    p = tmp_path / f"{d['model_type']}-{d['num_hidden_layers']}.json"
    p.write_text(json.dumps(d))
    return str(p)


def _attention_outputs(model, *args, **kwargs) -> list[torch.Tensor]:
    """Each Llama4TextAttention's output (after o_proj) in one forward."""
    outs: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _i, o: outs.append(o[0])) for m in model.modules()
             if type(m).__name__ == "Llama4TextAttention"]
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    return outs


def test_chunked_attention_equals_transformers_sdpa(tmp_path):
    """A 10-token prefill (chunks of 4) and a decode step against the cache it filled: every layer's attention
    output is transformers' own SDPA attention's under its chunked mask (the same model switched back to "sdpa"), and
    the chunking matters (the first layer's output differs from plain causal attention's)."""
    from transformers import DynamicCache

    w = load_workload(write(tmp_path, TINY), 2, 10, "fp32", "cpu")
    m = w.module.eval()
    assert m.config._attn_implementation == "opmap_chunked_attention"
    assert any("chunked kernel" in a for a in w.assumptions)
    ids = torch.randint(0, 120, (2, 10), generator=torch.Generator().manual_seed(1))
    new = torch.randint(0, 120, (2, 1), generator=torch.Generator().manual_seed(2))

    def run(impl):
        m.set_attn_implementation(impl)
        cache = DynamicCache(config=m.config)
        pre = _attention_outputs(m, ids, cache=cache, use_cache=True)
        return pre, _attention_outputs(m, new, cache=cache, use_cache=True)

    (got_pre, got_dec), (want_pre, want_dec) = run("opmap_chunked_attention"), run("sdpa")
    for g, want in zip(got_pre + got_dec, want_pre + want_dec, strict=True):
        assert torch.allclose(g, want, atol=1e-5)
    m.config.layer_types = ["full_attention"] * 4
    causal = _attention_outputs(m, ids, use_cache=False)
    assert not torch.allclose(causal[0], want_pre[0], atol=1e-3)


def _analyze(tmp_path, phase: PhaseSpec, seq: int | None):
    path = write(tmp_path, shallow(LLAMA4_MAVERICK, 4))
    h = get_hardware("b200")
    rt = get_runtime(h, "engine")
    spec = replace(check_phase(phase, path, 1), kv_write=rt.kv_write)
    w = phase_workload(path, spec, 1, seq, "bf16")
    a = analyze_phase(capture_phase(w, spec), w, h, "bf16", spec, fusion=rt.fusion, runtime=rt).analysis
    return [r for r in a.results if r.node.op == SDPA], a


def test_maverick_prefill_counts_in_chunk_pairs(tmp_path):
    """Llama 4 Maverick (published widths: 40 query heads of 128, 8 KV heads), 4 layers, one 16,384-token prompt:
    the three chunked layers (chunk 8192) compute n C (C + 1) / 2 pairs per head, n = 2, C = 8192, each pair 2 x 128
    (Q K^T) + 2 x 128 (P V) FLOPs; the global NoPE layer the causal S (S + 1) / 2."""
    s, c, heads, per_pair = 16384, 8192, 40, 4 * 128
    rows, _ = _analyze(tmp_path, PhaseSpec("prefill"), s)
    assert [r.node.args.get("chunk") for r in rows] == [c, c, c, None]
    for r in rows[:3]:
        assert r.cost.matrix_flops == heads * 2 * c * (c + 1) // 2 * per_pair
    assert rows[3].cost.matrix_flops == heads * s * (s + 1) // 2 * per_pair
    assert rows[0].pred.predicted_s < 0.6 * rows[3].pred.predicted_s  # half the pairs


def test_maverick_decode_reads_the_chunk_of_its_position(tmp_path):
    """A decode step with 20,000 tokens in the cache (the new one at position 19,999): a chunked layer's query sees
    its chunk's keys 16,384 .. 19,999, 3,616 of them, and reads only their K and V (8 KV heads x 128, bf16); the
    global layer all 20,000; the step's memory floor reads the same KV bytes."""
    rows, a = _analyze(tmp_path, PhaseSpec("decode", 20000), None)
    kv_bytes = 2 * 8 * 128 * 2  # K and V per token, bf16
    q_and_out = 2 * 40 * 128 * 2
    for r in rows[:3]:
        assert r.node.args["q_offset"] == 19999
        assert r.cost.matrix_flops == 40 * 3616 * 4 * 128
        assert r.cost.bytes_read + r.cost.bytes_written == 3616 * kv_bytes + q_and_out
    assert rows[3].cost.matrix_flops == 40 * 20000 * 4 * 128
    assert a.phase_figures.floor.kv_cache_read_bytes == (3 * 3616 + 20000) * kv_bytes
