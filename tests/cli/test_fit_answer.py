"""opmap fit, the answer a buyer needs: the engine settings it ran under (serve's options), a power budget met by
fewer devices, the cost per token and the ranking by it, the workload and SLO in the header, a table as wide as the
terminal, no null device count. Each on a zoo model (gpt2) and a Hugging Face config.json (a 4-layer Llama)."""

from __future__ import annotations

import contextlib
import io
import json
import math

import pytest

pytest.importorskip("transformers")

# a 4-layer Llama: 8 heads of 256 / 8 = 32, 2 KV heads
TINY = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": 256,
        "intermediate_size": 896, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
        "max_position_embeddings": 4096, "tie_word_embeddings": False}
# KV bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes per element (2 for bf16, 1 for fp8)
KV_ELEMENTS = {"gpt2": 2 * 12 * 12 * 64, "tiny": 2 * 4 * 2 * 32}  # gpt2: 12 layers, 12 heads of 64 (no GQA)
GPT2_PARAMS = 124_439_808  # Hugging Face gpt2 (the 124M model)
H100_HBM = 80 * 2**30  # H100 SXM: 80 GB HBM3 (NVIDIA datasheet), held by the catalog as 80 GiB
H100_HBM_RATE = 3.35e12  # B/s, NVIDIA H100 SXM datasheet
H100_TDP = 700.0  # W, NVIDIA H100 SXM datasheet
PLATFORMS = ["h100-sxm", "h200", "a100-sxm-80gb", "mi300x"]
BASE = ("--requests", "20", "--input-len", "128", "--output-len", "16", "--no-store")


def _fit(out, *args, width: int | None = None) -> tuple[int, str, str, dict]:
    """``opmap fit ARGS --out OUT`` in-process at a terminal ``width``: (exit status, stdout, stderr, fit.json)."""
    from opmap.cli import main
    from opmap.cli.common import console

    so, se = io.StringIO(), io.StringIO()
    old = console.width
    try:
        if width:
            console.width = width
        with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
            rc = main(["fit", *[str(a) for a in args], *BASE, "--out", str(out)])
    finally:
        console.width = old
    path = out / "fit.json"
    return rc, so.getvalue(), se.getvalue(), json.loads(path.read_text()) if path.exists() else {}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    p = tmp_path_factory.mktemp("tiny-llama") / "config.json"
    p.write_text(json.dumps(TINY))
    return str(p)


@pytest.fixture(scope="module")
def priced(tmp_path_factory, tiny):
    """One fit of both models on four platforms, one device each, with prices, serve's engine options set, at a
    60-column terminal."""
    return _fit(tmp_path_factory.mktemp("priced"), "--models", f"gpt2,{tiny}", "--hardware", ",".join(PLATFORMS),
                "--devices", "1", "--devices-budget", "1", "--slo-ttft", "500", "--slo-tpot", "50",
                "--price", "h100-sxm=2", "--price", "h200=6", "--kv-dtype", "fp8", "--max-num-seqs", "1",
                "--max-num-batched-tokens", "4096", "--gpu-memory-utilization", "0.8", width=60)


def _cell(d, model, hw):
    return next(c for c in d["cells"] if c["hardware"] == hw and (c["model"] == model or model == "tiny"
                                                                  and c["model"].endswith("config.json")))


