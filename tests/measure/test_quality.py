"""Quality evidence: the fake quantizers by hand, error ordering across formats, quality.json, the CLI."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from torch import nn

from opmap.cli import main
from opmap.errors import OpmapError
from opmap.measure.quality import fake_fp8, fake_int4, fake_int8, measure_quality
from opmap.record import record


def test_int8_per_channel_by_hand():
    w = torch.tensor([[1.0, -0.5, 0.3], [0.2, 0.1, -0.05]])
    q = fake_int8(w, per_channel=True)
    # row 0: scale 1/127; row 1: scale 0.2/127; each value rounds to the nearest multiple of its row's scale
    s = torch.tensor([[1 / 127], [0.2 / 127]])
    assert torch.allclose(q, torch.round(w / s) * s)
    assert q[0, 0] == pytest.approx(1.0) and q[1, 0] == pytest.approx(0.2)


def test_int4_groups_have_at_most_16_levels():
    torch.manual_seed(0)
    w = torch.randn(4, 256)
    q = fake_int4(w)
    for row in range(4):
        for g in range(2):
            grp = q[row, g * 128:(g + 1) * 128]
            scale = w[row, g * 128:(g + 1) * 128].abs().max() / 7
            assert len(torch.unique(torch.round(grp / scale))) <= 16
            assert (grp.abs() <= 8 * scale + 1e-6).all()


def test_fp8_keeps_representable_values():
    x = torch.tensor([448.0, 0.5, -2.0, 1.0])  # amax 448 -> scale 1; all four are e4m3 values
    assert torch.equal(fake_fp8(x), x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(256, 256), nn.Linear(256, 10)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_error_grows_as_the_format_narrows():
    torch.manual_seed(0)
    net, x = Net(), (torch.randn(16, 256),)
    q = {d: measure_quality("net", net, x, d) for d in ("bf16", "int8", "int4")}
    assert 0 < q["bf16"].rel_error < 1e-2
    # int4 steps are 127/7 (18x) coarser than int8's: the error must be larger
    assert q["int8"].rel_error < q["int4"].rel_error
    assert q["int8"].agreement_kind == "top-1 agreement" and q["int8"].positions == 16
    d = record(q["int4"])
    assert set(d) >= {"dtype", "rel_error", "max_abs_error", "agreement", "reference_dtype"}
    assert d["reference_dtype"] == "fp32"
    # quality.json's order: the version and the compared formats first, the torch it ran under after the seed
    assert list(d)[:4] == ["schema_version", "workload", "dtype", "reference_dtype"] and d["schema_version"] == 1
    assert list(d)[list(d).index("seed") + 2] == "torch_version" and d["torch_version"] == torch.__version__
    assert list(d)[-3:] == ["snr_db", "kl", "layers"] and isinstance(d["layers"], list)
    with pytest.raises(OpmapError, match="accepted: bf16, fp16, fp8, int8, int4"):
        measure_quality("net", net, x, "fp32")


def test_cli_quality_then_verified_analysis(tmp_path, capsys):
    f = tmp_path / "m.py"
    f.write_text("import torch\nfrom torch import nn\n"
                 "def make():\n"
                 "    return nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 8)), (torch.randn(4, 64),)\n")
    assert main(["quality", f"{f}:make", "--dtype", "int8", "--out", str(tmp_path / "q")]) == 0
    q = json.loads((tmp_path / "q" / "quality.json").read_text())
    assert q["dtype"] == "int8" and q["workload"] == "m.py:make"
    capsys.readouterr()
    assert main(["analyze", f"{f}:make", "--dtype", "int8", "--quality", str(tmp_path / "q" / "quality.json")]) == 0
    assert "precision evidence: verified" in capsys.readouterr().out
    assert main(["analyze", f"{f}:make", "--dtype", "int8"]) == 0
    assert "precision evidence: unverified" in capsys.readouterr().out
    assert main(["analyze", f"{f}:make", "--dtype", "fp8", "--quality", str(tmp_path / "q" / "quality.json")]) == 2
    assert "not m.py:make at fp8" in capsys.readouterr().err


# -- quality.json read from text (parse_quality): numbers finite and in range, text fields text ---------------------

GOOD_Q = {"schema_version": 1, "workload": "gpt2", "dtype": "int8", "rel_error": 0.01, "max_abs_error": 0.2,
          "agreement": 0.97, "agreement_kind": "next-token agreement", "positions": 128, "seed": 0}


@pytest.mark.parametrize("field,value,expected", [
    ("rel_error", "NaN", "rel_error must be a number >= 0 (got nan)"),
    ("rel_error", "Infinity", "rel_error must be a number >= 0 (got inf)"),
    ("rel_error", '"0.01"', "rel_error must be a number >= 0 (got '0.01')"),
    ("rel_error", "-0.5", "rel_error must be a number >= 0 (got -0.5)"),
    ("agreement", "1.5", "agreement must be a number from 0 to 1 (got 1.5)"),
    ("agreement", "true", "agreement must be a number from 0 to 1 (got true)"),
    ("max_abs_error", "1e400", "max_abs_error must be a number >= 0 (got inf)"),
    ("positions", "0", "positions must be an integer >= 1 (got 0)"),
    ("workload", "7", "workload must be a string (got 7)"),
    ("agreement_kind", "null", "agreement_kind must be a string (got null)"),
])
def test_quality_json_fields_are_checked(field, value, expected):
    from opmap.measure.quality import parse_quality

    text = json.dumps({**GOOD_Q, field: "@"}).replace('"@"', value)
    with pytest.raises(OpmapError) as e:
        parse_quality(text, "q.json")
    assert str(e.value) == f"quality file q.json: {expected}"


def test_quality_json_shape_is_checked():
    from opmap.measure.quality import parse_quality

    for text, expected in (("[1]", "expected a JSON object from opmap quality (got [1])"),
                           ('{"workload": "gpt2"}', "missing dtype"), (b"\xff\xfe\x00", "cannot read quality")):
        with pytest.raises(OpmapError, match=re.escape(expected)):
            parse_quality(text, "q.json")
    q = parse_quality(json.dumps(GOOD_Q).encode())
    assert q.agreement == 0.97 and q.workload == GOOD_Q["workload"] and q.dtype == GOOD_Q["dtype"]


def test_analyze_refuses_a_nan_quality_file_in_one_line(tmp_path, capsys):
    """Before: 'verified ... relative error nan' printed as evidence."""
    f = tmp_path / "m.py"
    f.write_text("import torch\nfrom torch import nn\n"
                 "def make():\n    return nn.Sequential(nn.Linear(8, 8)), (torch.randn(2, 8),)\n")
    q = tmp_path / "quality.json"
    q.write_text(json.dumps({**GOOD_Q, "workload": "m.py:make", "rel_error": "@"}).replace('"@"', "NaN"))
    assert main(["analyze", f"{f}:make", "--dtype", "int8", "--quality", str(q), "--no-store"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"opmap: error: quality file {q}: rel_error must be a number >= 0 (got nan)"


# -- the block-scaled formats: per-layer SNR, end-to-end SNR and KL ------------------------------------------------

def test_snr_and_kl_by_hand():
    from opmap.measure.quality import kl_mean, snr_db

    # ||ref||^2 = 25, ||y - ref||^2 = 0.25: 10 log10(100) = 20 dB; identical outputs: no error, None
    assert snr_db(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 4.5])) == pytest.approx(20.0)
    assert snr_db(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 4.0])) is None
    # p = softmax([0, ln 2]) = (1/3, 2/3), q uniform: KL = 1/3 ln(2/3) + 2/3 ln(4/3)
    p = torch.tensor([[[0.0, math.log(2.0)]]])
    kl = 1 / 3 * math.log(2 / 3) + 2 / 3 * math.log(4 / 3)
    assert kl_mean(p, torch.zeros(1, 1, 2)) == pytest.approx(kl)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp6", "mxfp8", "fp8-block"])
def test_block_format_layer_snr_is_the_quantized_gemm(fmt):
    """The first layer's SNR fed the reference's input is that of y = qdq(x) qdq(W)^T + b against x W^T + b,
    computed here from the emulation directly (W and x both quantized: W4A4 for the fp4 formats)."""
    from opmap.measure.blockscale import qdq

    torch.manual_seed(0)
    net, x = Net(), torch.randn(16, 256)
    q = measure_quality("net", net, (x,), fmt)
    xr = measure_inputs(net, x)
    with torch.no_grad():
        ref = net.a(xr)
        y = torch.nn.functional.linear(qdq(xr, fmt, weight=False), qdq(net.a.weight, fmt, weight=True), net.a.bias)
    want = 10 * math.log10(float(ref.double().square().sum()) / float((y - ref).double().square().sum()))
    first = q.layers[0]
    assert first.layer == "a" and first.snr_db == pytest.approx(want, abs=1e-3)
    assert first.snr_db_in_model == pytest.approx(want, abs=1e-3)  # the first layer's input is the model's
    assert q.snr_db == pytest.approx(-20 * math.log10(q.rel_error), rel=1e-9)  # SNR = -20 log10(relative error)
    assert q.kl is None and q.agreement_kind == "top-1 agreement"  # a classifier: no next-token distribution
    assert "W" in q.method and "compute in fp32" in q.method


def measure_inputs(net, x):
    """The random inputs measure_quality feeds ``net`` (seed 0): N(0, 1) of ``x``'s shape."""
    from opmap.measure.quality import random_inputs

    return random_inputs(net, (x,), 0)[0]


