"""ONNX models as workloads: the same OpGraph and cost rules as a torch capture, checked three ways.

1. Against the torch capture of the module the file was exported from (same weights, same shapes): total FLOPs
   within 1 %, minimum bytes within 5 % (issue 23).
2. Against onnx-tool 1.0.1 (a peer) per node, for the matrix work, on the same files; the known differences
   are formulas (below).
3. Against closed-form counts for attention, the contrib ops onnxruntime emits and the refusals.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from opmap.analyze import analyze
from opmap.costs import cost_graph, uncounted
from opmap.errors import OpmapError
from opmap.hardware import get_hardware
from opmap.workloads import load_workload
from opmap.workloads.onnx import load_onnx, parse_dims
from opmap.workloads.zoo import Workload

H100 = get_hardware("h100-sxm")
ZOO = ("gpt2", "bert", "resnet50", "vit")
TEXT = ("gpt2", "bert", "llama")


def _onnx(onnx_zoo, name, **kw):
    path = onnx_zoo[name][0]
    return load_onnx(str(path), batch=2, seq=32 if name in TEXT else None, **kw)


def _nodes_by_onnx(graph):
    """ONNX node name -> the opmap node covering it."""
    out = {}
    for n in graph.nodes:
        for name in n.args.get("onnx_nodes") or [n.args["onnx_node"]]:
            out[name] = n
    return out


# -- 1. the torch path ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ZOO)
def test_flops_and_bytes_match_the_torch_capture(onnx_zoo, name):
    path, module, inputs = onnx_zoo[name]
    torch_side = analyze(Workload(name, module, inputs, 2, None), H100, "fp32")
    onnx_side = analyze(_onnx(onnx_zoo, name), H100, "fp32")
    t, o = torch_side.total, onnx_side.total
    assert o.flops == pytest.approx(t.flops, rel=0.01)
    assert o.matrix_flops == pytest.approx(t.matrix_flops, rel=1e-9)  # the same GEMMs, convs and attention
    assert o.bytes == pytest.approx(t.bytes, rel=0.05)
    assert onnx_side.uncounted == {} and torch_side.uncounted == {}


def test_llama_from_the_dynamo_exporter_matches_the_torch_capture(onnx_llama):
    """The dynamo exporter's opset-23 graph: grouped-query attention as one ai.onnx Attention node (causal, 4 query
    heads over 2 KV heads), RMSNormalization, RoPE as Slice / Neg / Concat / Mul; module paths from its name
    scopes. Its RoPE slices and transposes are copies in onnxruntime (views in torch): bytes within 5 %."""
    path, module, inputs = onnx_llama["llama"]
    torch_side = analyze(Workload("llama", module, inputs, 2, 32), H100, "fp32")
    w = load_onnx(str(path), batch=2, seq=32)
    onnx_side = analyze(w, H100, "fp32")
    assert onnx_side.total.flops == pytest.approx(torch_side.total.flops, rel=0.01)
    assert onnx_side.total.matrix_flops == pytest.approx(torch_side.total.matrix_flops, rel=1e-9)
    assert onnx_side.total.bytes == pytest.approx(torch_side.total.bytes, rel=0.05)
    att = [n for n in w.graph.nodes if n.packet == "scaled_dot_product_attention"]
    assert len(att) == 2 and all(n.args["is_causal"] and n.inputs[1].shape == (2, 2, 32, 16) for n in att)
    assert {n.layer_type for n in att} == {"attention"} and onnx_side.uncounted == {}
    assert {n.layer_type for n in w.graph.nodes if n.packet == "rms_norm"} == {"norm"}


def test_constant_folding_exporter_folds_batch_norm_into_conv(onnx_zoo):
    """With constant folding on, the exporter folds each BatchNormalization into its Conv (weights and bias
    rescaled): same matrix FLOPs, no batch-norm nodes, each conv now adding a bias (1 FLOP per output element)."""
    plain = cost_graph(_onnx(onnx_zoo, "resnet50").graph)
    w = load_onnx(str(onnx_zoo["resnet50-folded"][0]), batch=2)
    folded = cost_graph(w.graph)
    assert sum(c.matrix_flops for c in folded) == sum(c.matrix_flops for c in plain)
    assert not any("batch_norm" in n.op for n in w.graph.nodes)
    conv_out = sum(n.outputs[0].numel for n in w.graph.nodes if n.packet == "convolution")
    conv_vec = sum(c.vector_flops for n, c in zip(w.graph.nodes, folded) if n.packet == "convolution")
    assert conv_vec == conv_out


# -- 2. onnx-tool -----------------------------------------------------------------------------------------------

def _onnx_tool_macs(path, feeds):
    import onnx_tool

    m = onnx_tool.Model(str(path))
    m.graph.shape_infer(feeds)
    m.graph.profile()
    return {name: (n.op_type, float(n.macs[0]), len(n.input)) for name, n in m.graph.nodemap.items()}


@pytest.mark.parametrize("name", ["gpt2", "bert", "resnet50", "vit", "resnet50-folded"])
def test_matrix_macs_agree_with_onnx_tool_per_node(onnx_zoo, name):
    """onnx-tool counts a MatMul / Gemm / Conv as output elements x reduction length MACs, plus one "MAC" per output
    element for a bias input (Gemm C, Conv B); opmap counts the bias add as a vector FLOP, never as a MAC (a
    multiply-add is 2 FLOPs; an add is 1), so opmap MACs = onnx-tool MACs - bias output elements. onnx-tool counts
    the decomposed attention's Q K^T and P V MatMuls dense; opmap prices them as one fused causal kernel that skips
    the masked half: opmap MACs + skipped MACs = onnx-tool's two MatMuls."""
    path, _, inputs = onnx_zoo[name]
    feeds = {n: x.numpy() for n, x in zip([i.name for i in onnx.load(str(path)).graph.input], inputs)}
    ot = _onnx_tool_macs(path, feeds)
    w = load_onnx(str(path), batch=2, seq=32 if name in TEXT else None)
    checked = 0
    for n, c in zip(w.graph.nodes, cost_graph(w.graph)):
        if not c.matrix_flops:
            continue
        names = n.args.get("onnx_nodes") or [n.args["onnx_node"]]
        peer = [ot[x] for x in names if x in ot and ot[x][0] in ("MatMul", "Gemm", "Conv")]
        bias = sum(n.outputs[0].numel for op, _, k in peer if op in ("Gemm", "Conv") and k > 2)
        assert c.macs + c.skipped_flops / 2 == sum(m for _, m, _ in peer) - bias, n.args
        checked += 1
    # GPT-2: per layer the packed QKV, attention output and two MLP GEMMs, and attention; the LM head. BERT: Q, K, V,
    # output, two MLP GEMMs and attention per layer; the pooler. ResNet-50: 53 convolutions and the classifier. ViT:
    # the patch convolution, per layer QKV, output, two MLP GEMMs and attention, the head.
    assert checked == {"gpt2": 2 * 5 + 1, "bert": 2 * 7 + 1, "resnet50": 54, "resnet50-folded": 54,
                       "vit": 1 + 2 * 5 + 1}[name]


