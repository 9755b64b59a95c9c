"""The zoo: parameter counts against the published figures, worked from each architecture's formula."""

from __future__ import annotations

import pytest
import torch

from opmap.errors import OpmapError
from opmap.workloads import MODELS, build_zoo, load_user, load_workload


def _block(d: int, ffn: int, bias: bool = True) -> int:
    """Pre/post-LN transformer block with biases: QKV + out proj + two-layer MLP + two LayerNorms."""
    return (3 * d * d + 3 * d) + (d * d + d) + (d * ffn + ffn) + (ffn * d + d) + 2 * 2 * d


def _llama(vocab: int, d: int, layers: int, heads: int, kv: int, ffn: int, experts: int = 0) -> int:
    hd = d // heads
    attn = d * d + 2 * d * kv * hd + d * d
    mlp = 3 * d * ffn
    moe = experts * mlp + d * experts if experts else mlp
    return vocab * d * 2 + layers * (attn + moe + 2 * d) + d  # untied embedding and head, final norm


PUBLISHED = {
    # GPT-2 small: HF gpt2 num_parameters() = 124,439,808 (tied head counted once)
    "gpt2": (124_439_808, 50257 * 768 + 1024 * 768 + 12 * _block(768, 3072) + 2 * 768),
    # BERT-base uncased with pooler: HF BertModel = 109,482,240
    "bert-base": (109_482_240, 30522 * 768 + 512 * 768 + 2 * 768 + 2 * 768 + 12 * _block(768, 3072)
                  + 768 * 768 + 768),
    # ViT-B/16: torchvision vit_b_16 = 86,567,656 (patch conv, class token, positions, head)
    "vit-b16": (86_567_656, 3 * 16 * 16 * 768 + 768 + 768 + 197 * 768 + 12 * _block(768, 3072) + 2 * 768
                + 768 * 1000 + 1000),
    # ResNet-50: torchvision resnet50 = 25,557,032 (He et al. 2016; torchvision model card)
    "resnet50": (25_557_032, None),
    # Llama 3 8B / 70B: Meta model card, 8.03B and 70.6B
    "llama-3-8b": (8_030_261_248, _llama(128256, 4096, 32, 32, 8, 14336)),
    "llama-3-70b": (70_553_706_496, _llama(128256, 8192, 80, 64, 8, 28672)),
    # Llama 2 7B / 70B (Touvron et al. 2023): HF Llama-2-7b-hf / -70b-hf num_parameters(); 7B is multi-head
    # (32 KV heads), both have a 32000-token vocabulary
    "llama-2-7b": (6_738_415_616, _llama(32000, 4096, 32, 32, 32, 11008)),
    "llama-2-70b": (68_976_648_192, _llama(32000, 8192, 80, 64, 8, 28672)),
    # Llama 3.1 405B: Meta model card 405B; "The Llama 3 Herd of Models" table 3 (126 layers, d 16384, FFN 53248)
    "llama-3.1-405b": (405_853_388_800, _llama(128256, 16384, 126, 128, 8, 53248)),
    # Mixtral 8x7B: Jiang et al. 2024, 46.7B total
    "mixtral-8x7b": (46_702_792_704, _llama(32000, 4096, 32, 32, 8, 14336, experts=8)),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_parameter_count_matches_published(name):
    published, formula = PUBLISHED[name]
    if formula is not None:
        assert formula == published  # the formula reproduces the published figure
    w = build_zoo(name, 1, 32 if MODELS[name].kind == "text" else 224)  # ViT positions depend on the image
    n = sum(p.numel() for p in w.module.parameters())
    assert n == published == MODELS[name].published_params
    assert next(w.module.parameters()).device.type == "meta"


def test_mixtral_active_parameters():
    """12.9B active per token (Jiang et al. 2024): everything but 6 of the 8 experts in each layer."""
    total = PUBLISHED["mixtral-8x7b"][0]
    active = total - 32 * 6 * 3 * 4096 * 14336
    assert abs(active - 12.9e9) / 12.9e9 < 0.01


def test_gpt2_head_is_tied():
    w = build_zoo("gpt2", 1, 8)
    assert w.module.lm_head.weight is w.module.wte.weight


def test_dtype_casts_module_and_float_inputs():
    w = build_zoo("vit-b16", 2, 32, "bf16")
    assert next(w.module.parameters()).dtype == torch.bfloat16
    assert w.inputs[0].dtype == torch.bfloat16 and w.inputs[0].shape == (2, 3, 32, 32)
    t = build_zoo("gpt2", 1, 8, "fp16")
    assert t.inputs[0].dtype == torch.long


def test_moe_balanced_assumption_is_stated():
    w = build_zoo("mixtral-8x7b", 1, 16)
    assert any("balanced" in a for a in w.assumptions)


def test_moe_routing_runs_real_on_cpu():
    """On real tensors the experts get the router's choices (uneven), and the result equals a dense
    per-token reference computation."""
    from opmap.workloads.llama import LlamaConfig, SparseMoeBlock

    torch.manual_seed(0)
    blk = SparseMoeBlock(LlamaConfig(dim=16, ffn_dim=24, n_experts=4, top_k=2))
    x = torch.randn(1, 12, 16)
    y = blk(x)
    xf = x.reshape(12, 16)
    probs = torch.softmax(blk.gate(xf), -1)
    w, idx = probs.topk(2, -1)
    w = w / w.sum(-1, keepdim=True)
    ref = torch.stack([sum(w[t, j] * blk.experts[int(idx[t, j])](xf[t]) for j in range(2)) for t in range(12)])
    assert torch.allclose(y.reshape(12, 16), ref, atol=1e-5)


@pytest.mark.parametrize("name,batch,seq,msg", [
    ("gpt2", 1, 2048, "from 1 to 1024"),
    ("bert-base", 0, 16, "batch must be at least 1"),
    ("vit-b16", 1, 100, "multiple of its 16-pixel patch"),
    ("nope", 1, 16, "accepted: gpt2"),
])
def test_bad_shapes_and_names(name, batch, seq, msg):
    with pytest.raises(OpmapError, match=msg):
        load_workload(name, batch, seq)


def test_bad_dtype():
    with pytest.raises(OpmapError, match="accepted: fp32, tf32, bf16, fp16"):
        build_zoo("gpt2", 1, 8, "fp64")


USER = '''
import torch, torch.nn as nn

def make():
    m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    return m, (torch.randn(4, 32),)

def not_a_pair():
    return 3
'''


def test_user_file_factory_runs_on_meta(tmp_path):
    f = tmp_path / "mine.py"
    f.write_text(USER)
    w = load_user(f"{f}:make", dtype="bf16")
    assert next(w.module.parameters()).device.type == "meta"
    assert w.inputs[0].device.type == "meta" and w.inputs[0].dtype == torch.bfloat16
    assert w.batch == 4
    with pytest.raises(OpmapError, match="must return"):
        load_user(f"{f}:not_a_pair")
    with pytest.raises(OpmapError, match="no callable"):
        load_user(f"{f}:missing")
    with pytest.raises(OpmapError, match="does not exist"):
        load_user(f"{tmp_path}/nope.py:make")
    bad = tmp_path / "bad.py"
    bad.write_text("import nonexistent_module_xyz\n")
    with pytest.raises(OpmapError, match="importing .* failed: ModuleNotFoundError"):
        load_user(f"{bad}:make")


def test_load_workload_refuses_a_device_before_building(monkeypatch):
    monkeypatch.setattr("opmap.workloads.zoo.build_zoo", lambda *a, **k: pytest.fail("built"))
    with pytest.raises(OpmapError, match="unknown capture device 'tpu'; accepted: meta, cpu, cuda"):
        load_workload("gpt2", 1, 8, "fp32", "tpu")
    if not torch.cuda.is_available():
        with pytest.raises(OpmapError, match="no CUDA device is available here; accepted: meta, cpu"):
            load_workload("gpt2", 1, 8, "fp32", "cuda")


def test_load_user_checks_the_dtype_before_running_the_file(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("raise RuntimeError('imported')\n")
    with pytest.raises(OpmapError, match="unknown dtype 'fp64'"):
        load_user(f"{f}:make", dtype="fp64")


@pytest.mark.parametrize("name,kv,theta,vocab", [
    ("llama-2-7b", 32, 10000.0, 32000), ("llama-2-70b", 8, 10000.0, 32000), ("llama-3.1-405b", 8, 500000.0, 128256)])
def test_llama_presets_heads_rope_and_vocab(name, kv, theta, vocab):
    """Llama 2 7B is multi-head (K and V as wide as Q), 70B and 405B group 8 KV heads; Llama 2's rope theta is
    10000, Llama 3's 500000 (the inverse frequencies' second entry is theta ** (-2 / head_dim))."""
    w = build_zoo(name, 1, 16)
    attn = w.module.layers[0].self_attn
    assert attn.kv == kv and attn.k_proj.out_features == kv * attn.hd == attn.v_proj.out_features
    assert attn.hd == 128 and w.module.embed_tokens.num_embeddings == vocab
    c = w.module.config
    assert c.rope_theta == theta and c.max_seq == MODELS[name].max_seq


def test_megatron_style_gpt_saves_korthikanti_activations():
    # GPT2Config(attention="unfused", dropout=0.1) is Megatron-LM's 2021 layer: scores in memory (baddbmm with
    # the scale, softmax, dropout, bmm) and hidden dropouts. Korthikanti et al. 2022, eq. 1: a layer keeps
    # s b h (34 + 5 a s / h) bytes in fp16; + 16 s b for the two LayerNorms' fp32 mean and rstd, which the
    # formula leaves out. Selective recomputation drops the 5 a s^2 b term: 34 s b h (+ 16 s b).
    import torch

    from opmap.capture import capture
    from opmap.mapping.activations import saved_activation_bytes
    from opmap.workloads.gpt2 import GPT2, GPT2Config

    s, b, h, a = 32, 2, 64, 4
    cfg = GPT2Config(vocab_size=128, block_size=s, n_layer=2, n_head=a, n_embd=h, attention="unfused", dropout=0.1)
    with torch.device("meta"):
        m, x = GPT2(cfg).to(torch.float16), torch.zeros(b, s, dtype=torch.long)
    full = saved_activation_bytes(m, (x,))
    assert full.by_block["h.0"] == full.by_block["h.1"] == s * b * h * (34 + 5 * a * s / h) + 16 * s * b
    sel = saved_activation_bytes(m, (x,), recompute="selective")
    assert sel.by_block["h.0"] == 34 * s * b * h + 16 * s * b
    ops = [n.op for n in capture(m, (x,), train=True).nodes]
    assert ops.count("aten.baddbmm.default") == 2 and "aten.scaled_dot_product_attention.default" not in ops
    assert ops.count("aten.native_dropout.default") == 2 * 3  # attention probabilities, attention out, MLP out


def test_llama_head_width_apart_from_the_model_width():
    # MaxText's 16B-scale decoder (configs/base.yml at AI-Hypercomputer/maxtext 04262f3cf, global_parameter_scale
    # 16): width 4096, 64 heads of 128 (8192 wide), MLP 28672, 32 layers, vocabulary 32000, untied output.
    # Parameters by the formula: per block 4 x 4096 x 8192 (q, k, v, o) + 3 x 4096 x 28672 (SwiGLU) + 2 x 4096
    # (RMSNorm weights); + 2 x 32000 x 4096 (embedding, output) + 4096 (final norm) = 15,831,666,688
    import torch

    from opmap.capture import capture
    from opmap.workloads.llama import Llama, LlamaConfig

    cfg = LlamaConfig(vocab_size=32000, dim=4096, n_layer=32, n_head=64, n_kv_head=64, ffn_dim=28672, head_dim=128)
    assert cfg.hd == 128 and LlamaConfig(dim=4096, n_head=32).hd == 128 and LlamaConfig(dim=4096, n_head=64).hd == 64
    with torch.device("meta"):
        m = Llama(cfg)
    block = 4 * 4096 * 8192 + 3 * 4096 * 28672 + 2 * 4096
    assert sum(p.numel() for p in m.parameters()) == 32 * block + 2 * 32000 * 4096 + 4096 == 15_831_666_688
    small = LlamaConfig(vocab_size=64, dim=32, n_layer=1, n_head=4, n_kv_head=2, ffn_dim=48, head_dim=16, max_seq=8)
    with torch.device("meta"):
        m, x = Llama(small), torch.zeros(2, 8, dtype=torch.long)
    sdpa = [n for n in capture(m, (x,)).nodes if n.op == "aten.scaled_dot_product_attention.default"]
    # 4 query heads of 16 (64 wide, twice the model width), 2 KV heads of 16
    assert len(sdpa) == 1
    assert tuple(sdpa[0].inputs[0].shape) == (2, 4, 8, 16) and tuple(sdpa[0].inputs[1].shape) == (2, 2, 8, 16)


def test_gpt_attention_dropout_is_in_the_fused_kernel_in_training_only():
    # GPT2Config(dropout=0.1): the SDPA call carries dropout_p 0.1 in a training capture (Megatron's and NeMo's GPT
    # runs set attention dropout 0.1) and 0 in inference; the zoo's gpt2 (dropout 0) carries 0 in both
    import torch

    from opmap.capture import capture
    from opmap.workloads.gpt2 import GPT2, GPT2Config

    def sdpa_dropout(p, train):
        with torch.device("meta"):
            m, x = GPT2(GPT2Config(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=16, dropout=p)), \
                torch.zeros(1, 16, dtype=torch.long)
        g = capture(m, (x,), train=train)
        return [n.args.get("dropout_p") for n in g.nodes if n.op == "aten.scaled_dot_product_attention.default"]

    assert sdpa_dropout(0.1, True) == [0.1] and sdpa_dropout(0.1, False) == [0.0]
    assert sdpa_dropout(0.0, True) == [0.0]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_logits_to_keep_gives_the_last_rows_of_the_full_logits(family):
    """The zoo decoders take transformers' ``logits_to_keep`` (serve prices a prompt's LM head over its last token,
    as engines sample it): on real CPU weights, the kept rows are the full forward's last rows, and 0 keeps all."""
    from opmap.workloads.gpt2 import GPT2, GPT2Config
    from opmap.workloads.llama import Llama, LlamaConfig

    torch.manual_seed(0)
    if family == "llama":
        model = Llama(LlamaConfig(vocab_size=97, dim=64, n_layer=2, n_head=4, n_kv_head=2, ffn_dim=96))
    else:
        model = GPT2(GPT2Config(vocab_size=97, block_size=32, n_layer=2, n_head=4, n_embd=64))
    ids = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        full = model(ids)
        assert full.shape == (2, 11, 97) and torch.equal(model(ids, None, 0), full)
        for keep in (1, 3):
            kept = model(ids, None, keep)
            assert kept.shape == (2, keep, 97)
            torch.testing.assert_close(kept, full[:, -keep:], rtol=1e-5, atol=1e-5)
