"""The presets' sizing rules against the engines' formulas, worked by hand beside each check."""

from __future__ import annotations

import math

import pytest

from opmap.engines import SizingInputs, engine_setting, memory_rule, override, parse_preset, trtllm_bench_setting
from opmap.engines.rules import sglang_graph_sizes, sglang_max_running, trtllm_graph_sizes, vllm_graph_sizes
from opmap.mapping.memory import Assumed, ServingMemory
from opmap.record import record

GiB = 2 ** 30


def inputs(device="h100-sxm", gib=80, tp=1, pp=1, kv_tokens=1_000_000, offline=False, context=8192, isl=128.0,
           osl=128.0, params=8.03e9, kv_per_token=2 * 32 * 8 * 128 * 1.0, dtype="fp8"):
    return SizingInputs(device, gib * GiB, tp, pp, kv_tokens, params / (tp * pp), kv_per_token / (tp * pp), params,
                        context, isl, osl, offline, dtype)


@pytest.mark.parametrize("device,gib,offline,want", [
    # arg_utils.py @ 99d7eb5d: >= 70 GiB and not an A100: LLM_CLASS 16384 / 1024, API server 8192 / 1024
    ("h100-sxm", 80, False, (1024, 8192)), ("h200", 141, True, (1024, 16384)),
    # else 8192 / 256 offline, 2048 / 256 for the API server (an 80 GB A100 too: "a100" in its name)
    ("a100-sxm-80gb", 80, False, (256, 2048)), ("a100-sxm-80gb", 80, True, (256, 8192)), ("l40s", 48, False,
                                                                                            (256, 2048)),
])
def test_vllm_batch_defaults_by_device_and_usage(device, gib, offline, want):
    p = parse_preset("vllm")
    s = engine_setting(p, inputs(device, gib, offline=offline), memory_rule(p, device, gib * GiB, 1, 1))
    assert (s.max_num_seqs, s.max_num_batched_tokens) == want
    assert (s.kv_block, s.chunked_prefill, s.no_evict) == (16, True, False)


def test_vllm_cuda_graph_sizes():
    p = parse_preset("vllm")
    # 256 sequences: max = min(512, 512); [1, 2, 4] + 8..248 by 8 (31) + 256..512 by 16 (17) = 51 sizes
    s = vllm_graph_sizes(p, 256)
    assert len(s) == 3 + 31 + 17 and s[:5] == [1, 2, 4, 8, 16] and s[-2:] == [496, 512]
    # 16 sequences: max = 32: [1, 2, 4, 8, 16, 24, 32]
    assert vllm_graph_sizes(p, 16) == [1, 2, 4, 8, 16, 24, 32]


def test_sglang_memory_fraction_by_hand():
    p = parse_preset("sglang")
    # H100 80 GiB = 81920 MiB, tp 1: chunk 8192, graph bs 256; reserved = 512 + 8192 x 1.5 + 256 x 2 + 1 x 1 / 8
    # x 1024 = 13440 MiB (above the 10240 floor); (81920 - 13440) / 81920 = 0.83594 -> 0.836
    r = memory_rule(p, "h100-sxm", 80 * GiB, 1, 1)
    assert (r.fraction, r.of) == (0.836, "static")
    # H200 141 GiB = 144384 MiB, tp 8: chunk 8192, graph bs 512; reserved = 512 + 12288 + 1024 + 1024 = 14848;
    # (144384 - 14848) / 144384 = 0.89716 -> 0.897
    assert memory_rule(p, "h200", 141 * GiB, 8, 1).fraction == 0.897
    # an L40S, 48 GiB = 49152 MiB: chunk 4096, bs 32; reserved = 512 + 6144 + 64 + 128 = 6848 (no floor: under 60 GiB)
    # (49152 - 6848) / 49152 = 0.86068 -> 0.861
    assert memory_rule(p, "l40s", 48 * GiB, 1, 1).fraction == 0.861
    assert memory_rule(p, "h100-sxm", 80 * GiB, 1, 1, fraction=0.7).fraction == 0.7  # a value given wins


