"""Every preset value against the engine's own default, as the cited source states it (the TOML's ``source``
names the file, commit and line; the literal here is copied from that text, never from opmap)."""

from __future__ import annotations

import pytest

from opmap.engines import ENGINES, for_vendor, parse_preset, parse_presets
from opmap.engines.tables import (
    BatchDefaults,
    BenchHeuristic,
    BenchUntuned,
    BytesPerElement,
    MaxRunning,
    MemFraction,
    MemoryBuckets,
    TrtllmGraphs,
    VllmGraphs,
)
from opmap.errors import OpmapError


def test_vllm_defaults_equal_its_source():
    p = parse_preset("vllm")
    assert p.spec == "vllm@0.11" and p.memory_of == "total" and p.scheduler == "vllm"
    # vllm/engine/arg_utils.py @ 001999d2: "gpu_memory_utilization: float = 0.90"
    assert p.value("memory_fraction") == 0.90
    assert p.value("kv_block") == 16  # vllm/platforms/cuda.py: block_size None -> 16
    assert p.value("chunked_prefill") is True  # V1: chunked prefill on for generative causal models
    d = p.rule(BatchDefaults)
    # arg_utils.py @ 99d7eb5d: "if device_memory >= 70 * GiB_bytes and "a100" not in device_name": LLM_CLASS 16384,
    # OPENAI_API_SERVER 8192, max_num_seqs 1024 / 1024; else 8192, 2048 and 256 / 256
    assert (d.large_memory_gib, d.excluded_name) == (70, "a100")
    assert (d.large_offline_tokens, d.large_server_tokens, d.large_offline_seqs,
            d.large_server_seqs) == (16384, 8192, 1024, 1024)
    assert (d.small_offline_tokens, d.small_server_tokens, d.small_offline_seqs,
            d.small_server_seqs) == (8192, 2048, 256, 256)
    assert d.sizes(True, True) == (16384, 1024) and d.sizes(False, False) == (2048, 256)  # (tokens, seqs)
    # compilation.py: "[1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max + 1, 16))", max min(2 x seqs, 512)
    g = p.rule(VllmGraphs)
    assert (g.first, g.step8_below, g.step16_from, g.cap, g.per_seq) == ((1, 2, 4), 256, 256, 512, 2)


def test_sglang_defaults_equal_its_source():
    p = parse_preset("sglang")
    assert p.memory_of == "static" and p.value("kv_block") == 1  # ServerArgs.page_size = 1
    b = p.rule(MemoryBuckets)
    # server_args.py _handle_gpu_memory_settings: < 20*1024 MiB: 2048 / 8; < 35*1024: 2048 / 24 or 80;
    # < 60*1024: 4096 / 32 or 160; < 90*1024: 8192 / 256 or 512; < 160*1024: 8192 / 256 or 512; else 16384 / 512
    assert b.below_mib == (20 * 1024, 35 * 1024, 60 * 1024, 90 * 1024, 160 * 1024)
    assert b.chunked_prefill_size == (2048, 2048, 4096, 8192, 8192)
    assert b.cuda_graph_max_bs_small_tp == (8, 24, 32, 256, 256)
    assert b.cuda_graph_max_bs_large_tp == (8, 80, 160, 512, 512)
    assert (b.above_chunked_prefill_size, b.above_cuda_graph_max_bs) == (16384, 512)
    m = p.rule(MemFraction)  # reserved_mem = 512 + max(chunk, 2048) * 1.5 + bs * 2 + tp * pp / 8 * 1024
    assert (m.base_mib, m.per_chunk_token_mib, m.min_chunk, m.per_graph_bs_mib,
            m.per_rank_mib, m.floor_above_mib, m.floor_mib) == (512, 1.5, 2048, 2, 1024 / 8, 60 * 1024, 10 * 1024)
    r = p.rule(MaxRunning)  # min(max_total_num_tokens // 2, min(max(int(tokens / ctx * 512), 2048), 4096))
    assert (r.per_token, r.pool_per_context, r.pool_min, r.pool_max) == (0.5, 512, 2048, 4096)


def test_trtllm_defaults_equal_its_source():
    p = parse_preset("trtllm")
    assert p.memory_of == "free" and p.scheduler == "noevict"
    assert p.value("max_num_seqs") == 2048  # llm_args.py BaseLlmArgs max_batch_size Field(default=2048)
    assert p.value("max_num_batched_tokens") == 8192  # max_num_tokens Field(default=8192)
    assert p.value("memory_fraction") == 0.9  # KvCacheConfig free_gpu_memory_fraction = 0.9
    assert p.value("kv_block") == 32  # KvCacheConfig tokens_per_block: int = 32
    assert p.value("chunked_prefill") is False  # TorchLlmArgs enable_chunked_prefill: bool = False
    assert p.rule(TrtllmGraphs).max_batch_size == 128  # CudaGraphConfig: "self.max_batch_size or 128"


