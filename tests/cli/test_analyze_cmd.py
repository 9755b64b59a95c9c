"""opmap analyze: outputs written, bad input answered in one line with exit status 2, before the work."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch


def test_analyze_writes_three_files(tmp_path, cli):
    rc, out, err = cli("analyze", "gpt2", "--hardware", "h100-sxm", "--seq", "64", "--dtype", "bf16",
                       "--out", tmp_path)
    assert rc == 0, err
    assert {p.name for p in tmp_path.iterdir()} == {"analysis.json", "sheet.csv", "sheet.md", "kernels.csv"}
    krows = list(csv.DictReader((tmp_path / "kernels.csv").open()))
    assert len(krows) == json.loads((tmp_path / "analysis.json").read_text())["fusion"]["kernels"]
    d = json.loads((tmp_path / "analysis.json").read_text())
    rows = list(csv.DictReader((tmp_path / "sheet.csv").open()))
    assert len(rows) == len(d["nodes"]) == d["totals"]["nodes"]
    assert d["assumptions"]["hardware"] == "h100-sxm" and d["assumptions"]["seq"] == 64
    md = (tmp_path / "sheet.md").read_text()
    assert md.startswith("# opmap analysis: gpt2 on h100-sxm") and "## Assumptions" in md
    assert "Kernels (eager)" in out and "Operators" in out and "predicted MFU" in out and "Layer types" in out


@pytest.mark.parametrize("args,needle", [
    (("gpt3",), "unknown model 'gpt3'; accepted: gpt2"),
    (("gpt2", "--hardware", "h1000"), "unknown hardware 'h1000'; accepted:"),
    (("gpt2", "--dtype", "fp5"), "unknown dtype 'fp5'; accepted: fp32, tf32, bf16, fp16, fp8, int8, int4"),
    (("gpt2", "--seq", "4096"), "gpt2 takes --seq from 1 to 1024"),
    (("resnet50", "--seq", "128"), "takes --image-size, not --seq"),
    (("gpt2", "--image-size", "128"), "takes --seq, not --image-size"),
    (("gpt2", "--device", "tpu"), "unknown capture device 'tpu'; accepted: meta, cpu, cuda"),
    (("gpt2", "--layer-type", "h.*=blob"), "PATTERN=TYPE"),
    (("gpt2", "--batch", "many"), "--batch"),
    (("llama-3-70b", "--device", "cpu"), "use --device meta"),
    (("gpt2", "--fusion", "xla"), "unknown fusion policy 'xla'; accepted: eager, compiler"),
    (("gpt2", "--fusion-plan", "/no/such/plan.json"), "fusion plan /no/such/plan.json does not exist"),
    (("resnet50", "--layout", "nhwc8"), "unknown layout 'nhwc8'; accepted: nchw, channels_last"),
    (("gpt2", "--quality", "/no/such/quality.json", "--dtype", "int8"), "quality file /no/such/quality.json not found"),
])
def test_bad_input_one_line_exit_2(tmp_path, refused, args, needle):
    out_dir = tmp_path / "out"
    refused("analyze", *args, "--out", out_dir, needle=needle)
    assert not out_dir.exists()  # nothing written


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_device(refused):
    refused("analyze", "gpt2", "--device", "cuda", needle="no CUDA device is available here; accepted: meta, cpu")


@pytest.mark.parametrize("args,needle", [
    (("--fusion", "xla"), "unknown fusion policy"),
    (("--fusion", "xla", "--device", "cpu"), "unknown fusion policy"),
    (("--fusion-plan", "/no/such/plan.json"), "does not exist"),
    (("--dtype", "int8", "--quality", "/no/such/quality.json"), "quality file /no/such/quality.json not found"),
    # read without end before (MemoryError), or blocking on a FIFO: a quality file is a bounded regular file
    (("--dtype", "int8", "--quality", "/dev/zero"), "quality file /dev/zero is a device: expected a regular file"),
    (("--dtype", "int8", "--quality", "/tmp"), "quality file /tmp is a folder: expected a regular file"),
])
def test_bad_options_fail_before_the_capture(refused, fail_if_called, args, needle):
    fail_if_called("opmap.analyze.capture")
    refused("analyze", "gpt2", "--seq", "8", *args, needle=needle)


@pytest.mark.parametrize("args,needle", [
    (("gpt2", "--hardware", "h1000"), "unknown hardware"),
    (("gpt2", "--layer-type", "x=blob"), "PATTERN=TYPE"),
    (("resnet50", "--seq", "64"), "takes --image-size"),
    (("llama-3-70b", "--device", "cpu"), "use --device meta"),
])
def test_bad_options_fail_before_the_build(refused, fail_if_called, args, needle):
    fail_if_called("opmap.workloads.load_workload")
    refused("analyze", *args, needle=needle)


def test_failed_run_keeps_earlier_outputs(tmp_path, cli):
    assert cli("analyze", "bert-base", "--seq", "16", "--out", tmp_path)[0] == 0
    before = (tmp_path / "analysis.json").read_text()
    rc, _, _ = cli("analyze", "bert-base", "--seq", "9999", "--out", tmp_path)
    assert rc == 2 and (tmp_path / "analysis.json").read_text() == before


def test_unwritable_out_is_one_line(tmp_path, cli):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc, _, err = cli("analyze", "gpt2", "--seq", "8", "--out", blocker / "sub")
    assert rc == 2 and "cannot create output folder" in err
    assert blocker.read_text() == "x"


def test_user_model_file(tmp_path, cli):
    f = tmp_path / "net.py"
    f.write_text("import torch\n"
                 "def build():\n"
                 "    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU())\n"
                 "    return m, torch.randn(2, 3, 16, 16)\n")
    rc, _, err = cli("analyze", f"{f}:build", "--hardware", "l4", "--dtype", "fp16", "--out", tmp_path / "o")
    assert rc == 0, err
    d = json.loads((tmp_path / "o" / "analysis.json").read_text())
    conv = [n for n in d["nodes"] if n["layer_type"] == "conv"]
    assert conv and conv[0]["matrix_flops"] == 2 * 2 * 8 * 14 * 14 * 3 * 9


def test_user_model_bad_dtype_fails_before_its_file_runs(tmp_path, refused):
    f = tmp_path / "net.py"
    f.write_text("raise SystemExit('imported')\n")
    refused("analyze", f"{f}:build", "--dtype", "fp5", needle="unknown dtype 'fp5'")


def test_layout_and_fusion_reach_the_analysis(tmp_path, cli):
    rc, _, err = cli("analyze", "resnet50", "--image-size", "64", "--layout", "channels_last", "--fusion", "compiler",
                     "--out", tmp_path)
    assert rc == 0, err
    d = json.loads((tmp_path / "analysis.json").read_text())
    assert d["assumptions"]["fusion_policy"].startswith("compiler")
    assert any("channels_last" in n for n in d["assumptions"]["workload_notes"])


def test_hardware_name_any_case_and_alias(cli, tiny_model):
    rc, out, err = cli("analyze", tiny_model, "--hardware", "H200")
    assert rc == 0 and "hardware h200 " in out, err
    rc, out, err = cli("analyze", tiny_model, "--hardware", "h100")
    assert rc == 0 and "note: hardware 'h100' taken as catalog entry 'h100-sxm'" in out, err
    assert "hardware h100-sxm " in out


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_model_shape_error_one_paragraph_exit_2(tmp_path, refused, device):
    f = tmp_path / "bad.py"
    f.write_text("import torch\n"
                 "def bad():\n"
                 "    return torch.nn.Sequential(torch.nn.Linear(4, 8)), (torch.randn(2, 5),)\n")
    line = refused("analyze", f"{f}:bad", "--device", device, needle="the model's forward fails")
    assert "module '0' (Linear)" in line and "addmm" in line and "2x5" in line



def test_layer_type_override_matching_nothing_warns(cli, tiny_model):
    rc, out, err = cli("analyze", tiny_model, "--layer-type", "blocks.*=mlp", "--layer-type", "1=elementwise")
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 0 and len(lines) == 1, err
    assert lines[0].startswith("opmap: warning: --layer-type blocks.*=mlp matched no module")


def test_70b_on_one_h200_fits_in_binary_memory_and_caps_the_context_at_the_model(cli):
    """Llama-3-70B's 70,553,706,496 bf16 weights are 141.1e9 B = 131.4 GiB; an H200's 141 GB of HBM3e is binary
    (141 GiB), so the weights fit (in decimal GB they seemed not to); memory alone would hold a longer context than
    the model's 8192 positions, which is what is offered."""
    rc, out, err = cli("analyze", "llama-3-70b", "--hardware", "h200", "--seq", "8", "--rows", "1")
    assert rc == 0, err
    assert "memory: fits: the weights take 131.4 GiB at bf16" in out and "of 141 GiB" in out
    assert "longest context 8192 (the model's position limit)" in " ".join(out.split())