def test_sglang_running_requests_and_budget():
    p = parse_preset("sglang")
    # 1e6 KV tokens, context 8192: pool min(max(int(1e6 / 8192 x 512) = 62500, 2048), 4096) = 4096; min(500000, 4096)
    assert sglang_max_running(p, 1_000_000, 8192) == 4096
    # 3000 tokens, context 1024: pool max(1500, 2048) = 2048; min(3000 // 2 = 1500, 2048) = 1500
    assert sglang_max_running(p, 3000, 1024) == 1500
    s = engine_setting(p, inputs(), memory_rule(p, "h100-sxm", 80 * GiB, 1, 1))
    assert (s.max_num_seqs, s.max_num_batched_tokens, s.kv_block) == (4096, 8192 + 4096, 1)
    # [1, 2, 4, 8, 12] + 16..256 by 8 (31) for cuda_graph_max_bs 256
    assert sglang_graph_sizes(p, 256) == [1, 2, 4, 8, 12] + list(range(16, 257, 8))


def test_trtllm_serve_defaults_and_graphs():
    p = parse_preset("trtllm")
    s = engine_setting(p, inputs(), memory_rule(p, "h100-sxm", 80 * GiB, 1, 1))
    assert (s.max_num_seqs, s.max_num_batched_tokens, s.kv_block, s.chunked_prefill, s.no_evict) == (
        2048, 8192, 32, False, True)
    assert (s.memory.fraction, s.memory.of) == (0.9, "free")
    assert trtllm_graph_sizes(p) == list(range(1, 32)) + [32, 64, 128]  # no padding, max_batch_size 128


def test_trtllm_bench_heuristic_against_its_formula():
    """tuning.py calc_engine_setting + finetune_setting, by hand: Llama-3-70B (70.6e9 parameters, 80 layers, 8 KV
    heads of 128) in fp8 at TP2 on H200s (141 GiB), 128/2048, fraction 0.95: engine 70.6e9 / 2^30 = 65.75 GiB;
    cache (141 x 2 - 65.75) x 0.95 = 205.44 GiB; KV per token 2 x 80 x max(2, 8) x 128 x 1 B = 163840 B;
    requests = 205.44 GiB / (163840 B x 2176) = 618.7; raw_bs 618.7 (< 1024: 128 x ceil(4.83) = 640);
    raw_tokens 618.7 x (1 + 128 / 2048) = 657.4 (< 4096: max(2048, 256 x 3)) = 2048 (benchmarks/README.md's
    "640 and 2048 for 70B TP2 at 128/2048 on H200s")."""
    h = trtllm_bench_setting(70.6e9, 1.0, 2 * 80 * 8 * 128 * 1.0, 141 * GiB, 2, 1, 128, 2048, 0.95)
    engine = 70.6e9 / GiB
    cache = (141 * 2 - engine) * 0.95
    requests = cache * GiB / (163840 * 2176)
    assert h.engine_gib == pytest.approx(engine) and h.cache_gib == pytest.approx(cache)
    assert h.requests == pytest.approx(requests) and requests == pytest.approx(618.7, abs=0.1)
    assert (h.max_batch_size, h.max_num_tokens) == (640, 2048)
    # Llama-3-8B fp8 at 128/128 on one H100: ~4400 requests fit, capped at 4096; tokens 4096 x 2 = 8192 (>= 8192:
    # 1024 x 8)
    h = trtllm_bench_setting(8.03e9, 1.0, 2 * 32 * 8 * 128 * 1.0, 80 * GiB, 1, 1, 128, 128, 0.95)
    assert (h.max_batch_size, h.max_num_tokens) == (4096, 8192)
    # 8 requests' worth at pp 1: raw_bs 8 -> the floor 64; tokens 8 x 2 = 16 -> the floor 2048
    kv = (80 * GiB - 8.03e9) * 0.95 / (8 * 256)  # a KV per token that fits 8 requests of 128 + 128
    h = trtllm_bench_setting(8.03e9, 1.0, kv, 80 * GiB, 1, 1, 128, 128, 0.95)
    assert math.isclose(h.requests, 8) and (h.max_batch_size, h.max_num_tokens) == (64, 2048)


