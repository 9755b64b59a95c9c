"""Per-device memory under a layout (opmap.mapping.sharded_memory): the activations saved for backward against
Korthikanti et al. 2022 (arXiv 2205.05198) on a zoo GPT and against PyTorch's own saved tensors on a Hugging Face
Llama run for real on the CPU; the KV cache of an inference step against 2 x layers x KV heads / tp x head dim x
bytes x batch x tokens.

Korthikanti's per-layer activations in fp16 / bf16 (sec. 4, eq. 1-4), with flash attention (no S x S tensor: the
5 a s / h term goes): 34 s b h with no parallelism, s b h (10 + 24 / t) under tensor parallelism t, 34 s b h / t
with sequence parallelism too; data parallelism changes nothing. The 10 s b h that tensor parallelism leaves whole:
the two LayerNorm inputs (4), the inputs of the QKV and first MLP GEMMs (4), the two 1-byte dropout masks (2). The
formula leaves out what these tests add by hand beside it: the flash kernel's fp32 log-sum-exp (4 a s b, split
with the heads) and the LayerNorms' fp32 mean and 1 / std (16 s b)."""

from __future__ import annotations

import json

import pytest
import torch

from opmap.analyze import analyze_graph
from opmap.capture import capture
from opmap.capture.training import training_loss
from opmap.cli import main
from opmap.hardware import get_hardware
from opmap.mapping.activations import saved_activation_bytes
from opmap.mapping.sharding import Parallelism, SavedPerBlock, Sharder, saved_per_block, sharded_memory
from opmap.workloads.gpt2 import GPT2, GPT2Config
from opmap.workloads.zoo import Workload

B, S, H, A, L, V = 2, 96, 128, 4, 2, 256  # S is not the head dim (32): an S x S tensor is told by its shape
SBH, SB = S * B * H, S * B


def _gpt():
    """The zoo's GPT-2 (opmap.workloads.gpt2) with Megatron's dropout 0.1, small, on meta, and its input."""
    cfg = GPT2Config(vocab_size=V, block_size=128, n_layer=L, n_head=A, n_embd=H, dropout=0.1)
    with torch.device("meta"):
        m = GPT2(cfg).to(torch.bfloat16)
    return m, torch.zeros(B, S, dtype=torch.long, device="meta")


@pytest.fixture(scope="module")
def gpt():
    """The small GPT's training graph's Sharder and the saved activations read off it."""
    m, x = _gpt()
    g = capture(m, (x,), train=True)
    s = Sharder(analyze_graph(g, Workload("gpt", None, None, B, S), get_hardware("h100-sxm"), "bf16"))
    return s, saved_per_block(g, s.roles, S)


def test_saved_per_block_is_korthikanti_and_what_pytorch_saves(gpt):
    """Read off the graph and measured by PyTorch's saved-tensor hooks on meta (the loss included): the same."""
    s, saved = gpt
    m, x = _gpt()
    measured = saved_activation_bytes(m, (x,), loss=training_loss)
    assert saved.split_bytes == 24 * SBH + 4 * A * SB  # Q, K, V 6 + attention output 2 + GeLU in 8 + out 8; LSE
    assert saved.replicated_bytes == 10 * SBH + 16 * SB  # Korthikanti's 10 s b h; LayerNorm statistics
    assert measured.per_block_bytes == 34 * SBH + 4 * A * SB + 16 * SB
    assert L * saved.block_bytes + saved.outside_bytes == measured.total_bytes


def _outside(t: int, sp: bool) -> float:
    """Saved outside the layers (not in Korthikanti's per-layer count): before them the embedding's output 2 s b h
    (SP scatters it over t) and the token and position ids (int64); after them the final LayerNorm's output 2 s b h
    and statistics 8 s b (over t with SP), the loss's fp32 log-softmax over the vocabulary 4 s b V (split over t:
    vocabulary-parallel cross-entropy), its int64 target and its fp32 total weight (a 4-byte scalar: whether a rank
    keeps its own copy is below the tests' tolerance)."""
    rep = t if sp else 1
    return (2 * SBH / rep + (8 * SB + 8 * S) / rep + (2 * SBH + 8 * SB) / rep + 4 * SB * V / t
            + (8 * SB + 4) / rep)


@pytest.mark.parametrize("p", [
    Parallelism(), Parallelism(dp=2), Parallelism(dp=8), Parallelism(tp=2), Parallelism(tp=4),
    Parallelism(tp=2, sp=True), Parallelism(tp=4, sp=True), Parallelism(tp=2, dp=2, zero=2),
], ids=lambda p: p.label())
def test_layout_activations_per_device_are_korthikanti(gpt, p):
    """llama-3-8b's 12.8 GiB fell to 5.9 GiB under any layout, dp 2 or dp 8 included, before the fix."""
    s, saved = gpt
    t = p.tp
    per_layer = 34 * SBH / t + (4 * A * SB + 16 * SB) / t if p.sp else SBH * (10 + 24 / t) + 4 * A * SB / t + 16 * SB
    golden = L * per_layer + _outside(t, p.sp)
    mem = sharded_memory(p, s, saved, "bf16", True, S)
    assert mem.activations_bytes == pytest.approx(golden, rel=1e-5)


