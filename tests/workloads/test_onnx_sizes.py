"""Absurd but finite sizes in an ONNX model (issue 34): data generated from constants is priced and held, never free;
a tensor no runtime can index is refused in one line; the work of reading a model stays bounded whatever the
sizes it names (shape inference, constant folding)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from opmap.analyze import analyze
from opmap.costs import cost_graph
from opmap.errors import OpmapError
from opmap.hardware import get_hardware
from opmap.workloads.onnx import load_onnx

H100 = get_hardware("h100-sxm")


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _f(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _w(name, *shape):
    return numpy_helper.from_array(np.zeros(shape, np.float32), name)


def _generated(tmp_path, shape, name="big.onnx"):
    """x (1,) + ReduceSum(ConstantOfShape(shape, 1.0)): a tensor made from a constant alone, as large as asked."""
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["big"], value=numpy_helper.from_array(
                 np.array([1.0], np.float32)), name="fill"),
             helper.make_node("ReduceSum", ["big"], ["s"], keepdims=0, name="sum"),
             helper.make_node("Add", ["x", "s"], ["y"], name="add")]
    m = _model(nodes, [_f("x", [1])], [_f("y", None)], [numpy_helper.from_array(np.array(shape, np.int64), "shape")])
    onnx.save(m, str(tmp_path / name))
    return tmp_path / name


def test_a_tensor_generated_from_constants_is_priced_and_held(tmp_path):
    """A ConstantOfShape of 10^15 float32 elements made from a constant shape ran 'at load' for free: 0 s, and
    'fits' in 80 GB. Data a node generates beyond what it reads is priced where it is made: the fill writes
    4 x 10^15 bytes, the sum reads them (at least 2 x 4e15 / the HBM bandwidth of predicted time), and the
    memory fit sees the tensor in flight (does not fit)."""
    n = 10**15
    w = load_onnx(str(_generated(tmp_path, [n])))
    costs = {nd.args["onnx_node"]: c for nd, c in zip(w.graph.nodes, cost_graph(w.graph))}
    assert costs["fill"].bytes_written == 4 * n and costs["sum"].bytes_read == 4 * n
    a = analyze(w, H100, "fp32")
    assert a.predicted_latency_s >= 2 * 4 * n / H100.memory_bandwidth_bytes_per_s
    assert not a.memory.fits and a.memory.activations_bytes >= 4 * n


def test_a_transposed_weight_still_runs_at_load_for_free(tmp_path):
    """What the rule keeps: a node that reads only weights and makes no more data than it read (a transpose, a
    cast) runs once at load, as onnxruntime folds it; no node is priced for it."""
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0], name="t"),
             helper.make_node("MatMul", ["x", "wt"], ["y"], name="mm")]
    m = _model(nodes, [_f("x", [2, 4])], [_f("y", [2, 8])], [_w("w", 8, 4)])
    onnx.save(m, str(tmp_path / "t.onnx"))
    assert [n.packet for n in load_onnx(str(tmp_path / "t.onnx")).graph.nodes] == ["matmul"]


def test_a_tensor_no_runtime_can_index_is_refused(tmp_path):
    """20 dims of 2^62 (2^1240 elements): the cost rules overflowed a float (an OverflowError traceback). A tensor
    of more than 2^63 - 1 elements (an int64 element count, ONNX's and onnxruntime's) is refused in one line naming
    it; 2^62 elements in all is still priced."""
    with pytest.raises(OpmapError, match=r"tensor 'big' .* more than 2\^63 - 1") as e:
        load_onnx(str(_generated(tmp_path, [2**62] * 20)))
    assert "\n" not in str(e.value)
    w = load_onnx(str(_generated(tmp_path, [2**31, 2**31], "ok.onnx")))
    assert cost_graph(w.graph)[0].bytes_written == 4 * 2**62


def test_a_long_integer_vector_costs_no_memory_to_infer(tmp_path):
    """onnx's shape inference with data propagation spelled a 1-D integer tensor out as one shape dim per element
    (about 150 bytes each): ConstantOfShape([10^9]) -> Add, a 300-byte file, took 18 GB in 30 s. opmap folds the
    shape arithmetic itself (bounded by FOLD_LIMIT / FOLD_TOTAL) and infers without it. At 2^23 elements (1.2 GB
    before), loading the model raises the peak memory of a fresh process by under 100 MB, and the 8 x 2^23 bytes
    of int64 the fill writes are priced."""
    import subprocess
    import sys

    n = 1 << 23
    nodes = [helper.make_node("Shape", ["x"], ["one"]),  # [1]: the length follows the input's shape
             helper.make_node("Mul", ["one", "n"], ["shape"]),
             helper.make_node("ConstantOfShape", ["shape"], ["c"], value=numpy_helper.from_array(
                 np.array([1], np.int64)), name="fill"),
             helper.make_node("Add", ["c", "c"], ["y"], name="add")]
    m = _model(nodes, [_f("x", [1])], [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
               [numpy_helper.from_array(np.array([n], np.int64), "n")])
    onnx.save(m, str(tmp_path / "long.onnx"))
    code = ("import resource\nfrom opmap.costs import cost_graph\nfrom opmap.workloads.onnx import load_onnx\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            f"w = load_onnx({str(tmp_path / 'long.onnx')!r})\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before, cost_graph(w.graph)[0].bytes_written)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    kib, written = r.stdout.split()[-2:]
    assert int(kib) < 100 * 1024, f"{int(kib) / 1024:.0f} MiB"
    assert float(written) == 8 * n


def test_folding_stops_at_its_budget(tmp_path):
    """Twelve ConstantOfShape fills of FOLD_LIMIT (2^22) float32 elements, each added to the input: a 2 kB file that
    had opmap compute and hold 12 x 16 MB of constants (20 such: 39 s, 12 GB). Folding stops at FOLD_TOTAL (2^25)
    elements in all: eight fold, the other four stay nodes, each priced by the 4 x 2^22 bytes it writes."""
    from opmap.workloads.onnx_model import FOLD_LIMIT

    budget = 1 << 25  # the stated budget, onnx_model.FOLD_TOTAL
    nodes, outs = [], []
    for i in range(12):
        nodes += [helper.make_node("ConstantOfShape", ["shape"], [f"c{i}"], value=numpy_helper.from_array(
                      np.array([1.0], np.float32)), name=f"fill{i}"),
                  helper.make_node("Add", ["x", f"c{i}"], [f"y{i}"], name=f"add{i}")]
        outs.append(_f(f"y{i}", None))
    m = _model(nodes, [_f("x", [1])], outs, [numpy_helper.from_array(np.array([FOLD_LIMIT], np.int64), "shape")])
    onnx.save(m, str(tmp_path / "fills.onnx"))
    w = load_onnx(str(tmp_path / "fills.onnx"))
    fills = [c for n, c in zip(w.graph.nodes, cost_graph(w.graph)) if n.packet == "full"]
    assert len(fills) == 12 - budget // FOLD_LIMIT == 4
    assert all(c.bytes_written == 4 * FOLD_LIMIT for c in fills)