def test_analyze_a_config_json(tmp_path, cli, refused):
    """path/to/config.json: built by transformers on meta and analysed; a bad one is refused in one line."""
    pytest.importorskip("transformers")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96,
                               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}))
    rc, out, err = cli("analyze", cfg, "--seq", "16", "--rows", "3")
    assert rc == 0, err
    assert "Hugging Face llama built by transformers" in out
    bad = tmp_path / "bad.json"
    bad.write_text('{"model_type": "no-such-arch"}')
    refused("analyze", bad, needle="model_type 'no-such-arch' is unknown to transformers")
    refused("analyze", tmp_path / "missing.json", needle="does not exist; accepted: path/to/config.json or hf:NAME")


def _totals(cli, *args) -> dict:
    rc, out, err = cli("analyze", *args, "--rows", "1", "--no-store")
    assert rc == 0, err
    assert "Traceback" not in out + err and "every op has a cost rule (0 uncounted)" in out
    out_dir = args[args.index("--out") + 1]
    return json.loads((Path(out_dir) / "analysis.json").read_text())


def test_a_vit_config_is_fed_pixel_values(tmp_path, cli, published_config):
    """ViT-B/16 at 224 (hub: google/vit-base-patch16-224, ViTForImageClassification). Before: AttributeError
    (opmap fed input_ids to a vision model). Parameters 86,567,656 (Dosovitskiy et al. 2021 Table 1: 86 M; patch
    embedding 768 x 3 x 16 x 16 + 768, class token and 197 positions 198 x 768, per layer QKV 3 x (768^2 + 768), output
    768^2 + 768, MLP 2 x 768 x 3,072 + 3,072 + 768, two LayerNorms 4 x 768; final LayerNorm 2 x 768; head 768 x
    1,000 + 1,000). Multiply-adds per image 17.56 G (the "17.6 GFLOPs" common counts give, counting one a FLOP):
    patches 196 x 768 x 768, per layer 197 x 768 x (3 x 768 + 768 + 2 x 3,072) and the attention products
    2 x 12 heads x 197^2 x 64, the head 768 x 1,000; at 2 FLOPs each, 35.13 GFLOPs."""
    d = _totals(cli, published_config("google/vit-base-patch16-224"), "--out", tmp_path)
    layer = 3 * (768 ** 2 + 768) + 768 ** 2 + 768 + 2 * 768 * 3072 + 3072 + 768 + 4 * 768
    assert d["totals"]["params"] == 768 * 3 * 16 * 16 + 768 + 198 * 768 + 12 * layer + 2 * 768 + 768 * 1000 + 1000
    macs = 196 * 768 * 768 + 12 * (197 * 768 * (3 * 768 + 768 + 2 * 3072) + 2 * 12 * 197 ** 2 * 64) + 768 * 1000
    assert d["totals"]["macs"] == macs == 17_563_828_224
    assert d["totals"]["matrix_flops"] == 2 * macs
    notes = " ".join(d["assumptions"]["workload_notes"])
    assert "input pixel_values of 1 x 3 x 224 x 224 (ViTForImageClassification)" in notes
    assert "no KV cache" not in notes


