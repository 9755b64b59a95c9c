"""The HTML dashboard's content (report.html, report.dashboard, report.figures) on a real tiny CPU profile: one
plotly bundle, nothing fetched from the network, tags and table as the run has them, figures from formulas."""

from __future__ import annotations

import json
import re

import pytest

from opmap.errors import OpmapError
from opmap.record import record
from opmap.report.chart import sig
from opmap.report.dashboard import from_dir
from opmap.report.html import write_report


@pytest.fixture(scope="module")
def profile_dir(tiny_profile, tmp_path_factory):
    from opmap.report.profile_sheet import write_profile_outputs

    d = tmp_path_factory.mktemp("profile")
    write_profile_outputs(tiny_profile, d)
    return d


@pytest.fixture(scope="module")
def page(profile_dir):
    """(the page's text, the profile.json body, the paths written)."""
    paths = write_report(from_dir(profile_dir), profile_dir / "report.html")
    return (profile_dir / "report.html").read_text(), json.loads((profile_dir / "profile.json").read_text()), paths


def _script(page: str, ident: str):
    m = re.search(rf'<script type="application/json" id="{ident}">(.*?)</script>', page, re.S)
    assert m, ident
    return json.loads(m.group(1))


def test_one_plotly_bundle_and_no_network_reference(page):
    from plotly.offline import get_plotlyjs

    text, _, _ = page
    head = get_plotlyjs()[:300]
    assert text.count(head) == 1
    assert len(re.findall(r"<script>", text)) == 2  # the bundle and the page's own script
    # the page's own markup (the bundle taken out: its strings hold links it only draws, such as the plotly
    # logo's, which the page turns off; the browser test checks nothing is requested) loads nothing from
    # elsewhere: no src/href to a scheme or a protocol-relative URL, no stylesheet link, no frame
    own = text.replace(get_plotlyjs(), "")
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:[a-z]+:)?//""", own, re.I)
    assert "<link" not in own and "@import" not in own and "<iframe" not in own


def test_tags_are_the_runs_tags(page):
    text, body, _ = page
    assert _script(text, "opmap-tags") == body["tags"]


def test_table_has_one_row_per_kernel(page):
    text, body, _ = page
    tbody = re.search(r'<table class="sheet" id="kernel-table">.*?<tbody>(.*?)</tbody>', text, re.S).group(1)
    assert tbody.count("<tr>") == len(body["kernels"]) == 3  # Linear, GELU, Linear: eager, one kernel each


def test_figure_data_rounded_to_four_significant_digits(page):
    figs = _script(page[0], "opmap-figures")

    def floats(x):
        if isinstance(x, float):
            yield x
        elif isinstance(x, dict):
            for v in x.values():
                yield from floats(v)
        elif isinstance(x, list):
            for v in x:
                yield from floats(v)

    xs = list(floats(figs))
    assert xs and all(float(f"{x:.3e}") == x for x in xs)


def test_sig_rounds_to_significant_digits():
    # 4 significant digits by definition: the first four digits kept, the fifth rounds
    assert sig(123456.789) == 123500.0
    assert sig(0.000123456) == 0.0001235
    assert sig({"a": [2.0 / 3.0, 7], "b": "x"}) == {"a": [0.6667, 7], "b": "x"}
    assert sig(float("nan")) is None and sig(0.0) == 0.0


def test_roofline_points_and_ceilings_from_the_formulas(page):
    """Each kernel at (FLOPs / bytes, FLOPs / time); the ceilings are the test spec's (conftest spec_dict):
    memory 10 GB/s as y = 10e9 x, the fp32 matrix peak 50 GFLOP/s and the vector peak 5 GFLOP/s flat."""
    text, body, _ = page
    fig = _script(text, "opmap-figures")["roofline"]
    nodes = {n["id"]: n for n in body["nodes"]}
    matrix = next(k for k in body["kernels"] if k["kernel_class"] == "matrix")
    flops = sum(nodes[n]["flops"] for n in matrix["nodes"])
    x, y = flops / matrix["traffic_bytes"], flops / matrix["predicted_s"]
    predicted = [t for t in fig["data"] if t["name"].endswith("(predicted)")]
    assert any(any(px == pytest.approx(x, rel=1e-3) and py == pytest.approx(y, rel=1e-3)
                   for px, py in zip(t["x"], t["y"])) for t in predicted)
    assert any(t["name"].endswith("(measured)") for t in fig["data"])  # a profile: measured points too
    lines = {t["name"].split(" ")[0]: t for t in fig["data"] if t["mode"] == "lines"}
    mem = lines["memory"]
    assert all(yy == pytest.approx(10e9 * xx, rel=1e-3) for xx, yy in zip(mem["x"], mem["y"]))
    assert set(lines["matrix"]["y"]) == {50e9} and set(lines["vector"]["y"]) == {5e9}


