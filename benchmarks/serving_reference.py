"""Published in-flight-batching serving results beside ``opmap serve``'s predictions (issue 20).

Each ``Ref`` is one published figure, exactly as printed, with its unit, workload (model, precision, lengths,
scenario, SLO), system (accelerator, count, TP/PP), engine and source (repository + path + commit, or URL).
The runner turns each into an ``opmap serve`` command, runs it as a subprocess (``python -m opmap.cli`` with this
checkout's ``src`` first on the path), reads serve.json and prints predicted / published per device.

Kinds of row (``scenario``):
- ``offline``: output tokens/s under an unbounded queue (trtllm-bench throughput, vLLM benchmark_throughput,
  MLPerf Offline). Predicted: serve.json ``throughput.output_tokens_per_s`` of one replica (``--arrival
  offline``) / (tp x pp). Published: the figure / the accelerators that produced it (the TP group for
  TensorRT-LLM's tables, the whole system for MLPerf).
- ``server``: MLPerf Server, the highest Poisson rate meeting p99 TTFT / TPOT. Predicted: serve.json
  ``capacity.rate_per_s`` (``--find-capacity`` with the scenario's SLO) x mean output tokens / (tp x pp).
- ``itl``: mean inter-token latency at a fixed Poisson rate (TensorRT-LLM's online serving table). Predicted:
  serve.json ``latency.itl.mean_s``.

ratio = predicted speed / published speed: throughput rows predicted / published, latency rows published /
predicted; > 1 means opmap predicts faster than was measured. Band (issue 20): 0.75-1.33. A row whose figure set a
catalog or runtime value is ``fit`` and kept out of the verdict (``ROLES``).

Flags the CLI does not accept yet (``--runtime``, ``--kv-dtype``, ``--max-num-seqs``, ``--pp``, ...): the row is
reported "not runnable: <opmap's error line>", or, with ``--drop-missing-flags``, run without them (listed per row).

Run:  .venv/bin/python benchmarks/serving_reference.py [--quick | --rows ID,ID] [--jobs 2] [--drop-missing-flags]
Writes benchmarks/results/serving_reference.json (a --rows / --quick run: serving_reference_subset.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BAND = (0.75, 1.33)
SCHEMA_VERSION = 1
SERVER_START_RATE = 1.0  # requests/s where --find-capacity's grid starts (it spans x1/8..x16 and moves from there)

# --- sources (each figure below cites one of these, plus its table cell) -------------------------------------
TRT017 = ("NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md @ 258c7540c03517def55d9a5aadfa9288af474e1b, "
          "'Throughput Measurements' (v0.17, trtllm-bench throughput: in-flight batching, all requests queued at "
          "once, token-norm-dist lengths with stdev 0; 'Token Throughput (tokens/sec)' = output tokens/s of the TP "
          "group; FP8 quantization also sets an FP8 KV cache, per the same page)")
TRT017_ONLINE = ("NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md @ "
                 "258c7540c03517def55d9a5aadfa9288af474e1b, 'Online Serving Measurements' (v0.14.0, Triton "
                 "TensorRT-LLM backend, 500 requests, BF16): Mean ITL (ms) at the given QPS")
TRT10 = ("NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md @ 00f37686aa854010d68bcbd0f4ab000221541ca6 "
         "(v1.0, PyTorch backend, trtllm-bench throughput, CUDA graphs padded; 'Total Output Throughput "
         "(tokens/sec)' of the TP group; nvidia/*-FP8 ModelOpt checkpoints)")
MLPERF41 = ("mlcommons/inference_results_v4.1 @ a2f5d66d17e8f75c02fd74dfe810ecca6a046696 "
            "closed/{path}/performance/run_1/mlperf_log_summary.txt")
# The rest of NVIDIA's engine and harness settings (same commit): closed/NVIDIA/configs/llama2-70b/__init__.py
# GPUBaseConfig max_num_tokens = 4096 (no system class overrides it) and use_graphs = False; the harness
# (code/harness/harness_llm/llm_core.cc) runs TensorRT-LLM's GptManager with SchedulerConfig(policy) only ("we can
# add context chunking policy later if needed": no chunked context) and the policy max_util (code/common/
# arguments.py trtllm_batch_sched_policy default; no config sets it): MAX_UTILIZATION, which pauses requests when
# KV runs out (opmap: preemption, no noevict)
MLPERF41_NV_TOKENS = 4096
MLPERF41_NV_ENGINE = ("max_num_tokens 4096 (configs/llama2-70b/__init__.py GPUBaseConfig), no chunked context and the "
                      "MAX_UTILIZATION scheduler (code/harness/harness_llm/llm_core.cc, code/common/arguments.py): "
                      "--policy engine:BATCH,4096,64,nochunk")
MLPERF41_NV_CFG = ("layout and batch: closed/NVIDIA/configs/llama2-70b/{scenario}/__init__.py (same commit): "
                   "{cls}, use_fp8, kvcache_free_gpu_mem_frac 0.90")
MLPERF41_AMD_CFG = ("layout: closed/AMD/code/llama2-70b-99.9/test_VllmFp8/test_VllmFp8_SyncServer_audit.sh (TP=1, "
                    "DP=8, --quantization fp8, --kv-cache-dtype fp8); vLLM 0.4.3+rocm614 "
                    "(closed/AMD/systems/8xMI300X_2xEPYC-9374F.json)")
ORACLE = ("https://blogs.oracle.com/cloud-infrastructure/post/serving-llama-31-405b-model-with-amd-mi300x-gpus "
          "(2024-10-10), 'Throughput measurements': vLLM benchmark_throughput.py, Llama 3.1 405B FP8, one instance "
          "on all eight MI300X of BM.GPU.MI300X.8; output throughput tokens/s")
MLPERF41_NV_FREE_FRACTION = 0.90  # closed/NVIDIA/configs/llama2-70b/{Offline,Server}: kvcache_free_gpu_mem_frac
MLPERF_SLO = "MLPerf llama2-70b Server: p99 TTFT 2000 ms, p99 TPOT 200 ms (the summary's ttft_latency / tpot_latency)"
# The engine arguments of AMD's submission (same commit): Offline, VllmFp8/mainVllmFp8_Offline.py DefaultEngineInput
# (max_num_seqs 2048, max_num_batched_tokens 65536, block_size 16, enable_chunked_prefill False) with
# test_VllmFp8_Offline_perf.sh's --gpu-memory-utilization 0.99 and --enforce-eager True; Server,
# VllmFp8/mainVllmFp8_SyncServer.py's argument defaults (--max-num-seqs 1024, --max-num-batched-tokens 49152,
# --gpu-memory-utilization 0.97; block 16, graphs on, chunked prefill off: vLLM 0.4.3's default). vLLM preempts
# by recompute when KV runs out (no noevict)
MLPERF41_AMD_FLAGS = {
    "offline": {"--policy": "engine:2048,65536,16,nochunk", "--gpu-memory-utilization": "0.99",
                "--runtime": "engine-eager"},
    "server": {"--policy": "engine:1024,49152,16,nochunk", "--gpu-memory-utilization": "0.97"},
}
MLPERF41_AMD_ARGS = ("engine arguments: Offline max_num_seqs 2048, max_num_batched_tokens 65536, block 16, no chunked "
                     "prefill, gpu_memory_utilization 0.99, --enforce-eager (VllmFp8/mainVllmFp8_Offline.py, "
                     "test_VllmFp8_Offline_perf.sh); Server max_num_seqs 1024, max_num_batched_tokens 49152, "
                     "gpu_memory_utilization 0.97, graphs on (VllmFp8/mainVllmFp8_SyncServer.py defaults)")


@dataclass(frozen=True)
class Ref:
    """One published serving figure and the workload that produced it. ``value`` and ``unit`` as published;
    ``devices`` = the accelerators that produced ``value`` (so per device = value / devices for throughput)."""

    id: str
    scenario: str  # offline | server | itl
    published_model: str  # as the source names it
    model: str  # opmap zoo model with that architecture
    hardware: str  # opmap catalog name
    devices: int
    tp: int
    dtype: str
    input_len: int  # mean prompt tokens (fixed for synthetic rows)
    output_len: float  # mean generated tokens (fixed for synthetic rows; tokens / samples for MLPerf)
    value: float
    unit: str
    engine: str
    source: str
    pp: int = 1
    rate_per_s: float | None = None  # itl rows: the offered QPS
    slo_ttft_ms: float | None = None  # server rows
    slo_tpot_ms: float | None = None
    flags: dict[str, str] = field(default_factory=dict)  # extra opmap serve flags
    requests: int = 1000
    role: str = "held out"  # held out | fit
    notes: str = ""  # assumptions the row's prediction rests on
    input_spec: str = ""  # an opmap length spec for a dataset's prompt distribution (else input_len, fixed)
    output_spec: str = ""  # the same for the generated lengths (else output_len, fixed)

    @property
    def per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def published_per_device(self) -> float:
        """Throughput rows: value / devices (tokens/s per accelerator); itl rows: the latency in seconds."""
        if self.scenario == "itl":
            return self.value / 1e3  # ms -> s
        return self.value / self.devices

    def what(self) -> str:
        lay = f"tp{self.tp}" + (f" pp{self.pp}" if self.pp > 1 else "")
        sysn = f"{self.devices} x {self.hardware}"
        extra = f" @ {self.rate_per_s:g} QPS" if self.rate_per_s else ""
        return (f"{self.published_model} {self.dtype} {self.input_len}/{self.output_len:g} {self.scenario}{extra}, "
                f"{lay} on {sysn}, {self.engine}")

    def command(self, out: Path) -> list[str]:
        """The opmap serve argument list (after ``python -m opmap.cli``) that predicts this row."""
        args = ["serve", self.model, "--hardware", self.hardware, "--tp", str(self.tp), "--dtype", self.dtype,
                "--requests", str(self.requests), "--input-len", self.input_spec or str(self.input_len),
                "--output-len", self.output_spec or str(round(self.output_len)), "--out", str(out), "--no-store"]
        if self.pp > 1:
            args += ["--pp", str(self.pp)]
        if self.scenario == "offline":
            args += ["--arrival", "offline"]
        elif self.scenario == "itl":
            args += ["--arrival", f"poisson:{self.rate_per_s:g}"]
        else:  # server: the capacity search starts at a fixed rate, never at one taken from the published figure
            args += ["--arrival", f"poisson:{SERVER_START_RATE:g}", "--find-capacity", "--slo-ttft",
                     f"{self.slo_ttft_ms:g}", "--slo-tpot", f"{self.slo_tpot_ms:g}"]
        for k, v in self.flags.items():
            args += [k] if v == "" else [k, v]
        return args


ENGINE_FLAGS = {"--runtime": "engine"}


# --- engine configuration per row (what the published run's engine was set to) --------------------------------
# trtllm-bench picks max_batch_size / max_num_tokens from the dataset's ISL/OSL and the KV memory left after the
# weights (TensorRT-LLM tensorrt_llm/bench/build/tuning.py, calc_engine_setting + finetune_setting; read at
# 04cba882084a25665e7f80f5bda71b35b9790b6f, the version stored in the index: the v0.17 tag's copy was not):
#   engine = params x bytes/elem / 2^30; free = device GiB x tp x pp - engine; cache = free x 0.95;
#   requests = cache / (KV bytes per token x (ISL + OSL)); raw_bs = min(requests, 4096) / pp;
#   raw_tokens = min(raw_bs x (1 + ISL / OSL), 32768); max_bs rounded up to 32 (< 256, at least 64), 128
#   (< 1024) or 256; max_tokens rounded up to 256 (< 4096, at least 2048), 512 (< 8192) or 1024.
# The KV per token counts max(tp, kv heads) heads (each TP rank holds at least one).
TRT_TUNING = ("TensorRT-LLM tensorrt_llm/bench/build/tuning.py @ 04cba882084a25665e7f80f5bda71b35b9790b6f "
              "(calc_engine_setting, finetune_setting): trtllm-bench's max_batch_size / max_num_tokens heuristic")
TRT_BENCH_DEFAULTS = ("tensorrt_llm/bench/benchmark/throughput.py @ 000a01de66f0eab4ab05640711f0253f50f5209c: "
                      "--scheduler_policy default guaranteed_no_evict, --enable_chunked_context default off")
TRT_KV_BLOCK = 64  # assumed: TensorRT-LLM's build scripts default tokens_per_block to 64 (32 and 128 in others)
TRT_FREE_FRACTION = 0.95  # perf-overview (both versions): "--kv_cache_free_gpu_mem_fraction 0.95" in most runs
# trtllm-bench's requests per ISL/OSL (perf-overview, 'Preparing a Dataset' table, both versions)
TRT_REQUESTS = {(128, 128): 30000, (128, 2048): 3000, (128, 4096): 1500, (1000, 2000): 1500, (2048, 128): 3000,
                (2048, 2048): 1500, (5000, 500): 1500, (1000, 1000): 3000, (500, 2000): 3000, (20000, 2000): 1000}


@dataclass(frozen=True)
class Geometry:
    """What the engine's sizing reads of a model: parameters, layers, KV heads, head size (the model's published
    config.json on Hugging Face)."""

    params: float
    layers: int
    kv_heads: int
    head_dim: int


GEOMETRY = {  # meta-llama/* and mistralai/Mixtral-8x7B-v0.1 config.json; parameter counts from the model cards
    "llama-3-8b": Geometry(8.03e9, 32, 8, 128),
    "llama-3-70b": Geometry(70.6e9, 80, 8, 128),
    "llama-3.1-405b": Geometry(405.9e9, 126, 8, 128),
    "mixtral-8x7b": Geometry(46.7e9, 32, 8, 128),
    "llama-2-70b": Geometry(69.0e9, 80, 8, 128),
}
DEVICE_GIB = {"h100-sxm": 80.0, "h200": 141.0, "a100-sxm-80gb": 80.0, "mi300x": 192.0,  # HBM as vendors state it
              "l40s": 48.0}  # L40S: 48 GB GDDR6 (the catalog: 48 GiB)


def trtllm_bench_setting(model: str, hw: str, tp: int, pp: int, isl: int, osl: int, weight_bytes: float,
                         kv_bytes: float, fraction: float = TRT_FREE_FRACTION) -> tuple[int, int]:
    """(max_batch_size, max_num_tokens) as trtllm-bench's heuristic picks them (``TRT_TUNING``)."""
    g = GEOMETRY[model]
    per_token_gib = 2 * g.layers * max(tp, g.kv_heads) * g.head_dim * kv_bytes / 2**30
    engine = g.params * weight_bytes / 2**30
    cache = (DEVICE_GIB[hw] * tp * pp - engine) * fraction
    requests = cache / (per_token_gib * (isl + osl))
    raw_bs = min(requests, 4096) / pp
    raw_tok = min(raw_bs * (1 + isl / osl), 32768)
    if raw_bs < 256:
        bs = max(64, 32 * math.ceil(raw_bs / 32))
    elif raw_bs < 1024:
        bs = 128 * math.ceil(raw_bs / 128)
    else:
        bs = 256 * math.ceil(raw_bs / 256)
    if raw_tok < 4096:
        tok = max(2048, 256 * math.ceil(raw_tok / 256))
    elif raw_tok < 8192:
        tok = 512 * math.ceil(raw_tok / 512)
    else:
        tok = 1024 * math.ceil(raw_tok / 1024)
    return bs, tok


