"""opmap profile model.onnx: onnxruntime's profiler trace parsed and joined to the predicted nodes by ONNX node name."""

from __future__ import annotations

import json

import pytest

from opmap.analyze import analyze_graph
from opmap.errors import OpmapError
from opmap.hardware import get_hardware
from opmap.measure.onnx_run import join, parse_trace, run_onnx_profile
from opmap.workloads.onnx import load_onnx

H100 = get_hardware("h100-sxm")


def _event(name, ts, dur, cat="Node"):
    return {"cat": cat, "name": name, "ts": ts, "dur": dur, "ph": "X", "args": {}}


def test_parse_trace_splits_iterations_by_executor_spans():
    trace = [_event("model_loading_uri", 0, 5, "Session"),
             _event("SequentialExecutor::Execute", 10, 100, "Session"),
             _event("a_kernel_time", 20, 30), _event("b_kernel_time", 60, 10), _event("a_fence_before", 20, 1),
             _event("SequentialExecutor::Execute", 200, 50, "Session"), _event("a_kernel_time", 210, 20)]
    its = parse_trace(json.dumps(trace))
    assert its == [(100e-6, [("a", 30.0), ("b", 10.0)]), (50e-6, [("a", 20.0)])]
    with pytest.raises(OpmapError, match="not JSON"):
        parse_trace('[{"cat": "Node"')
    with pytest.raises(OpmapError, match="not a list"):
        parse_trace('{"cat": "Node"}')


def test_join_sums_the_onnx_nodes_a_predicted_node_covers(onnx_zoo):
    """A linear node stands for MatMul + bias Add: its measured time is their sum; the fused attention node is the
    sum of its chain; events of nodes the prediction folded away stay unattributed."""
    w = load_onnx(str(onnx_zoo["gpt2"][0]), batch=2, seq=32)
    a = analyze_graph(w.graph, w, H100, "fp32")
    lin = next(i for i, r in enumerate(a.results) if r.node.packet == "linear")
    att = next(i for i, r in enumerate(a.results) if r.node.packet == "scaled_dot_product_attention")
    mm, add = a.results[lin].node.args["onnx_nodes"]
    chain = a.results[att].node.args["onnx_nodes"]
    events = [(mm, 7.0), (add, 3.0), *((n, 2.0) for n in chain), ("/Shape", 50.0)]
    att_ = join(a, [(1e-3, events), (1e-3, events)])
    assert att_.timings[lin].median_s == pytest.approx(10e-6) and att_.timings[lin].samples == 2
    assert att_.timings[att].median_s == pytest.approx(2e-6 * len(chain))
    assert att_.attributed_s == pytest.approx(10e-6 + 2e-6 * len(chain))
    assert att_.unattributed_s == pytest.approx(1e-3 - att_.attributed_s)
    assert 0 < att_.coverage < 1  # two of the kernel nodes were measured


def test_profile_runs_in_onnxruntime_and_joins_most_nodes(onnx_zoo):
    path = onnx_zoo["gpt2"][0]
    w = load_onnx(str(path), batch=2, seq=32)
    p = run_onnx_profile(w, path, H100, "fp32", "cpu", warmup=1, iters=3, profile_iters=2)
    att = p.attribution
    kernels = [i for i, r in enumerate(p.analysis.results) if r.cost.kernel]
    assert att.coverage >= 0.9 and all(i in att.timings for i in kernels)
    assert att.attributed_s > 0 and p.latency.p50_s > 0
    assert att.attributed_s <= att.iteration_s  # node events lie inside the iteration span
    d = p.to_dict()
    assert d["kind"] == "profile" and d["schema_version"] >= 1
    measured = [n["measured"] for n in d["nodes"] if n["measured"]]
    assert len(measured) >= len(kernels) and all(m["measured_s"] > 0 for m in measured)
    assert d["profiler"]["coverage"] == att.coverage and "onnxruntime" in d["tags"]["device_name"]


def test_unnamed_nodes_join_under_the_names_onnxruntime_gives_them(tmp_path):
    """onnxruntime names an unnamed node OpType_i, i its index among the non-Constant nodes; the reader names them
    the same way, so every kernel is matched."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    c = numpy_helper.from_array(np.ones((2, 4), np.float32))
    nodes = [helper.make_node("Constant", [], ["c"], value=c), helper.make_node("MatMul", ["x", "w"], ["y0"]),
             helper.make_node("Add", ["y0", "c"], ["y"]), helper.make_node("Relu", ["y"], ["z"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [2, 4])],
                          [helper.make_tensor_value_info("z", 1, [2, 4])],
                          [numpy_helper.from_array(np.ones((4, 4), np.float32), "w")])
    path = tmp_path / "unnamed.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    w = load_onnx(str(path))
    assert [n.args["onnx_node"] for n in w.graph.nodes] == ["MatMul_0", "Add_1", "Relu_2"]
    p = run_onnx_profile(w, path, H100, "fp32", "cpu", warmup=0, iters=1, profile_iters=2)
    assert p.attribution.coverage == 1.0 and len(p.attribution.timings) == 3


def test_onnxruntime_runs_the_math_and_threads_priced(onnx_zoo):
    """onnxruntime's CUDA provider runs fp32 GEMMs in TF32 unless told (use_tf32 defaults to true in its
    CUDAExecutionProviderInfo) and its CPU provider takes a thread per core, whatever torch and the calibration use:
    the run is told the dtype priced and torch's thread count."""
    import torch

    from opmap.measure.onnx_run import providers, session

    assert providers("cuda", "fp32")[0] == ("CUDAExecutionProvider", {"use_tf32": "0"})
    assert providers("cuda", "tf32")[0] == ("CUDAExecutionProvider", {"use_tf32": "1"})
    assert providers("cpu", "fp32") == ["CPUExecutionProvider"]
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert session(onnx_zoo["gpt2"][0], "cpu").get_session_options().intra_op_num_threads == 1
    finally:
        torch.set_num_threads(n)