def test_trtllm_bench_preset_sizes_from_the_run():
    p = parse_preset("trtllm-bench")
    x = inputs(isl=128, osl=2048, params=70.6e9, kv_per_token=2 * 80 * 8 * 128 * 1.0, gib=141, tp=2, device="h200")
    s = engine_setting(p, x, memory_rule(p, "h200", 141 * GiB, 2, 1, fraction=0.95))
    assert (s.max_num_seqs, s.max_num_batched_tokens, s.kv_block, s.no_evict) == (640, 2048, 32, True)
    s = override(s, max_num_seqs=512, chunked_prefill=True)
    assert (s.max_num_seqs, s.chunked_prefill) == (512, True)
    assert s.overrides == ("max_num_seqs 512 (--max-num-seqs; the preset's 640)",
                           "chunked_prefill True (--chunked-prefill; the preset's False)")


@pytest.mark.parametrize("dtype,want", [
    # an MXFP4 checkpoint (gpt-oss: W4A8_MXFP4_MXFP8 on Blackwell, W4A16_MXFP4 on Hopper) is not in build.py's
    # TUNED_QUANTS: BuildConfig's max_batch_size 2048, max_num_tokens 8192 whatever the KV cache holds
    ("w4a8-mxfp4", (2048, 8192)), ("mxfp4", (2048, 8192)), ("int4", (2048, 8192)),
    # the same run in fp8 is sized by the heuristic: 70.6e9 x 1 B, 128/2048 at TP2 on H200s: 640 and 2048 (above)
    ("fp8", (640, 2048)),
])
def test_trtllm_bench_untuned_formats_take_the_build_defaults(dtype, want):
    p = parse_preset("trtllm-bench")
    x = inputs(isl=128, osl=2048, params=70.6e9, kv_per_token=2 * 80 * 8 * 128 * 1.0, gib=141, tp=2, device="h200",
               dtype=dtype)
    s = engine_setting(p, x, memory_rule(p, "h200", 141 * GiB, 2, 1, fraction=0.95))
    assert (s.max_num_seqs, s.max_num_batched_tokens) == want
    assert ("TUNED" in s.why[0] or "tuned" in s.why[0]) == (dtype != "fp8")


def test_memory_fraction_semantics_by_hand():
    """One H100 (80 GiB), weights 16 GiB, runtime reserve 2 GiB, 128 KiB of KV a token:
    vLLM 0.9 of the whole device: 72 - 16 - 2 = 54 GiB = 54 x 8192 = 442368 tokens = 27648 blocks of 16;
    SGLang 0.836 of weights + KV: 80 x 0.836 - 16 = 50.88 GiB = 416808 tokens (416808.96 floored), 416808 pages;
    TensorRT-LLM 0.9 of the memory free: 0.9 x (80 - 16 - 2) = 55.8 GiB = 457113 tokens = 14284 blocks of 32."""
    reserve = {"workspace": Assumed(2 * GiB, "assumed", "test")}

    def tokens(u, of):
        return ServingMemory(80 * GiB, u, 16 * GiB, reserve, 128 * 1024, of).kv_capacity_tokens

    assert tokens(0.9, "total") == 442368 and 442368 // 16 == 27648
    assert tokens(0.836, "static") == 416808
    assert tokens(0.9, "free") == 457113 and 457113 // 32 == 14284
    m = record(ServingMemory(80 * GiB, 0.9, 16 * GiB, reserve, 128 * 1024, "free"))
    assert m["utilization_of"] == "free"
    assert "utilization_of" not in record(ServingMemory(80 * GiB, 0.9, 16 * GiB, reserve, 128 * 1024))
