"""The fit matrix: the power model by hand, a served cell's figures consistent, constraints keep cells with reasons."""

from __future__ import annotations

import dataclasses
import json

import pytest

from opmap.errors import OpmapError
from opmap.explore.fit import IDLE_FRACTION, _power_w, check_models, fit_cell, fit_matrix, power_method, rank
from opmap.explore.results import ChosenLayout, Confidence, FitCell, FitStop, LayoutResult
from opmap.hardware import get_hardware
from opmap.record import record
from opmap.serve.metrics import Slo


def test_power_model_by_hand_from_the_catalog_idle():
    # H200: TDP 700 W (NVIDIA H200 datasheet), idle 80.3 W (measured, ALICE GPU Energy Benchmark, in the catalog).
    # 2 devices at a 50% busy fraction: 2 x (80.3 + (700 - 80.3) x 0.5) = 2 x (80.3 + 309.85) = 780.3 W
    h200 = get_hardware("h200")
    assert _power_w(h200, 2, [0.5]) == pytest.approx(780.3)
    assert _power_w(h200, 1, [0.0]) == pytest.approx(80.3)  # idle alone
    assert _power_w(h200, 1, [1.0]) == pytest.approx(700.0)  # busy all the time: the TDP
    # the busy fraction is the mean over replicas: (0.2 + 0.6) / 2 = 0.4 -> 80.3 + 619.7 x 0.4 = 328.18 W
    assert _power_w(h200, 1, [0.2, 0.6]) == pytest.approx(328.18)
    m = power_method(h200)
    assert m.startswith("modelled: idle + (TDP - idle) x busy fraction") and "80.3 W, measured" in m
    assert "ALICE" in m


def test_power_model_falls_back_only_without_an_idle_field():
    h100 = get_hardware("h100-sxm")
    bare = dataclasses.replace(h100, fields={k: v for k, v in h100.fields.items() if k != "idle_power_w"})
    # the stated fallback: idle = 15% of the 700 W TDP = 105 W; 105 + 595 x 0.5 = 402.5 W
    assert _power_w(bare, 1, [0.5]) == pytest.approx(IDLE_FRACTION * 700 + (1 - IDLE_FRACTION) * 700 * 0.5)
    assert "assumed" in power_method(bare) and "lists no idle_power_w" in power_method(bare)
    assert "estimate" in power_method(h100)  # the catalog's H100 idle is an estimate and says so
    assert power_method(get_hardware("tpu-v5e")).startswith("not modelled: tpu-v5e lists no TDP")


def test_a_served_cell_and_a_struck_one():
    slo = Slo(0.5, 0.05)
    r = fit_matrix(["gpt2"], ["h100-sxm", "l4"], slo, "256", "32", 150, power_budget_w=100.0,
                   prices={"h100-sxm": 2.0}, devices=1, devices_budget=1, workers=1)
    h100, l4 = (next(c for c in record(r)["cells"] if c["hardware"] == h) for h in ("h100-sxm", "l4"))
    assert h100["fits"] and h100["devices"] == 1 and h100["throughput_at_slo"] > 0
    assert h100["layout"]["tp"] == 1 and h100["layout"]["replicas"] == 1 and h100["runner_up"] is None
    # one device in the budget: the throughput per device is the cell's throughput
    assert h100["throughput_per_device"] == pytest.approx(h100["throughput_at_slo"])
    # energy per token and perf per watt are one figure, two ways; perf per dollar from the price per device-hour
    assert h100["energy_per_token_j"] == pytest.approx(h100["power_w"] / h100["throughput_at_slo"])
    assert h100["perf_per_watt"] == pytest.approx(1 / h100["energy_per_token_j"])
    assert h100["perf_per_dollar"] == pytest.approx(h100["throughput_at_slo"] * 3600 / 2.0)
    # the power lies between the catalog idle (80.3 W) and the TDP (700 W)
    assert 80.3 <= h100["power_w"] <= 700.0
    # busy at its SLO rate the H100 draws over a 100 W budget: kept, struck, with the numbers
    assert "over the 100 W budget" in h100["excluded_reason"] and h100["rank"] is None
    assert l4["excluded_reason"] == "" and l4["rank"] == 1  # 72 W TDP: inside the budget whatever it does
    assert l4["bound"] in ("memory", "compute", "overhead")
    # the sourced risk: level and source from the catalog
    assert h100["risk"] == "low" and "TensorRT-LLM" in h100["risk_source"]
    assert l4["risk"] == "medium" and l4["risk_source"]
    assert "idle 8.3 W, estimate" in l4["power_method"]
    # the capacity is the steady search's: never above the saturation rate of the same layout, its run stated
    cap = h100["capacity"]
    assert h100["rate_at_slo_per_s"] == cap["rate_per_s"] <= cap["saturation_per_s"]
    assert cap["run"]["requests"] >= 150 and cap["run"]["verdict"] == "stationary"


