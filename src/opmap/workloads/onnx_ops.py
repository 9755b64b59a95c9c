"""ONNX nodes onto opmap's cost rules: each op type mapped to the aten op whose rule prices it (one rule set for
torch captures and ONNX files), with its inputs named and its attributes translated as the rule reads them.

- Matrix: MatMul -> matmul, Gemm -> addmm / mm (transA / transB as transposed operands), Conv / ConvTranspose ->
  convolution, Einsum -> einsum, com.microsoft FusedMatMul -> matmul.
- Attention: the exporters' decomposed pattern MatMul(Q, K^T) [-> Mul / Div by a scalar] [-> Add / Where mask]
  -> Softmax -> MatMul(., V), with the scalar scalings of Q and K and the transposes that only feed it, becomes
  one scaled_dot_product_attention node (a fused kernel: the S x S scores never reach memory); a constant
  lower-triangular mask makes it causal (the masked half counted as skipped, as for torch's is_causal), any
  other mask is an explicit attn_mask (dense work). ai.onnx Attention (opset 23), com.microsoft Attention
  (the QKV projection, then attention), MultiHeadAttention and GroupQueryAttention map onto the same rule.
- Norms: LayerNormalization -> native_layer_norm, SimplifiedLayerNormalization / RMSNormalization -> rms_norm,
  BatchNormalization -> batch norm (inference), InstanceNormalization, GroupNormalization; com.microsoft
  SkipLayerNormalization / SkipSimplifiedLayerNormalization -> the norm with its fused residual inputs.
- Softmax / LogSoftmax; elementwise ops by their aten names (Gelu with its approximation; com.microsoft FastGelu
  and BiasGelu -> gelu with its fused bias; BiasAdd -> adds).
- Movement: Reshape, Flatten, Squeeze, Unsqueeze, Identity and inference Dropout alias their input (views, as
  onnxruntime runs them); Transpose, Slice, Expand, Split, Concat, Cast, Pad, Tile, Resize copy; Gather of a
  weight is an embedding lookup, other gathers read what they touch.
- Anything else (control flow, quantized and vendor ops) becomes a node named ``onnx.OpType`` that no rule
  prices: listed as uncounted, never a silent zero.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

import numpy as np

from opmap.capture.layer_types import classify
from opmap.graph import Node, OpGraph, TensorMeta
from opmap.ops import DATA_MOVEMENT_OPS, is_pointwise
from opmap.workloads.onnx_attention import ATTENTION_OPS, find_attention, packed_splits
from opmap.workloads.onnx_data import ELEM_DTYPES
from opmap.workloads.onnx_model import FLOAT_ELEMS, OnnxModel, attrs, contiguous

MS = "com.microsoft"


class Builder:
    """Turns the live ONNX nodes into OpGraph nodes, tensor by tensor."""

    def __init__(self, om: OnnxModel, float_dtype: str, overrides=()):
        self.om = om
        self.float_dtype = float_dtype
        self.overrides = tuple(overrides)
        self.nodes: list[Node] = []
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list] = {}
        for n in om.live:
            for i in n.input:
                if i:
                    self.consumers.setdefault(i, []).append(n)

    # -- tensors ----------------------------------------------------------------------------------------------
    def dtype(self, name: str) -> str:
        e = self.om.elem.get(name, 1)
        return self.float_dtype if e in FLOAT_ELEMS else ELEM_DTYPES.get(e, "float32")

    def meta(self, name: str, shape: tuple[int, ...] | None = None, stride: tuple[int, ...] | None = None,
             dtype: str | None = None) -> TensorMeta | None:
        """TensorMeta of tensor ``name`` (``shape``: a view of it with another shape, same elements)."""
        s = self.om.shapes.get(name) if shape is None else shape
        if s is None:
            return None
        param = name if (name in self.om.initializers or name in self.om.folded or name in self.om.at_load) else None
        return TensorMeta(tuple(int(x) for x in s), dtype or self.dtype(name), stride or contiguous(tuple(s)),
                          self.producer.get(name), param)

    def input(self, node, i: int) -> TensorMeta | None:
        """The TensorMeta of the node's input ``i`` (None where it is absent or has no shape)."""
        return self.meta(node.input[i]) if len(node.input) > i and node.input[i] else None

    def known(self, node) -> bool:
        return all(not n or n in self.om.shapes for n in (*node.input, *node.output))

    # -- nodes ------------------------------------------------------------------------------------------------
    def add(self, onnx_node, packet: str, inputs: list[tuple[str, TensorMeta | None]], outputs: list,
            args: dict[str, Any] | None = None, is_view: bool = False, op: str | None = None) -> int:
        """Append one node; ``outputs`` holds tensor names (registered as produced here) or TensorMetas."""
        nid = len(self.nodes)
        ins = [(n, t) for n, t in inputs if t is not None]
        outs = []
        for o in outputs:
            if isinstance(o, TensorMeta):
                outs.append(o)
                continue
            t = self.meta(o)
            if t is not None:
                outs.append(TensorMeta(t.shape, t.dtype, t.stride))
            self.producer[o] = nid
        op = op or f"aten.{packet}.default"
        kind = ("data_movement" if is_view or packet in DATA_MOVEMENT_OPS or packet.endswith("_copy")
                else "elementwise" if is_pointwise(op) else "other")
        stack = module_stack(onnx_node)
        path, cls = stack[-1] if stack else ("", "")
        layer = classify(stack, kind, self.overrides)
        a = {**(args or {}), "onnx_op": onnx_node.op_type, "onnx_node": onnx_node.name or onnx_node.output[0]}
        self.nodes.append(Node(nid, op, path, cls, layer, tuple(t for _, t in ins), tuple(outs),
                               tuple(n for n, _ in ins), a, is_view=is_view))
        return nid

    def inner(self, shape: tuple[int, ...], like: str) -> TensorMeta:
        """An intermediate tensor of a decomposed node (produced by the node added last)."""
        return TensorMeta(tuple(shape), self.dtype(like), contiguous(tuple(shape)), len(self.nodes) - 1)


