"""The measured MoE grids (opmap.hardware.moe_grid): the catalog files load and are bounded, a malformed one is one
clear error, and a lookup returns the measured latency at a measured point and the log-log interpolation between
two, the values read from the file here (NVIDIA's aiconfigurator tables, benchmarks/reference/aiconfigurator_moe.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from opmap.errors import OpmapError
from opmap.hardware import get_hardware
from opmap.hardware import moe_grid as mg
from opmap.hardware.moe_grid import MoeShape, Rates, load_moe_grid

CATALOG = Path(mg.__file__).with_name("catalog")
DEVICES = {"h100-sxm": {"bf16", "fp8", "fp8-block", "mxfp4"}, "h200": {"bf16", "fp8", "fp8-block", "mxfp4"},
           "b200": {"bf16", "fp8", "fp8-block", "nvfp4", "w4a8-mxfp4"},
           "gb200": {"bf16", "fp8", "fp8-block", "nvfp4", "w4a8-mxfp4"}}
GPT_OSS_120B = [2880, 2880, 4, 128, 1, 1]  # hidden, expert width, top-k, experts (openai/gpt-oss-120b config.json)
RATES = Rates(4.5e15, 8e12, 0.53)  # only ratios of roofline_s are used; an exact hit does not read them


def _raw(device: str, fmt: str, shape: list[int]) -> dict:
    """One measured shape of the catalog file, its latencies as opmap reads them: the running minimum from the
    largest token count down (a count runs padded to a larger one at worst; opmap.hardware.moe_grid)."""
    j = json.loads((CATALOG / f"{device}.moe.json").read_text())
    e = next(e for e in j["tables"][fmt]["shapes"] if e["shape"] == shape)
    lat = e["latency_us"]
    return {**e, "latency_us": [min(lat[i:]) for i in range(len(lat))]}


def test_more_tokens_never_run_faster():
    """gpt-oss-120b on a B200 (w4a8-mxfp4, tp 1 ep 1) measures 465.3 us at 1536 tokens and 434.0 at 2048 (the
    file's values): 1536 tokens run padded to 2048 at worst, so they price at 2048's."""
    j = json.loads((CATALOG / "b200.moe.json").read_text())
    e = next(e for e in j["tables"]["w4a8-mxfp4"]["shapes"] if e["shape"] == GPT_OSS_120B)
    at = dict(zip(e["tokens"], e["latency_us"]))
    assert at[2048] < at[1536]
    p = load_moe_grid("b200.moe.json").layer_s("w4a8-mxfp4", MoeShape(*GPT_OSS_120B), 1536, RATES)
    assert p.seconds == pytest.approx(at[2048] * 1e-6, rel=1e-9)
    assert min(e["latency_us"][e["tokens"].index(2048):]) == at[2048]  # no larger count measures less


@pytest.mark.parametrize("device", sorted(DEVICES))
def test_each_grid_file_loads_is_bounded_and_named_by_its_device(device):
    name = f"{device}.moe.json"
    assert get_hardware(device).calibration["moe_grid"] == name
    assert "aiconfigurator" in get_hardware(device).calibration["moe_grid_source"]
    g = load_moe_grid(name)
    assert set(g.formats()) == DEVICES[device] | {"fp16"}  # fp16 reads the bf16 table
    assert (CATALOG / name).stat().st_size < 300_000
    for fmt in DEVICES[device]:
        shapes = g.tables[fmt]
        assert 0 < len(shapes) <= 200
        for m in shapes:
            assert m.shape.tp * m.shape.ep <= 8  # the extractor keeps one HGX node's layouts
            assert len(m.log_tokens) <= 27  # the tables measure 1 - 16384 tokens at 27 counts


def test_an_exact_shape_and_token_count_is_the_measured_latency():
    e = _raw("b200", "w4a8-mxfp4", GPT_OSS_120B)
    i = e["tokens"].index(64)
    p = load_moe_grid("b200.moe.json").layer_s("w4a8-mxfp4", MoeShape(*GPT_OSS_120B), 64, RATES)
    assert p.exact
    assert p.seconds == pytest.approx(e["latency_us"][i] * 1e-6, rel=1e-9)


@pytest.mark.parametrize("device,fmt", [("b200", "w4a8-mxfp4"), ("h200", "mxfp4")])
def test_between_two_measured_token_counts_the_latency_is_log_log(device, fmt):
    e = _raw(device, fmt, GPT_OSS_120B)
    i = e["tokens"].index(16)
    t0, t1 = e["tokens"][i], e["tokens"][i + 1]
    l0, l1 = e["latency_us"][i], e["latency_us"][i + 1]
    t = 24  # between 16 and 32
    # log l = log l0 + (log t - log t0) / (log t1 - log t0) x (log l1 - log l0)
    want = math.exp(math.log(l0) + (math.log(t) - math.log(t0)) / (math.log(t1) - math.log(t0))
                    * (math.log(l1) - math.log(l0))) * 1e-6
    p = load_moe_grid(f"{device}.moe.json").layer_s(fmt, MoeShape(*GPT_OSS_120B), t, RATES)
    assert p.seconds == pytest.approx(want, rel=1e-9)
    assert min(l0, l1) * 1e-6 < p.seconds < max(l0, l1) * 1e-6 or l0 == l1


def test_past_the_grid_the_edge_efficiency_carries_over_and_says_so():
    """At 4 x the largest measured count, compute-bound at the edge: the roofline scales by 4 (FLOPs linear in the
    tokens, ``roofline_s``), so the time is 4 x the edge's measured latency."""
    e = _raw("b200", "w4a8-mxfp4", GPT_OSS_120B)
    top, lat = e["tokens"][-1], e["latency_us"][-1]
    s = MoeShape(*GPT_OSS_120B)
    flops_s = 6.0 * top * s.topk * s.hidden * s.inter / RATES.matrix_flops_per_s
    assert flops_s > (s.experts * 3 * s.hidden * s.inter * RATES.weight_bytes + 4 * top * s.hidden) / \
        RATES.memory_bytes_per_s  # compute-bound at the edge: the ratio below is the FLOPs'
    p = load_moe_grid("b200.moe.json").layer_s("w4a8-mxfp4", s, 4 * top, RATES)
    assert p.seconds == pytest.approx(4 * lat * 1e-6, rel=1e-9)
    assert "not extrapolated" in p.note


def test_a_shape_not_measured_takes_the_nearest_ones_efficiency():
    """Hidden 3072 (not in the table) at gpt-oss's expert width, top 4 of 128: the nearest measured shape is
    gpt-oss-120b's; at 64 tokens both are memory-bound on every active expert's weights (256 routed tokens reach all
    128), so the time scales by the weight bytes, 3072 / 2880, over the measured 2880 time."""
    e = _raw("b200", "w4a8-mxfp4", GPT_OSS_120B)
    lat = e["latency_us"][e["tokens"].index(64)] * 1e-6
    s = MoeShape(3072, 2880, 4, 128)
    p = load_moe_grid("b200.moe.json").layer_s("w4a8-mxfp4", s, 64, RATES)
    w = lambda h: (128 * 3 * h * 2880 * RATES.weight_bytes + 4 * 64 * h) / RATES.memory_bytes_per_s  # noqa: E731
    assert not p.exact and "2880x2880 top4 of 128" in p.note
    assert p.seconds == pytest.approx(lat * w(3072) / w(2880), rel=1e-9)


@pytest.mark.parametrize("text,words", [
    ("{not json", "cannot read MoE grid"),
    ('{"tables": {}}', "missing 'tables'"),
    ('{"tables": {"fp8": {"shapes": [{"shape": [1, 2, 3], "tokens": [1], "latency_us": [1.0]}]}}}',
     "shape must list hidden, inter, topk, experts, tp, ep"),
    ('{"tables": {"fp8": {"shapes": [{"shape": [8, 8, 1, 8, 1, 1], "tokens": [4, 2], "latency_us": [1, 2]}]}}}',
     "tokens must increase"),
    ('{"tables": {"fp8": {"shapes": [{"shape": [8, 8, 1, 8, 1, 1], "tokens": [1, 2], "latency_us": [1, -2]}]}}}',
     "latency_us[1]"),
    ('{"tables": {"fp8": {"shapes": [{"shape": [8, 8, 1, 8, 1, 1], "tokens": [1], "latency_us": [1]}]}}, '
     '"aliases": {"fp16": "bf16"}}', "alias fp16 -> 'bf16' names no table"),
])
def test_a_malformed_grid_is_one_clear_error(tmp_path, monkeypatch, text, words):
    (tmp_path / "bad.moe.json").write_text(text)
    monkeypatch.setattr(mg, "MOE_GRID_DIR", tmp_path)
    load_moe_grid.cache_clear()
    try:
        with pytest.raises(OpmapError) as e:
            load_moe_grid("bad.moe.json")
        assert words in str(e.value) and "\n" not in str(e.value)
    finally:
        load_moe_grid.cache_clear()


def test_a_grid_name_outside_the_catalog_is_refused():
    with pytest.raises(OpmapError, match="beside the catalog"):
        load_moe_grid("../b200.moe.json")


def test_the_models_own_layout_prices_it_before_another_model_of_the_same_per_device_shape():
    """Llama 4 Maverick (hidden 5120, expert width 8192, top 1 of 128) at ep 8 holds 16 experts a GPU, as Scout's 16
    at ep 1 do; the table's Maverick ep 8 row prices it (at 448 tokens: between its 384 and 512 points)."""
    shape = [5120, 8192, 1, 128, 1, 8]
    e = _raw("h200", "fp8", shape)
    i = e["tokens"].index(384)
    l0, l1 = e["latency_us"][i], e["latency_us"][i + 1]
    assert e["tokens"][i + 1] == 512
    want = math.exp(math.log(l0) + (math.log(448) - math.log(384)) / (math.log(512) - math.log(384))
                    * (math.log(l1) - math.log(l0))) * 1e-6
    p = load_moe_grid("h200.moe.json").layer_s("fp8", MoeShape(*shape), 448, RATES)
    assert p.exact and p.seconds == pytest.approx(want, rel=1e-9)