def free_fraction_as_utilization(model: str, hw: str, tp: int, pp: int, weight_bytes: float,
                                 fraction: float) -> float:
    """TensorRT-LLM's KV fraction is of the memory free after the weights; opmap's --gpu-memory-utilization is
    vLLM's, of the whole device (usable = capacity x u - weights - reserve). The same KV pool: capacity x u -
    weights = fraction x (capacity - weights), so u = fraction + (1 - fraction) x weights / capacity, per device
    (the runtime reserve is left inside the free memory on both sides)."""
    g = GEOMETRY[model]
    weights = g.params * weight_bytes / (tp * pp) / 2**30
    return min(1.0, fraction + (1 - fraction) * weights / DEVICE_GIB[hw])


def _trt_engine(model, hw, tp, dtype, isl, osl, kv_bytes) -> tuple[dict[str, str], int, str]:
    """The engine flags, request count and their citation of a trtllm-bench throughput row."""
    wb = 1.0 if dtype == "fp8" else 2.0
    bs, tok = trtllm_bench_setting(model, hw, tp, 1, isl, osl, wb, kv_bytes)
    u = free_fraction_as_utilization(model, hw, tp, 1, wb, TRT_FREE_FRACTION)
    flags = {"--policy": f"engine:{bs},{tok},{TRT_KV_BLOCK},noevict", "--gpu-memory-utilization": f"{u:.4f}"}
    cfg = (f"engine: max_batch_size {bs}, max_num_tokens {tok} ({TRT_TUNING}, at {isl}/{osl}, tp {tp}); "
           f"scheduler GUARANTEED_NO_EVICT ({TRT_BENCH_DEFAULTS}; chunked context is off by default there, opmap "
           "chunks: with whole prompts a budget of max_num_tokens close to the prompt, as the heuristic gives at "
           "2048/2048, would admit a prompt only when no decode runs, which the published rates rule out); KV "
           f"blocks of {TRT_KV_BLOCK} tokens (assumed: the build scripts' tokens_per_block default); KV "
           f"--kv_cache_free_gpu_mem_fraction {TRT_FREE_FRACTION} of the memory free after the weights = "
           f"--gpu-memory-utilization {u:.4f} of the device; {TRT_REQUESTS[(isl, osl)]} requests (perf-overview's "
           "table for this ISL/OSL)")
    return flags, TRT_REQUESTS[(isl, osl)], cfg