def test_a_config_without_sdpa_attention_runs_eager(tmp_path, cli, published_config):
    """Gemma-2 2B (hub: google/gemma-2-2b): transformers' Gemma2 has no SDPA attention (logit softcapping). Before:
    refused, the message cut mid-word. Now built with its eager attention: the scores over every (query, key)
    pair, 256^2 of them at seq 256, not the causal half. Parameters 2,614,341,888: tied embeddings 256,000 x 2,304,
    per layer q 2,304 x 2,048, k and v 2,304 x 1,024 each, o 2,048 x 2,304, MLP 3 x 2,304 x 9,216, four RMSNorms
    4 x 2,304; final norm 2,304. Multiply-adds at 256 tokens: the linear weights once a token (the LM head on every
    token) plus 26 layers x 8 heads x 2 products x 256^2 x 256. KV bytes per token: 2 x 26 layers x 4 KV heads x
    256 x 2 (bf16) = 106,496."""
    d = _totals(cli, published_config("google/gemma-2-2b"), "--seq", "256", "--out", tmp_path)
    linear = 26 * (2304 * 2048 + 2 * 2304 * 1024 + 2048 * 2304 + 3 * 2304 * 9216)
    assert d["totals"]["params"] == 256000 * 2304 + linear + 26 * 4 * 2304 + 2304
    assert d["totals"]["macs"] == 256 * (linear + 2304 * 256000) + 26 * 8 * 2 * 256 ** 2 * 256
    mem = d["totals"]["memory_fit"]
    # 13 of Gemma-2's 26 layers slide over a 4,096-token window, more than the 256 tokens here
    assert ("KV cache 106496 B per token (13 of 26 layers slide over a 4096-token window and hold at most that many "
            "tokens)") in mem["assumptions"]
    assert mem["per_device"]["kv_cache_bytes"] == 256 * 2 * 26 * 4 * 256 * 2
    notes = " ".join(d["assumptions"]["workload_notes"])
    assert "eager attention (Gemma2ForCausalLM has no SDPA attention in transformers)" in notes


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_an_eager_attention_config_captures_on_real_tensors(tmp_path, cli, published_config, device):
    """Gemma-2 (eager attention) cut to 2 layers of hidden 256 on --device cpu. Before: "cannot run on the meta
    device" (a memoized factory call, the mask's torch.zeros((), device=cpu), replayed as a meta tensor into a CPU
    capture). Multiply-adds at 32 tokens, as the 2B test counts them: the linear weights once a token (q 256 x 256, k
    and v 256 x 128, o 256 x 256, MLP 3 x 256 x 512; the tied LM head 256 x 1,024) plus 2 layers x 4 heads x 2
    products x 32^2 x 64; the same on meta and on real tensors."""
    cfg = published_config("google/gemma-2-2b", num_hidden_layers=2, hidden_size=256, intermediate_size=512,
                           head_dim=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=1024,
                           query_pre_attn_scalar=64)
    d = _totals(cli, cfg, "--seq", "32", "--device", device, "--out", tmp_path)
    linear = 2 * (256 * 256 + 2 * 256 * 128 + 256 * 256 + 3 * 256 * 512)
    assert d["totals"]["macs"] == 32 * (linear + 256 * 1024) + 2 * 4 * 2 * 32 ** 2 * 64