def test_block_formats_order_by_element_width():
    torch.manual_seed(0)
    net, x = Net(), (torch.randn(16, 256),)
    snr = {f: measure_quality("net", net, x, f).layers[0].snr_db for f in ("mxfp8", "mxfp6", "nvfp4", "mxfp4")}
    # the first GEMM's own error: 3 mantissa bits (E4M3, E2M3) against 1 (E2M1), up to ~12 dB apart (6 dB a bit;
    # less here: nvfp4's scale maps each block's max onto 6 exactly), at least one bit's 6 dB; nvfp4's 16-element,
    # non-power-of-two scales beat mxfp4's
    assert snr["mxfp8"] > snr["nvfp4"] + 6 and snr["mxfp6"] > snr["nvfp4"] + 6
    assert snr["nvfp4"] > snr["mxfp4"]


def test_cli_quality_nvfp4_on_a_hugging_face_config(tmp_path, capsys):
    pytest.importorskip("transformers")
    from pathlib import Path

    cfg = Path(__file__).parents[2] / "examples" / "tiny-llama.json"
    assert main(["quality", str(cfg), "--dtype", "nvfp4", "--seq", "16", "--out", str(tmp_path / "q")]) == 0
    q = json.loads((tmp_path / "q" / "quality.json").read_text())
    assert q["dtype"] == "nvfp4" and "W4A4" in q["method"]
    # tiny-llama: 2 layers x 7 Linear (q, k, v, o, gate, up, down) and the LM head, each with its SNR
    assert len(q["layers"]) == 15 and q["layers"][-1]["layer"] == "lm_head"
    assert all(5 < la["snr_db"] < 30 for la in q["layers"])  # 4-bit: ~17 dB on N(0, 1)-like data, not exact
    assert q["kl"] > 0 and q["agreement_kind"] == "next-token agreement" and q["positions"] == 2 * 16
    out = capsys.readouterr().out
    assert "KL(ref || q)" in out and "per Linear layer" in out
