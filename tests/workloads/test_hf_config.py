"""Hugging Face configs read as data (opmap.workloads.hf_config): every field opmap builds from is checked before
transformers is imported, and a bad one is refused in one line naming the field and the accepted range."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from opmap.errors import OpmapError
from opmap.workloads import load_workload
from opmap.workloads.hf import validate_config

# a tiny llama (the shapes of tests/workloads/test_hf.py) that builds
LLAMA = {"model_type": "llama", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 256, "tie_word_embeddings": False}
MIXTRAL = {**LLAMA, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2}
MISTRAL = {**LLAMA, "model_type": "mistral", "sliding_window": 8}
# Llama-3.1-405B's config.json as published on the hub (meta-llama/Llama-3.1-405B), the largest dense model
# published with a transformers config: every limit must let it through
LLAMA_405B = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
              "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 16384,
              "initializer_range": 0.02, "intermediate_size": 53248, "max_position_embeddings": 131072,
              "mlp_bias": False, "model_type": "llama", "num_attention_heads": 128, "num_hidden_layers": 126,
              "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
              "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192, "rope_type": "llama3"},
              "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 128256}

LAYERS, HIDDEN, HEADS = "an integer from 1 to 1,024", "an integer from 1 to 131,072", "an integer from 1 to 1,024"
FFN, VOCAB = "an integer from 1 to 1,048,576", "an integer from 1 to 4,194,304"
POSITIONS, EXPERTS = "an integer from 1 to 67,108,864", "an integer from 1 to 262,144"
THETA, EPS = "a number above 0 and at most 1e+12", "a number above 0 and at most 1"


def write(tmp_path: Path, d: dict) -> str:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(d))  # NaN and inf are written as JSON's NaN / Infinity, which json.loads reads back
    return str(p)


@pytest.mark.parametrize("base,field,value,accepted", [
    (LLAMA, "num_hidden_layers", -3, LAYERS),
    (LLAMA, "num_hidden_layers", 0, LAYERS),
    (LLAMA, "num_hidden_layers", 1025, LAYERS),
    (LLAMA, "num_hidden_layers", True, LAYERS),
    (LLAMA, "num_hidden_layers", "2", LAYERS),
    (LLAMA, "num_hidden_layers", 2.5, LAYERS),
    (LLAMA, "hidden_size", 0, HIDDEN),
    (LLAMA, "hidden_size", 262_144, HIDDEN),
    (LLAMA, "num_attention_heads", -4, HEADS),
    (LLAMA, "num_key_value_heads", 0, HEADS),
    (LLAMA, "intermediate_size", 2 ** 21, FFN),
    (LLAMA, "vocab_size", 10 ** 9, VOCAB),
    (LLAMA, "max_position_embeddings", 2 ** 27, POSITIONS),
    (LLAMA, "max_position_embeddings", math.inf, POSITIONS),
    (LLAMA, "head_dim", -16, "an integer from 0 to 4,096"),
    (LLAMA, "rope_theta", math.nan, THETA),
    (LLAMA, "rope_theta", 0, THETA),
    (LLAMA, "rope_theta", "10000", THETA),
    (LLAMA, "rms_norm_eps", -1e-6, EPS),
    (MIXTRAL, "num_local_experts", 0, EXPERTS),
    (MIXTRAL, "num_experts_per_tok", -1, EXPERTS),
    (MISTRAL, "sliding_window", -1, "an integer from 0 to 67,108,864"),
])
def test_a_bad_field_is_refused_naming_itself_and_its_range(tmp_path, base, field, value, accepted):
    """Each was built (or crashed inside transformers) before: -3 layers, NaN rope_theta, a bool layer count..."""
    with pytest.raises(OpmapError) as e:
        load_workload(write(tmp_path, {**base, field: value}), 1, 8)
    msg = str(e.value)
    assert f"config.json: {field} must be {accepted} (" in msg and msg.endswith(f"got {value!r}") and "\n" not in msg


@pytest.mark.parametrize("patch,path,accepted", [
    ({"rope_scaling": {"rope_type": "linear", "factor": math.inf}}, "rope_scaling.factor",
     "a number above 0 and at most 65536"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": -1.0}}, "rope_parameters.rope_theta", THETA),
    ({"text_config": {"num_hidden_layers": 10 ** 9}}, "text_config.num_hidden_layers", LAYERS),
])
def test_nested_rope_and_sub_config_fields_are_checked(tmp_path, patch, path, accepted):
    with pytest.raises(OpmapError, match=re.escape(f"config.json: {path} must be {accepted} (")):
        load_workload(write(tmp_path, {**LLAMA, **patch}), 1, 8)


def test_nan_in_any_field_is_refused(tmp_path):
    with pytest.raises(OpmapError, match=r"config.json: initializer_range is NaN; accepted: a number"):
        load_workload(write(tmp_path, {**LLAMA, "initializer_range": math.nan}), 1, 8)


def test_more_experts_per_token_than_experts(tmp_path):
    with pytest.raises(OpmapError, match="num_experts_per_tok 5 is more than the 4 experts \\(num_local_experts\\); "
                                         "accepted: 1 to 4"):
        load_workload(write(tmp_path, {**MIXTRAL, "num_experts_per_tok": 5}), 1, 8)


@pytest.mark.parametrize("content,needle", [
    ("[" * 100_000 + "]" * 100_000, "is not valid JSON (nested too deep)"),
    (json.dumps({**LLAMA, "x": json.loads("[" * 40 + "]" * 40)}), "nests deeper than 32 levels"),
    (json.dumps({**LLAMA, "pad": "x" * (16 * 2 ** 20)}), "is 16.0 MiB, over the 16 MiB opmap reads for it"),
])
def test_absurd_files_are_one_line(tmp_path, content, needle):
    """A JSON nested 100,000 deep was a RecursionError traceback; a 16 MB file was read whole."""
    p = tmp_path / "config.json"
    p.write_text(content)
    with pytest.raises(OpmapError, match=f"^{re.escape(f'config file {p}')}.*{re.escape(needle)}"):
        load_workload(str(p), 1, 8)


def test_validate_config_takes_any_value():
    """The dict-level check (for fuzzing): anything that is not an object is refused in one line, a valid one is
    returned as is, NaN given as a Python float is refused as it is from JSON."""
    for bad, kind in (([1], "array"), ("x", "string"), (None, "NoneType"), (3.5, "float")):
        with pytest.raises(OpmapError, match=f"^w is not a JSON object \\(got a JSON {kind}\\)"):
            validate_config(bad, "w")
    assert validate_config(LLAMA, "w") is LLAMA
    with pytest.raises(OpmapError, match="^w: rope_theta must be"):
        validate_config({**LLAMA, "rope_theta": float("nan")}, "w")
    # a key with a newline, an integer of 5,000 digits (repr refuses it), a deep self-reference: still one line
    for d in ({**LLAMA, "x": {"a\nb": float("nan")}}, {**LLAMA, "vocab_size": 10 ** 5000}):
        with pytest.raises(OpmapError) as e:
            validate_config(d, "w")
        assert "\n" not in str(e.value) and len(str(e.value)) < 400
    loop: dict = {**LLAMA}
    loop["self"] = loop
    with pytest.raises(OpmapError, match="nests deeper than 32 levels"):
        validate_config(loop, "w")


@pytest.mark.parametrize("d", [
    LLAMA_405B,
    {**LLAMA, "head_dim": None, "sliding_window": None, "rope_scaling": None},  # null: transformers' default
    {**LLAMA, "num_hidden_layers": 2.0},  # an integral float, as some configs write integers
    {**LLAMA, "intermediate_size": [96, 128]},  # per layer (Gemma 3n)
    {**LLAMA, "time_step_limit": [0.0, math.inf]},  # an infinity that means something (Mamba 2)
    {**MISTRAL, "sliding_window": 0},  # 0: no window (Qwen2-MoE's default)
])
def test_published_shapes_pass(d):
    assert validate_config(d, "w") is d


def test_every_transformers_causal_lm_default_config_passes():
    """Every causal-LM config class transformers ships (what opmap builds), at its defaults, passes (the
    encoder-decoders aside): the limits refuse no shape transformers itself sets up."""
    pytest.importorskip("transformers")
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    checked = 0
    for mt in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        try:
            d = CONFIG_MAPPING[mt]().to_dict()
        except Exception:  # a config class that needs arguments, or an entry this transformers lacks
            continue
        try:
            validate_config(json.loads(json.dumps(d, default=str)), mt)
        except OpmapError as e:
            assert "encoder-decoder" in str(e), str(e)
        checked += 1
    assert checked > 150


def test_a_byte_order_mark_is_skipped(tmp_path):
    """Windows editors start a UTF-8 file with a byte-order mark; the config behind it is read."""
    p = tmp_path / "config.json"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps(LLAMA).encode())
    w = load_workload(str(p), 1, 8)
    assert w.module.config.num_hidden_layers == LLAMA["num_hidden_layers"]


# -- the work as a whole (issue 34) ---------------------------------------------------------------------------------

SRC = str(Path(__file__).resolve().parents[2] / "src")
# hidden 131,072 x 1,024 layers of 1,024 heads: every field inside its Limit; the CLI ran 96 s to print 493 T
# parameters (with a 1M-wide MLP). Here, by the closed form: V h + L (h head_dim (2 heads + 2 KV) + 3 h f)
WIDE = {**LLAMA, "hidden_size": 131_072, "num_hidden_layers": 1024, "num_attention_heads": 1024,
        "num_key_value_heads": 1024}
WIDE_PARAMS = 128 * 131_072 + 1024 * (131_072 * 128 * (2 * 1024 + 2 * 1024) + 3 * 131_072 * 96)
# 262,144 experts, top-k 262,144: one token calls every expert, in each of the 2 layers (past 200 s, unfinished)
ROUTED = {**MIXTRAL, "num_local_experts": 262_144, "num_experts_per_tok": 262_144}
ROUTED_NODES = 2 * (60 + 8 * 262_144)  # layers x (a layer's nodes + 8 per expert called): hf_config's count


@pytest.mark.parametrize("d,needle", [
    (WIDE, f"about {WIDE_PARAMS / 1e12:,.0f} T parameters (hidden size 131,072 x 1,024 layers, estimated from the "
           "config); opmap builds models of at most 20 T parameters (10x the ~2 T"),
    (ROUTED, f"a capture would record about {ROUTED_NODES:,} graph nodes (2 layers x 262,144 experts active for 1 "
             "token (top-k 262,144 of 262,144)); opmap builds at most 1,000,000 (5x the ~190,000 of Kimi K2"),
])
def test_a_config_too_big_as_a_whole_is_refused_at_once(tmp_path, d, needle):
    """Timed in a subprocess (a regression cannot hang this session): refused in under half a second, before
    transformers is imported, in one line naming the figure and the limit."""
    import os
    import subprocess
    import sys

    p = write(tmp_path, d)
    code = ("import sys, time\nfrom opmap.errors import OpmapError\nfrom opmap.workloads import load_workload\n"
            "t = time.perf_counter()\ntry:\n    load_workload(sys.argv[1])\nexcept OpmapError as e:\n"
            "    print(time.perf_counter() - t, 'transformers' in sys.modules)\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code, p], env={**os.environ, "PYTHONPATH": SRC}, capture_output=True,
                       text=True, timeout=120, stdin=subprocess.DEVNULL)
    lines = r.stdout.splitlines()
    assert len(lines) == 2, r.stdout[-500:] + r.stderr[-1500:]
    seconds, imported = lines[0].split()
    assert float(seconds) < 0.5 and imported == "False"
    assert needle in lines[1], lines[1]


def test_the_experts_a_batch_activates_count_at_build(tmp_path):
    """262,144 experts at top-k 8 over 8 layers pass for one token (8 x (60 + 8 x 8) nodes), but 2,048 tokens
    activate 15,883 of them a layer (E (1 - (1 - k/E)^(tokens)), rounded up): past the limit, refused before
    transformers builds anything."""
    from opmap.ops import active_experts

    d = {**MIXTRAL, "num_hidden_layers": 8, "num_local_experts": 262_144, "num_experts_per_tok": 8,
         "max_position_embeddings": 4096}
    assert validate_config(d, "w") is d
    a = active_experts(262_144, 8, 2048)
    assert a == math.ceil(262_144 * (1 - (1 - 8 / 262_144) ** 2048) - 1e-9) == 15_883
    with pytest.raises(OpmapError, match=f"about {8 * (60 + 8 * a):,} graph nodes .* for 2,048 tokens"):
        load_workload(write(tmp_path, d), 1, 2048)


# the fields of published config.json files that size them (hub: deepseek-ai/DeepSeek-V3, moonshotai/Kimi-K2-Instruct,
# Qwen/Qwen3-235B-A22B) and their published parameter counts
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
               "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
               "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 8,
               "first_k_dense_replace": 3, "n_group": 8, "topk_group": 4, "kv_lora_rank": 512, "q_lora_rank": 1536,
               "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
               "max_position_embeddings": 163840, "rope_theta": 10000, "rms_norm_eps": 1e-06}
KIMI_K2 = {**DEEPSEEK_V3, "model_type": "kimi_k2", "num_attention_heads": 64, "num_key_value_heads": 64,
           "n_routed_experts": 384, "first_k_dense_replace": 1, "vocab_size": 163840, "max_position_embeddings": 131072}
QWEN3_235B = {"model_type": "qwen3_moe", "hidden_size": 4096, "intermediate_size": 12288,
              "moe_intermediate_size": 1536, "num_hidden_layers": 94, "num_attention_heads": 64,
              "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
              "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000.0}


@pytest.mark.parametrize("d,published", [(LLAMA_405B, 405.8e9), (DEEPSEEK_V3, 671e9), (KIMI_K2, 1.04e12),
                                         (QWEN3_235B, 235e9)])
def test_published_models_are_within_the_work_limits(d, published):
    """The largest published dense and MoE models pass at one token and at 64 x 4,096 tokens (every expert
    active); the closed-form parameter estimate is within 5 % of each published count."""
    from opmap.workloads.hf_config import MAX_NODES, check_work, work

    assert validate_config(d, "w") is d
    check_work(d, "w", 64 * 4096)
    params, nodes, _, _ = work(d, 64 * 4096)
    assert params == pytest.approx(published, rel=0.05) and nodes < MAX_NODES / 4


def test_a_long_error_is_cut_at_a_sentence_or_a_word_never_mid_word():
    """transformers' refusal of SDPA for Gemma-2 is one line of 470 characters; opmap's message cut it at 300,
    mid-word ("...open an issue in Transfo")."""
    from opmap.workloads.hf_config import first_line

    e = ValueError("Gemma2ForCausalLM does not support an attention implementation through "
                   "torch.nn.functional.scaled_dot_product_attention yet. Please request the support for this "
                   "architecture: https://github.com/huggingface/transformers/issues/28005. If you believe this error "
                   "is a bug, please open an issue in Transformers GitHub repository and load your model with the "
                   "argument `attn_implementation=\"eager\"` meanwhile.\nsecond line")
    line = first_line(e)
    assert line.endswith("issues/28005.") and "Transfo" not in line and len(line) <= 320
    words = first_line(ValueError("word " * 100))
    assert words.endswith("word...") and len(words) <= 320
    assert first_line(ValueError("short")) == "ValueError: short"


def test_a_config_linked_to_dev_zero_is_one_line(tmp_path):
    """The reader itself: config.json linked to /dev/zero passed its size check (a device's size is 0) and was read
    without end (MemoryError) where the path's checks before it were raced or skipped. A link is still followed
    (the hub cache links each snapshot's config.json to a blob), but what it reaches must be a bounded regular
    file."""
    from opmap.workloads.hf_config import read_config_file

    p = tmp_path / "config.json"
    p.symlink_to("/dev/zero")
    with pytest.raises(OpmapError, match=f"^{re.escape(f'config file {p}')} is a device: expected a regular file$"):
        read_config_file(p)
    blob = tmp_path / "blob"
    blob.write_text(json.dumps(LLAMA))
    p.unlink()
    p.symlink_to(blob)  # as the hub cache lays a snapshot out
    assert read_config_file(p)["num_hidden_layers"] == LLAMA["num_hidden_layers"]