def _trt017(id_, model, pub, hw, tp, dtype, isl, osl, value, kv=None, **kw) -> Ref:
    eng, n, cfg = _trt_engine(model, hw, tp, dtype, isl, osl, 1.0 if kv == "fp8" else 2.0)
    flags = {**ENGINE_FLAGS, **({"--kv-dtype": kv} if kv else {}), **eng}
    gpu = {"h100-sxm": "H100 80GB HBM3", "h200": "H200 141GB HBM3", "a100-sxm-80gb": "A100-SXM4-80GB",
           "l40s": "L40S"}[hw]
    return Ref(id_, "offline", pub, model, hw, tp, tp, dtype, isl, osl, value, "output tokens/s per TP group",
               "TensorRT-LLM v0.17 (trtllm-bench)", f"{TRT017}; row {pub}, TP {tp}, {isl}/{osl}, column {gpu}; {cfg}",
               flags=flags, requests=n, **kw)


# The KV format of the v1.0 rows follows the checkpoint's hf_quant_config.json (trtllm-bench's PyTorch flow:
# kv_cache_dtype "auto"). nvidia/Llama-3.1-405B-Instruct-FP8's says "kv_cache_quant_algo": null (modelopt 0.17.0):
# bf16 KV. The 8B and 70B checkpoints' files were not readable here; their published rates decide it. A decode step
# reads the weights and every sequence's KV, so over a run a TP group emits at most B / ((W + B L kv) / (tp bw))
# tokens per second, B the sequences that fit (KV pool / (L kv per sequence)), L the mean KV length, bw 2.97 TB/s
# (the H100's achievable rate, catalog). 8B at 500/2000, bf16 KV (131,072 B a token): the pool is 0.95 x (85.9 -
# 8.0 GB) = 74.0 GB, B = 74.0e9 / (2500 x 131,072) = 225, L = 1500, W = 8.0 GB: at most 225 / ((8.0e9 + 225 x 1500 x
# 131,072) / 2.97e12) = 12.8k tokens/s, below the published 17,660: the run held an fp8 KV cache (twice the
# sequences, half the reads: at most 25.6k). 70B TP2 at 1000/2000, bf16 KV (163,840 B a token per device): pool
# 0.95 x (85.9 - 35.3) = 48.1 GB a device, B = 97, L = 2000, W = 35.3 GB a device: at most 4.3k tokens/s per TP
# group against the published 4,146, i.e. the run at 96% of the memory bound with no prefill, no compute, no
# all-reduce: not credible; an fp8 KV cache doubles the bound (8.6k)
TRT10_KV = {"llama-3-8b": ("fp8", "fp8 KV: the published rate exceeds what a bf16 KV cache allows (TRT10_KV)"),
            "llama-3-70b": ("fp8", "fp8 KV: the published rate is 96% of the bf16-KV memory bound (TRT10_KV)"),
            "llama-3.1-405b": (None, "bf16 KV: the checkpoint's hf_quant_config.json has kv_cache_quant_algo null")}