def module_stack(node) -> list[tuple[str, str]]:
    """(module path, class name) pairs, outermost first: from the dynamo exporter's name scopes and class
    hierarchy when present, else from a TorchScript-exporter name such as ``/h.0/attn/c_attn/MatMul``."""
    meta = {p.key: p.value for p in node.metadata_props}
    scopes, classes = meta.get("pkg.torch.onnx.name_scopes"), meta.get("pkg.torch.onnx.class_hierarchy")
    if scopes and classes:
        try:
            s, c = ast.literal_eval(scopes), ast.literal_eval(classes)
        except (ValueError, SyntaxError):
            s, c = None, None
        if isinstance(s, list) and isinstance(c, list) and len(s) == len(c):
            return [(str(p), str(k).rsplit(".", 1)[-1]) for p, k in zip(s[1:-1], c[1:-1])]
    name = node.name or ""
    if not name.startswith("/"):
        return []
    paths: list[str] = []
    for part in (p for p in name.split("/")[1:-1] if p):
        # a scope may repeat its parent's name ("/layer4/layer4.0/conv2"): the longer name replaces it
        if paths and part.startswith(paths[-1].rsplit(".", 1)[-1] + "."):
            parent = paths.pop()
            paths.append(parent.rsplit(".", 1)[0] + "." + part if "." in parent else part)
        else:
            paths.append(f"{paths[-1]}.{part}" if paths else part)
    return [(p, "") for p in paths]


# -- the op table ---------------------------------------------------------------------------------------------

MapFn = Callable[[Builder, Any, dict[str, Any]], None]
OPS: dict[tuple[str, str], MapFn] = {}


def maps(*op_types: str, domain: str = "") -> Callable[[MapFn], MapFn]:
    def deco(fn: MapFn) -> MapFn:
        for t in op_types:
            OPS[(domain, t)] = fn
        return fn
    return deco


def _in(b: Builder, node, i: int) -> TensorMeta | None:
    return b.input(node, i)