def test_trtllm_bench_defaults_equal_its_source():
    p = parse_preset("trtllm-bench")
    assert p.memory_of == "free" and p.scheduler == "noevict"
    assert p.value("memory_fraction") == 0.90  # throughput.py --kv_cache_free_gpu_mem_fraction default=.90
    assert p.value("chunked_prefill") is False  # --enable_chunked_context default off
    h = p.rule(BenchHeuristic)  # tuning.py finetune_setting @ 04cba882
    assert (h.max_requests, h.max_tokens, h.bs_min, h.token_min) == (4096, 32768, 64, 2048)
    assert h.bs_steps == ((256, 32), (1024, 128)) and h.bs_step_above == 256
    assert h.token_steps == ((4096, 256), (8192, 512)) and h.token_step_above == 1024
    b = p.rule(BytesPerElement)  # tuning.py BYTES_PER_ELEM: NO_QUANT 2.0, FP8 1.0, NVFP4 .5
    assert (b.of("bf16"), b.of("fp8"), b.of("nvfp4")) == (2.0, 1.0, 0.5)
    assert b.of("int4") == 2.0  # BYTES_PER_ELEM.get(quant_algo, 2)
    assert b.of("fp8-block") == 1.0  # FP8_BLOCK_SCALES: 1.0
    # build.py @ 000a01de: TUNED_QUANTS {NVFP4, FP8, FP8_BLOCK_SCALES, NO_QUANT, None}, any other quant_algo takes
    # BuildConfig's max_batch_size 2048 and max_num_tokens 8192 (builder.py)
    u = p.rule(BenchUntuned)
    assert (u.max_batch_size, u.max_num_tokens) == (2048, 8192)
    assert not any(u.applies(f) for f in ("bf16", "fp16", "fp32", "fp8", "fp8-block", "nvfp4", ""))
    assert all(u.applies(f) for f in ("mxfp4", "w4a8-mxfp4", "int4", "int8", "mxfp8"))


@pytest.mark.parametrize("engine", ENGINES)
def test_every_value_names_its_source(engine):
    p = parse_preset(engine)
    for key, v in p.values.items():
        assert v.source, f"{engine} {key} has no source"
    for r in p.rules:
        assert r.source, f"{engine} [{r.TABLE}] has no source"


def test_versions_and_vendors():
    assert parse_preset("vllm@0.11") == parse_preset(" VLLM ")
    presets = parse_presets("nvidia=trtllm,AMD=vllm@0.11")
    assert for_vendor(presets, "NVIDIA").engine == "trtllm" and for_vendor(presets, "amd").engine == "vllm"
    assert for_vendor(presets, "Google") is None
    assert for_vendor(parse_presets("sglang"), "AMD").engine == "sglang"


@pytest.mark.parametrize("spec,needle", [
    ("tgi", "unknown engine preset 'tgi': accepted: vllm"),
    ("vllm@0.1", "engine preset vllm has no version '0.1': known 0.11"),
])
def test_a_bad_preset_is_one_line(spec, needle):
    with pytest.raises(OpmapError, match=needle.replace("(", r"\(")):
        parse_preset(spec)


@pytest.mark.parametrize("spec,needle", [
    ("nvidia=trtllm,nvidia=vllm", "names vendor 'nvidia' twice"),
    ("nvidia=", "each part is VENDOR=NAME"),
    (",", "is empty"),
])
def test_a_bad_vendor_list_is_one_line(spec, needle):
    with pytest.raises(OpmapError, match=needle):
        parse_presets(spec)


def test_a_damaged_table_is_named_in_one_line():
    from opmap.engines.tables import read_table

    with pytest.raises(OpmapError, match=r"x.toml: \[max_running\] unknown keys pool; lacks pool_max; accepted"):
        read_table(MaxRunning, "max_running", {"per_token": 0.5, "pool_per_context": 512, "pool_min": 2048,
                                               "pool": 4096, "source": "s"}, "x.toml")


def test_a_preset_records_its_version():
    from opmap.record import record

    p = parse_preset("trtllm")
    assert record(p) == {"engine": "trtllm", "name": "TensorRT-LLM", "version": "1.3", "release": p.release}