def _trt10(id_, model, pub, hw, tp, isl, osl, value, **kw) -> Ref:
    kv, why = TRT10_KV[model]
    eng, n, cfg = _trt_engine(model, hw, tp, "fp8", isl, osl, 1.0 if kv == "fp8" else 2.0)
    return Ref(id_, "offline", pub, model, hw, tp, tp, "fp8", isl, osl, value, "output tokens/s per TP group",
               "TensorRT-LLM v1.0 (trtllm-bench, PyTorch backend)",
               f"{TRT10}; table '{pub}', column {hw.upper()} TP{tp} (FP8), row {isl}/{osl}; {cfg} (the PyTorch flow "
               "sizes the same way when no max_batch_size is given; CUDA graphs captured up to batch 8192)",
               flags={**ENGINE_FLAGS, **({"--kv-dtype": kv} if kv else {}), **eng}, requests=n,
               notes=f"KV cache precision not stated on the page: {why}", **kw)


# v0.14's Triton backend launched the engine without CUDA graphs: the backend's cuda_graph_mode parameter first
# appears in triton-inference-server/tensorrtllm_backend v0.15.0 (all_models/inflight_batcher_llm/tensorrt_llm/
# config.pbtxt, default false): the engine's fused kernels, each a host launch
TRT14_RUNTIME = {"--runtime": "engine-eager"}


def _online(id_, model, pub, hw, tp, isl, osl, qps, itl_ms, ttft_ms, **kw) -> Ref:
    return Ref(id_, "itl", pub, model, hw, tp, tp, "bf16", isl, osl, itl_ms, "ms mean ITL",
               "TensorRT-LLM v0.14.0 (Triton backend)",
               f"{TRT017_ONLINE}; {pub}, {hw}, TP {tp}, {isl}/{osl}, QPS {qps}: Mean TTFT {ttft_ms} ms, "
               f"Mean ITL {itl_ms} ms", rate_per_s=qps, flags={**ENGINE_FLAGS, **TRT14_RUNTIME}, requests=500, **kw)


# The prompts of MLPerf's llama2-70b set (OpenOrca, 24,576 samples, Llama-2 tokenizer, chat template included):
# mean 222.33 tokens, median 152, p90 519, max 1021 (processorca.py keeps prompts under 1024 tokens, it does not
# truncate them). Computed over every row of openshift-psap/performance-dashboard
# mlperf-data/summaries/llama2-70b-99.csv @ 7cd1065d (input_length per sample, copied from tok_input_length of the
# official open_orca_gpt4_tokenized_llama.sampled_24576.pkl by mlperf-data/original/generate_dataset_summaries.py);
# MLCommons itself publishes only the output mean (294.45 tokens per sample, language/llama2-70b/README.md).
# As a lognormal: median 152 and mean 222.33 give sigma = sqrt(2 ln(222.33 / 152)) = 0.872, truncated at 1023
# (processorca.py keeps prompts under 1024 tokens).
MLPERF_ISL_MEAN, MLPERF_ISL_SPEC = 222, "lognormal:152,0.872,1023"
# The generated lengths: each run's mean (tokens / samples, 290-293; MLCommons' reference run: 294.45) with the spread
# of the set's reference answers (GPT-4's, tok_output_length: median 190, mean 218.89 over the same 24,576 rows, same
# extract), as a lognormal: sigma = sqrt(2 ln(218.89 / 190)) = 0.532, median = mean / exp(sigma^2 / 2) = mean / 1.152.
# How Llama 2's own answers spread is not published; the reference answers are the nearest published spread. Capped
# at 1024: the reference SUT generates with max_new_tokens 1024 (mlcommons/inference language/llama2-70b/SUT.py
# gen_kwargs).
MLPERF_OSL_SIGMA, MLPERF_OSL_MAX = 0.532, 1024
# A run of the whole set, as MLPerf's Offline scenario runs it (min_query_count 24,576 for llama2-70b): with lengths
# that vary, a run of about one batch (1,000 requests at 806-1,024 sequences in flight) is mostly its drain, the
# longest answers finishing alone; the published rate is the sustained one.
MLPERF_SAMPLES = 24_576


def mlperf_output_spec(mean: float) -> str:
    return f"lognormal:{mean / math.exp(MLPERF_OSL_SIGMA ** 2 / 2):.1f},{MLPERF_OSL_SIGMA},{MLPERF_OSL_MAX}"
MLPERF_NOTE = ("prompt lengths: the dataset's distribution as a lognormal (median 152, mean 222.33 tokens; computed "
               "from the per-sample lengths of the official pickle as extracted in openshift-psap/"
               "performance-dashboard mlperf-data/summaries/llama2-70b-99.csv @ 7cd1065d); output: the run's own "
               "mean (tokens / samples) with the spread of the set's reference answers (lognormal sigma 0.532)")