POINTWISE = {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Sqrt": "sqrt", "Reciprocal": "reciprocal",
    "Exp": "exp", "Log": "log", "Tanh": "tanh", "Sigmoid": "sigmoid", "Relu": "relu", "LeakyRelu": "leaky_relu",
    "PRelu": "leaky_relu", "Erf": "erf", "Neg": "neg", "Abs": "abs", "Floor": "floor", "Ceil": "ceil",
    "Round": "round", "Sin": "sin", "Cos": "cos", "Tan": "tan", "Equal": "eq", "Less": "lt", "LessOrEqual": "le",
    "Greater": "gt", "GreaterOrEqual": "ge", "Not": "logical_not", "And": "logical_and", "Or": "logical_or",
    "Xor": "logical_xor", "Where": "where", "Max": "maximum", "Min": "minimum", "Clip": "clamp",
    "HardSigmoid": "hardsigmoid", "HardSwish": "hardswish", "Softplus": "softplus", "Elu": "elu", "Selu": "selu",
    "Celu": "celu", "Mish": "mish", "IsNaN": "isnan", "IsInf": "isinf", "Sign": "sign", "Mod": "remainder",
    "Gelu": "gelu", "Atan": "atan", "Asin": "asin", "Acos": "acos", "Sinh": "sinh", "Cosh": "cosh",
    "BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or", "BitwiseXor": "bitwise_xor",
    "BitwiseNot": "bitwise_not",
}


@maps(*POINTWISE)
def pointwise(b: Builder, node, a) -> None:
    args: dict[str, Any] = {}
    if node.op_type == "Gelu" and a.get("approximate", b"none") in (b"tanh", "tanh"):
        args["approximate"] = "tanh"
    if node.op_type == "Pow":
        e = b.om.value(node.input[1], 16)
        if e is not None and e.size == 1:
            args["exponent"] = float(e.reshape(-1)[0])
    ins = [(f"input{i}", b.meta(n)) for i, n in enumerate(node.input) if n and b.om.shapes.get(n) is not None]
    b.add(node, POINTWISE[node.op_type], ins, [node.output[0]], args)


@maps("MatMul")
def matmul(b: Builder, node, a) -> None:
    b.add(node, "matmul", [("self", _in(b, node, 0)), ("other", _in(b, node, 1))], [node.output[0]])


def _transposed(t: TensorMeta | None) -> TensorMeta | None:
    """The last two dims swapped, as a strided view (what a transA / transB flag means to the kernel)."""
    if t is None or len(t.shape) < 2:
        return t
    sh = (*t.shape[:-2], t.shape[-1], t.shape[-2])
    st = (*t.stride[:-2], t.stride[-1], t.stride[-2])
    return TensorMeta(sh, t.dtype, st, t.producer, t.param)


@maps("FusedMatMul", domain=MS)
def fused_matmul(b: Builder, node, a) -> None:
    x, y = _in(b, node, 0), _in(b, node, 1)
    x = _transposed(x) if a.get("transA") else x
    y = _transposed(y) if a.get("transB") else y
    b.add(node, "matmul", [("self", x), ("other", y)], [node.output[0]])


@maps("Gemm")
def gemm(b: Builder, node, a) -> None:
    x, w, c = _in(b, node, 0), _in(b, node, 1), _in(b, node, 2)
    x = _transposed(x) if a.get("transA") else x
    w = _transposed(w) if a.get("transB") else w
    if c is None:
        b.add(node, "mm", [("self", x), ("mat2", w)], [node.output[0]])
        return
    b.add(node, "addmm", [("self", c), ("mat1", x), ("mat2", w)], [node.output[0]], {"beta": a.get("beta", 1.0)})


@maps("Conv", "ConvTranspose")
def conv(b: Builder, node, a) -> None:
    b.add(node, "convolution", [("input", _in(b, node, 0)), ("weight", _in(b, node, 1)), ("bias", _in(b, node, 2))],
          [node.output[0]], {"groups": int(a.get("group", 1)), "transposed": node.op_type == "ConvTranspose",
                             "stride": list(a.get("strides", [])), "padding": list(a.get("pads", [])),
                             "dilation": list(a.get("dilations", []))})


@maps("Einsum")
def einsum(b: Builder, node, a) -> None:
    eq = a.get("equation", b"")
    eq = eq.decode() if isinstance(eq, bytes) else str(eq)
    b.add(node, "einsum", [(f"operand{i}", b.meta(n)) for i, n in enumerate(node.input)], [node.output[0]],
          {"equation": eq})