def test_gpt_oss_runs_fused_sink_attention_with_its_biased_experts(tmp_path, cli, published_config):
    """gpt-oss-20b (hub: openai/gpt-oss-20b): no SDPA attention in transformers (attention sinks), run as the
    engines' fused attention with sinks (opmap.workloads.hf_sinks), and experts with biases and (in, out) weights.
    Parameters 20,914,757,184 (OpenAI's model card: 20.91 B): embeddings and the
    untied head 2 x 201,088 x 2,880; per layer q 2,880 x 4,096 + 4,096, k and v 2,880 x 512 + 512 each, o 4,096 x
    2,880 + 2,880, 64 sinks, router 2,880 x 32 + 32, 32 experts of gate-up 2,880 x 5,760 + 5,760 and down 2,880 x
    2,880 + 2,880, two norms; final norm. Multiply-adds per token 3.61 G (the card's 3.6 B active parameters): the
    attention projections, the router and 4 experts a layer, the head; plus the fused kernel's products over the
    64 x 65 / 2 causal (query, key) pairs at seq 64 (64 heads, QK^T and PV of head dim 64; the window of 128 binds
    no query at 64 tokens)."""
    d = _totals(cli, published_config("openai/gpt-oss-20b"), "--seq", "64", "--out", tmp_path)
    attn = 2880 * 4096 + 4096 + 2 * (2880 * 512 + 512) + 4096 * 2880 + 2880 + 64
    moe = 2880 * 32 + 32 + 32 * (2880 * 5760 + 5760 + 2880 * 2880 + 2880)
    assert d["totals"]["params"] == 2 * 201088 * 2880 + 24 * (attn + moe + 2 * 2880) + 2880 == 20_914_757_184
    per_token = 24 * (2880 * 4096 + 2 * 2880 * 512 + 4096 * 2880 + 2880 * 32 + 4 * 3 * 2880 * 2880) + 2880 * 201088
    assert d["totals"]["macs"] == 64 * per_token + 24 * 64 * 2 * (64 * 65 // 2) * 64
    # sliding layers (window 128) and full ones alike cache all 64 tokens: 2 x 24 x 8 KV heads x 64 x 2 bytes
    assert ("KV cache 49152 B per token (12 of 24 layers slide over a 128-token window and hold at most that many "
            "tokens)") in d["totals"]["memory_fit"]["assumptions"]


def test_the_longest_context_of_a_config_stops_at_its_positions(tmp_path, cli, published_config):
    """Phi-3-mini-4k (hub: microsoft/Phi-3-mini-4k-instruct) holds 4,096 positions (max_position_embeddings, no
    rope scaling): memory alone would hold far more, and before the longest context printed was that (over
    600,000); prefill and decode both stop at 4,096."""
    cfg = published_config("microsoft/Phi-3-mini-4k-instruct")
    d = _totals(cli, cfg, "--seq", "256", "--out", tmp_path / "prefill")
    assert d["totals"]["memory_fit"]["max_context"] == 4096
    assert "longest context 4096 (the model's position limit)" in d["totals"]["memory_fit"]["text"]
    d = _totals(cli, cfg, "--phase", "decode", "--kv-len", "1024", "--batch", "8", "--out", tmp_path / "decode")
    assert d["totals"]["memory_fit"]["max_context"] == 4096


def test_the_longest_decode_context_of_a_zoo_model_stops_at_its_positions(tmp_path, cli):
    """llama-3-8b holds 8,192 positions (Meta's config.json, max_position_embeddings); its decode memory at batch
    8 would hold far more."""
    d = _totals(cli, "llama-3-8b", "--phase", "decode", "--kv-len", "1024", "--batch", "8", "--out", tmp_path)
    assert d["totals"]["memory_fit"]["max_context"] == 8192


# unbalanced rich markup, a clear-screen CSI and an OSC 8 hyperlink in a module's name (add_module refuses only
# "." and ""), in its class's name and in the file's name
EVIL_MODULE = "l[/b]\x1b[2J\x1b]8;;http://evil\x1b\\y"
EVIL_MODEL = f'''
import torch
from torch import nn

Block = type({"Blk[/b]" + chr(27) + "[2J"!r}, (nn.Module,), {{"forward": lambda self, x: self.inner(x)}})


def tiny():
    inner = nn.Sequential()
    inner.add_module({EVIL_MODULE!r}, nn.Linear(16, 16))
    b = Block()
    b.inner = inner
    return b, (torch.randn(2, 16),)
'''


def test_user_strings_are_printed_as_text(tmp_path, cli):
    f = tmp_path / "ev[red]il\x1b[2J.py"
    f.write_text(EVIL_MODEL)
    rc, out, err = cli("analyze", f"{f}:tiny", "--hardware", "h100-sxm", "--out", tmp_path / "out", "--no-store")
    assert rc == 0, err
    assert "\x1b" not in out + err
    assert "opmap analyze ev[red]il.py:tiny on" in out
    assert "inner.l[/b]y" in out  # the module path in the kernel and operator tables, literally
    d = json.loads((tmp_path / "out" / "analysis.json").read_text())
    assert any(n["module"] == "inner." + EVIL_MODULE for n in d["nodes"])  # the files keep the name as it is


def test_allow_long_context_goes_past_the_position_limit_for_rotary_models(cli, refused):
    """llama-2-7b holds 4096 positions (rotary): --seq 8192 is refused with the way past it, then allowed with
    --allow-long-context; gpt2's learned positions have no rope scaling to allow."""
    refused("analyze", "llama-2-7b", "--seq", "8192", "--no-store", needle="--allow-long-context goes past it")
    refused("analyze", "llama-2-7b", "--phase", "decode", "--kv-len", "8192", "--no-store",
            needle="--allow-long-context goes past it")
    rc, out, err = cli("analyze", "llama-2-7b", "--phase", "decode", "--kv-len", "8192", "--allow-long-context",
                       "--no-store", "--rows", "1")
    assert rc == 0, err
    refused("analyze", "gpt2", "--seq", "2048", "--allow-long-context", "--no-store", needle="learned positions")


def test_library_fusion_prices_a_training_step_between_eager_and_engine(tmp_path, cli):
    """--fusion library on a gpt2 training step: every kernel that holds a GEMM holds only GEMMs (its node ops);
    fewer kernels than eager (fused norm / activation / dropout + add kernels), more than engine (engine is library
    plus the GEMM epilogues), and the bytes saved and the step time order the same way."""
    res = {}
    for policy in ("eager", "library", "engine"):
        out = tmp_path / policy
        rc, _, err = cli("analyze", "gpt2", "--hardware", "h100-sxm", "--seq", "128", "--dtype", "bf16", "--phase",
                         "train", "--fusion", policy, "--out", out)
        assert rc == 0, err
        res[policy] = json.loads((out / "analysis.json").read_text())
    lib = res["library"]
    assert lib["assumptions"]["fusion_policy"].startswith("library")
    k = {p: d["fusion"]["kernels"] for p, d in res.items()}
    assert k["eager"] > k["library"] > k["engine"]
    saved = {p: d["fusion"]["bytes_saved"] for p, d in res.items()}
    assert saved["eager"] == 0 < saved["library"] < saved["engine"]
    ops = {n["id"]: n["op"] for n in lib["nodes"]}
    gemm = {"aten.mm.default", "aten.addmm.default", "aten.bmm.default"}
    mixed = [kr["id"] for kr in lib["kernels"] if {ops[i] for i in kr["nodes"]} & gemm
             and not {ops[i] for i in kr["nodes"]} <= gemm]
    assert mixed == []
    t = {p: d["phase"]["step_s"] for p, d in res.items()}
    assert t["eager"] > t["library"] > t["engine"]


# rack scale by hand (opmap.mapping.collectives' formulas; the catalog's figures: NVLink 5 900e9 B/s a direction,
# 0.6 us a hop; GB200 NVLS 548.4e9 B/s + NCCL's 23 us; B200 nodes of 8, one 50e9 B/s NIC a GPU, 2.7 us a hop;
# NCCL LL: base 6.6 us, efficiency 1/2, hop factor 1)
def _collectives(tmp_path, cli, *args):
    rc, _, err = cli("analyze", *args, "--phase", "decode", "--out", tmp_path)
    assert rc == 0, err
    return json.loads((tmp_path / "analysis.json").read_text())["collectives"]


def _tp16_by_hand(s):
    """(gb200 NVLS, b200 tree) all-reduce times of ``s`` bytes over 16 GPUs. b200: two nodes, a ring per GPU through
    its own NIC at min(900e9, 8 x 50e9) = 400e9; the double binary tree's depth 7 NVLink hops + log2(2) network
    hops, twice: 6.6 us + 2 (7 x 0.6 + 2.7) us + 2 S / (400e9 x 1/2)."""
    return 23e-6 + s / 548.4e9, 6.6e-6 + 2 * (7 * 0.6e-6 + 2.7e-6) + 2 * s / (400e9 * 0.5)


def test_tp16_inside_an_nvl72_rack_and_across_b200_nodes(tmp_path, cli):
    """Llama 3 70B decode at tp 16: the all-reduce after each row-parallel GEMM carries one token's 8192 hidden
    values in bf16 (16,384 bytes), two a layer x 80 layers. On GB200 the group is inside the 72-GPU NVLink domain
    (scale_up, NVLS); on B200 it spans two 8-GPU nodes over InfiniBand (auto: the tiers walked)."""
    gb = _collectives(tmp_path / "gb", cli, "llama-3-70b", "--tp", "16", "--hardware", "gb200")[0]
    b = _collectives(tmp_path / "b", cli, "llama-3-70b", "--tp", "16", "--hardware", "b200")[0]
    s = 8192 * 2
    assert gb["message_bytes"] == b["message_bytes"] == s and gb["count"] == 160
    nvls, tree = _tp16_by_hand(s)
    assert (gb["link"], gb["algorithm"]) == ("scale_up", "in_switch")
    assert gb["predicted_s"] == pytest.approx(nvls, rel=1e-9)
    assert (b["link"], b["algorithm"]) == ("auto", "tree")
    assert b["predicted_s"] == pytest.approx(tree, rel=1e-9)


def test_tp16_of_a_hugging_face_config_on_a_rack(tmp_path, cli):
    """A Llama config of 16 heads (hidden 256): tp 16 decode in bf16, 2 all-reduces a layer x 2 layers of one token's
    256 x 2 bytes, on GB200's NVLS inside the rack; on B200 across two nodes."""
    cfg = {"model_type": "llama", "vocab_size": 2048, "hidden_size": 256, "intermediate_size": 512,
           "num_hidden_layers": 2, "num_attention_heads": 16, "num_key_value_heads": 16,
           "max_position_embeddings": 4096, "torch_dtype": "float32"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    gb = _collectives(tmp_path / "gb", cli, path, "--tp", "16", "--hardware", "gb200", "--dtype", "bf16")[0]
    b = _collectives(tmp_path / "b", cli, path, "--tp", "16", "--hardware", "b200", "--dtype", "bf16")[0]
    s = 256 * 2
    assert gb["message_bytes"] == s and gb["count"] == 4
    nvls, tree = _tp16_by_hand(s)
    assert (gb["link"], gb["algorithm"], gb["predicted_s"]) == ("scale_up", "in_switch", pytest.approx(nvls))
    assert (b["link"], b["predicted_s"]) == ("auto", pytest.approx(tree))


def test_mixtral_ep8_all_to_all_on_nvlink(tmp_path, cli):
    """Mixtral 8x7B with its 8 experts over 8 GPUs of a GB200 rack: the dispatch and combine all-to-alls inside the
    NVLink domain, each (n-1)/n S over one NVLink hop: LL 6.6 us + 0.6 us + 7/8 S / (900e9 x 1/2), two a layer x
    32 layers."""
    c = _collectives(tmp_path, cli, "mixtral-8x7b", "--dp", "8", "--ep", "8", "--hardware", "gb200")
    a2a = [x for x in c if x["collective"] == "all_to_all"]
    assert a2a and all(x["link"] == "scale_up" and x["group_size"] == 8 for x in a2a)
    s = a2a[0]["message_bytes"]
    assert a2a[0]["count"] == 64
    assert a2a[0]["predicted_s"] == pytest.approx(6.6e-6 + 0.6e-6 + 7 / 8 * s / 450e9, rel=1e-9)