def _mlperf(id_, scenario, system, bench, hw, devices, tp, tokens_s, samples_s, engine, cfg, flags, **kw) -> Ref:
    sub = "AMD" if hw == "mi300x" else "NVIDIA"
    path = f"{sub}/results/{system}/{bench}/{scenario.capitalize()}"
    unit = "tokens/s per system" if scenario == "offline" else "completed tokens/s per system"
    slo = {"slo_ttft_ms": 2000.0, "slo_tpot_ms": 200.0} if scenario == "server" else {}
    src = (f"{MLPERF41.format(path=path)}: '{'Tokens' if scenario == 'offline' else 'Completed tokens'} per second' "
           f"{tokens_s}, samples per second {samples_s} (mean output = tokens / samples); {cfg}"
           + (f"; {MLPERF_SLO}" if scenario == "server" else ""))
    if sub == "NVIDIA":  # kvcache_free_gpu_mem_frac 0.90 of the memory free after the weights, as opmap's fraction
        u = free_fraction_as_utilization("llama-2-70b", hw, tp, 1, 1.0, MLPERF41_NV_FREE_FRACTION)
        # use_graphs = False (configs/llama2-70b/__init__.py GPUBaseConfig): the engine's kernels, each a host launch
        flags = {**flags, "--gpu-memory-utilization": f"{u:.4f}", "--runtime": "engine-eager"}
        src += (f"; KV fraction {MLPERF41_NV_FREE_FRACTION} of free memory = --gpu-memory-utilization {u:.4f} of "
                f"the device; {MLPERF41_NV_ENGINE}; use_graphs False: --runtime engine-eager")
    else:
        src += f"; {MLPERF41_AMD_ARGS}"
        flags = {**MLPERF41_AMD_FLAGS[scenario], **flags}
    return Ref(id_, scenario, f"Llama 2 70B ({bench}, OpenOrca 24,576 samples)", "llama-2-70b", hw, devices, tp,
               "fp8", MLPERF_ISL_MEAN, round(tokens_s / samples_s, 2), tokens_s, unit, engine, src,
               flags={**ENGINE_FLAGS, "--kv-dtype": "fp8", **flags}, requests=MLPERF_SAMPLES, notes=MLPERF_NOTE,
               input_spec=MLPERF_ISL_SPEC, output_spec=mlperf_output_spec(tokens_s / samples_s), **slo, **kw)


def _nv_cfg(scenario: str, cls: str) -> str:
    return MLPERF41_NV_CFG.format(scenario=scenario, cls=cls)


L8, L70, L405, MIX = "llama-3-8b", "llama-3-70b", "llama-3.1-405b", "mixtral-8x7b"
L31_8, L31_70, L31_405, MX = "LLaMA v3.1 8B", "LLaMA v3.1 70B", "LLaMA v3.1 405B", "Mixtral 8x7B"

