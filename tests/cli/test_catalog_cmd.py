"""opmap models list, hardware list, hardware show."""

from __future__ import annotations


def test_models_and_hardware_listings(cli):
    rc, out, _ = cli("models", "list")
    assert rc == 0 and "124,439,808" in out and "mixtral-8x7b" in out
    rc, out, _ = cli("hardware", "list")
    assert rc == 0 and "h100-sxm" in out and "tpu-v5p" in out
    rc, out, _ = cli("hardware", "show", "h100-sxm")
    assert rc == 0 and "datasheet_dense" in out and "memory_bandwidth_bytes_per_s" in out
    # the idle draw and the software risk with their kinds (an estimate says so) and sources
    assert "idle_power_w" in out and "estimate" in out and "software_risk" in out and "assessed" in out
    assert "TensorRT-LLM" in out


def test_unknown_hardware(refused):
    refused("hardware", "show", "h1000", needle="unknown hardware 'h1000'; accepted:")


def test_hardware_any_case_and_alias_note(cli):
    rc, out, err = cli("hardware", "show", "H200")
    assert rc == 0 and "h200:" in out and "taken as catalog entry" not in out, err
    rc, out, err = cli("hardware", "show", "mi300")
    assert rc == 0 and "note: hardware 'mi300' taken as catalog entry 'mi300x'" in out, err


def test_hardware_list_and_show_name_the_achievable_figures_or_datasheet_only(cli):
    rc, out, _ = cli("hardware", "list")
    assert rc == 0 and "like for like" in out and "datasheet only" in out and "GiB" in out
    rc, out, _ = cli("hardware", "show", "h100-sxm")
    # the measured figures the time model runs at, with their sources (Bekman's MAMF table, Azure's BabelStream)
    assert rc == 0 and "achievable matrix bf16" in out and "mamf-finder" in out
    assert "achievable_memory_bandwidth_bytes_per_s" in out and "2.97 TB/s" in out and "priced: like for like" in out
    rc, out, _ = cli("hardware", "show", "mi250x")  # no published achievable figure of either kind
    assert rc == 0 and "priced: datasheet only: matrix rate, bandwidth" in out and "FlashMLA" in out


def test_hardware_show_names_a_devices_measured_gemm_curves_and_their_source(cli):
    rc, out, _ = cli("hardware", "show", "h100-sxm")
    # NVIDIA's grid: 39 M x 18 N x 18 K = 12,636 shapes per format (hardware/catalog/h100-sxm.gemm.json)
    flat = " ".join(out.split())  # the table wraps long cells
    assert rc == 0 and "measured curves" in flat and "12636 shapes" in flat and "aiconfigurator" in flat
    rc, out, _ = cli("hardware", "show", "mi250x")  # no published per-shape timings
    assert rc == 0 and "measured curves" not in out


def test_hardware_show_prints_the_attention_dropout_factor_and_a_spec_files_text_literally(cli, tmp_path):
    from pathlib import Path

    import opmap.hardware

    rc, out, _ = cli("hardware", "show", "h100-sxm")
    flat = " ".join(out.split())
    # TransformerEngine issue 3312's H200 pair: 0.614 / 0.594 ms = 1.034
    assert rc == 0 and "attention dropout" in flat and "cudnn 1.034x" in flat and "issue 3312" in flat
    # a spec file's sources are the user's text: shown as written, never read as terminal markup
    src = Path(opmap.hardware.__file__).with_name("catalog") / "h100-sxm.toml"
    text = src.read_text().replace('source = "TransformerEngine issue 3312:', 'source = "[bold red]mine[/] 3312:', 1)
    spec = tmp_path / "mine.toml"
    spec.write_text(text)
    rc, out, err = cli("hardware", "show", str(spec))
    assert rc == 0, err
    assert "[bold red]mine[/]" in " ".join(out.split())


def test_hardware_show_prints_a_spec_files_name_and_notes_literally(cli, tmp_path):
    from pathlib import Path

    import opmap.hardware

    src = Path(opmap.hardware.__file__).with_name("catalog") / "h100-sxm.toml"
    text = src.read_text()
    name_line = next(line for line in text.splitlines() if line.startswith("display_name"))
    spec = tmp_path / "odd.toml"
    spec.write_text(text.replace(name_line, 'display_name = "[/x] H100 [bold]mine[/bold]"', 1))
    rc, out, err = cli("hardware", "show", str(spec))
    assert rc == 0, err  # unescaped, rich stops on the stray closing tag
    assert "[/x] H100 [bold]mine[/bold]" in " ".join(out.split())


def test_hardware_list_never_cuts_a_name_and_has_json(cli, monkeypatch):
    """The names --hardware takes are printed whole at a narrow terminal (they were cut: "a100-sxm-80…"), and
    --json gives the same catalog as numbers: H100 SXM's dense bf16 peak is 989.4 TFLOP/s and its HBM3 3.35 TB/s
    (NVIDIA H100 Tensor Core GPU datasheet, SXM column: 1,979 TFLOPS bf16 with sparsity, half of it dense)."""
    import json

    from opmap.cli.common import console
    from opmap.hardware import catalog

    monkeypatch.setattr(console, "width", 60)
    rc, out, _ = cli("hardware", "list")
    assert rc == 0 and "…" not in out
    cells = {c.strip() for line in out.splitlines() for c in line.split("│")}
    assert set(catalog()) <= cells, set(catalog()) - cells
    rc, out, _ = cli("hardware", "list", "--json")
    d = json.loads(out)
    assert rc == 0 and d["schema_version"] == 1 and [x["name"] for x in d["devices"]] == list(catalog())
    h100 = next(x for x in d["devices"] if x["name"] == "h100-sxm")
    assert abs(h100["matrix_peak_flops_per_s"]["bf16"] / 989.4e12 - 1) < 0.01
    assert abs(h100["memory_bandwidth_bytes_per_s"] / 3.35e12 - 1) < 0.01