def test_the_first_pipeline_stage_holds_its_microbatches_in_flight(gpt):
    """pp 2, 4 microbatches: under 1F1B the first stage holds min(m, pp) = 2 microbatches' activations of its one
    layer and of what precedes the layers (Korthikanti sec. 4.2.3); the last stage one microbatch's of its layer
    and the head (smaller here)."""
    s, saved = gpt
    p = Parallelism(pp=2, microbatch=B, global_batch=4 * B)
    per_layer = 34 * SBH + 4 * A * SB + 16 * SB
    first = 2 * (per_layer + 2 * SBH + 8 * SB + 8 * S)
    last = per_layer + 2 * SBH + 8 * SB + 4 * SB * V + 8 * SB + 4
    assert first > last
    assert sharded_memory(p, s, saved, "bf16", True, S).activations_bytes == pytest.approx(first, rel=1e-5)


# -- a Hugging Face config.json, run for real ---------------------------------------------------------------------

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": 256,
         "intermediate_size": 896, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
         "max_position_embeddings": 4096, "tie_word_embeddings": False}
HS, HB = 64, 1  # sequence, microbatch of the Hugging Face runs


def _real_saved(cfg: dict) -> dict[str, float]:
    """Bytes of the storages PyTorch's autograd saves in a real bf16 forward and loss of the config's model on the
    CPU (real tensors, SDPA attention), by decoder layer ("" outside them), each storage once, parameters never."""
    from transformers import LlamaConfig, LlamaForCausalLM

    conf = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("model_type", "architectures")})
    conf._attn_implementation = "sdpa"
    torch.manual_seed(0)
    m = LlamaForCausalLM(conf).to(torch.bfloat16).train()
    params = {p.untyped_storage().data_ptr() for p in m.parameters()}
    where, seen, by = [""], set(), {}
    for i, layer in enumerate(m.model.layers):
        layer.register_forward_pre_hook(lambda mod, a, i=i: where.__setitem__(0, str(i)))
        layer.register_forward_hook(lambda mod, a, o: where.__setitem__(0, ""))

    def pack(x):
        st = x.untyped_storage()
        if st.data_ptr() not in seen and st.data_ptr() not in params:
            seen.add(st.data_ptr())
            by[where[0]] = by.get(where[0], 0.0) + st.nbytes()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        loss = training_loss(m(torch.randint(0, cfg["vocab_size"], (HB, HS))).logits)
    del loss
    return by


@pytest.mark.parametrize("layout", [{}, {"dp": 2}, {"tp": 2}, {"tp": 2, "sp": True}], ids=str)
def test_hf_llama_config_activations_per_device_against_pytorch(tmp_path, capsys, layout):
    """A Llama config.json analysed for training with and without a layout: the activations per device are what
    PyTorch saves running the same config for real (data parallelism: unchanged); under tensor parallelism t its
    decoder layers' bytes less the replicated part over t, the replicated part being the two RMSNorms a layer runs
    (transformers' LlamaRMSNorm, 8 h + 4 bytes a token each: the fp32 copy of the input 4 h, its 1 / rms 4, the
    bf16 normalized 2 h the weight's gradient reads, the weighted output 2 h the projections read), and the loss's
    fp32 log-softmax 4 s b V split too (vocabulary-parallel). With SP the norms split as well, the final one and
    the rotary tables layer 0 keeps for all included (Korthikanti sec. 4.2.2)."""
    real = _real_saved(LLAMA)
    h, layers, vocab = LLAMA["hidden_size"], LLAMA["num_hidden_layers"], LLAMA["vocab_size"]
    t, sp = layout.get("tp", 1), layout.get("sp", False)
    layer = real["1"]  # a middle layer (layer 0 also keeps the rotary tables every layer reads)
    norm = (8 * h + 4) * HS * HB
    split = layers * (layer - 2 * norm) + 4 * HS * HB * vocab
    if sp:  # the layers' norms, the final norm and the rotary tables too
        split += layers * 2 * norm + norm + (real["0"] - real["1"])
    golden = sum(real.values()) - split * (1 - 1 / t)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA))
    args = [a for k, v in layout.items() for a in ((f"--{k}",) if v is True else (f"--{k}", v))]
    rc = main([str(a) for a in ("analyze", cfg, "--phase", "train", "--seq", HS, "--microbatch", HB, "--no-store",
                                "--rows", 1, "--out", tmp_path / "out", *args)])
    assert rc == 0, capsys.readouterr().err
    act = json.loads((tmp_path / "out" / "analysis.json").read_text())["totals"]["memory_fit"]["per_device"][
        "activations_bytes"]
    # the int64 token ids and loss target (a few hundred bytes: opmap splits them with the rest under SP) aside
    assert act == pytest.approx(golden, rel=1e-3 if sp else 1e-6)