REFS: list[Ref] = [
    # TensorRT-LLM v0.17 throughput table: Llama 3.1 8B (architecture of llama-3-8b), TP1
    _trt017("trt17-8b-h100-128-128", L8, L31_8, "h100-sxm", 1, "fp8", 128, 128, 28836.77, kv="fp8"),
    _trt017("trt17-8b-h100-128-2048", L8, L31_8, "h100-sxm", 1, "fp8", 128, 2048, 21109.38, kv="fp8"),
    _trt017("trt17-8b-h100-2048-128", L8, L31_8, "h100-sxm", 1, "fp8", 2048, 128, 3556.73, kv="fp8"),
    _trt017("trt17-8b-h100-2048-2048", L8, L31_8, "h100-sxm", 1, "fp8", 2048, 2048, 9488.42, kv="fp8"),
    _trt017("trt17-8b-h200-1000-1000", L8, L31_8, "h200", 1, "fp8", 1000, 1000, 17537.96, kv="fp8"),
    _trt017("trt17-8b-h200-5000-500", L8, L31_8, "h200", 1, "fp8", 5000, 500, 3987.79, kv="fp8"),
    _trt017("trt17-8b-a100-128-128", L8, L31_8, "a100-sxm-80gb", 1, "fp16", 128, 128, 6627.27),
    _trt017("trt17-8b-a100-500-2000", L8, L31_8, "a100-sxm-80gb", 1, "fp16", 500, 2000, 4276.58),
    _trt017("trt17-8b-a100-2048-128", L8, L31_8, "a100-sxm-80gb", 1, "fp16", 2048, 128, 799.61),
    # Llama 3.1 70B (architecture of llama-3-70b)
    _trt017("trt17-70b-h100-tp2-128-128", L70, L31_70, "h100-sxm", 2, "fp8", 128, 128, 6645.12, kv="fp8"),
    _trt017("trt17-70b-h100-tp2-1000-1000", L70, L31_70, "h100-sxm", 2, "fp8", 1000, 1000, 4390.53, kv="fp8"),
    _trt017("trt17-70b-h100-tp4-500-2000", L70, L31_70, "h100-sxm", 4, "fp8", 500, 2000, 9836.7, kv="fp8"),
    _trt017("trt17-70b-h200-tp1-128-128", L70, L31_70, "h200", 1, "fp8", 128, 128, 4020.75, kv="fp8"),
    _trt017("trt17-70b-h200-tp1-2048-128", L70, L31_70, "h200", 1, "fp8", 2048, 128, 465.99, kv="fp8"),
    _trt017("trt17-70b-h200-tp2-128-2048", L70, L31_70, "h200", 2, "fp8", 128, 2048, 8290.35, kv="fp8"),
    _trt017("trt17-70b-h200-tp8-2048-2048", L70, L31_70, "h200", 8, "fp8", 2048, 2048, 11142.47, kv="fp8"),
    _trt017("trt17-70b-a100-tp4-128-128", L70, L31_70, "a100-sxm-80gb", 4, "fp16", 128, 128, 2733.48),
    _trt017("trt17-70b-a100-tp8-1000-1000", L70, L31_70, "a100-sxm-80gb", 8, "fp16", 1000, 1000, 3320.41),
    # Llama 3.1 405B, TP8 on H200
    _trt017("trt17-405b-h200-tp8-128-2048", L405, L31_405, "h200", 8, "fp8", 128, 2048, 5938.09, kv="fp8"),
    _trt017("trt17-405b-h200-tp8-1000-1000", L405, L31_405, "h200", 8, "fp8", 1000, 1000, 3399.69, kv="fp8"),
    # Mixtral 8x7B (MoE, top-2 of 8)
    _trt017("trt17-mix-h100-tp1-128-128", MIX, MX, "h100-sxm", 1, "fp8", 128, 128, 15962.49, kv="fp8"),
    _trt017("trt17-mix-h100-tp2-2048-128", MIX, MX, "h100-sxm", 2, "fp8", 2048, 128, 3333.68, kv="fp8"),
    _trt017("trt17-mix-h200-tp1-1000-1000", MIX, MX, "h200", 1, "fp8", 1000, 1000, 10371.36, kv="fp8"),
    _trt017("trt17-mix-a100-tp2-128-128", MIX, MX, "a100-sxm-80gb", 2, "fp16", 128, 128, 5541.47),
    _trt017("trt17-mix-a100-tp4-128-2048", MIX, MX, "a100-sxm-80gb", 4, "fp16", 128, 2048, 10911.86),
    # L40S (FP8, no NVLink: TP over PCIe), the same table's L40S column
    _trt017("trt17-8b-l40s-128-128", L8, L31_8, "l40s", 1, "fp8", 128, 128, 9104.61, kv="fp8"),
    _trt017("trt17-8b-l40s-2048-2048", L8, L31_8, "l40s", 1, "fp8", 2048, 2048, 2225.27, kv="fp8"),
    _trt017("trt17-70b-l40s-tp4-128-2048", L70, L31_70, "l40s", 4, "fp8", 128, 2048, 1942.66, kv="fp8"),
    _trt017("trt17-mix-l40s-tp4-500-2000", MIX, MX, "l40s", 4, "fp8", 500, 2000, 6914.68, kv="fp8"),
    # TensorRT-LLM v1.0 (PyTorch backend)
    _trt10("trt10-8b-h100-500-2000", L8, "Llama 3.1 8B", "h100-sxm", 1, 500, 2000, 17660),
    _trt10("trt10-70b-h100-tp2-1000-2000", L70, "Llama 3.3 70B", "h100-sxm", 2, 1000, 2000, 4146),
    _trt10("trt10-405b-h100-tp8-128-2048", L405, "Llama 3.1 405B", "h100-sxm", 8, 128, 2048, 4340),
    _trt10("trt10-405b-h100-tp8-1000-1000", L405, "Llama 3.1 405B", "h100-sxm", 8, 1000, 1000, 2919),
    # TensorRT-LLM v0.14 online serving (BF16): mean ITL at a fixed request rate
    _online("trt14-8b-h100-467-256-q16", L8, "LLaMA 3.1 8B", "h100-sxm", 1, 467, 256, 16, 11, 30),
    _online("trt14-8b-h200-467-256-q16", L8, "LLaMA 3.1 8B", "h200", 1, 467, 256, 16, 9, 27),
    _online("trt14-70b-h100-tp4-467-256-q8", L70, "LLaMA 3.1 70B", "h100-sxm", 4, 467, 256, 8, 32, 92),
    _online("trt14-70b-h200-tp4-202-214-q16", L70, "LLaMA 3.1 70B", "h200", 4, 202, 214, 16, 28, 67),
    # MLPerf Inference v4.1, llama2-70b, Datacenter closed
    _mlperf("mlperf41-h100x8-offline", "offline", "DGX-H100_H100-SXM-80GBx8_TRT", "llama2-70b-99.9", "h100-sxm", 8,
            2, 24524.9, 84.4792, "TensorRT-LLM (NVIDIA MLPerf v4.1 harness)",
            _nv_cfg("Offline", "H100_SXM_80GB_TP2x4_HighAccuracy: tensor_parallelism 2, gpu_batch_size 896"),
            {"--policy": f"engine:896,{MLPERF41_NV_TOKENS},{TRT_KV_BLOCK},nochunk"}),
    _mlperf("mlperf41-h100x8-server", "server", "DGX-H100_H100-SXM-80GBx8_TRT", "llama2-70b-99.9", "h100-sxm", 8,
            2, 21605.79, 74.42, "TensorRT-LLM (NVIDIA MLPerf v4.1 harness)",
            _nv_cfg("Server", "H100_SXM_80GB_TP2x4_HighAccuracy: tensor_parallelism 2, gpu_batch_size 1024"),
            {"--policy": f"engine:1024,{MLPERF41_NV_TOKENS},{TRT_KV_BLOCK},nochunk"}),
    _mlperf("mlperf41-h200x8-offline", "offline", "H200-SXM-141GBx8_TRT", "llama2-70b-99", "h200", 8, 1, 31302.7,
            107.477, "TensorRT-LLM (NVIDIA MLPerf v4.1 harness)",
            _nv_cfg("Offline", "H200_SXM_141GBx8: tensor_parallelism 1, gpu_batch_size 806"),
            {"--policy": f"engine:806,{MLPERF41_NV_TOKENS},{TRT_KV_BLOCK},nochunk"}),
    _mlperf("mlperf41-h200x8-server", "server", "H200-SXM-141GBx8_TRT", "llama2-70b-99", "h200", 8, 1, 29228.22,
            100.35, "TensorRT-LLM (NVIDIA MLPerf v4.1 harness)",
            _nv_cfg("Server", "H200_SXM_141GBx8: tensor_parallelism 1, gpu_batch_size 896"),
            {"--policy": f"engine:896,{MLPERF41_NV_TOKENS},{TRT_KV_BLOCK},nochunk"}),
    _mlperf("mlperf41-mi300xx8-offline", "offline", "8xMI300X_2xEPYC-9374F", "llama2-70b-99", "mi300x", 8, 1,
            23514.8, 80.15, "vLLM 0.4.3 (ROCm 6.1.2)", MLPERF41_AMD_CFG, {}),
    _mlperf("mlperf41-mi300xx8-server", "server", "8xMI300X_2xEPYC-9374F", "llama2-70b-99", "mi300x", 8, 1,
            21028.23, 71.74, "vLLM 0.4.3 (ROCm 6.1.2)", MLPERF41_AMD_CFG, {}),
    _mlperf("mlperf41-mi300xx1-offline", "offline", "1xMI300X_2xEPYC-9374F", "llama2-70b-99.9", "mi300x", 1, 1,
            3062.72, 10.4445, "vLLM 0.4.3 (ROCm 6.1.2)", MLPERF41_AMD_CFG, {}),
    _mlperf("mlperf41-mi300xx1-server", "server", "1xMI300X_2xEPYC-9374F", "llama2-70b-99.9", "mi300x", 1, 1,
            2520.27, 8.59, "vLLM 0.4.3 (ROCm 6.1.2)", MLPERF41_AMD_CFG, {}),
    # vLLM on MI300X (Oracle Cloud), Llama 3.1 405B FP8, one TP8 instance
    Ref("oracle-405b-mi300x-128-128", "offline", "Llama 3.1 405B FP8", L405, "mi300x", 8, 8, "fp8", 128, 128, 1993,
        "output tokens/s per system", "vLLM (benchmark_throughput.py)", f"{ORACLE}: 'Typical chatbot online "
        "scenario', input 128, output 128, 1993 TPS", flags=dict(ENGINE_FLAGS),
        notes="KV cache precision not stated (model dtype assumed); vLLM version not stated"),
    Ref("oracle-405b-mi300x-128-2048", "offline", "Llama 3.1 405B FP8", L405, "mi300x", 8, 8, "fp8", 128, 2048, 2794,
        "output tokens/s per system", "vLLM (benchmark_throughput.py)", f"{ORACLE}: 'Generation heavy use case', "
        "input 128, output 2048, 2794 TPS", flags=dict(ENGINE_FLAGS),
        notes="KV cache precision not stated (model dtype assumed); vLLM version not stated"),
]

