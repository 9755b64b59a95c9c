"""Quality evidence on fit cells: files matched to the fit's models, each cell's format cited with its figures,
"no quality evidence" for a block-scaled / fp4 cell without a file, and the CLI end to end on a Hugging Face
config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opmap.cli import main
from opmap.errors import OpmapError
from opmap.explore.fit_quality import NO_EVIDENCE, attach, needs_evidence, read_evidence, words
from opmap.explore.results import FitCell, FitMatrix
from opmap.record import record

Q = {"schema_version": 1, "workload": "tiny-llama.json", "dtype": "nvfp4", "rel_error": 0.21, "max_abs_error": 0.3,
     "agreement": 0.655, "agreement_kind": "next-token agreement", "positions": 128, "seed": 0, "snr_db": 13.4,
     "kl": 0.00117, "weights": "random"}


def write(tmp_path: Path, name: str, **over) -> Path:
    p = tmp_path / name
    p.write_text(json.dumps({**Q, **over}))
    return p


def test_needs_evidence_is_block_scaled_or_fp4():
    assert all(needs_evidence(f) for f in ("nvfp4", "mxfp4", "mxfp6", "mxfp8", "fp8-block"))
    assert not any(needs_evidence(f) for f in ("bf16", "fp8", "int8", "int4", "no-such-format"))


def test_cells_cite_their_format_s_file_or_say_there_is_none(tmp_path):
    models = ["examples/tiny-llama.json", "gpt2"]
    ev = read_evidence([write(tmp_path, "q.json")], models)
    assert set(ev) == {("examples/tiny-llama.json", "nvfp4")}
    fit = FitMatrix(1, tuple(models), ("b200", "h100-sxm"), None, "512", "128", 100, "bf16", "engine", None, False, (
        FitCell("examples/tiny-llama.json", "b200", dtype="nvfp4"),  # a per-device format
        FitCell("gpt2", "b200", dtype="nvfp4"),  # no file for gpt2
        FitCell("examples/tiny-llama.json", "h100-sxm", dtype="fp8"),  # fp8: no claim either way
        FitCell("gpt2", "h100-sxm")), "local", {}, None, {})  # the fit's --dtype, bf16
    cells = record(attach(fit, ev))["cells"]
    q = cells[0]["quality"]
    assert list(q) == ["format", "file", "snr_db", "agreement", "agreement_kind", "kl", "weights", "rel_error"]
    assert q["file"] == str(tmp_path / "q.json") and (q["snr_db"], q["agreement"], q["kl"]) == (13.4, 0.655, 0.00117)
    assert words(cells[0]) == (f"quality nvfp4 vs fp32 ({tmp_path / 'q.json'}): SNR 13.4 dB, top-1 65.5%, "
                               "KL 0.00117 nats")
    assert list(cells[1])[-1] == "quality"  # the cell's last key
    assert json.dumps(cells[1]["quality"]) == json.dumps({"format": "nvfp4", "file": None, "note": NO_EVIDENCE})
    assert words(cells[1]) == "no quality evidence for nvfp4"
    assert "quality" not in cells[2] and "quality" not in cells[3] and words(cells[3]) == ""
    assert fit.cells[0].quality is None  # the input left as it was


def test_a_file_for_another_workload_or_twice_the_same_is_refused(tmp_path):
    with pytest.raises(OpmapError, match=r"is for tiny-llama.json, not one of the fit's models \(gpt2\)"):
        read_evidence([write(tmp_path, "q.json")], ["gpt2"])
    with pytest.raises(OpmapError, match="two quality files for gpt2 at nvfp4"):
        read_evidence([write(tmp_path, "a.json", workload="gpt2"), write(tmp_path, "b.json", workload="gpt2")],
                      ["gpt2"])
    with pytest.raises(OpmapError, match="agreement must be a number from 0 to 1"):
        read_evidence([write(tmp_path, "bad.json", agreement=2)], ["examples/tiny-llama.json"])


def test_fit_quality_on_a_hugging_face_config(tmp_path, capsys):
    """opmap quality then opmap fit --quality on examples/tiny-llama.json: the cell cites the file's figures."""
    pytest.importorskip("transformers")
    cfg = str(Path(__file__).parents[2] / "examples" / "tiny-llama.json")
    assert main(["quality", cfg, "--dtype", "fp8", "--seq", "16", "--out", str(tmp_path / "q")]) == 0
    q = json.loads((tmp_path / "q" / "quality.json").read_text())
    qfile = str(tmp_path / "q" / "quality.json")
    assert main(["fit", "--models", cfg, "--hardware", "l4", "--slo-p99", "3000", "--requests", "100",
                 "--input-len", "128", "--output-len", "16", "--devices-budget", "1", "--dtype", "fp8",
                 "--quality", qfile, "--out", str(tmp_path / "f"), "--no-store"]) == 0
    (c,) = json.loads((tmp_path / "f" / "fit.json").read_text())["cells"]
    assert c["quality"]["file"] == qfile and c["quality"]["snr_db"] == q["snr_db"] and c["quality"]["kl"] == q["kl"]
    assert f"SNR {q['snr_db']:.1f} dB" in (tmp_path / "f" / "fit.md").read_text()
    assert "quality fp8 vs fp32" in " ".join(capsys.readouterr().out.split())
    assert main(["fit", "--models", "gpt2", "--hardware", "l4", "--quality", qfile]) == 2  # before any cell runs
    assert "not one of the fit's models (gpt2)" in capsys.readouterr().err
