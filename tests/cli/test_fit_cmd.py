"""opmap fit: the fit.json contract, bad input in one line."""

from __future__ import annotations

import importlib.util
import json

import pytest


def test_fit_writes_the_contract(tmp_path, cli):
    rc, out, err = cli("fit", "--models", "gpt2", "--hardware", "l4", "--slo-p99", "3000", "--requests", "100",
                       "--input-len", "128", "--output-len", "16", "--devices-budget", "2", "--out", tmp_path)
    assert rc == 0, err
    d = json.loads((tmp_path / "fit.json").read_text())
    (c,) = d["cells"]
    keys = {"model", "hardware", "devices", "fits", "throughput_at_slo", "latency_p99_s", "perf_per_watt",
            "energy_per_token_j", "power_method", "perf_per_dollar", "bound", "risk", "risk_source", "rank",
            "excluded_reason"}
    assert keys <= set(c) and c["latency_p99_s"] <= 3.0
    assert c["power_method"].startswith("modelled: idle + (TDP - idle) x busy fraction")
    assert "idle 8.3 W" in c["power_method"] and c["risk"] == "medium" and c["risk_source"]
    assert "3000 ms" in out and "p99 end to end 3000 ms" in (tmp_path / "fit.md").read_text()
    # the layout search on a budget of two: the chosen layout and the runner-up named in the table and fit.md
    assert d["schema_version"] == 3 and d["runtime"] == "engine" and c["devices_budget"] == 2
    assert c["layout"]["devices_used"] <= 2 and c["runner_up"] is not None
    md = (tmp_path / "fit.md").read_text()
    assert "| layout | runner-up |" in md and "runner-up" in out
    # the catalog's L4 has no achievable bandwidth: the cell says so (and would rank after like-for-like cells)
    assert c["datasheet_only"] and "l4 (datasheet only: achievable_" in md and "datasheet only" in out
    # ... and its confidence label says the same (issue 39): a datasheet-priced cell, the weakest input named
    conf = c["confidence"]
    assert conf["label"] == "datasheet" and conf["weakest"]["kind"] in ("datasheet", "derived", "assumed")
    assert f"[datasheet: {conf['weakest']['name']}]" in md
    png = tmp_path / "trade_curve.png"
    if importlib.util.find_spec("matplotlib"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert not png.exists() and "matplotlib is not installed" in out


def test_fit_prices_a_qwen2_config_with_per_layer_types(tmp_path, cli, published_config):
    """Qwen2.5-7B (hub: Qwen/Qwen2.5-7B) on one H100 SXM. Before: IndexError in config.layer_types[i] (fit's 1-
    and 2-layer captures). Its output tokens/s cannot beat the weight read: each decode step of the 20 requests
    (all in flight at once) reads the 7,615,616,512 bf16 parameters at 3.35 TB/s (datasheet): at most
    20 x 3.35e12 / (2 x 7,615,616,512) = 4,399 tokens/s."""
    rc, out, err = cli("fit", "--models", published_config("Qwen/Qwen2.5-7B"), "--hardware", "h100-sxm",
                       "--slo-p99", "3000", "--requests", "20", "--input-len", "128", "--output-len", "16",
                       "--devices-budget", "1", "--out", tmp_path, "--no-store")
    assert rc == 0, err
    (c,) = json.loads((tmp_path / "fit.json").read_text())["cells"]
    assert c["fits"] and c["layout"]["devices_used"] == 1
    assert 0 < c["throughput_per_device"] <= 20 * 3.35e12 / (2 * 7_615_616_512)


def test_fit_refuses_bad_input(refused):
    refused("fit", "--models", "gpt2", "--hardware", "l4", "--price", "l4=cheap",
            needle="--price takes NAME=USD_PER_HOUR")
    refused("fit", "--models", "gpt2", "--hardware", "l4", "--slo-p99", "100", "--slo-ttft", "50",
            needle="give --slo-p99, or --slo-ttft and --slo-tpot, not both")
    refused("fit", "--models", "gpt2", "--hardware", "l4", "--price", "h100-sxm=2",
            needle="--price names h100-sxm, not among --hardware")
    refused("fit", "--models", "nosuch,gpt2", "--hardware", "l4", needle="not one: nosuch (accepted: ")
    refused("fit", "--models", "resnet50", "--hardware", "l4", needle="not one: resnet50")
    refused("fit", "--models", "gpt2", "--hardware", "l4", "--engine", "spark",
            needle="unknown engine 'spark'; accepted: local, ray")
    refused("fit", "--models", "gpt2", "--hardware", "l4", "--runtime", "jit",
            needle="unknown runtime 'jit'; accepted: eager")
    refused("fit", "--models", "gpt2", "--hardware", "l4", "--devices-budget", "0", needle="--devices-budget")
    refused("fit", "--models", "gpt2", "--hardware", "l4", "--devices", "4", "--devices-budget", "2",
            needle="--devices 4 per replica exceeds --devices-budget 2")


def test_an_earlier_trade_curve_never_stays_beside_a_new_fit_json(tmp_path, cli):
    """A second fit into the same folder whose SLO no platform meets has no curve to draw: the first run's
    trade_curve.png goes in the same step as the new fit.json lands. (p99 end to end under 1 ms: the prefill and
    3 decode steps of a 4-token answer each read gpt2's 124M bf16 weights, 248 MB, at the L4's 300 GB/s, so
    at least 4 x 0.83 ms = 3.3 ms.)"""
    pytest.importorskip("matplotlib")
    args = ("fit", "--models", "gpt2", "--hardware", "l4", "--requests", "20", "--input-len", "128",
            "--output-len", "4", "--devices-budget", "1", "--out", tmp_path, "--no-store")
    rc, _, err = cli(*args, "--slo-p99", "3000")
    assert rc == 0, err
    assert (tmp_path / "trade_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rc, out, err = cli(*args, "--slo-p99", "1")
    assert rc == 0, err
    assert "trade_curve.png not drawn: no platform has a throughput at the SLO" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fit.json", "fit.md"]
    assert json.loads((tmp_path / "fit.json").read_text())["cells"][0]["throughput_at_slo"] is None


def test_fit_refuses_a_price_that_is_not_a_positive_number(refused, fail_if_called):
    """Before: --price l4=nan was taken and fit.json held a bare NaN perf per dollar (not JSON)."""
    fail_if_called("opmap.explore.fit.fit_matrix")
    for usd in ("nan", "inf", "0", "-2"):
        line = refused("fit", "--models", "gpt2", "--hardware", "l4", "--price", f"l4={usd}", needle="--price l4")
        assert line.endswith(f"--price l4 must be a number > 0 and <= 10000 USD per hour (got {float(usd):g})")


@pytest.mark.parametrize("args,needle", [
    (("--price", "l4=1e300"), "--price l4 must be a number > 0 and <= 10000 USD per hour (got 1e+300)"),
    (("--power-budget", "1e300"), "--power-budget must be a number > 0 and <= 1000000000 W (a gigawatt at most)"),
    (("--slo-tpot", "1e308"), "--slo-tpot must be a number > 0 and <= 86400000 ms (one day at most) (got 1e+308)"),
])
def test_fit_refuses_absurd_numbers(refused, fail_if_called, args, needle):
    """Before: a price of 1e300 USD an hour, a power budget of 1e300 W or a TPOT limit of 1e308 ms were taken as they
    were (opmap.validate.CEILINGS)."""
    fail_if_called("opmap.explore.fit.fit_matrix")
    refused("fit", "--models", "gpt2", "--hardware", "l4", *args, needle=needle)


@pytest.mark.parametrize("args,needle", [
    (("--kv-dtype", "fp4"), "unknown --kv-dtype 'fp4'; accepted: bf16, fp16, fp8, int8 or nvfp4"),
    (("--gpu-memory-utilization", "0"), "--gpu-memory-utilization must be a number > 0 and <= 1 (got 0)"),
    (("--gpu-memory-utilization", "1.5"), "--gpu-memory-utilization must be a number > 0 and <= 1 (got 1.5)"),
    (("--max-num-seqs", "0"), "--max-num-seqs must be an integer from 1"),
    (("--max-num-seqs", "64", "--max-num-batched-tokens", "32"),
     "--max-num-batched-tokens (32) must be >= --max-num-seqs (64)"),
])
def test_fit_refuses_engine_settings_as_serve_does(refused, fail_if_called, args, needle):
    """fit takes serve's engine options with serve's checks: refused in one line before any cell runs."""
    fail_if_called("opmap.explore.fit.fit_matrix")
    refused("fit", "--models", "gpt2", "--hardware", "l4", *args, needle=needle)
    refused("serve", "gpt2", *args, needle=needle)  # the same words as serve's
