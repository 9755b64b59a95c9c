"""Models named by a Hugging Face config (opmap.workloads.hf): built by transformers on meta, captured, and
checked against counts worked by hand from each config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from opmap.capture import capture  # noqa: E402
from opmap.costs import cost_graph, uncounted  # noqa: E402
from opmap.errors import OpmapError  # noqa: E402
from opmap.workloads import load_workload  # noqa: E402

V, H, F, L, NH, KV, P = 128, 64, 96, 2, 4, 2, 256  # vocab, hidden, FFN, layers, heads, KV heads, positions
HD = H // NH
E, K = 4, 2  # mixtral: experts, experts per token
WINDOW = 8  # mistral's sliding window
_LLAMA_LIKE = dict(vocab_size=V, hidden_size=H, intermediate_size=F, num_hidden_layers=L, num_attention_heads=NH,
                   num_key_value_heads=KV, max_position_embeddings=P, tie_word_embeddings=False)
CONFIGS = {
    "llama": _LLAMA_LIKE,
    "mistral": {**_LLAMA_LIKE, "sliding_window": WINDOW},
    "mixtral": {**_LLAMA_LIKE, "num_local_experts": E, "num_experts_per_tok": K},
    "qwen2": _LLAMA_LIKE,
    "gpt2": dict(vocab_size=V, n_embd=H, n_layer=L, n_head=NH, n_positions=P, bos_token_id=0, eos_token_id=0),
    "opt": dict(vocab_size=V, hidden_size=H, ffn_dim=F, num_hidden_layers=L, num_attention_heads=NH,
                max_position_embeddings=P, word_embed_proj_dim=H, bos_token_id=0, eos_token_id=0, pad_token_id=1),
}


def _attn_params(kv: int = KV) -> int:
    """q, k, v, o projections without bias: q and o are h x h, k and v h x (kv * head_dim)."""
    return 2 * H * H + 2 * H * kv * HD


def params_by_hand(mt: str) -> int:
    """Parameter count from the config, by hand (embeddings, blocks, final norm, head)."""
    if mt in ("llama", "mistral", "qwen2"):
        bias = (H + 2 * KV * HD) if mt == "qwen2" else 0  # Qwen2: biases on q, k, v
        return V * H * 2 + L * (_attn_params() + bias + 3 * H * F + 2 * H) + H  # untied head, RMSNorm weights
    if mt == "mixtral":
        return V * H * 2 + L * (_attn_params() + H * E + E * 3 * H * F + 2 * H) + H  # router + E experts
    if mt == "gpt2":  # tied head; c_attn 3h^2, c_proj h^2, MLP 4h each way, biases, two LayerNorms per block
        block = (3 * H * H + 3 * H) + (H * H + H) + (H * 4 * H + 4 * H) + (4 * H * H + H) + 2 * 2 * H
        return V * H + P * H + L * block + 2 * H
    if mt == "opt":  # tied head; learned positions offset by 2 (OPTLearnedPositionalEmbedding); biased linears
        block = 4 * (H * H + H) + (H * F + F) + (F * H + H) + 2 * 2 * H
        return V * H + (P + 2) * H + L * block + 2 * H
    raise AssertionError(mt)


def matmul_params_by_hand(mt: str) -> int:
    """Weights each token multiplies once (all linear layers and the LM head; for mixtral the active
    experts: top-k of them, plus the router)."""
    if mt in ("llama", "mistral", "qwen2"):
        return L * (_attn_params() + 3 * H * F) + H * V
    if mt == "mixtral":
        return L * (_attn_params() + H * E + K * 3 * H * F) + H * V
    if mt == "gpt2":
        return L * 12 * H * H + H * V
    if mt == "opt":
        return L * (4 * H * H + 2 * H * F) + H * V
    raise AssertionError(mt)


def attention_flops_by_hand(mt: str, b: int, s: int) -> int:
    """Q K^T and P V: 2 * head_dim FLOPs each per (query, key) pair per head. Causal SDPA counts the
    s(s+1)/2 computed pairs; mistral with s > its window gets an explicit mask from transformers, dense s*s."""
    pairs = s * s if (mt == "mistral" and s >= WINDOW) else s * (s + 1) // 2
    return L * b * NH * pairs * 4 * HD


def write_config(tmp_path: Path, mt: str, **extra) -> Path:
    p = tmp_path / f"{mt}.json"
    p.write_text(json.dumps({"model_type": mt, **CONFIGS[mt], **extra}))
    return p


def sdpa_nodes(g):
    return [n for n in g.nodes if n.op.startswith("aten.scaled_dot_product_attention")]


@pytest.mark.parametrize("mt", list(CONFIGS))
def test_build_and_capture_on_meta(tmp_path, mt):
    b, s = 2, 16
    w = load_workload(str(write_config(tmp_path, mt)), b, s)
    assert next(w.module.parameters()).device.type == "meta"
    assert w.batch == b and w.seq == s and w.inputs["input_ids"].shape == (b, s)
    assert w.inputs["use_cache"] is False
    assert w.module.num_parameters() == params_by_hand(mt)
    g = capture(w.module, w.inputs)
    assert g.params == params_by_hand(mt)
    assert len(sdpa_nodes(g)) == L  # attention recorded whole, once per layer
    costs = cost_graph(g)
    matrix = sum(c.matrix_flops for c in costs)
    assert matrix == 2 * b * s * matmul_params_by_hand(mt) + attention_flops_by_hand(mt, b, s)
    assert uncounted(g, costs) == {}


@pytest.mark.parametrize("mt", list(CONFIGS))
def test_training_step_has_no_uncounted_op(tmp_path, mt):
    """Forward, loss, backward and AdamW of each architecture: every backward op has a rule (SwiGLU's silu_backward,
    GPT-2's tanh GELU written as tensor math: tanh_backward)."""
    w = load_workload(str(write_config(tmp_path, mt)), 1, 8)
    g = capture(w.module, (), w.inputs, train=True, optimizer="adamw")
    assert any(n.args.get("phase") == "backward" for n in g.nodes)
    assert uncounted(g, cost_graph(g)) == {}


def test_gqa_reaches_sdpa(tmp_path):
    """Llama with 4 query heads over 2 KV heads: SDPA gets K and V with 2 heads and enable_gqa (no repeat)."""
    w = load_workload(str(write_config(tmp_path, "llama")), 1, 8)
    node = sdpa_nodes(capture(w.module, w.inputs))[0]
    assert node.inputs[0].shape == (1, NH, 8, HD) and node.inputs[1].shape == (1, KV, 8, HD)
    assert node.args["enable_gqa"] and node.args["is_causal"]


def test_sliding_window_gives_a_mask_beyond_the_window(tmp_path):
    """Mistral: within the window transformers lets SDPA apply the causal mask itself; from the window on it
    passes an explicit banded mask (dense work), and the workload says so."""
    cfg = str(write_config(tmp_path, "mistral"))
    short = load_workload(cfg, 1, WINDOW // 2)
    node = sdpa_nodes(capture(short.module, short.inputs))[0]
    assert node.args["is_causal"] and "attn_mask" not in node.input_names
    assert not any("sliding window" in a for a in short.assumptions)
    long = load_workload(cfg, 1, 2 * WINDOW)
    node = sdpa_nodes(capture(long.module, long.inputs))[0]
    assert not node.args["is_causal"] and "attn_mask" in node.input_names
    assert node.inputs[node.input_names.index("attn_mask")].shape[-2:] == (2 * WINDOW, 2 * WINDOW)
    assert any(f"sliding window {WINDOW}" in a for a in long.assumptions)


def test_mixtral_experts_balanced(tmp_path):
    """Each expert's two GEMMs (gate+up, down) see batch*seq*top_k/experts tokens; the assumption is stated."""
    b, s = 2, 16
    w = load_workload(str(write_config(tmp_path, "mixtral")), b, s)
    assert any("balanced expert load" in a for a in w.assumptions)
    g = capture(w.module, w.inputs)
    expert_mms = [n for n in g.nodes if n.module.endswith("mlp.experts") and n.op == "aten.mm.default"]
    assert len(expert_mms) == L * E * 2
    assert {n.inputs[0].shape[0] for n in expert_mms} == {b * s * K // E}
    assert {n.outputs[0].shape[1] for n in expert_mms} == {2 * F, H}


@pytest.mark.parametrize("mt", list(CONFIGS))
def test_fake_tensor_mode_agrees_on_the_linear_work(tmp_path, mt):
    """The same model under torch's FakeTensorMode (no opmap patches but the balanced experts) runs too, and
    its linear layers do the same FLOPs as the meta capture. transformers treats a fake tensor as a trace, so
    there the attention of the decoder-only rope models gets an explicit mask: why opmap captures on meta."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import AutoModelForCausalLM

    from opmap.workloads.hf import _balance_experts, load_config

    b, s = 1, 8
    path = str(write_config(tmp_path, mt))
    w = load_workload(path, b, s)
    meta = capture(w.module, w.inputs)
    with FakeTensorMode(allow_non_fake_inputs=True):
        m = AutoModelForCausalLM.from_config(load_config(path), attn_implementation="sdpa",
                                             experts_implementation="eager")
        _balance_experts(m)
        fake = capture(m, {"input_ids": torch.zeros(b, s, dtype=torch.long), "use_cache": False}, memoize=False)

    def linear_flops(g):
        return sum(c.matrix_flops for n, c in zip(g.nodes, cost_graph(g)) if "scaled_dot" not in n.op)

    assert linear_flops(fake) == linear_flops(meta) == 2 * b * s * matmul_params_by_hand(mt)
    assert fake.params == meta.params


@pytest.mark.parametrize("content,needle", [
    ("{not json", "is not valid JSON"),
    ('{"hidden_size": 8}', 'has no "model_type"'),
    ('{"model_type": "no-such-arch"}', "model_type 'no-such-arch' is unknown to transformers"),
    ('[1, 2]', "is not a JSON object"),
])
def test_bad_config_files(tmp_path, content, needle):
    p = tmp_path / "config.json"
    p.write_text(content)
    with pytest.raises(OpmapError, match=needle) as e:
        load_workload(str(p))
    assert "\n" not in str(e.value)
    if "model_type" in needle:
        assert "llama, mistral, mixtral, qwen2, gpt2, opt" in str(e.value)


def test_missing_file_and_uncached_name(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(OpmapError, match="does not exist; accepted: path/to/config.json or hf:NAME"):
        load_workload(str(tmp_path / "nope.json"))
    with pytest.raises(OpmapError, match="'opmap-test/not-cached' is not in the local Hugging Face cache .*never "
                                         "downloads"):
        load_workload("hf:opmap-test/not-cached")


def test_seq_beyond_the_config_positions(tmp_path):
    with pytest.raises(OpmapError, match=r"takes --seq from 1 to 256, got 257"):
        load_workload(str(write_config(tmp_path, "gpt2")), 1, P + 1)


@pytest.mark.parametrize("rope,limit", [
    # Qwen/Qwen2.5-7B-Instruct: 32,768 positions; its model card's YaRN block (factor 4 of 32,768) reaches 131,072
    ({"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}, 131072),
    # meta-llama/Llama-3.1-8B: 131,072 positions, llama3 scaling 8 x 8,192 (shorter): max_position_embeddings holds
    ({"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
      "rope_type": "llama3"}, 131072),
    (None, 32768),
])
def test_the_position_limit_is_the_rope_scaled_maximum(tmp_path, rope, limit):
    from opmap.workloads.hf import load_config, max_positions

    positions = 131072 if rope and rope.get("rope_type") == "llama3" else 32768
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "qwen2", **CONFIGS["qwen2"], "max_position_embeddings": positions,
                             "rope_scaling": rope}))
    assert max_positions(load_config(str(p))) == limit


def _vit(tmp_path, **fields) -> str:
    p = tmp_path / "vit.json"
    p.write_text(json.dumps({"model_type": "vit", "architectures": ["ViTForImageClassification"], "hidden_size": H,
                             "num_hidden_layers": L, "num_attention_heads": NH, "intermediate_size": F,
                             "image_size": 32, "patch_size": 8, "num_channels": 3, **fields}))
    return str(p)


def test_a_vision_config_takes_an_image_side(tmp_path):
    """A ViT config reads pixel_values: (batch, 3, side, side), the side its image_size unless --image-size gives
    another (a multiple of the patch; the position embeddings interpolated); a bare ViTModel where the
    architectures name no classifier."""
    w = load_workload(_vit(tmp_path), 2)
    assert tuple(w.inputs["pixel_values"].shape) == (2, 3, 32, 32) and w.seq is None
    assert type(w.module).__name__ == "ViTForImageClassification"
    w = load_workload(_vit(tmp_path), 1, 64)
    assert tuple(w.inputs["pixel_values"].shape) == (1, 3, 64, 64) and w.inputs["interpolate_pos_encoding"]
    g = capture(w.module, w.inputs)
    assert any(n.op == "aten.scaled_dot_product_attention.default" and n.input("key").shape[-2] == 65 for n in g)
    with pytest.raises(OpmapError, match="takes --image-size as a positive multiple of its 8-pixel patch"):
        load_workload(_vit(tmp_path), 1, 36)
    assert type(load_workload(_vit(tmp_path, architectures=["ViTModel"])).module).__name__ == "ViTModel"


def test_a_model_reading_neither_text_nor_images_is_one_line(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "wav2vec2", "hidden_size": H, "num_hidden_layers": L,
                             "num_attention_heads": NH, "intermediate_size": F, "vocab_size": V}))
    with pytest.raises(OpmapError, match="Wav2Vec2ForCTC reads input_values; opmap builds inputs for models reading "
                                         "input_ids .text. or pixel_values .images.|Wav2Vec2Model reads input_values"):
        load_workload(str(p))


def test_an_architecture_that_cannot_be_built_is_one_line(tmp_path, monkeypatch):
    import transformers

    def boom(*a, **k):
        raise RuntimeError("needs a kernel this machine lacks\nsecond line")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", boom)
    with pytest.raises(OpmapError, match="transformers cannot build .*llama.json \\(llama\\) on meta: "
                                         "RuntimeError: needs a kernel this machine lacks; accepted") as e:
        load_workload(str(write_config(tmp_path, "llama")))
    assert "\n" not in str(e.value)


def test_hf_name_from_the_local_cache_through_the_cli(tmp_path):
    """``opmap analyze hf:NAME`` with the config laid out as huggingface_hub caches it, offline."""
    snap = tmp_path / "hub" / "models--opmap-test--tiny-llama" / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"model_type": "llama", **CONFIGS["llama"]}))
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("0" * 40)
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1",
           "OPMAP_GRAPH_CACHE": "0", "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    r = subprocess.run([sys.executable, "-m", "opmap.cli", "analyze", "hf:opmap-test/tiny-llama", "--seq", "32",
                        "--rows", "3", "--out", str(tmp_path / "out")], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    a = json.loads((tmp_path / "out" / "analysis.json").read_text())
    assert a["totals"]["params"] == params_by_hand("llama")
    assert a["totals"]["matrix_flops"] == 2 * 32 * matmul_params_by_hand("llama") + attention_flops_by_hand(
        "llama", 1, 32)
    assert "hf:opmap-test/tiny-llama" in r.stdout


# Llama-2-7b-hf's config.json as published on the Hugging Face hub (meta-llama/Llama-2-7b-hf), written here
LLAMA2_7B_CONFIG = {"architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
                    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008,
                    "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 32,
                    "num_hidden_layers": 32, "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
                    "rope_scaling": None, "tie_word_embeddings": False, "torch_dtype": "float16", "vocab_size": 32000}


def test_llama2_7b_config_matches_the_zoo_preset(tmp_path):
    """The published Llama-2-7b-hf config, built by transformers, has HF's 6,738,415,616 parameters and does
    the same matrix work as the zoo's own llama-2-7b."""
    p = tmp_path / "config.json"
    p.write_text(json.dumps(LLAMA2_7B_CONFIG))
    hf = load_workload(str(p), 1, 32, "bf16")
    zoo = load_workload("llama-2-7b", 1, 32, "bf16")
    assert hf.module.num_parameters() == 6_738_415_616
    g_hf, g_zoo = capture(hf.module, hf.inputs), capture(zoo.module, zoo.inputs)
    assert g_hf.params == g_zoo.params == 6_738_415_616

    def matrix(g):
        return sum(c.matrix_flops for c in cost_graph(g))

    assert matrix(g_hf) == matrix(g_zoo)


@pytest.mark.parametrize("kv_write", ["in-place", "append"])
@pytest.mark.parametrize("mt", ["llama", "mistral", "mixtral", "gpt2", "opt"])
def test_decode_reads_the_kv_cache_of_its_heads_and_window(mt, kv_write, tmp_path):
    # one new token per sequence against a transformers DynamicCache of kv_len - 1 tokens, the new K and V written
    # in place (an engine) or appended (eager transformers): the attention reads 2 (K, V) x layers x KV heads x
    # head dim x cached tokens x 2 B (bf16) x batch, the KV heads being GQA's (llama, mistral, mixtral: 2 of 4)
    # and the cached tokens capped at mistral's sliding window
    from opmap.phases.decode import decode_kv_read_bytes
    from opmap.workloads.phases import PhaseSpec, check_phase, phase_workload

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": mt, **CONFIGS[mt]}))
    kv_len, batch = 64, 3
    spec = check_phase(PhaseSpec("decode", kv_len, kv_write=kv_write), str(path), batch)
    w = phase_workload(str(path), spec, batch, None, "bf16")
    g = capture(w.module, (), w.inputs)
    kv_heads = NH if mt in ("gpt2", "opt") else KV
    tokens = min(kv_len, WINDOW) if mt == "mistral" else kv_len
    assert decode_kv_read_bytes(g) == 2 * L * kv_heads * HD * tokens * 2 * batch
    q = [n.inputs[0].shape for n in g.nodes if n.op == "aten.scaled_dot_product_attention.default"]
    # one query per head per sequence (mistral's windowed path folds the query heads of a KV group into the
    # query-length axis: (batch, KV heads, heads / KV heads, head dim))
    assert len(q) == L and all(s[0] == batch and s[1] * s[2] == NH for s in q)
    # the KV write: in place, one token's K and V per layer copied into the cache (batch x KV heads x 1 x head dim
    # each); appended, every layer's K and V concatenated anew, the cached tokens and the new one
    copies = [n.outputs[0].shape for n in g.nodes if n.op == "aten.copy_.default"]
    cats = [n.outputs[0].shape for n in g.nodes if n.op == "aten.cat.default" and n.outputs[0].shape[-2] == tokens]
    if kv_write == "in-place":
        assert copies == [(batch, kv_heads, 1, HD)] * 2 * L and not cats
    else:
        assert cats == [(batch, kv_heads, tokens, HD)] * 2 * L and not copies


# ---- a config is data, never code -------------------------------------------------------------------------------

SRC = str(Path(__file__).resolve().parents[2] / "src")
PROMPT_WORDS = ("custom code", "[y/N]", "trust_remote_code=True")  # transformers' remote-code prompt


def planted_code(folder: Path, marker: Path) -> None:
    """evil.py: a module that writes ``marker`` the moment it is imported (what answering the prompt `y` ran)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                    "from transformers import PretrainedConfig, PreTrainedModel\n"
                                    "class EvilConfig(PretrainedConfig):\n    model_type = 'evil'\n"
                                    "class EvilModel(PreTrainedModel):\n    config_class = EvilConfig\n")


def run_cli(tmp_path: Path, *args: str, stdin: str | None = None, cwd: Path | None = None, timeout: float = 120):
    """``opmap ARGS`` in a subprocess with an empty Hugging Face cache under tmp_path; stdin closed, or ``stdin``."""
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_CACHE": str(tmp_path / "hub"),
           "HF_HUB_OFFLINE": "1", "OPMAP_GRAPH_CACHE": "0", "PYTHONPATH": SRC}
    return subprocess.run([sys.executable, "-m", "opmap.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or tmp_path,
                          **({"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}))


def cache_entry(tmp_path: Path, repo: str, config: dict, rev: str = "a" * 40) -> Path:
    """``repo``'s config.json laid out as huggingface_hub caches it: models--ORG--NAME/snapshots/REV, refs/main."""
    root = tmp_path / "hub" / ("models--" + repo.replace("/", "--"))
    snap = root / "snapshots" / rev
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(config))
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(rev)
    return snap


@pytest.mark.parametrize("route", ["config.json", "folder", "hf:"])
def test_remote_code_is_refused_never_run(tmp_path, route):
    """A config whose model needs the repository's Python (auto_map) is refused in one line naming the config and
    the auto_map entry, without a prompt and without running it: with stdin closed, and with `y` waiting on stdin
    (what ran the planted code before). Two ways in: a model_type transformers knows without an auto model class
    (siglip_text_model: a part of SigLIP), given as a file or a folder; a custom model_type, from the hub cache."""
    marker = tmp_path / "MARKER"
    if route == "hf:":
        snap = cache_entry(tmp_path, "someorg/evil", {"model_type": "evil",
                                                       "auto_map": {"AutoConfig": "evil.EvilConfig",
                                                                    "AutoModel": "evil.EvilModel"}})
        planted_code(snap, marker)
        target, entry, stdin = "hf:someorg/evil", "auto_map['AutoConfig'] = 'evil.EvilConfig'", "y\n"
    else:
        folder = tmp_path / "model"
        planted_code(folder, marker)
        (folder / "config.json").write_text(json.dumps({"model_type": "siglip_text_model",
                                                        "auto_map": {"AutoModel": "evil.EvilModel"}}))
        target = str(folder / "config.json") if route == "config.json" else str(folder)
        entry, stdin = "auto_map['AutoModel'] = 'evil.EvilModel'", (None if route == "config.json" else "y\n")
    r = run_cli(tmp_path, "analyze", target, "--seq", "8", "--out", str(tmp_path / "out"), stdin=stdin)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    named = target if route == "hf:" else str(folder / "config.json")
    assert lines[0].startswith(f"opmap: error: {named}") or named in lines[0]
    assert entry in lines[0] and "never runs their code" in lines[0]
    assert not marker.exists()
    assert not any(w in r.stdout + r.stderr for w in PROMPT_WORDS)
    assert not (tmp_path / "out").exists()


def test_auto_map_beside_transformers_own_class_is_ignored_not_run(tmp_path):
    """A llama config that also names repository code (as many hub configs do): transformers' own LlamaForCausalLM
    is built, the planted module is never imported, and the workload says so."""
    marker = tmp_path / "MARKER"
    planted_code(tmp_path, marker)
    p = write_config(tmp_path, "llama", auto_map={"AutoModelForCausalLM": "evil.EvilModel"})
    w = load_workload(str(p), 1, 8)
    assert type(w.module).__name__ == "LlamaForCausalLM" and w.module.num_parameters() == params_by_hand("llama")
    assert any("auto_map['AutoModelForCausalLM'] = 'evil.EvilModel' ignored" in a for a in w.assumptions)
    assert not marker.exists()


def test_hf_name_never_reads_a_folder_under_the_current_directory(tmp_path, monkeypatch):
    """hf:someorg/somemodel is a hub id looked up in the cache only: ./someorg/somemodel/config.json is not read
    (it was), and the refusal says the name is not cached and that a folder is given as a path; given as a path,
    the same folder builds."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    folder = tmp_path / "someorg" / "somemodel"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", **CONFIGS["llama"]}))
    with pytest.raises(OpmapError) as e:
        load_workload("hf:someorg/somemodel", 1, 8)
    msg = str(e.value)
    assert "'someorg/somemodel' is not in the local Hugging Face cache" in msg
    assert "a folder is given as a path" in msg and "\n" not in msg
    w = load_workload("someorg/somemodel", 1, 8)
    assert w.name == "somemodel" and w.module.num_parameters() == params_by_hand("llama")


@pytest.mark.parametrize("name", ["/etc", "./someorg/somemodel", "../x", "a/b/c", "~/models/x", "a--b/c", ""])
def test_hf_takes_a_hub_id_not_a_path(tmp_path, monkeypatch, name):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(OpmapError, match=r"hf: takes a Hugging Face hub id \(ORG/NAME.*a folder or a config.json is "
                                         r"given as a path"):
        load_workload(f"hf:{name}")


def test_hf_home_locates_the_cache(tmp_path, monkeypatch):
    """Without HF_HUB_CACHE the cache is HF_HOME/hub, as huggingface_hub has it, read when the name is looked up
    (not when a module was imported)."""
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    cache_entry(tmp_path, "opmap-test/home-llama", {"model_type": "llama", **CONFIGS["llama"]})
    w = load_workload("hf:opmap-test/home-llama", 1, 8)
    assert w.name == "hf:opmap-test/home-llama" and w.module.num_parameters() == params_by_hand("llama")


def test_a_cached_config_that_is_not_an_object_is_one_line(tmp_path, monkeypatch):
    """Through hf: a config.json holding a JSON array was a traceback (transformers read it as an object)."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    snap = cache_entry(tmp_path, "opmap-test/list", {})
    (snap / "config.json").write_text("[1, 2]")
    with pytest.raises(OpmapError, match=r"^hf:opmap-test/list is not a JSON object \(got a JSON array\)"):
        load_workload("hf:opmap-test/list")


def test_a_billion_layers_is_refused_in_milliseconds(tmp_path):
    """num_hidden_layers 1,000,000,000 took minutes and 8 GB to build; it is refused before transformers is
    imported. Timed inside a subprocess (so a regression cannot hang this session): under 10 s, generously."""
    p = write_config(tmp_path, "llama", num_hidden_layers=1_000_000_000)
    code = ("import sys, time\nfrom opmap.errors import OpmapError\nfrom opmap.workloads import load_workload\n"
            "t = time.perf_counter()\ntry:\n    load_workload(sys.argv[1], 1, 8)\nexcept OpmapError as e:\n"
            "    print(time.perf_counter() - t, 'transformers' in sys.modules)\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code, str(p)], env={**os.environ, "PYTHONPATH": SRC},
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    seconds, imported = r.stdout.splitlines()[0].split()
    assert float(seconds) < 10 and imported == "False"
    assert "num_hidden_layers must be an integer from 1 to 1,024" in r.stdout and "got 1000000000" in r.stdout


@pytest.mark.parametrize("content,needle", [
    ({"model_type": "t5", "vocab_size": 128, "d_model": 64, "d_ff": 96, "num_layers": 2, "num_heads": 4},
     "model_type 't5' is an encoder-decoder; opmap builds decoder-only models (tested: llama"),
    ({"model_type": "llama", **CONFIGS["llama"], "num_key_value_heads": 3},
     "num_key_value_heads 3 does not divide num_attention_heads 4; accepted: a divisor of 4"),
    ({"model_type": ["llama"]}, "model_type must be a string naming the architecture"),
    ({"model_type": 5}, "model_type must be a string naming the architecture"),
])
def test_newcomer_faults_are_one_line_through_the_cli(tmp_path, capsys, content, needle):
    """Each was a traceback (a T5 config, a list model_type, KV heads that do not divide the heads) or a wrong
    message (a number model_type: 'unknown to transformers')."""
    from opmap.cli import main

    p = tmp_path / "config.json"
    p.write_text(json.dumps(content))
    rc = main(["analyze", str(p), "--seq", "8", "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 2 and len(lines) == 1 and needle in lines[0], err
    assert lines[0].startswith(f"opmap: error: config file {p}") and "Traceback" not in out + err


def test_transformers_warnings_do_not_break_the_one_line(tmp_path):
    """A GPT-2 config with a small vocabulary (GPT-2's default bos/eos token 50256 lies outside it: transformers
    logs two warnings) and an activation transformers lacks: stderr is the one error line, nothing else."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "gpt2", **CONFIGS["gpt2"], "bos_token_id": 50256,
                               "eos_token_id": 50256, "activation_function": "no_such_act"}))
    r = run_cli(tmp_path, "analyze", str(cfg), "--seq", "8")
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"opmap: error: transformers cannot build {cfg} (gpt2)") and "no_such_act" in lines[0]


def test_a_copy_of_a_built_model_runs_its_own_weights():
    """opmap wraps a Hugging Face model's forward (eager-KV marks, one-line errors, the packing probe); a deepcopy
    (opmap quality's reduced-precision twin) must run the copy's weights, not the original's: the wrapper is a method
    bound to the module it is called on, not a closure over the original. With the copy's LM head zeroed, its logits
    are exactly 0 (a Linear without bias over a zero weight) while the original's are not."""
    import copy

    from opmap.cli.common import build_workload

    cfg = str(Path(__file__).parents[2] / "examples" / "tiny-llama.json")
    w = build_workload(cfg, 1, 8, None, "fp32", "cpu")
    twin = copy.deepcopy(w.module)
    with torch.no_grad():
        twin.lm_head.weight.zero_()
        ours, theirs = w.module(**w.inputs).logits, twin(**w.inputs).logits
    assert theirs.abs().max() == 0 and ours.abs().max() > 0
