"""The dashboard's typed figure spec (report.chart): Plotly's figure JSON from it, rounding to significant digits,
and the figure builders of report.dashboard returning it, on a Hugging Face config's analysis and a zoo model's."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from opmap.report.chart import Axis, Bar, ColorBar, Figure, Heatmap, Layout, Line, Marker, Scatter, Title, sig


def _scatter_figure() -> Figure:
    return Figure((Scatter(mode="lines+markers", name="a", x=(1.0, 2.0 / 3.0), y=(None, 1e9 / 7), text=("p", "q"),
                           line=Line("#000000", "dot"), marker=Marker("#111111", "x")),),
                  Layout(Title("t"), Axis(type="log", title=Title("x")), Axis(title=Title("y"), range=(0, 1.02))))


def test_plotly_json_keys_in_plotlys_names_unset_fields_left_out():
    fig = _scatter_figure().to_plotly_json()
    assert fig == {"data": [{"type": "scatter", "mode": "lines+markers", "name": "a", "x": [1.0, 2.0 / 3.0],
                             "y": [None, 1e9 / 7], "text": ["p", "q"], "line": {"color": "#000000", "dash": "dot"},
                             "marker": {"color": "#111111", "symbol": "x"}}],
                   "layout": {"title": {"text": "t"}, "xaxis": {"type": "log", "title": {"text": "x"}},
                              "yaxis": {"title": {"text": "y"}, "range": [0, 1.02]}}}
    # the trace's keys in Plotly's trace order (legendgroup unset: left out), a layout without bars x then y
    assert list(fig["data"][0]) == ["type", "mode", "name", "x", "y", "text", "line", "marker"]
    assert list(fig["layout"]["xaxis"]) == ["type", "title"] and list(fig["layout"]["yaxis"]) == ["title", "range"]
    assert json.loads(json.dumps(fig)) == fig  # plain JSON values only


def test_a_bar_charts_layout_lists_the_y_axis_first():
    """The key order the pages written before the spec was typed have: title, barmode, yaxis, xaxis."""
    fig = Figure((Bar(name="b", x=("mlp",), y=(1.5,)),),
                 Layout(Title("t"), Axis(title=Title("layer type")), Axis(title=Title("time (s)")), barmode="group"))
    assert list(fig.to_plotly_json()["layout"]) == ["title", "barmode", "yaxis", "xaxis"]
    assert fig.to_plotly_json()["data"] == [{"type": "bar", "name": "b", "x": ["mlp"], "y": [1.5]}]


def test_rounded_keeps_four_significant_digits_everywhere_and_nothing_else():
    """2/3 -> 0.6667, 1e9/7 = 142,857,142.857 -> 1.429e8; ints, None and strings untouched; NaN has no JSON: None."""
    r = _scatter_figure().rounded()
    (t,) = r.data
    assert t.x == (1.0, 0.6667) and t.y == (None, 1.429e8) and t.text == ("p", "q")
    assert r.layout.yaxis.range == (0, 1.02) and r.layout == _scatter_figure().layout
    heat = Heatmap(x=("h",), y=("m",), z=((float("nan"), 123456.0),), text=(("a", "b"),), colorscale="Viridis",
                   colorbar=ColorBar(Title("c")), hovertemplate="%{z}")
    assert Figure((heat,), r.layout).rounded().data[0].z == ((None, 123500.0),)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.name = "b"  # type: ignore[misc]
    assert sig(123456.789) == 123500.0 and sig([2.0 / 3.0, 7]) == [0.6667, 7]


TINY = str(Path(__file__).resolve().parents[2] / "examples" / "tiny-llama.json")  # a Hugging Face config.json


@pytest.mark.parametrize("model", [TINY, "gpt2"])
def test_the_builders_return_typed_figures_on_an_hf_config_and_a_zoo_model(model):
    """The roofline and the layer-type bars of an analysis (a Hugging Face config, a zoo model): the memory slope
    y = bandwidth x intensity (h100-sxm's catalog bandwidth), a bar per layer type."""
    from opmap.analyze import analyze
    from opmap.hardware import get_hardware
    from opmap.report.dashboard import Sources, layer_time, roofline
    from opmap.store.db import payload_rows
    from opmap.workloads import load_workload

    hw = get_hardware("h100-sxm")
    body = analyze(load_workload(model, batch=1, seq=32, dtype="bf16"), hw, "bf16").to_dict()
    kernels, lts = payload_rows(body)
    src = Sources(title="t", origin="o", tags={}, body=body, kernels=kernels, layer_types=lts)
    roof = roofline(src)
    assert isinstance(roof, Figure) and all(isinstance(t, Scatter) for t in roof.data)
    mem = next(t for t in roof.data if t.name.startswith("memory"))
    assert all(y == pytest.approx(hw.memory_bandwidth_bytes_per_s * x) for x, y in zip(mem.x, mem.y))
    bars = layer_time(src)
    assert isinstance(bars, Figure) and isinstance(bars.data[0], Bar)
    assert set(bars.data[0].x) == {lt["layer_type"] for lt in lts}