def test_causal_attention_counts_the_computed_half(onnx_zoo):
    """GPT-2's exported attention (scores masked by a Trilu-built causal mask): one fused node per layer with
    2 B H P (D + Dv) matrix FLOPs, P = S (S + 1) / 2 computed pairs, the rest of the S^2 pairs skipped."""
    w = _onnx(onnx_zoo, "gpt2")
    sdpa = [(n, c) for n, c in zip(w.graph.nodes, cost_graph(w.graph)) if n.packet == "scaled_dot_product_attention"]
    assert len(sdpa) == 2
    b, h, s, d = 2, 4, 32, 16
    pairs = s * (s + 1) // 2
    for n, c in sdpa:
        assert n.args["is_causal"] and n.layer_type == "attention"
        assert c.matrix_flops == 2 * b * h * pairs * (d + d)
        assert c.skipped_flops == 2 * b * h * (s * s - pairs) * (d + d)
        # read Q, K, V once and write O once: no S x S scores, no transposed copies
        assert c.bytes == 4 * 4 * b * h * s * d


def test_bert_attention_is_dense_and_layer_types_come_from_names(onnx_zoo):
    w = _onnx(onnx_zoo, "bert")
    sdpa = [n for n in w.graph.nodes if n.packet == "scaled_dot_product_attention"]
    assert len(sdpa) == 2 and not any(n.args["is_causal"] for n in sdpa)
    types = {n.args["onnx_node"]: n.layer_type for n in w.graph.nodes}
    assert {t for k, t in types.items() if "LayerNorm" in k} == {"norm"}
    assert {n.layer_type for n in w.graph.nodes if n.packet == "embedding"} == {"embedding"}
    assert {n.layer_type for n in w.graph.nodes if "intermediate" in n.module or ".mlp" in n.module} <= {"mlp"}