def test_trace_and_pngs_beside_the_page(page, profile_dir):
    text, _, paths = page
    names = {p.name for p in paths}
    assert 'href="trace.json"' in text and "ui.perfetto.dev" in text
    assert (profile_dir / "trace.json").is_file()  # the profile's own trace, linked where it lies
    figs = _script(text, "opmap-figures")
    assert {f"report_{n}.png" for n in figs} <= names
    for n in figs:
        assert (profile_dir / f"report_{n}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_over_the_size_budget_writes_nothing(profile_dir, tmp_path):
    with pytest.raises(OpmapError, match=r"over the 1.0 MB budget"):
        write_report(from_dir(profile_dir), tmp_path / "small.html", max_bytes=1_000_000)
    assert list(tmp_path.iterdir()) == []


def test_kernel_trace_lays_kernels_end_to_end(page):
    from opmap.report.trace import kernel_trace

    _, body, _ = page
    src_kernels = from_dir_kernels(body)
    t = kernel_trace(src_kernels, {"x": 1}, "t")
    pred = [e for e in t.events if e.tid == 2 and e.ph == "X"]
    assert len(pred) == len(body["kernels"])
    assert sum(e.dur_us for e in pred) == pytest.approx(sum(k["predicted_s"] for k in body["kernels"]) * 1e6)
    assert all(a.ts_us + a.dur_us == pytest.approx(b.ts_us) for a, b in zip(pred, pred[1:]))
    written = record(t)  # the file: Chrome's names (ts, dur in microseconds), the tags and the schema
    assert list(written) == ["traceEvents", "displayTimeUnit", "otherData"] and written["displayTimeUnit"] == "ms"
    assert written["otherData"] == {"opmap_tags": {"x": 1}, "schema": "opmap kernel trace 1"}
    durs = [e["dur"] for e in written["traceEvents"] if e.get("tid") == 2 and e["ph"] == "X"]
    assert durs == [e.dur_us for e in pred]
    assert written["traceEvents"][0] == {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "t"}}


def from_dir_kernels(body):
    from opmap.store.db import payload_rows

    return payload_rows(body)[0]


def test_without_plotly_one_line_names_the_extra(monkeypatch, profile_dir, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "plotly" else real(name, *a))
    with pytest.raises(OpmapError, match=r"pip install 'opmap\[report\]'"):
        write_report(from_dir(profile_dir), tmp_path / "r.html")


def test_sweep_curves_measured_percentiles_and_prediction():
    """A measured sweep point (the shape opmap sweep --measure writes): p50 / p95 / p99 drawn at its measured
    throughput; its prediction at the same tokens per batch, x = tokens/s x measured latency / predicted
    latency (here 64 tokens: 1,000 tok/s x 0.064 s / 0.001 s = 64,000 tok/s)."""
    from opmap.report.dashboard import sweep_curves

    pt = {"batch": 2, "seq": 32, "latency_s": 0.064, "latency_p50_s": 0.064, "latency_p95_s": 0.07,
          "latency_p99_s": 0.08, "tokens_per_s": 1000.0, "predicted": {"latency_s": 0.001, "hardware": "h100-sxm"}}
    fig = sweep_curves({"model": "m", "hardware": "h", "phase": "prefill", "points": [pt]})
    by = {t.name: t for t in fig.data}
    assert by["seq 32 p95 measured"].y == (0.07,) and by["seq 32 p99 measured"].x == (1000.0,)
    assert by["seq 32 predicted on h100-sxm"].y == (0.001,)
    assert by["seq 32 predicted on h100-sxm"].x[0] == pytest.approx(64_000)
    predicted_only = sweep_curves({"points": [{**pt, "latency_p50_s": None, "latency_p95_s": None,
                                               "latency_p99_s": None, "predicted": None}]})
    assert [t.name for t in predicted_only.data] == ["seq 32 predicted"]


def test_perf_per_watt_takes_a_measured_sweeps_energy():
    """A measured point's tokens per joule is tokens / J over its timed repeats: 3 repeats of batch 2 x seq 16
    (96 tokens) over 4.8 J is 20 tokens/J; predicted points (energy null) are left out."""
    from opmap.report.dashboard import perf_per_watt

    sw = {"points": [{"batch": 2, "seq": 16, "tokens_per_j": 96 / 4.8, "power_w": 12.0, "power_method": "measured"},
                     {"batch": 4, "seq": 16, "tokens_per_j": None, "power_w": None, "power_method": "predicted"}]}
    fig = perf_per_watt(None, sw)
    (bar,) = fig.data
    assert bar.x == ("batch 2 seq 16",) and bar.y == (pytest.approx(20.0),)
    assert perf_per_watt(None, {"points": sw["points"][1:]}) is None


def test_script_json_has_no_markup_characters_and_reads_back():
    from opmap.report.html import script_json

    x = {"workload": "</script><!--<script>a && b > c", "é": "\u2028"}
    text = script_json(x)
    assert not any(c in text for c in "<>&") and text.isascii()
    assert json.loads(text) == x


def test_ceilings_from_the_assumptions_else_the_catalog():
    """The run's own rates win; a rate it lacks comes from the catalog entry: NVIDIA H100 SXM5's datasheet
    (nvidia.com H100 datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity, 989.4 dense; 3.35 TB/s HBM3)."""
    from opmap.hardware import get_hardware
    from opmap.report.dashboard import ceilings

    own = ceilings({"assumptions": {"hardware": "h100-sxm", "dtype": "bf16", "matrix_peak_flops_per_s": 5e14,
                                    "vector_peak_flops_per_s": {"value": 6e13}, "memory_bandwidth_bytes_per_s": 2e12}})
    assert (own.matrix_flops_per_s, own.vector_flops_per_s, own.memory_bytes_per_s) == (5e14, 6e13, 2e12)
    assert own.top_flops_per_s == 5e14
    filled = ceilings({"assumptions": {"hardware": "h100-sxm", "dtype": "bf16"}})
    assert filled.matrix_flops_per_s == pytest.approx(989.4e12) and filled.memory_bytes_per_s == pytest.approx(3.35e12)
    assert filled.vector_flops_per_s == float(get_hardware("h100-sxm").vector_peak_flops_per_s["fp32"].value)
    assert filled.hardware == "h100-sxm" and filled.format == "bf16"
    bare = ceilings({"assumptions": {"hardware": "no-such-device"}})
    assert bare.top_flops_per_s is None and bare.memory_bytes_per_s is None
