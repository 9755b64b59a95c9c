"""Decode attention on a device with a measured grid (opmap.mapping.tilers' flash_attention, ``_decode_grid``): the
fused attention kernel of a one-token-per-sequence step takes the time TensorRT-LLM's decode attention was measured
at (the catalog's <device>.attn.json, written by benchmarks/reference/aiconfigurator_attention.py), for Hugging Face
configs (gpt-oss's full and 128-token sliding layers, Qwen3) and a zoo model (llama-3-8b) at a measured batch and KV
length; MLA, a kernel the grid does not time, keeps the flash-decoding tiles. Expected values are read from the JSON
file here, never from the code under test."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

pytest.importorskip("transformers")

from hf_family_configs import DEEPSEEK_R1, GPT_OSS_120B, QWEN3_8B, shallow  # noqa: E402
from opmap.hardware import get_hardware  # noqa: E402
from opmap.hardware.attention_grid import GRID_DIR  # noqa: E402
from opmap.phases.runtime import get_runtime  # noqa: E402
from opmap.phases.step import analyze_phase, capture_phase  # noqa: E402
from opmap.workloads.phases import PhaseSpec, check_phase, phase_workload  # noqa: E402

BATCH, KV_LEN = 256, 1024  # both on the grid: batch 1-2048 by powers of 2, KV (cached + new token) 2, 4, ... 32768
SDPA = "aten.scaled_dot_product_attention.default"


def measured_s(device: str, heads: int, kv_heads: int, head_dim: int, window: int, batch: int, kv: int) -> float:
    """The file's time (s) of one decode attention call of that configuration with a bf16 KV cache."""
    tables = json.loads((GRID_DIR / f"{device}.attn.json").read_text())["tables"]
    t = next(t for t in tables if (t["kv_dtype"], t["heads"], t["kv_heads"], t["head_dim"], t["window"])
             == ("bf16", heads, kv_heads, head_dim, window))
    return t["latency_us"][t["batch"].index(batch) * len(t["kv"]) + t["kv"].index(kv)] * 1e-6


def attention_kernels(target: str, device: str):
    """(query shape, key shape, kernel row) of each fused attention kernel of ``target``'s decode step at BATCH x
    KV_LEN in bf16 under the engine runtime, and the analysis."""
    h = get_hardware(device)
    rt = get_runtime(h, "engine")
    spec = replace(check_phase(PhaseSpec("decode", KV_LEN), target, BATCH), kv_write=rt.kv_write)
    w = phase_workload(target, spec, BATCH, None, "bf16")
    a = analyze_phase(capture_phase(w, spec), w, h, "bf16", spec, fusion=rt.fusion, runtime=rt).analysis
    out = []
    for k in a.kernel_results:
        node = a.results[k.kernel.anchor].node
        if node.op == SDPA:
            out.append((node.input("query").shape, node.input("key").shape, k))
    return out, a


def hf(tmp_path, cfg: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(shallow(cfg, 2)))
    return str(path)


@pytest.mark.parametrize("device", ("b200", "h200", "gb200"))
def test_gpt_oss_layers_take_the_measured_time(tmp_path, device):
    """gpt-oss-120b (64 query heads, 8 KV heads x 64): its first layer slides over 128 tokens (the cache holds the
    window: K of 128 tokens), read off the table measured with window 128; its second attends to all 1024. The
    GB200's catalog entry lists no compute units (no tile search): the grid prices it all the same, with no tile."""
    kernels, a = attention_kernels(hf(tmp_path, GPT_OSS_120B), device)
    assert [(q, kk) for q, kk, _ in kernels] == [((BATCH, 64, 1, 64), (BATCH, 8, 128, 64)),
                                                 ((BATCH, 64, 1, 64), (BATCH, 8, KV_LEN, 64))]
    sliding, full = (k for _, _, k in kernels)
    assert sliding.predicted_s == pytest.approx(measured_s(device, 64, 8, 64, 128, BATCH, 128), rel=1e-6)
    assert full.predicted_s == pytest.approx(measured_s(device, 64, 8, 64, 0, BATCH, KV_LEN), rel=1e-6)
    assert f"decode attention from the measured grid {device}.attn.json" in full.why
    assert full.bound == "memory"
    assert (full.tile is None) == (not get_hardware(device).tiled)
    assert f"from the measured grid {device}.attn.json" in a.assumptions.attention_kernel


@pytest.mark.parametrize("device", ("b200", "h200"))
def test_qwen3_and_a_zoo_llama_take_the_measured_time(tmp_path, device):
    """Qwen3-8B and the zoo's llama-3-8b: 32 query heads, 8 KV heads x 128, every layer full attention."""
    for target in (hf(tmp_path, QWEN3_8B), "llama-3-8b"):
        kernels, _ = attention_kernels(target, device)
        assert kernels and all(kk == (BATCH, 8, KV_LEN, 128) for _, kk, _ in kernels)
        for _, _, k in kernels:
            assert k.predicted_s == pytest.approx(measured_s(device, 32, 8, 128, 0, BATCH, KV_LEN), rel=1e-6)


def test_mla_is_not_priced_off_the_grid(tmp_path):
    """DeepSeek-R1's absorbed MLA decode (128 heads over one 576-wide latent, values its first 512 columns) runs
    another kernel than the grid times: flash-decoding tiles, no grid note."""
    kernels, _ = attention_kernels(hf(tmp_path, DEEPSEEK_R1), "b200")
    assert kernels
    for _, _, k in kernels:
        assert "measured grid" not in k.why and "flash-decoding" in k.why


def test_a_device_without_a_grid_keeps_the_tiles(tmp_path):
    """The same decode on an A100 (no attention grid in its catalog entry): flash-decoding tiles."""
    assert get_hardware("a100-sxm-80gb").curves.decode_attention is None
    kernels, a = attention_kernels(hf(tmp_path, QWEN3_8B), "a100-sxm-80gb")
    assert kernels and all("flash-decoding" in k.why for _, _, k in kernels)
    assert "attn.json" not in a.assumptions.attention_kernel