@maps("Softmax", "LogSoftmax")
def softmax(b: Builder, node, a) -> None:
    b.add(node, "_softmax" if node.op_type == "Softmax" else "_log_softmax", [("self", _in(b, node, 0))],
          [node.output[0]], {"dim": int(a.get("axis", -1))})


@maps("LayerNormalization")
def layer_norm(b: Builder, node, a) -> None:
    x = _in(b, node, 0)
    axis = int(a.get("axis", -1)) % len(x.shape)
    b.add(node, "native_layer_norm", [("input", x), ("weight", _in(b, node, 1)), ("bias", _in(b, node, 2))],
          [node.output[0]], {"normalized_shape": list(x.shape[axis:])})


@maps("RMSNormalization", "SimplifiedLayerNormalization")
@maps("SimplifiedLayerNormalization", domain=MS)
def rms_norm(b: Builder, node, a) -> None:
    x = _in(b, node, 0)
    axis = int(a.get("axis", -1)) % len(x.shape)
    b.add(node, "rms_norm", [("input", x), ("weight", _in(b, node, 1))], [node.output[0]],
          {"normalized_shape": list(x.shape[axis:])})


@maps("SkipLayerNormalization", "SkipSimplifiedLayerNormalization", domain=MS)
def skip_norm(b: Builder, node, a) -> None:
    """norm(input + skip (+ bias)) as one fused kernel: the norm rule with its residual inputs (one add per element
    each, read once; the sum written only where the node outputs it, output 3)."""
    rms = node.op_type.startswith("SkipSimplified")
    x, skip, bias = _in(b, node, 0), _in(b, node, 1), _in(b, node, 3 if rms else 4)
    outs = [node.output[0]] + ([node.output[3]] if len(node.output) > 3 and node.output[3] else [])
    b.add(node, "rms_norm" if rms else "native_layer_norm",
          [("input", x), ("residual", skip), ("residual_bias", bias), ("weight", _in(b, node, 2)),
           *([] if rms else [("bias", _in(b, node, 3))])], outs, {"normalized_shape": [x.shape[-1]]})


@maps("BatchNormalization")
def batch_norm(b: Builder, node, a) -> None:
    b.add(node, "_native_batch_norm_legit_no_training",
          [(n, _in(b, node, i)) for i, n in enumerate(("input", "weight", "bias", "running_mean", "running_var"))],
          [node.output[0]])


@maps("InstanceNormalization")
def instance_norm(b: Builder, node, a) -> None:
    b.add(node, "instance_norm", [("input", _in(b, node, 0)), ("weight", _in(b, node, 1)), ("bias", _in(b, node, 2))],
          [node.output[0]])


@maps("GroupNormalization")
def group_norm(b: Builder, node, a) -> None:
    b.add(node, "native_group_norm", [("input", _in(b, node, 0)), ("weight", _in(b, node, 1)),
                                      ("bias", _in(b, node, 2))], [node.output[0]],
          {"group": int(a.get("num_groups", 1))})


@maps("FastGelu", "BiasGelu", domain=MS)
def bias_gelu(b: Builder, node, a) -> None:
    """gelu(x + bias) as one kernel: tanh form for FastGelu, erf form for BiasGelu; the bias add fused."""
    b.add(node, "gelu", [("self", _in(b, node, 0)), ("bias", _in(b, node, 1))], [node.output[0]],
          {"approximate": "tanh"} if node.op_type == "FastGelu" else {})


@maps("BiasAdd", domain=MS)
def bias_add(b: Builder, node, a) -> None:
    b.add(node, "add", [("self", _in(b, node, 0)), ("bias", _in(b, node, 1)), ("skip", _in(b, node, 2))],
          [node.output[0]])


VIEWS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout")


@maps(*VIEWS)
def view(b: Builder, node, a) -> None:
    b.add(node, "view", [("self", _in(b, node, 0))], [node.output[0]], is_view=True)


COPIES = {"Transpose": "permute_copy", "Slice": "slice_copy", "Expand": "expand_copy", "Cast": "_to_copy",
          "Pad": "constant_pad_nd", "Tile": "tile", "DepthToSpace": "pixel_shuffle", "SpaceToDepth": "pixel_unshuffle",
          "CastLike": "_to_copy", "OneHot": "one_hot"}