# A row that set a catalog or runtime value goes here (id -> what it set); such rows are listed, not judged.
FIT: dict[str, str] = {}
QUICK = ("trt17-8b-h100-128-128", "trt17-70b-h100-tp2-1000-1000", "trt17-mix-h100-tp1-128-128",
         "trt14-8b-h100-467-256-q16", "mlperf41-h200x8-offline", "oracle-405b-mi300x-128-2048")
CLAIM = "at least 85% of held-out rows within 0.75-1.33 and mean absolute error under 20%"
ROW_TIMEOUT_S = 1800


def role(ref: Ref) -> str:
    return "fit" if ref.id in FIT else ref.role


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
           "COLUMNS": "240", "NO_COLOR": "1", "TERM": "dumb"}
    return env


def _opmap(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opmap.cli", *args], env=_env(), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, cwd=REPO)


def accepted_flags() -> set[str]:
    """The long options ``opmap serve --help`` lists in this checkout."""
    p = _opmap(["serve", "--help"], 300)
    return set(re.findall(r"--[a-z][a-z0-9-]*", p.stdout + p.stderr))


def error_line(text: str) -> str:
    """The one line saying why opmap refused (``opmap: error: ...`` or typer's ``No such option``)."""
    lines = [ln.strip(" │|\t") for ln in text.splitlines()]
    for pat in ("opmap: error", "No such option", "Error", "Traceback"):
        hit = [ln for ln in lines if pat in ln]
        if hit:
            return hit[-1] if pat != "Traceback" else next((ln for ln in reversed(lines) if ln), hit[-1])
    return next((ln for ln in reversed(lines) if ln), "no output")


def predicted(ref: Ref, report: dict) -> tuple[float, str]:
    """(predicted figure in the row's per-device unit, what opmap reported), from serve.json."""
    if ref.scenario == "offline":
        out = report["throughput"]["output_tokens_per_s"]
        return out / ref.per_replica, f"{out:.4g} out tok/s per replica"
    if ref.scenario == "itl":
        return report["latency"]["itl"]["mean_s"], f"TPOT mean {report['latency']['tpot']['mean_s'] * 1e3:.3g} ms"
    cap = report["capacity"]["rate_per_s"]
    # the run's own mean answer length (a distribution's draws, truncated, are not exactly the row's mean)
    req = report.get("requests") or {}
    mean_out = req["output_tokens"] / req["count"] if req.get("count") else round(ref.output_len)
    return cap * mean_out / ref.per_replica, f"capacity {cap:.4g} req/s per replica x {mean_out:.4g} tokens"


def ratio(ref: Ref, pred: float) -> float:
    """Predicted speed / published speed (> 1: opmap faster than measured)."""
    pub = ref.published_per_device
    return pub / pred if ref.scenario == "itl" else pred / pub


def run_row(ref: Ref, accepted: set[str] | None) -> dict:
    """Run one row's opmap serve command; ``accepted`` = the options to keep (None: keep every row flag)."""
    res = {"id": ref.id, "role": role(ref), "published_per_device": ref.published_per_device, "dropped_flags": []}
    with tempfile.TemporaryDirectory(prefix="serving_ref_") as tmp:
        out = Path(tmp) / "run"
        args = ref.command(out)
        if accepted is not None:
            keep, i = [], 0
            while i < len(args):
                a = args[i]
                takes_value = a in ref.flags and ref.flags[a] != ""
                if a.startswith("--") and a in ref.flags and a not in accepted:
                    res["dropped_flags"].append(a)
                    i += 2 if takes_value else 1
                    continue
                keep.append(a)
                i += 1
            args = keep
        res["command"] = "opmap " + " ".join(args).replace(str(out), "OUT")
        try:
            p = _opmap(args, ROW_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return {**res, "status": f"not runnable: timed out after {ROW_TIMEOUT_S} s"}
        if p.returncode != 0:
            return {**res, "status": f"not runnable: {error_line(p.stderr + p.stdout)}"}
        try:
            report = json.loads((out / "serve.json").read_text())
            pred, how = predicted(ref, report)
        except (OSError, KeyError, TypeError, ValueError) as e:
            return {**res, "status": f"not runnable: serve.json unreadable ({type(e).__name__}: {e})"}
    r = ratio(ref, pred)
    return {**res, "status": "ok", "predicted_per_device": pred, "ratio": r, "how": how,
            "in_band": BAND[0] <= r <= BAND[1], "runtime": report.get("runtime") or report.get("cost", {}).get(
                "runtime"), "preemptions": report.get("preemptions")}


def summary(results: list[dict]) -> dict:
    held = [x for x in results if x["role"] == "held out"]
    ok = [x for x in held if x["status"] == "ok"]
    ratios = [x["ratio"] for x in ok]
    mae = statistics.fmean(abs(r - 1) for r in ratios) if ratios else None
    in_band = sum(1 for x in ok if x["in_band"])
    return {"held_out": len(held), "runnable": len(ok), "not_runnable": len(held) - len(ok), "in_band": in_band,
            "in_band_fraction": in_band / len(held) if held else None,
            "median_ratio": statistics.median(ratios) if ratios else None, "mean_abs_error": mae,
            "geomean_error": math.exp(statistics.fmean(abs(math.log(r)) for r in ratios)) - 1 if ratios else None,
            "pass": bool(held) and len(ok) == len(held) and in_band >= 0.85 * len(held) and mae is not None
            and mae < 0.20}


def _fmt(ref: Ref, v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1e3:.3g} ms" if ref.scenario == "itl" else f"{v:,.0f} tok/s/dev"


def select(rows_arg: str | None, quick: bool) -> list[Ref]:
    by_id = {r.id: r for r in REFS}
    if rows_arg:
        ids = [s.strip() for s in rows_arg.split(",") if s.strip()]
        bad = [i for i in ids if i not in by_id]
        if bad:
            raise SystemExit(f"serving_reference: unknown row id(s) {', '.join(bad)}; --list prints the ids")
        return [by_id[i] for i in ids]
    return [by_id[i] for i in QUICK] if quick else list(REFS)


def markdown(payload: dict) -> str:
    """The rows of a results JSON as a Markdown table (for benchmarks/README.md)."""
    lines = ["| row | workload | system | engine | published | per device | predicted | ratio | band | role |",
             "|---|---|---|---|---:|---:|---:|---:|---|---|"]
    for x in payload["rows"]:
        ref = Ref(**{k: x[k] for k in Ref.__dataclass_fields__})
        lay = f"tp{ref.tp}" + (f" pp{ref.pp}" if ref.pp > 1 else "")
        wl = f"{ref.published_model}, {ref.dtype}, {ref.input_len}/{ref.output_len:g}, {ref.scenario}"
        if ref.rate_per_s:
            wl += f" @ {ref.rate_per_s:g} QPS"
        pred = _fmt(ref, x.get("predicted_per_device"))
        r = f"{x['ratio']:.2f}" if x["status"] == "ok" else x["status"]
        band = ("in" if x.get("in_band") else "out") if x["status"] == "ok" and x["role"] == "held out" else "-"
        lines.append(f"| {ref.id} | {wl} | {ref.devices} x {ref.hardware}, {lay} | {ref.engine} | {ref.value} "
                     f"{ref.unit} | {_fmt(ref, ref.published_per_device)} | {pred} | {r} | {band} | {x['role']} |")
    return "\n".join(lines)


def write_results(payload: dict, subset: bool) -> Path:
    """results/serving_reference.json for the whole table; a --rows / --quick run writes
    serving_reference_subset.json instead, so it never replaces the full table's results."""
    sys.path.insert(0, str(REPO / "src"))
    from opmap.validate import json_text

    out_dir = HERE / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / ("serving_reference_subset.json" if subset else "serving_reference.json")
    tmp = out.with_suffix(f".json.{os.getpid()}.tmp")
    tmp.write_text(json_text(payload, indent=2) + "\n")
    os.replace(tmp, out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", help="comma-separated row ids (see --list)")
    ap.add_argument("--quick", action="store_true", help=f"only {len(QUICK)} rows, one per kind of source")
    ap.add_argument("--jobs", type=int, default=2, help="rows run at once (at most 2 on a shared host)")
    ap.add_argument("--drop-missing-flags", action="store_true",
                    help="run rows without the flags this checkout's CLI lacks (listed per row) instead of "
                         "reporting them not runnable")
    ap.add_argument("--list", action="store_true", help="print the rows and their commands, run nothing")
    ap.add_argument("--markdown", action="store_true", help="print the last results JSON as a Markdown table")
    a = ap.parse_args(argv)
    if a.markdown:
        print(markdown(json.loads((HERE / "results" / "serving_reference.json").read_text())))
        return 0
    refs = select(a.rows, a.quick)
    if a.list:
        for r in refs:
            print(f"{r.id}: {r.what()} = {r.value:g} {r.unit} ({r.published_per_device:.6g} per device)\n"
                  f"  opmap {' '.join(r.command(Path('OUT')))}")
        return 0
    from rich.console import Console
    from rich.table import Table

    con = Console(width=None if sys.stdout.isatty() else 200)
    accepted = accepted_flags() if a.drop_missing_flags else None
    with ThreadPoolExecutor(max_workers=max(1, min(a.jobs, 2))) as pool:
        results = list(pool.map(lambda r: run_row(r, accepted), refs))
    t = Table(title="opmap serve predicted / published, per device (ratio > 1: opmap faster)")
    for c in ("id", "published", "predicted", "ratio", "band", "role", "opmap", "dropped flags"):
        t.add_column(c, overflow="fold")
    for ref, x in zip(refs, results, strict=True):
        band = "-" if x["role"] != "held out" else ("in" if x.get("in_band") else "out")
        t.add_row(ref.id, _fmt(ref, ref.published_per_device), _fmt(ref, x.get("predicted_per_device")),
                  f"{x['ratio']:.2f}" if "ratio" in x else x["status"], band if x["status"] == "ok" else "-",
                  x["role"], x.get("how", ""), " ".join(x["dropped_flags"]))
    con.print(t)
    s = summary(results)
    mae = "-" if s["mean_abs_error"] is None else f"{s['mean_abs_error']:.1%}"
    med = "-" if s["median_ratio"] is None else f"{s['median_ratio']:.2f}"
    con.print(f"held-out rows in {BAND[0]}-{BAND[1]}: {s['in_band']} of {s['held_out']} ({s['not_runnable']} not "
              f"runnable); median ratio {med}; mean absolute error {mae}; claim ({CLAIM}): "
              f"{'PASS' if s['pass'] else 'FAIL'}", highlight=False)
    sys.path.insert(0, str(HERE))
    from _common import machine, now_iso

    path = write_results({"schema_version": SCHEMA_VERSION, "benchmark": "serving_reference", "created": now_iso(),
                          "machine": machine(), "claim": CLAIM, "band": list(BAND),
                          "drop_missing_flags": a.drop_missing_flags, "summary": s,
                          "rows": [{**asdict(ref), "what": ref.what(), **x} for ref, x in zip(refs, results,
                                                                                              strict=True)]},
                         subset=bool(a.rows or a.quick))
    con.print(f"wrote {path}")
    return 0 if s["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
