"""``opmap serve --engine-preset``: a Hugging Face config (examples/tiny-llama.json) and a zoo model served under
each engine's defaults; the values checked against the engines' formulas; bad presets refused in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hf_family_configs import GPT_OSS_120B, shallow  # noqa: E402

TINY = str(Path(__file__).resolve().parents[2] / "examples" / "tiny-llama.json")
SERVE = ("--requests", 40, "--input-len", 64, "--output-len", 8, "--arrival", "poisson:20", "--no-store")


def _serve(cli, tmp_path, *args):
    rc, out, err = cli("serve", *args, "--out", tmp_path)
    assert rc == 0, err
    return json.loads((tmp_path / "serve.json").read_text()), out


def test_vllm_preset_on_a_hugging_face_config(cli, tmp_path):
    """vLLM on an H100 (80 GiB, not an A100), an API server run: 1024 sequences, 8192 tokens, blocks of 16, 0.9 of
    the whole device (vllm/engine/arg_utils.py @ 99d7eb5d)."""
    d, out = _serve(cli, tmp_path, TINY, *SERVE, "--engine-preset", "vllm")
    assert d["policy"]["spec"] == "engine:1024,8192,16"
    ep = d["assumptions"]["engine_preset"]
    assert (ep["engine"], ep["version"], ep["max_num_seqs"], ep["max_num_batched_tokens"]) == ("vllm", "0.11", 1024,
                                                                                               8192)
    assert ep["memory"] == {"fraction": 0.9, "of": "total", "why": ep["memory"]["why"]}
    assert "99d7eb5d" in " ".join(ep["why"]) and ep["cuda_graph_sizes"][-1] == 512  # min(1024 x 2, 512)
    assert d["assumptions"]["memory"]["utilization"] == 0.9 and "utilization_of" not in d["assumptions"]["memory"]
    assert "engine preset vllm@0.11 (vLLM" in out


def test_sglang_preset_memory_is_weights_plus_kv(cli, tmp_path):
    """SGLang on an H100: mem_fraction_static 0.836 of the whole device for weights + KV (worked in
    test_rules.py), so KV bytes = 80 GiB x 0.836 - weights, the reserve outside it."""
    d, out = _serve(cli, tmp_path, TINY, *SERVE, "--engine-preset", "sglang")
    m = d["assumptions"]["memory"]
    assert m["utilization_of"] == "static" and m["utilization"] == 0.836
    assert m["usable_bytes"] == pytest.approx(m["capacity_bytes"] * 0.836 - m["weights_bytes"])
    assert m["kv_capacity_tokens"] == int(m["usable_bytes"] // m["kv_bytes_per_token"])
    # tiny-llama's context is 1024 positions: its KV pool holds far more than 4096 x 1024 / 512 tokens, so the
    # request pool is 4096; a step's budget = chunk 8192 + 4096 decodes
    assert d["policy"]["spec"] == "engine:4096,12288,1"
    assert "(weights + KV)" in out


def test_trtllm_preset_memory_is_of_the_free_memory(cli, tmp_path):
    d, _ = _serve(cli, tmp_path, TINY, *SERVE, "--engine-preset", "trtllm@1.3")
    m = d["assumptions"]["memory"]
    assert m["utilization_of"] == "free"
    assert m["usable_bytes"] == pytest.approx(0.9 * (m["capacity_bytes"] - m["weights_bytes"] - m["reserve_bytes"]))
    assert d["policy"]["spec"] == "engine:2048,8192,32,nochunk,noevict"
    assert d["kv_cache"]["blocks"] == m["kv_capacity_tokens"] // 32


def test_trtllm_bench_preset_on_a_zoo_model_sizes_from_the_data_set(cli, tmp_path):
    """Llama-3-8B fp8 on one H100 at 128/128, offline: opmap's KV at 0.95 of the free memory holds ~4,400 requests
    of 256 tokens (tuning.py: (80 - 8 GiB) x 0.95 / (128 KiB x 256)), capped at 4096: max_batch_size 4096,
    max_num_tokens 4096 x (1 + 128 / 128) = 8192; --max-num-seqs overrides and says so."""
    d, out = _serve(cli, tmp_path, "llama-3-8b", "--dtype", "fp8", "--kv-dtype", "fp8", "--requests", 64,
                    "--input-len", 128, "--output-len", 128, "--arrival", "offline", "--no-store",
                    "--engine-preset", "trtllm-bench", "--gpu-memory-utilization", "0.95", "--max-num-seqs", 2048)
    ep = d["assumptions"]["engine_preset"]
    assert (ep["max_num_seqs"], ep["max_num_batched_tokens"], ep["no_evict"]) == (2048, 8192, True)
    assert ep["overrides"][0] == "max_num_seqs 2048 (--max-num-seqs; the preset's 4096)"
    assert "memory fraction 0.95 of free (--gpu-memory-utilization)" in ep["overrides"]
    assert d["policy"]["spec"] == "engine:2048,8192,32,nochunk,noevict"
    assert "overridden: max_num_seqs 2048" in out


def test_trtllm_bench_on_gpt_oss_takes_the_build_defaults(cli, tmp_path):
    """gpt-oss's published config (MXFP4 experts, quant_method mxfp4; two layers kept) under trtllm-bench on a B200:
    its quant_algo (W4A8_MXFP4_MXFP8) is not among build.py's TUNED_QUANTS, so max_batch_size and max_num_tokens are
    BuildConfig's 2048 and 8192 (builder.py), not the heuristic's: two layers' KV (2 x 2 x 8 x 64 x 1 B = 2 KiB a
    token) would fit far over 4096 requests of 2048 tokens, capped at 4096 (tuning.py), a budget of 8192."""
    cfg = tmp_path / "gpt-oss.json"
    cfg.write_text(json.dumps(shallow(GPT_OSS_120B, 2)))
    d, out = _serve(cli, tmp_path, str(cfg), "--hardware", "b200", "--dtype", "w4a8-mxfp4", "--kv-dtype", "fp8",
                    "--requests", 16, "--input-len", 1024, "--output-len", 1024, "--arrival", "offline",
                    "--no-store", "--engine-preset", "trtllm-bench", "--gpu-memory-utilization", "0.95")
    ep = d["assumptions"]["engine_preset"]
    assert (ep["max_num_seqs"], ep["max_num_batched_tokens"]) == (2048, 8192)
    assert "not among the heuristic's tuned" in ep["why"][0] and "000a01de" in ep["why"][0]
    assert d["policy"]["spec"] == "engine:2048,8192,32,nochunk,noevict"


@pytest.mark.parametrize("args,needle", [
    (("--engine-preset", "tgi"), "unknown engine preset 'tgi': accepted: vllm (versions 0.11)"),
    (("--engine-preset", "vllm@0.10"), "engine preset vllm has no version '0.10': known 0.11"),
    (("--engine-preset", "vllm", "--policy", "continuous"), "--policy replaces it: drop one"),
    (("--engine-preset", "sglang", "--disaggregate", "1:1"), "--disaggregate replaces it"),
])
def test_bad_presets_are_refused_in_one_line(refused, args, needle):
    refused("serve", TINY, "--no-store", *args, needle=needle)
