"""The command line: outputs written, bad input answered in one line with exit status 2."""

from __future__ import annotations

import csv
import json

import pytest

from opmap.cli import main


def run(capsys, *args):
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_analyze_writes_three_files(tmp_path, capsys):
    rc, out, err = run(capsys, "analyze", "gpt2", "--hardware", "h100-sxm", "--seq", "64", "--dtype", "bf16",
                       "--out", str(tmp_path))
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
    (("analyze", "gpt3"), "unknown model 'gpt3'; accepted: gpt2"),
    (("analyze", "gpt2", "--hardware", "h1000"), "unknown hardware 'h1000'; accepted:"),
    (("analyze", "gpt2", "--dtype", "fp4"), "unknown dtype 'fp4'; accepted:"),
    (("analyze", "gpt2", "--seq", "4096"), "gpt2 takes --seq from 1 to 1024"),
    (("analyze", "resnet50", "--seq", "128"), "takes --image-size, not --seq"),
    (("analyze", "gpt2", "--device", "tpu"), "accepted: meta, cpu, cuda"),
    (("analyze", "gpt2", "--layer-type", "h.*=blob"), "PATTERN=TYPE"),
    (("analyze", "gpt2", "--batch", "many"), "--batch"),
    (("analyze", "llama-3-70b", "--device", "cpu"), "use --device meta"),
    (("hardware", "show", "h1000"), "unknown hardware"),
    (("analyze", "gpt2", "--fusion", "xla"), "unknown fusion policy 'xla'; accepted: eager, compiler"),
    (("analyze", "gpt2", "--fusion-plan", "/no/such/plan.json"), "does not exist"),
    (("analyze", "resnet50", "--layout", "nhwc8"), "unknown layout 'nhwc8'; accepted: nchw, channels_last"),
    (("analyze", "gpt2", "--quality", "/no/such/quality.json", "--dtype", "int8"), "cannot read quality file"),
    (("quality", "gpt2", "--dtype", "fp32"), "accepted: bf16, fp16, fp8, int8, int4"),
    (("profile", "gpt2", "--dtype", "int8", "--hardware", "h100-sxm"), "profile runs torch dtypes"),
])
def test_bad_input_one_line_exit_2(tmp_path, capsys, args, needle):
    out_dir = tmp_path / "out"
    rc, out, err = run(capsys, *args, *(("--out", str(out_dir)) if args[0] == "analyze" else ()))
    assert rc == 2
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err + out
    assert not out_dir.exists()  # nothing written


def test_failed_run_keeps_earlier_outputs(tmp_path, capsys):
    assert run(capsys, "analyze", "bert-base", "--seq", "16", "--out", str(tmp_path))[0] == 0
    before = (tmp_path / "analysis.json").read_text()
    rc, _, _ = run(capsys, "analyze", "bert-base", "--seq", "9999", "--out", str(tmp_path))
    assert rc == 2 and (tmp_path / "analysis.json").read_text() == before


def test_unwritable_out_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc, out, err = run(capsys, "analyze", "gpt2", "--seq", "8", "--out", str(blocker / "sub"))
    assert rc == 2 and "cannot create output folder" in err
    assert blocker.read_text() == "x"


def test_models_and_hardware_listings(capsys):
    rc, out, _ = run(capsys, "models", "list")
    assert rc == 0 and "124,439,808" in out and "mixtral-8x7b" in out
    rc, out, _ = run(capsys, "hardware", "list")
    assert rc == 0 and "h100-sxm" in out and "tpu-v5p" in out
    rc, out, _ = run(capsys, "hardware", "show", "h100-sxm")
    assert rc == 0 and "datasheet_dense" in out and "memory_bandwidth_bytes_per_s" in out


def test_user_model_file(tmp_path, capsys):
    f = tmp_path / "net.py"
    f.write_text("import torch\n"
                 "def build():\n"
                 "    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU())\n"
                 "    return m, torch.randn(2, 3, 16, 16)\n")
    rc, out, err = run(capsys, "analyze", f"{f}:build", "--hardware", "l4", "--dtype", "fp16",
                       "--out", str(tmp_path / "o"))
    assert rc == 0, err
    d = json.loads((tmp_path / "o" / "analysis.json").read_text())
    conv = [n for n in d["nodes"] if n["layer_type"] == "conv"]
    assert conv and conv[0]["matrix_flops"] == 2 * 2 * 8 * 14 * 14 * 3 * 9