def test_module_paths_from_either_exporter():
    """TorchScript names (``/layer4/layer4.0/conv2/Conv``: a scope may repeat its parent) and the dynamo exporter's
    name scopes and class hierarchy (metadata_props) give the module stack layer types are classified by."""
    from opmap.workloads.onnx_ops import module_stack

    ts = helper.make_node("Conv", ["x", "w"], ["y"], name="/layer4/layer4.0/conv2/Conv")
    assert module_stack(ts)[-1] == ("layer4.0.conv2", "")
    assert module_stack(helper.make_node("MatMul", ["a", "b"], ["c"], name="/h.0/attn/c_attn/MatMul")) == [
        ("h.0", ""), ("h.0.attn", ""), ("h.0.attn.c_attn", "")]
    dyn = helper.make_node("MatMul", ["a", "b"], ["c"], name="node_linear")
    dyn.metadata_props.add(key="pkg.torch.onnx.name_scopes", value="['', 'h.0', 'h.0.attn', 'linear']")
    dyn.metadata_props.add(key="pkg.torch.onnx.class_hierarchy",
                           value="['m.GPT2', 'm.GPT2Block', 'm.CausalSelfAttention', 'aten.linear.default']")
    assert module_stack(dyn) == [("h.0", "GPT2Block"), ("h.0.attn", "CausalSelfAttention")]
    assert module_stack(helper.make_node("Add", ["a", "b"], ["c"], name="Add_3")) == []


# -- dims --------------------------------------------------------------------------------------------------------

def test_dims_bind_by_seq_or_by_name(onnx_zoo):
    path = str(onnx_zoo["gpt2"][0])
    by_seq = load_onnx(path, batch=3, seq=8)
    by_dim = load_onnx(path, batch=1, dims={"batch": 3, "seq": 8})
    assert [n.outputs[0].shape for n in by_seq.graph.nodes] == [n.outputs[0].shape for n in by_dim.graph.nodes]
    assert by_seq.graph.inputs[0].shape == (3, 8) and by_seq.seq == 8 and by_seq.batch == 3
    lm = by_seq.graph.nodes[-1]
    assert lm.outputs[0].shape == (3, 8, 1000)


def test_dims_refused_when_unbound_unknown_or_malformed(onnx_zoo):
    path = str(onnx_zoo["gpt2"][0])
    with pytest.raises(OpmapError, match=r"dynamic dims 'seq' are unbound .*--seq N.*--dim NAME=VALUE"):
        load_onnx(path, batch=1)
    with pytest.raises(OpmapError, match=r"--dim heads: gpt2.onnx has no dynamic dim of that name; its dynamic dims: "
                                         r"batch, seq"):
        load_onnx(path, seq=4, dims={"heads": 2})
    with pytest.raises(OpmapError, match=r"--seq 8: resnet50.onnx has no sequence-named dynamic dim to bind; its "
                                         r"dynamic dims: batch"):
        load_onnx(str(onnx_zoo["resnet50"][0]), seq=8)
    with pytest.raises(OpmapError, match=r"--batch 4: gpt2.onnx has no batch-named dynamic dim to bind"):
        load_onnx(path, batch=4, dims={"batch": 2, "seq": 8})
    for bad in ("seq", "seq=0", "seq=x", "=4", f"seq={2**31}"):
        with pytest.raises(OpmapError, match="expected NAME=VALUE"):
            parse_dims([bad])


