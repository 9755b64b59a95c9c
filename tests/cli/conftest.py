"""Fixtures for the command-line tests: run ``main`` in-process, a tiny user model, a stand-in calibration,
published Hugging Face configs."""

from __future__ import annotations

import json

import pytest

from hf_family_configs import GPT_OSS_20B  # noqa: E402

TINY = ("import torch\n"
        "def tiny():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU()), (torch.randn(2, 16),)\n")


@pytest.fixture
def tiny_model(tmp_path):
    """path/to/tiny.py:tiny, a two-layer user model."""
    f = tmp_path / "tiny.py"
    f.write_text(TINY)
    return f"{f}:tiny"


@pytest.fixture
def fail_if_called(monkeypatch):
    """``fail_if_called("module.attr")``: calling it fails the test (work that bad input must not reach)."""
    def patch(target: str):
        def boom(*_a, **_k):
            raise AssertionError(f"{target} ran on bad input")

        monkeypatch.setattr(target, boom)

    return patch


@pytest.fixture
def stand_in_calibration(monkeypatch):
    """The library's calibrate replaced by a fixed, tiny CPU calibration (no measuring); the calls made to it
    are recorded in the returned list."""
    import torch

    from opmap.calibrate import Calibration, fingerprint
    from opmap.timing import Sample

    calls = []

    def fake(device="cpu", quick=False, progress=None, budgeted=True, allow_busy=False):
        calls.append((device, quick))
        if progress:
            progress("matmul fp32 256x256x256")
        return Calibration(
            device, fingerprint(torch.device(device)),
            matmul=[{"m": 256, "n": 256, "k": 256, "dtype": "fp32", "layout": "nt", "flops_per_s": 1e11,
                     "min_s": 3.2e-4, "max_s": 3.6e-4}],
            bandwidth=[{"kind": "copy", "bytes": 2 ** 20, "bytes_per_s": 1e10, "min_s": 1e-4, "max_s": 1.2e-4}],
            launch_overhead=Sample((5e-6, 6e-6, 7e-6)), vector={"fp32": 1e10}, transcendental_per_s=1e9,
            view_overhead_s=2e-6)

    monkeypatch.setattr("opmap.calibrate.calibrate", fake)
    return calls


# Published config.json files, field for field as their hub repositories hold them (written here: tests download
# nothing). The figures the tests check are worked from these fields.
PUBLISHED_CONFIGS = {
    "Qwen/Qwen2.5-7B": {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
        "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
        "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": True, "use_mrope": False,
        "use_sliding_window": False, "vocab_size": 152064},
    "google/vit-base-patch16-224": {
        "architectures": ["ViTForImageClassification"], "attention_probs_dropout_prob": 0.0, "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0, "hidden_size": 768, "image_size": 224, "initializer_range": 0.02,
        "intermediate_size": 3072, "layer_norm_eps": 1e-12, "model_type": "vit", "num_attention_heads": 12,
        "num_channels": 3, "num_hidden_layers": 12, "patch_size": 16, "qkv_bias": True,
        "transformers_version": "4.13.0.dev0",
        # the published file names the 1,000 ImageNet classes; only their number sizes the model
        "id2label": {str(i): f"class {i}" for i in range(1000)},
        "label2id": {f"class {i}": i for i in range(1000)}},
    "microsoft/Phi-3-mini-4k-instruct": {
        "architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_phi3.Phi3Config",
                     "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"},
        "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072,
        "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 4096, "model_type": "phi3",
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
        "original_max_position_embeddings": 4096, "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
        "rope_scaling": None, "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.40.2", "use_cache": True, "vocab_size": 32064},
    "google/gemma-2-2b": {
        "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
        "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "initializer_range": 0.02,
        "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
        "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0, "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096, "torch_dtype": "float32",
        "transformers_version": "4.42.4", "use_cache": True, "vocab_size": 256000},
    "openai/gpt-oss-20b": GPT_OSS_20B,  # the published config.json (tests/hf_family_configs.py)
}


@pytest.fixture
def published_config(tmp_path):
    """``published_config(repo)``: the path of a config.json holding PUBLISHED_CONFIGS[repo] (``**fields`` replace
    some of its fields)."""
    pytest.importorskip("transformers")

    def write(repo: str, **fields) -> str:
        path = tmp_path / repo.replace("/", "--") / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**PUBLISHED_CONFIGS[repo], **fields}))
        return str(path)

    return write