@maps(*COPIES)
def copy(b: Builder, node, a) -> None:
    b.add(node, COPIES[node.op_type], [("self", _in(b, node, 0))], [node.output[0]])


@maps("Resize", "Upsample")
def resize(b: Builder, node, a) -> None:
    mode = a.get("mode", b"nearest")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    b.add(node, "upsample_nearest2d" if mode == "nearest" else "upsample_bilinear2d", [("self", _in(b, node, 0))],
          [node.output[0]])


@maps("Split")
def split(b: Builder, node, a) -> None:
    b.add(node, "split_with_sizes_copy", [("self", _in(b, node, 0))], [o for o in node.output if o])


@maps("Concat")
def concat(b: Builder, node, a) -> None:
    b.add(node, "cat", [(f"tensors{i}", b.meta(n)) for i, n in enumerate(node.input) if n], [node.output[0]])


@maps("Gather")
def gather(b: Builder, node, a) -> None:
    """A lookup in a weight along its first axis is an embedding; other gathers read what they touch."""
    data, idx = _in(b, node, 0), _in(b, node, 1)
    if node.input[0] in b.om.initializers and int(a.get("axis", 0)) == 0:
        b.add(node, "embedding", [("weight", data), ("indices", idx)], [node.output[0]])
    else:
        b.add(node, "index_select", [("self", data), ("index", idx)], [node.output[0]])


@maps("GatherElements", "GatherND")
def gather_elements(b: Builder, node, a) -> None:
    b.add(node, "gather", [("self", _in(b, node, 0)), ("index", _in(b, node, 1))], [node.output[0]])


@maps("ScatterND", "ScatterElements")
def scatter(b: Builder, node, a) -> None:
    b.add(node, "scatter", [("self", _in(b, node, 0)), ("index", _in(b, node, 1)), ("src", _in(b, node, 2))],
          [node.output[0]])


REDUCE = {"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "amax", "ReduceMin": "amin", "ReduceProd": "prod",
          "ReduceL2": "norm", "ArgMax": "argmax", "ArgMin": "argmin", "CumSum": "cumsum"}


@maps(*REDUCE)
def reduce(b: Builder, node, a) -> None:
    b.add(node, REDUCE[node.op_type], [("self", _in(b, node, 0))], [node.output[0]])


@maps("TopK")
def topk(b: Builder, node, a) -> None:
    k = b.om.value(node.input[1], 16)
    b.add(node, "topk", [("self", _in(b, node, 0))], [o for o in node.output if o],
          {"k": int(k.reshape(-1)[0]) if k is not None else 1, "dim": int(a.get("axis", -1))})


@maps("MaxPool", "AveragePool")
def pool(b: Builder, node, a) -> None:
    ks = list(a.get("kernel_shape", [1]))
    b.add(node, ("max_pool" if node.op_type == "MaxPool" else "avg_pool") + f"{max(len(ks), 1)}d",
          [("self", _in(b, node, 0))], [node.output[0]], {"kernel_size": ks})


@maps("GlobalAveragePool", "GlobalMaxPool")
def global_pool(b: Builder, node, a) -> None:
    x = _in(b, node, 0)
    kind = "avg" if node.op_type == "GlobalAveragePool" else "max"
    b.add(node, f"adaptive_{kind}_pool{max(len(x.shape) - 2, 1)}d", [("self", x)], [node.output[0]])


@maps("Range")
def arange(b: Builder, node, a) -> None:
    b.add(node, "arange", [], [node.output[0]])


@maps("ConstantOfShape")
def fill(b: Builder, node, a) -> None:
    b.add(node, "full", [], [node.output[0]])


@maps("Shape", "Size")
def shape_of(b: Builder, node, a) -> None:
    b.add(node, "sym_size", [], [node.output[0]])


def uncounted(b: Builder, node, why: str = "") -> None:
    """A node no rule prices: kept, named ``onnx.OpType`` (its domain after it where not ai.onnx)."""
    dom = "" if node.domain in ("", "ai.onnx") else "." + node.domain
    ins = [(f"input{i}", b.meta(n)) for i, n in enumerate(node.input) if n]
    outs = [o for o in node.output if o]
    b.add(node, node.op_type, ins, outs, {"uncounted": why} if why else {}, op=f"onnx.{node.op_type}{dom}")