# -- 3. contrib ops, unknown ops ----------------------------------------------------------------------------------

def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)])


def _f(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _w(name, *shape):
    return numpy_helper.from_array(np.zeros(shape, np.float32), name)


def test_onnxruntime_contrib_ops_follow_their_formulas(tmp_path):
    """com.microsoft Attention (B 1, S 8, hidden 16, 2 heads, unidirectional), SkipLayerNormalization and FastGelu
    (with bias): the QKV projection 2 S hidden (3 hidden) FLOPs + the 3 hidden bias adds; causal attention
    2 H P (2 D), P = S (S + 1) / 2; each fused kernel reads its inputs once and writes only its output."""
    s, hid, heads = 8, 16, 2
    nodes = [
        helper.make_node("Attention", ["x", "wqkv", "bqkv"], ["a"], domain="com.microsoft", num_heads=heads,
                         unidirectional=1, name="attn"),
        helper.make_node("SkipLayerNormalization", ["a", "x", "g", "beta"], ["n"], domain="com.microsoft",
                         name="skipln"),
        helper.make_node("FastGelu", ["n", "fb"], ["y"], domain="com.microsoft", name="gelu"),
    ]
    m = _model(nodes, [_f("x", [1, s, hid])], [_f("y", [1, s, hid])],
               [_w("wqkv", hid, 3 * hid), _w("bqkv", 3 * hid), _w("g", hid), _w("beta", hid), _w("fb", hid)])
    # contrib ops have no ONNX shape-inference functions: their output shapes come from onnx_shapes.py
    path = tmp_path / "contrib.onnx"
    onnx.save(m, str(path))
    w = load_onnx(str(path))
    costs = cost_graph(w.graph)
    ops = [n.packet for n in w.graph.nodes]
    assert ops == ["linear", "scaled_dot_product_attention", "native_layer_norm", "gelu"]
    assert uncounted(w.graph, costs) == {}
    lin, att, ln, gelu = costs
    assert lin.matrix_flops == 2 * s * hid * 3 * hid and lin.vector_flops == s * 3 * hid
    d, pairs = hid // heads, s * (s + 1) // 2
    assert att.matrix_flops == 2 * heads * pairs * 2 * d
    # the fused residual: one add and 7 norm ops per element; a, x, gamma, beta read once, the output written
    assert ln.vector_flops == (1 + 7) * s * hid and ln.bytes == 4 * (3 * s * hid + 2 * hid)
    # the fused bias: one add and the tanh form's 7 ops per element, one tanh
    assert gelu.vector_flops == (1 + 7) * s * hid and gelu.transcendental_flops == s * hid
    assert gelu.bytes == 4 * (2 * s * hid + hid)


def test_weight_only_nodes_run_at_load(tmp_path):
    """x (B, 4) @ Transpose(W (8, 4)): the transpose reads only a weight, so it runs once at load (onnxruntime's
    constant folding) and the MatMul reads W^T as a weight: 2 B 4 8 FLOPs, bytes x + W + y, no copy node."""
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0], name="t"),
             helper.make_node("MatMul", ["x", "wt"], ["y"], name="mm")]
    m = _model(nodes, [_f("x", ["batch", 4])], [_f("y", ["batch", 8])], [_w("w", 8, 4)])
    onnx.save(m, str(tmp_path / "t.onnx"))
    w = load_onnx(str(tmp_path / "t.onnx"), batch=3)
    (node,), (c,) = w.graph.nodes, cost_graph(w.graph)
    assert node.packet == "matmul" and c.matrix_flops == 2 * 3 * 4 * 8
    assert c.param_bytes_read == 4 * 8 * 4 and c.bytes_read == 4 * 3 * 4 and c.bytes_written == 4 * 3 * 8