def test_inference_kv_cache_per_device_is_the_formula(gpt):
    """A prefill step of B sequences of S tokens, laid out: its KV cache per device is 2 x layers x KV heads /
    min(tp, KV heads) x head dim x 2 bytes x batch x tokens, its layers / pp; with m microbatches a replica holds
    every sequence's."""
    cfg = GPT2Config(vocab_size=V, block_size=128, n_layer=4, n_head=A, n_embd=H)
    with torch.device("meta"):
        m = GPT2(cfg).to(torch.bfloat16)
    x = torch.zeros(B, S, dtype=torch.long, device="meta")
    a = analyze_graph(capture(m, (x,)), Workload("gpt", None, None, B, S), get_hardware("h100-sxm"), "bf16")
    s = Sharder(a)
    hd = H // A
    for p in (Parallelism(), Parallelism(tp=2), Parallelism(tp=4), Parallelism(tp=2, pp=2),
              Parallelism(pp=2, dp=2, microbatch=B, global_batch=4 * B)):
        mem = sharded_memory(p, s, SavedPerBlock(0.0, 0.0, 0.0, 0.0), "bf16", False, S)
        kv = 2 * 4 * (A / p.tp) * hd * 2 * B * S / p.pp * p.microbatches
        assert mem.kv_cache_bytes == pytest.approx(kv, rel=1e-12), p.label()


# -- fp8 training: Transformer Engine saves a Linear's input as its fp8 copy ----------------------------------------
# TE's Linear / LayerNormLinear / LayerNormMLP save the e4m3 copy of the GEMM input (1 byte an element) for the weight
# gradient instead of the bf16 input (NVIDIA/TransformerEngine transformer_engine/pytorch/module/linear.py, v1.x,
# commit 0004dbd0231c: ``saved_inputmat_t`` from ``fp8_cast_transpose_fused``). A storage another backward node also
# reads (the attention output, which the fused attention's backward keeps) stays in bf16 and gains the 1-byte copy.

def test_fp8_training_saves_the_linear_inputs_at_one_byte_zoo_gpt(gpt):
    """Korthikanti's 34 s b h under TE fp8: the QKV input and the first MLP GEMM's input (the LayerNorm outputs,
    2 s b h each, replicated) and the second MLP GEMM's input (the GeLU output, 8 s b h, split) at half; the
    attention output (2 s b h, split) the attention's backward reads too, so its 1-byte copy adds s b h."""
    s, bf16 = gpt
    m, x = _gpt()
    g = capture(m, (x,), train=True)
    fp8 = saved_per_block(g, s.roles, S, fp8=True)
    assert fp8.replicated_bytes == bf16.replicated_bytes - 2 * SBH == 8 * SBH + 16 * SB
    assert fp8.split_bytes == bf16.split_bytes - 4 * SBH + SBH == 21 * SBH + 4 * A * SB
    assert fp8.input_bytes == bf16.input_bytes and fp8.outside_bytes == bf16.outside_bytes


def test_fp8_training_saves_the_linear_inputs_at_one_byte_hf_llama(tmp_path):
    """A Llama config.json (the bf16 count is what PyTorch saves, test_hf_llama_config_activations_per_device_...)
    under TE fp8: the two RMSNorm outputs the projections read (h each a token, replicated) and the down projection's
    input (the intermediate size I) at 1 byte an element; the attention output the o projection reads (h), kept by
    the attention's backward, plus its 1-byte copy. Per block: replicated - 2 h s b, split - I s b + h s b."""
    from opmap.workloads.hf import build_hf

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA))
    w = build_hf(str(cfg), HB, HS, "bf16", "meta")
    g = capture(w.module, w.inputs, train=True)
    s = Sharder(analyze_graph(g, Workload("llama", None, None, HB, HS), get_hardware("h100-sxm"), "fp8"))
    bf16, fp8 = saved_per_block(g, s.roles, HS), saved_per_block(g, s.roles, HS, fp8=True)
    h, inter, tokens = LLAMA["hidden_size"], LLAMA["intermediate_size"], HS * HB
    assert fp8.replicated_bytes == bf16.replicated_bytes - 2 * h * tokens
    assert fp8.split_bytes == bf16.split_bytes - inter * tokens + h * tokens
    assert fp8.outside_bytes == bf16.outside_bytes