def build_graph(om: OnnxModel, float_dtype: str, overrides=()) -> OpGraph:
    """The OpGraph of a folded, shape-inferred ONNX model."""
    b = Builder(om, float_dtype, overrides)
    fused = find_attention(b)
    split_views = packed_splits(b, fused)
    biased = matmul_bias(b)
    skipped = {id(n) for f in fused.values() for n in f.absorbed} | {id(add) for add in biased.values()}
    for node in om.live:
        if id(node) in fused:
            fused[id(node)].emit(b)
            continue
        if id(node) in skipped:
            continue
        if id(node) in split_views:
            b.add(node, "split" if node.op_type == "Split" else "permute", [("self", _in(b, node, 0))],
                  [o for o in node.output if o], is_view=True)
            continue
        if id(node) in biased:
            linear(b, node, biased[id(node)])
            continue
        fn = OPS.get((node.domain if node.domain != "ai.onnx" else "", node.op_type))
        if fn is None:
            fn = ATTENTION_OPS.get((node.domain if node.domain != "ai.onnx" else "", node.op_type))
        if any(a.type in (5, 10) for a in node.attribute):  # GRAPH / GRAPHS: control flow
            uncounted(b, node, "control flow: its subgraphs are not priced")
        elif fn is None:
            uncounted(b, node)
        elif not b.known(node):
            uncounted(b, node, "shape inference left a tensor of it without a static shape")
        else:
            fn(b, node, attrs(node))
    params = [(n, int(np.prod(t.dims)) if len(t.dims) else 1) for n, t in om.initializers.items()
              if t.data_type in FLOAT_ELEMS]
    from opmap.precision import dtype_bytes

    n_params = sum(s for _, s in params)
    inputs = tuple(t for t in (b.meta(vi.name) for vi in om.model.graph.input if vi.name not in om.initializers)
                   if t is not None)
    notes = [*om.notes, *(f.note for f in fused.values() if f.note)]
    if split_views:
        notes.append(f"{len(split_views)} Split / Transpose node(s) of a packed QKV projection read in place by "
                     "fused attention (views, not copies)")
    if biased:
        notes.append(f"{len(biased)} MatMul + bias Add pair(s) priced as one GEMM with bias (onnxruntime's "
                     "MatMulAddFusion; torch's linear)")
    return OpGraph(tuple(b.nodes), n_params, n_params * dtype_bytes(float_dtype),
                   len(om.initializers) - len(params), inputs, "onnx (parsed, not executed)",
                   tuple(dict.fromkeys(notes)), tuple(params))


def matmul_bias(b: Builder) -> dict[int, Any]:
    """MatMul nodes (by id) whose only consumer adds a 1-D weight of the output's last size: that Add node."""
    out = {}
    for n in b.om.live:
        if n.op_type != "MatMul" or n.domain not in ("", "ai.onnx") or not b.known(n):
            continue
        cons = b.consumers.get(n.output[0], [])
        if len(cons) != 1 or cons[0].op_type != "Add" or not b.known(cons[0]):
            continue
        add = cons[0]
        other = add.input[1] if add.input[0] == n.output[0] else add.input[0]
        w = b.om.shapes.get(n.input[1])
        if other in b.om.initializers and w and len(w) == 2 and b.om.shapes.get(other) == (w[1],):
            out[id(n)] = add
    return out


def linear(b: Builder, node, add) -> None:
    """x @ W + bias as linear(x, W^T, bias): W (K, N) seen as the (N, K) weight torch's linear takes."""
    w = _in(b, node, 1)
    wt = TensorMeta((w.shape[1], w.shape[0]), w.dtype, (1, w.shape[1]), w.producer, w.param)
    bias = add.input[1] if add.input[0] == node.output[0] else add.input[0]
    b.add(node, "linear", [("input", _in(b, node, 0)), ("weight", wt), ("bias", b.meta(bias))], [add.output[0]],
          {"onnx_nodes": [node.name or node.output[0], add.name or add.output[0]]})