def test_an_op_without_a_rule_is_listed_uncounted(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("NonZero", ["r"], ["nz"], name="nz"),
             helper.make_node("MyOp", ["r"], ["y"], domain="my.vendor", name="mine")]
    m = _model(nodes, [_f("x", [4, 4])], [helper.make_tensor_value_info("nz", TensorProto.INT64, None), _f("y", None)])
    m.opset_import.append(helper.make_opsetid("my.vendor", 1))
    path = tmp_path / "odd.onnx"
    onnx.save(m, str(path))
    w = load_onnx(str(path))
    u = uncounted(w.graph, cost_graph(w.graph))
    assert u == {"onnx.NonZero": 1, "onnx.MyOp.my.vendor": 1}
    relu = cost_graph(w.graph)[0]
    assert relu.counted and relu.vector_flops == 16


# -- files --------------------------------------------------------------------------------------------------------

def test_external_data_model_reads_like_the_inline_one(onnx_zoo, tmp_path):
    m = onnx.load(str(onnx_zoo["bert"][0]))
    path = tmp_path / "ext" / "bert.onnx"
    path.parent.mkdir()
    onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="bert.data",
              size_threshold=0)
    assert (path.parent / "bert.data").stat().st_size > path.stat().st_size
    a = cost_graph(load_onnx(str(path), batch=2, seq=32).graph)
    b = cost_graph(_onnx(onnx_zoo, "bert").graph)
    assert sum(c.flops for c in a) == sum(c.flops for c in b) and sum(c.bytes for c in a) == sum(c.bytes for c in b)


def _external(tmp_path, location, data=b"\0" * 64):
    m = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_f("x", [2, 4])], [_f("y", [2, 4])], [_w("w", 4, 4)])
    t = m.graph.initializer[0]
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value=location)
    path = tmp_path / "m" / "m.onnx"
    path.parent.mkdir(exist_ok=True)
    onnx.save(m, str(path))
    if data is not None:
        (path.parent / "w.bin").write_bytes(data)
    return path