def test_fit_runs_under_serves_engine_settings_and_states_them(priced, tiny, tmp_path):
    """Before: fit had no --kv-dtype, --max-num-seqs, --max-num-batched-tokens or --gpu-memory-utilization (every
    cell ran bf16 KV and 256 sequences in 0.9 of the memory). The KV cache follows the formula: bytes per token =
    2 x layers x KV heads x head dim x bytes (fp8 half of bf16), tokens = usable bytes // that, usable falling by
    the HBM x the utilization given up."""
    rc, out, err, d = priced
    assert rc == 0, err
    assert d["engine_settings"] == {"policy": "engine:1,4096,16", "max_num_seqs": 1, "max_num_batched_tokens": 4096,
                                    "kv_block": 16, "kv_dtype": "fp8", "kv_dtype_source": "--kv-dtype",
                                    "gpu_memory_utilization": 0.8}
    words = " ".join(out.split())
    for s in ("KV cache fp8 (--kv-dtype)", "at most 1 sequence (--max-num-seqs)", "4096 tokens a step",
              "0.8 of each device's memory (--gpu-memory-utilization)"):
        assert s in words, s
    rc, _, err, base = _fit(tmp_path, "--models", f"gpt2,{tiny}", "--hardware", "h100-sxm", "--devices", "1",
                            "--devices-budget", "1", "--slo-ttft", "500", "--slo-tpot", "50")
    assert rc == 0, err
    assert base["engine_settings"]["kv_dtype"] == "bf16" and base["engine_settings"]["max_num_seqs"] == 256
    for m in ("gpt2", "tiny"):
        b, f = _cell(base, m, "h100-sxm")["memory"], _cell(d, m, "h100-sxm")["memory"]
        assert (b["kv_dtype"], f["kv_dtype"]) == ("bf16", "fp8")
        assert b["kv_bytes_per_token"] == KV_ELEMENTS[m] * 2 and f["kv_bytes_per_token"] == KV_ELEMENTS[m] * 1
        assert b["capacity_bytes"] == f["capacity_bytes"] == H100_HBM
        assert b["usable_bytes"] - f["usable_bytes"] == pytest.approx(H100_HBM * (0.9 - 0.8), rel=1e-9)
        for mem in (b, f):
            assert mem["kv_capacity_tokens"] == int(mem["usable_bytes"] // mem["kv_bytes_per_token"])
    # one sequence a step: each output token is a decode step reading gpt2's bf16 weights at most at 3.35 TB/s
    one = _cell(d, "gpt2", "h100-sxm")["throughput_at_slo"]
    assert 0 < one <= H100_HBM_RATE / (2 * GPT2_PARAMS) < _cell(base, "gpt2", "h100-sxm")["throughput_at_slo"]


def test_the_header_names_the_workload_lengths_and_the_slo(priced):
    """Before: the table's title named the SLO and the runtime, never the prompt and output lengths."""
    rc, out, err, d = priced
    words = " ".join(out.split())
    assert "input 128 tokens, output 16 tokens a request" in words
    assert "SLO: p99 TTFT 500 ms, p99 TPOT 50 ms" in words


def test_prices_give_the_cost_per_million_tokens_and_the_ranking(priced):
    """Before: a price gave tokens per dollar in fit.md only, and the ranking stayed by throughput per device.
    Cost per million output tokens = price per device-hour x devices / (output tokens/s x 3600) x 1e6; the priced
    cells rank cheapest first, the unpriced after them."""
    rc, out, err, d = priced
    prices = {"h100-sxm": 2.0, "h200": 6.0}
    for model in d["models"]:
        mine = sorted((c for c in d["cells"] if c["model"] == model), key=lambda c: c["rank"])
        assert [c["rank"] for c in mine] == [1, 2, 3, 4]
        for c in mine:
            p = prices.get(c["hardware"])
            want = None if p is None else p * c["devices"] / (c["throughput_at_slo"] * 3600) * 1e6
            assert c["cost_per_million_output_tokens"] == (None if want is None else pytest.approx(want))
            if want is not None:
                assert f"${want:.3g}" in out
        costs = [c["cost_per_million_output_tokens"] for c in mine]
        assert costs[:2] == sorted(costs[:2]) and costs[2:] == [None, None]
        assert mine[2]["throughput_per_device"] >= mine[3]["throughput_per_device"]  # unpriced: by throughput


@pytest.mark.parametrize("width", [80, 60])
def test_the_table_fits_the_terminal_and_never_cuts_a_platform(priced, width, capsys):
    """Before: one column per platform: at 60 columns four platforms cut their names (what --hardware takes).
    Now one table per workload, a row per platform: no line past the width, every name whole."""
    from opmap.cli.common import console
    from opmap.cli.fit import _print

    rc, out, err, d = priced
    assert rc == 0, err
    if width != 60:  # the command ran at 60 columns: print the same fit at 80
        old = console.width
        console.width = width
        try:
            _print(d, d["models"])
        finally:
            console.width = old
        out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if not x.startswith("wrote ")]  # paths are never broken
    assert max(len(x) for x in lines) <= width
    assert "…" not in out
    starts = [x.split()[0] for x in lines if x.split() and x.split()[0] in PLATFORMS]  # a row per cell
    assert sorted(starts) == sorted(PLATFORMS * len(d["models"]))


def test_a_power_budget_keeps_the_replicas_it_powers(tmp_path, tiny):
    """Before: 8 one-device replicas of an H100 over a 1,400 W budget struck the cell, though 2 H100s at their
    700 W TDP (NVIDIA datasheet) fit it. Each replica draws idle + (TDP - idle) x its busy fraction at its SLO
    rate; the budget keeps floor(1400 / that) of them."""
    from opmap.hardware import get_hardware

    idle = get_hardware("h100-sxm").idle_power_w
    rc, out, err, d = _fit(tmp_path, "--models", f"gpt2,{tiny}", "--hardware", "h100-sxm", "--devices", "1",
                           "--devices-budget", "8", "--slo-p99", "3000", "--power-budget", "1400")
    assert rc == 0, err
    for m in ("gpt2", "tiny"):
        c = _cell(d, m, "h100-sxm")
        (lay,) = c["layouts"]
        u = min(1.0, sum(lay["utilization"]) / len(lay["utilization"]))
        one = idle + (H100_TDP - idle) * u
        assert c["excluded_reason"] == "" and c["rank"] == 1
        assert c["devices"] == min(8, math.floor(1400 / one)) >= 2  # at most 700 W each: at least 2
        assert c["power_w"] == pytest.approx(c["devices"] * one) and c["power_w"] <= 1400
        assert c["throughput_at_slo"] == pytest.approx(lay["output_tokens_per_s"])
    assert "power budget 1400 W" in out


def test_a_cell_that_fits_nowhere_has_no_null_device_count(tmp_path):
    """Before: fit.json held "devices": null for Llama-3-70B on an L4 (70.6B parameters x 2 bytes = 141 GB of
    bf16 weights against the L4's 24 GB, NVIDIA datasheet). Now the count is left out; devices_tried, the
    budget and the reason say what was tried."""
    cfg = tmp_path / "llama-3-70b" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({  # meta-llama/Meta-Llama-3-70B's published shape
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
        "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
        "vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
        "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16"}))
    rc, out, err, d = _fit(tmp_path / "out", "--models", f"llama-3-70b,{cfg}", "--hardware", "l4",
                           "--devices-budget", "1", "--slo-p99", "3000")
    assert rc == 0, err
    assert '"devices": null' not in (tmp_path / "out" / "fit.json").read_text()
    for c in d["cells"]:
        assert "devices" not in c and c["devices_tried"] == [1] and c["devices_budget"] == 1
        assert not c["fits"] and c["rank"] is None and "GiB" in c["excluded_reason"]