def test_serve_and_fit_give_the_same_capacity_for_the_same_cell(tmp_path, capsys):
    """One search, the same defaults: serve --find-capacity on one H100 and fit's one-device layout of the same
    cell (same lengths, SLO, seed and run length) find the same rate to the last digit (before: fit ran 500
    requests from a start of 1 request/s, serve 1000 from its --arrival rate, and they disagreed)."""
    from opmap.cli import main

    rc = main(["serve", "gpt2", "--hardware", "h100-sxm", "--input-len", "128", "--output-len", "16",
               "--slo-ttft", "500", "--slo-tpot", "50", "--find-capacity", "--arrival", "poisson:3",
               "--out", str(tmp_path), "--no-store"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    served = json.loads((tmp_path / "serve.json").read_text())
    cell = fit_cell("gpt2", "h100-sxm", Slo(0.5, 0.05), "128", "16", 1000, devices=1, devices_budget=1)
    assert cell.chosen.capacity["rate_per_s"] == pytest.approx(served["capacity"]["rate_per_s"], rel=1e-12)
    assert cell.chosen.capacity["saturation_per_s"] == pytest.approx(served["capacity"]["saturation_per_s"], rel=1e-12)
    # serve prints the run at that rate: its arrival and its figures are the capacity run's, the rate once
    assert served["arrival"] == f"poisson:{served['capacity']['rate_per_s']:g}"
    assert served["latency"]["e2e"]["p99_s"] == pytest.approx(cell.latency_p99_s, rel=1e-12)
    assert out.count("capacity: ") == 1 and "saturation" in out


def test_datasheet_only_cells_are_ranked_after_the_rest_unless_asked():
    """A datasheet-only device (its catalog lacks achievable figures) never ranks first by default, even at
    twice the throughput per device; --include-datasheet-only ranks it with the others."""
    cells = [FitCell("m", "a", datasheet_only=("achievable_bandwidth",), throughput_per_device=200.0),
             FitCell("m", "b", throughput_per_device=100.0),
             FitCell("m", "c", excluded_reason="struck", throughput_per_device=300.0)]
    assert [c.rank for c in rank(cells, ["m"])] == [2, 1, None]
    assert [c.rank for c in rank(cells, ["m"], include_datasheet_only=True)] == [1, 2, None]


def test_fit_takes_what_analyze_takes_and_refuses_the_rest(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text("{}")
    check_models(["gpt2", str(cfg), "hf:meta-llama/Llama-3.1-8B"])  # accepted (built when priced)
    for bad in ("nosuch", "resnet50", str(tmp_path / "missing.json"), "nofile.py:make"):
        with pytest.raises(OpmapError, match=r"opmap fit serves decoders .*not one: .*\(accepted: a zoo decoder"):
            check_models([bad])


def test_a_power_budget_keeps_the_replicas_it_powers_by_hand():
    """Two H100s busy all the time draw 2 x 700 W = 1,400 W (TDP 700 W, NVIDIA H100 SXM datasheet): a 1,400 W budget
    keeps 2 of 8 one-device replicas (a quarter of the throughput) and no 8-device replica (5,600 W); 600 W keeps
    none, and the cell is struck with the least draw named."""
    from opmap.explore.fit import _over_budget, power_fit
    from opmap.explore.layouts import choose

    h100 = get_hardware("h100-sxm")

    def layouts():
        one = LayoutResult(1, 1, 1, 8, 8, fits=True, rate_per_s=10.0, output_tokens_per_s=8000.0,
                           per_device_tokens_per_s=1000.0, utilization=[1.0])
        eight = LayoutResult(8, 1, 8, 1, 8, fits=True, rate_per_s=30.0, output_tokens_per_s=12000.0,
                             per_device_tokens_per_s=1500.0, utilization=[1.0])
        return [one, eight]

    tried, within = power_fit(layouts(), h100, 1400.0)
    best, runner = choose(within)
    assert best is tried[0] and runner is None
    assert (best.replicas, best.devices_used, best.power_w) == (2, 2, pytest.approx(1400.0))
    assert best.output_tokens_per_s == pytest.approx(2000.0) and best.per_device_tokens_per_s == 250.0
    assert best.power_limited == "2 of 8 replicas within the 1400 W budget"
    assert tried[1].over_power_budget and tried[1].power_w == pytest.approx(5600.0)
    tried, within = power_fit(layouts(), h100, 600.0)
    assert within == [] and choose(within) == (None, None)
    assert _over_budget(tried, 600.0).endswith("1 x tp1 (1 device), draws 700 W at its SLO rate, over the 600 W budget")


def test_fit_cell_keys_in_order():
    """fit.json's cell (schema 3): the layouts whole, the chosen layout and the runner-up in brief (``ep`` only past
    1), the engine preset and confidence only where set, the chosen layout's figures last and only where one was
    chosen."""
    from opmap.hardware.trust import Input, Trust

    keys = ["model", "hardware", "fits", "throughput_at_slo", "throughput_per_device", "latency_p99_s",
            "perf_per_watt", "energy_per_token_j", "power_w", "power_method", "perf_per_dollar",
            "cost_per_million_output_tokens", "bound", "risk", "risk_source", "datasheet_only", "devices_budget",
            "layout", "runner_up", "layouts", "rank", "excluded_reason", "runtime", "devices_tried", "dtype",
            "dtype_line"]
    bare = FitCell("m", "h", devices_tried=(1, 2))
    assert list(record(bare)) == keys and record(bare)["layout"] is None and record(bare)["devices_tried"] == [1, 2]
    lay = dataclasses.replace(LayoutResult.of(2, 1, 4), fits=True, rate_per_s=3.0, limited_by="slo")
    moe = LayoutResult.of(2, 1, 4, ep=2)
    trust = Trust("datasheet", Input("peak", "datasheet", "s"), (Input("peak", "datasheet", "s"),))
    chosen = ChosenLayout(4, 6.0, {"rate_per_s": 3.0}, None, None)
    cell = dataclasses.replace(bare, layout=lay, runner_up=moe, layouts=(lay, moe), engine_preset={"engine": "vllm"},
                               confidence=Confidence(trust), chosen=chosen)
    d = record(cell)
    assert list(d) == [*keys, "engine_preset", "confidence", "devices", "rate_at_slo_per_s", "capacity", "memory",
                       "power_limited"]
    brief = ["tp", "pp", "devices_per_replica", "replicas", "devices_used", "rate_per_s", "saturation_per_s",
             "output_tokens_per_s", "per_device_tokens_per_s", "latency_p99_s", "limited_by"]
    assert list(d["layout"]) == brief and list(d["runner_up"]) == [*brief, "ep"] and d["runner_up"]["ep"] == 2
    assert d["layouts"][0] == record(lay) and d["layout"]["rate_per_s"] == 3.0
    assert list(d["confidence"]) == ["label", "weakest", "inputs", "line"]
    assert d["confidence"]["line"] == trust.line() and d["devices"] == 4
    stop = FitStop("SIGTERM", 1, 2, ("m on h",))
    assert record(stop) == {"signal": "SIGTERM", "cells_done": 1, "cells_total": 2, "cells_not_run": ["m on h"]}