def test_refusals_are_one_line(onnx_zoo, tmp_path, monkeypatch):
    good = onnx_zoo["gpt2"][0].read_bytes()
    cases = []
    (tmp_path / "empty.onnx").write_bytes(b"")
    cases.append(("empty.onnx", "is empty"))
    (tmp_path / "cut.onnx").write_bytes(good[: len(good) // 2])
    cases.append(("cut.onnx", "truncated, malformed or of another format"))
    (tmp_path / "text.onnx").write_bytes(b"this is not a model\n" * 20)
    cases.append(("text.onnx", "model"))
    # other ONNX protobufs that parse as a ModelProto's fields: a tensor's header (onnx.save_tensor), a function
    (tmp_path / "tensor.onnx").write_bytes(onnx.TensorProto(dims=[2, 3], data_type=1).SerializeToString())
    cases.append(("tensor.onnx", "holds no graph with nodes"))
    (tmp_path / "func.onnx").write_bytes(onnx.FunctionProto(name="f", domain="d").SerializeToString())
    cases.append(("func.onnx", "holds no graph with nodes"))
    old = _model([helper.make_node("Relu", ["x"], ["y"])], [_f("x", [2])], [_f("y", [2])], opset=12)
    onnx.save(old, str(tmp_path / "old.onnx"))
    cases.append(("old.onnx", "uses opset 12; opmap reads opset 13 and later"))
    ghost = _model([helper.make_node("Add", ["x", "ghost"], ["y"], name="add")], [_f("x", [2])], [_f("y", [2])])
    onnx.save(ghost, str(tmp_path / "ghost.onnx"))
    cases.append(("ghost.onnx", "node 'add' reads 'ghost', which no input, initializer or earlier node provides"))
    for name, needle in cases:
        with pytest.raises(OpmapError, match=None) as e:
            load_workload(str(tmp_path / name), seq=4)
        assert needle in str(e.value) and "\n" not in str(e.value), (name, e.value)
    with pytest.raises(OpmapError, match="does not exist"):
        load_workload(str(tmp_path / "none.onnx"))
    monkeypatch.setattr("opmap.workloads.onnx.MAX_MODEL_BYTES", 1000)
    with pytest.raises(OpmapError, match="one ONNX file holds under 2 GiB"):
        load_workload(str(onnx_zoo["gpt2"][0]), seq=4)


def test_external_data_refusals(tmp_path):
    with pytest.raises(OpmapError, match="external data file 'w.bin' .* is missing"):
        load_onnx(str(_external(tmp_path, "w.bin", data=None)))
    with pytest.raises(OpmapError, match=r"outside the model's folder"):
        load_onnx(str(_external(tmp_path, "../w.bin")))
    with pytest.raises(OpmapError, match=r"holds 8 bytes, initializer 'w' needs bytes up to 64"):
        load_onnx(str(_external(tmp_path, "w.bin", data=b"\0" * 8)))
    w = load_onnx(str(_external(tmp_path, "w.bin")))
    assert cost_graph(w.graph)[0].macs == 2 * 4 * 4


def test_a_missing_onnx_package_is_one_line(monkeypatch, onnx_zoo):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnx" else real(name, *a))
    with pytest.raises(OpmapError, match=r"ONNX models need the onnx package: pip install 'opmap\[onnx\]'"):
        load_onnx(str(onnx_zoo["gpt2"][0]), seq=4)


def test_op_table_prices_each_family_by_its_formula(tmp_path):
    """One graph through the families the table maps (opset 23: RMSNormalization and Attention exist), each counted
    and checked against its closed form: Gemm with transA (2 M N K + M N), a grouped conv (2 N Cout Hout Wout
    Cin/g kh kw), a transposed conv (2 N Cin Hin Win Cout/g kh kw), max / global-average pooling, ReduceMean, RMS
    norm (4 per element, one rsqrt per row) and opset-23 causal Attention over (B, H, S, D)."""
    n, c, h = 2, 8, 16
    nodes = [
        helper.make_node("Conv", ["x", "wc"], ["c1"], group=2, pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("ConvTranspose", ["c1", "wt"], ["c2"], strides=[2, 2], name="convt"),
        helper.make_node("MaxPool", ["c2"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("GlobalAveragePool", ["p"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flat"),
        helper.make_node("Gemm", ["ft", "wg", "bg"], ["y"], transA=1, name="gemm"),
        helper.make_node("ReduceMean", ["y"], ["r"], keepdims=1, name="mean"),
        helper.make_node("RMSNormalization", ["q", "s"], ["qn"], name="rms"),
        helper.make_node("Attention", ["qn", "k", "v"], ["o"], is_causal=1, name="att"),
    ]
    inputs = [_f("x", [n, c, h, h]), _f("ft", [c, n]), _f("q", [1, 2, 8, 4]), _f("k", [1, 2, 8, 4]),
              _f("v", [1, 2, 8, 4])]
    m = _model(nodes, inputs, [_f("r", None), _f("o", None), _f("f", None)],
               [_w("wc", c, c // 2, 3, 3), _w("wt", c, 4, 2, 2), _w("wg", c, 10), _w("bg", 10), _w("s", 4)],
               opset=23)
    onnx.save(m, str(tmp_path / "ops.onnx"))
    w = load_onnx(str(tmp_path / "ops.onnx"))
    costs = {nd.args["onnx_node"]: (nd, cst) for nd, cst in zip(w.graph.nodes, cost_graph(w.graph))}
    assert uncounted(w.graph, [cc for _, cc in costs.values()]) == {}
    assert costs["conv"][1].matrix_flops == 2 * n * c * h * h * (c // 2) * 9
    assert costs["convt"][1].matrix_flops == 2 * n * c * h * h * 4 * 4 and costs["convt"][0].outputs[0].shape == (
        n, 4, 2 * h, 2 * h)
    assert costs["pool"][1].vector_flops == n * 4 * h * h * 4  # output elements x 4 taps
    assert costs["gap"][1].vector_flops == n * 4 * h * h + n * 4
    gemm = costs["gemm"][1]
    assert gemm.matrix_flops == 2 * n * 10 * c and gemm.vector_flops == n * 10
    assert costs["mean"][1].vector_flops == n * 10
    assert costs["rms"][1].vector_flops == 4 * 2 * 8 * 4 and costs["rms"][1].transcendental_flops == 2 * 8
    pairs = 8 * 9 // 2
    assert costs["att"][1].matrix_flops == 2 * 2 * pairs * (4 + 4) and costs["att"][0].args["is_causal"]
    assert costs["flat"][1].is_view


def test_multihead_and_group_query_attention(tmp_path):
    """com.microsoft MultiHeadAttention (query 1 x 4 x 16, keys and values 1 x 6 x 16, 2 heads: dense,
    2 H Sq Sk (D + Dv)) and GroupQueryAttention (4 query heads over 2 KV heads, causal over the 6 cached
    positions of its present key: query i sees min(i + 1, 6) keys)."""
    nodes = [helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["o"], domain="com.microsoft", num_heads=2,
                              name="mha"),
             helper.make_node("GroupQueryAttention", ["q2", "k2", "v2"], ["o2", "pk", "pv"], domain="com.microsoft",
                              num_heads=4, kv_num_heads=2, name="gqa")]
    m = _model(nodes, [_f("q", [1, 4, 16]), _f("k", [1, 6, 16]), _f("v", [1, 6, 16]), _f("q2", [1, 6, 32]),
                       _f("k2", [1, 6, 16]), _f("v2", [1, 6, 16])],
               [_f("o", [1, 4, 16]), _f("o2", [1, 6, 32]), _f("pk", [1, 2, 6, 8]), _f("pv", [1, 2, 6, 8])])
    onnx.save(m, str(tmp_path / "mha.onnx"))
    w = load_onnx(str(tmp_path / "mha.onnx"))
    (mha, c1), (gqa, c2) = zip(w.graph.nodes, cost_graph(w.graph))
    assert c1.matrix_flops == 2 * 2 * 4 * 6 * (8 + 8) and not mha.args["is_causal"]
    assert gqa.args["is_causal"] and gqa.inputs[1].shape == (1, 2, 6, 8)
    assert c2.matrix_flops == 2 * 4 * (6 * 7 // 2) * (8 + 8)


def test_a_file_optimized_by_onnxruntime_keeps_its_flops(onnx_zoo, tmp_path):
    """onnxruntime's transformer optimizer rewrites the BERT export with contrib ops (SkipLayerNormalization with
    the residual and bias adds fused in, BiasGelu): their shapes come from onnx_shapes.py, their costs from the same
    rules; the FLOPs are the export's, the bytes fewer (the fused kernels do not write the sums)."""
    import warnings

    from onnxruntime.transformers import optimizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = optimizer.optimize_model(str(onnx_zoo["bert"][0]), model_type="bert", num_heads=4, hidden_size=64)
    path = tmp_path / "bert_ort.onnx"
    opt.save_model_to_file(str(path))
    ops = {(n.domain, n.op_type) for n in onnx.load(str(path)).graph.node}
    assert ("com.microsoft", "SkipLayerNormalization") in ops and ("com.microsoft", "BiasGelu") in ops
    fused = cost_graph(load_onnx(str(path), batch=2, seq=32).graph)
    plain = cost_graph(_onnx(onnx_zoo, "bert").graph)
    assert all(c.counted for c in fused)
    assert sum(c.flops for c in fused) == pytest.approx(sum(c.flops for c in plain), rel=1e-9)
    assert sum(c.bytes for c in fused) < sum(c.bytes for c in plain)
