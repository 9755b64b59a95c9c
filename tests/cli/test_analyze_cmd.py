"""opmap analyze: outputs written, bad input answered in one line with exit status 2, before the work."""

from __future__ import annotations

import csv
import json

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
    (("gpt2", "--dtype", "fp4"), "unknown dtype 'fp4'; accepted: fp32, tf32, bf16, fp16, fp8, int8, int4"),
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
    (("gpt2", "--quality", "/no/such/quality.json", "--dtype", "int8"), "cannot read quality file"),
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
    (("--dtype", "int8", "--quality", "/no/such/quality.json"), "cannot read quality file"),
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
    refused("analyze", f"{f}:build", "--dtype", "fp4", needle="unknown dtype 'fp4'")


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
