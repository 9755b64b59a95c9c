"""ONNX models as workloads: ``opmap analyze model.onnx``. Parsed with ``onnx``, never executed.

The path from file to OpGraph:

1. read and check: the file exists, is at most 2 GiB (protobuf's limit on one message; larger models keep their
   weights as external data), parses as a ModelProto with a graph, declares ai.onnx opset 13 or later, and every
   tensor that keeps its data in a file (initializers, constants, attributes, subgraphs: onnx_data.py) names a
   regular file inside the model's folder that holds the bytes the tensor needs;
2. bind the dynamic dims (``dim_param``) of the graph inputs: ``--dim NAME=VALUE`` first, then ``--batch`` for a
   batch-named dim and ``--seq`` for a sequence-named one; any dim left unbound is refused by name;
3. fold and infer: onnx shape inference gives every tensor its shape; the shape arithmetic (Shape, Gather,
   Concat, ... on tensors whose values are then known) is evaluated with numpy on those small integer tensors and
   replaced by constants, as onnxruntime folds it at session creation (at most FOLD_LIMIT elements a tensor,
   FOLD_TOTAL in all), and inference runs again until nothing more folds. onnx's own data propagation is left
   off: it spells any 1-D integer tensor out as one shape dim per element (a 300-byte file asked for 10^15). A
   tensor of more than 2^63 - 1 elements is refused; one made from constants alone is free (run at load) only
   when it holds no more than it was made from;
4. build the graph (onnx_ops.py): each remaining node mapped onto the aten op whose cost rule prices it.

Float tensors are priced at the build dtype of ``--dtype`` (as the zoo casts its module); integer tensors keep
their own type.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from opmap.errors import OpmapError
from opmap.precision import build_dtype, check_requestable
from opmap.workloads.onnx_data import check_external_data, is_external, tensor_value
from opmap.workloads.onnx_model import FLOAT_ELEMS, FOLD_LIMIT, SMALL, OnnxModel
from opmap.workloads.onnx_model import numel as _numel
from opmap.workloads.zoo import Workload

MAX_MODEL_BYTES = 2 * 2**30  # protobuf refuses a message of 2 GiB or more
MAX_DIM = 2**31 - 1  # a bound dim beyond int32 describes no tensor a device holds
MAX_ELEMS = 2**63 - 1  # a tensor's element count is an int64 (ONNX, onnxruntime)
# inference, folding and contrib-op shapes alternate at most this often: each pass gets past one more level of
# folding or one more contrib op on the way (a 48-layer model with two contrib ops a layer needs about 100)
MAX_PASSES = 256
MIN_OPSET = 13
BATCH_NAMES = re.compile(r"(?i)^(batch|batch_?size|batchsize|bs|b|n|num_?batch(es)?|unk__\d+_batch)$")
SEQ_NAMES = re.compile(r"(?i)^(seq|seq_?len(gth)?|sequence|sequence_?len(gth)?|num_?tokens|tokens|t|s|l"
                       r"|total_?sequence_?length)$")

# -- 1. read and check ----------------------------------------------------------------------------------------

def require(module: str) -> None:
    """Refuse in one line when an optional package of the onnx extra is missing."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise OpmapError(f"ONNX models need the {module} package: pip install 'opmap[onnx]' (onnx, onnxruntime)")


def read_model(path: Path):
    """The ModelProto in ``path``, checked to be one; every failure is one OpmapError line."""
    require("onnx")
    import onnx
    from google.protobuf.message import DecodeError

    if not path.is_file():
        raise OpmapError(f"ONNX model {path} does not exist (or is not a file)")
    size = path.stat().st_size
    if size == 0:
        raise OpmapError(f"ONNX model {path} is empty")
    if size >= MAX_MODEL_BYTES:
        raise OpmapError(f"ONNX model {path} is {size / 2**30:.1f} GiB; one ONNX file holds under 2 GiB (protobuf's "
                         "limit): save larger models with their weights as external data")
    m = onnx.ModelProto()
    try:
        m.ParseFromString(path.read_bytes())
    except (DecodeError, RuntimeError, ValueError) as e:
        raise OpmapError(f"{path} is not a readable ONNX model (protobuf: {str(e).strip() or type(e).__name__}); "
                         "the file is truncated, malformed or of another format") from None
    if not m.HasField("graph") or not m.graph.node or not m.opset_import:
        raise OpmapError(f"{path} is not an ONNX model: it parses as protobuf but holds no graph with nodes and "
                         "no opset (another protobuf, or a truncated file)")
    return m


def check_opset(m, path: Path) -> int:
    version = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), None)
    if version is None:
        raise OpmapError(f"{path} declares no ai.onnx opset; opmap reads ai.onnx opset {MIN_OPSET} and later")
    if version < MIN_OPSET:
        raise OpmapError(f"{path} uses opset {version}; opmap reads opset {MIN_OPSET} and later (convert it with "
                         f"onnx.version_converter.convert_version(model, {MIN_OPSET}))")
    return int(version)


def check_references(m, path: Path) -> None:
    """Every tensor a node reads is a graph input, an initializer or an earlier node's output (nodes in order, as
    the ONNX spec requires): a file cut at a message boundary still parses, and fails here."""
    have = {vi.name for vi in m.graph.input} | {t.name for t in m.graph.initializer}
    for node in m.graph.node:
        for name in node.input:
            if name and name not in have:
                raise OpmapError(f"{path}: node {node.name or node.op_type!r} reads {name!r}, which no input, "
                                 "initializer or earlier node provides (a truncated or malformed file)")
        have.update(o for o in node.output if o)


# -- 2. bind the dynamic dims ---------------------------------------------------------------------------------

def parse_dims(items) -> dict[str, int]:
    """``--dim NAME=VALUE`` strings -> {name: value}; a bad one is refused naming the form accepted."""
    out: dict[str, int] = {}
    for item in items:
        name, sep, value = str(item).partition("=")
        if not sep or not name.strip() or not value.strip().isdigit() or not 1 <= int(value) <= MAX_DIM:
            raise OpmapError(f"bad --dim {item!r}: expected NAME=VALUE with VALUE an integer from 1 to {MAX_DIM} (NAME "
                             "a dynamic dim of the model's inputs)")
        out[name.strip()] = int(value)
    return out


def bind_dims(m, batch: int, seq: int | None, dims: dict[str, int], path: Path) -> dict[str, int]:
    """Each dynamic dim of the graph inputs -> its value; unbound ones, --dim names the model lacks, and a --batch or
    --seq that neither binds a dim nor matches the static shape (batch: every input's first dim; seq: an input's
    second dim) are refused."""
    init = {t.name for t in m.graph.initializer}
    names: list[str] = []
    for vi in m.graph.input:
        if vi.name in init:
            continue
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            raise OpmapError(f"{path}: input {vi.name!r} is not a tensor of known rank; opmap reads models whose "
                             "inputs are tensors with a shape (static or named dynamic dims)")
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                continue
            if not d.dim_param:
                raise OpmapError(f"{path}: input {vi.name!r} axis {axis} has an unnamed dynamic dim; name it in the "
                                 "model (a dim_param) to bind it with --dim NAME=VALUE")
            if d.dim_param not in names:
                names.append(d.dim_param)
    unknown = [n for n in dims if n not in names]
    if unknown:
        raise OpmapError(f"--dim {unknown[0]}: {path.name} has no dynamic dim of that name; its dynamic dims: "
                         f"{', '.join(names) or 'none'}")
    bound: dict[str, int] = {}
    missing = []
    for n in names:
        if n in dims:
            bound[n] = dims[n]
        elif BATCH_NAMES.match(n):
            bound[n] = batch
        elif SEQ_NAMES.match(n) and seq is not None:
            bound[n] = seq
        else:
            missing.append(n)
    static = [[d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in m.graph.input if vi.name not in init]
    if batch != 1 and not any(BATCH_NAMES.match(n) and n not in dims for n in names) \
            and not all(s and s[0] == batch for s in static):
        raise OpmapError(f"--batch {batch}: {path.name} has no batch-named dynamic dim to bind; its dynamic dims: "
                         f"{', '.join(names) or 'none (static shapes)'} (bind them with --dim NAME=VALUE)")
    if seq is not None and not any(SEQ_NAMES.match(n) and n not in dims for n in names) \
            and not any(len(s) > 1 and s[1] == seq for s in static):
        raise OpmapError(f"--seq {seq}: {path.name} has no sequence-named dynamic dim to bind; its dynamic dims: "
                         f"{', '.join(names) or 'none (static shapes)'} (bind them with --dim NAME=VALUE)")
    if missing:
        hint = " (a sequence dim: --seq N binds it)" if any(SEQ_NAMES.match(n) for n in missing) else ""
        raise OpmapError(f"{path.name}: dynamic dims {', '.join(repr(n) for n in missing)} are unbound{hint}; "
                         "pass --dim NAME=VALUE for each")
    return bound


# -- 3. fold and infer ----------------------------------------------------------------------------------------

def _concrete_inputs(m, bound: dict[str, int], init: set[str]) -> list:
    from onnx import helper

    out = []
    for vi in m.graph.input:
        if vi.name in init:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else bound[d.dim_param]
                 for d in tt.shape.dim]
        out.append(helper.make_tensor_value_info(vi.name, tt.elem_type, shape))
    return out


def _declared(m, bound: dict[str, int]) -> list:
    """The model's own value_info (shapes an exporter declared, such as contrib ops' outputs, which ONNX shape
    inference cannot derive), its dynamic dims bound."""
    out = []
    for vi in m.graph.value_info:
        c = type(vi)()
        c.CopyFrom(vi)
        for d in c.type.tensor_type.shape.dim:
            if d.dim_param in bound:
                d.dim_value = bound[d.dim_param]
        out.append(c)
    return out


def _light_model(m, inputs: list, consts: dict[str, np.ndarray], nodes: list, big: list, declared: list):
    """The graph for shape inference: concrete inputs, the big initializers as typed inputs (no data copied), the
    known constants as initializers (those over SMALL elements, such as a mask, as typed inputs too: inference
    needs values only of the small shape tensors), the nodes not yet folded, the declared shapes."""
    from onnx import helper, numpy_helper

    init = []
    for name, v in consts.items():
        v = np.asarray(v)
        if v.size > SMALL and v.dtype.kind in "biuf":
            big = [*big, helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))]
        else:
            init.append(numpy_helper.from_array(v, name))
    # the outputs without their declared shapes (a declared dynamic dim would win over the inferred static one), or
    # with a shape derived here (a contrib op's output): inference reads a graph output's type from the output list
    known = {vi.name: vi for vi in declared}
    outputs = [known.get(o.name) or helper.make_tensor_value_info(o.name, o.type.tensor_type.elem_type or 1, None)
               for o in m.graph.output]
    names = {o.name for o in outputs}
    g = helper.make_graph(nodes, m.graph.name or "g", inputs + big, outputs, initializer=init,
                          value_info=[vi for vi in declared if vi.name not in consts and vi.name not in names])
    lm = helper.make_model(g, opset_imports=list(m.opset_import), ir_version=m.ir_version)
    return lm


def _shapes_of(inferred) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    shapes: dict[str, tuple[int, ...]] = {}
    elem: dict[str, int] = {}
    g = inferred.graph
    for vi in (*g.input, *g.value_info, *g.output):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            continue
        if tt.elem_type:
            elem[vi.name] = tt.elem_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes[vi.name] = tuple(int(d.dim_value) for d in tt.shape.dim)
    for t in g.initializer:
        shapes[t.name] = tuple(int(d) for d in t.dims)
        elem[t.name] = t.data_type
    return shapes, elem


def infer(m, path: Path, batch: int, seq: int | None, dims: dict[str, int]) -> OnnxModel:
    """Bind, then alternate shape inference and folding until no node folds (see the module docstring)."""
    import onnx

    from opmap.workloads.onnx_fold import fold_node
    from opmap.workloads.onnx_shapes import contrib_shapes

    opset = check_opset(m, path)
    check_references(m, path)
    check_external_data(m, path)
    bound = bind_dims(m, batch, seq, dims, path)
    name_nodes(m)
    initializers = {t.name: t for t in m.graph.initializer}
    om = OnnxModel(path, m, opset, bound, {}, {}, {}, initializers=initializers)
    for name, t in initializers.items():
        if _numel(t.dims) <= SMALL and not is_external(t):
            v = om.value(name)
            if v is not None:
                om.consts[name] = v
    big = [onnx.helper.make_tensor_value_info(n, t.data_type, list(t.dims))
           for n, t in initializers.items() if n not in om.consts]
    inputs = _concrete_inputs(m, bound, set(initializers))
    declared = _declared(m, bound)
    nodes = list(m.graph.node)
    for node in nodes:  # Constant nodes are values, never kernels
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            v = _constant_value(node, path)
            if v is not None:
                om.consts[node.output[0]] = v
                om.folded.add(node.output[0])
    live = [n for n in nodes if not (n.op_type == "Constant" and n.output[0] in om.consts)]
    shape_derived: set[str] = set()  # folded values computed from the bound input shapes (not known at load)
    for _ in range(MAX_PASSES):
        try:
            inferred = onnx.shape_inference.infer_shapes(_light_model(m, inputs, om.consts, live, big, declared),
                                                         strict_mode=False, data_prop=False)
        except Exception as e:  # noqa: BLE001 - inference errors come as several types; each is one line here
            text = str(e).strip().splitlines()
            raise OpmapError(f"{path}: ONNX shape inference failed: {text[0][:300] if text else type(e).__name__}"
                             ) from None
        om.shapes, om.elem = _shapes_of(inferred)
        derived = contrib_shapes(live, om.shapes, om.elem)
        for name, shape, et in derived:  # contrib ops' outputs, declared for the next pass to carry on from
            om.shapes[name], om.elem[name] = shape, et
            declared.append(onnx.helper.make_tensor_value_info(name, et, list(shape)))
        still = []
        for node in live:
            out = fold_node(node, om)
            if out is None:
                still.append(node)
                continue
            from_shapes = node.op_type in ("Shape", "Size") or any(i in shape_derived for i in node.input)
            for name, v in zip(node.output, out):
                om.consts[name] = v
                om.folded.add(name)
                om.shapes[name] = tuple(v.shape)
                if from_shapes:
                    shape_derived.add(name)
        if len(still) == len(live) and not derived:
            break
        live = still
    _check_sizes(om, path)
    live = _at_load(om, live, shape_derived)
    om.live = _drop_dead(live, {o.name for o in m.graph.output})
    om.notes.append(f"{len(om.folded)} constant and shape-arithmetic tensors folded (their values are known once "
                    "the dims are bound; onnxruntime folds them at session creation)")
    return om


def _check_sizes(om: OnnxModel, path: Path) -> None:
    """Every tensor's element count fits an int64 (as ONNX and onnxruntime count elements) and no dim is negative:
    a shape past that is no tensor any runtime allocates, and its figures would overflow the cost rules."""
    for name, shape in om.shapes.items():
        n = _numel(shape)
        if n > MAX_ELEMS or any(d < 0 for d in shape):
            dims = "x".join(str(d) for d in shape[:6]) + ("x..." if len(shape) > 6 else "")
            count = f"{n:.3g}" if abs(n) < 10**300 else f"about 10^{len(str(abs(n))) - 1}"
            raise OpmapError(f"{path}: tensor {name!r} has shape {dims} ({len(shape)} dims, {count} "
                             f"elements): a negative dim, or more than 2^63 - 1 elements (an int64 count, ONNX's and "
                             f"onnxruntime's), is no tensor a runtime allocates")


RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                        "Bernoulli", "Dropout"})


def _at_load(om: OnnxModel, live: list, shape_derived: set[str]) -> list:
    """Drop the nodes that compute only on weights and constants and make no more data than they read (a transposed
    tied weight, a weight cast): they run once when the model loads (onnxruntime's constant folding), not per
    inference, and their results stand in for the weights they were made from (values not computed). A node that
    makes more than it reads (a ConstantOfShape, Expand or Tile of a constant) stays, priced by what it writes, its
    output held in memory like any activation: generated data is never free. Nodes reading anything the inputs or
    their shapes determine stay."""
    static = set(om.initializers) | {c for c in om.consts if c not in shape_derived}
    keep = []
    for n in live:
        ins = [i for i in n.input if i]
        outs = [o for o in n.output if o]
        if (n.domain in ("", "ai.onnx") and n.op_type not in RANDOM_OPS and ins and all(i in static for i in ins)
                and not any(a.type in (5, 10) for a in n.attribute)
                and all(o in om.shapes for o in outs)
                and max((_numel(om.shapes[o]) for o in outs), default=0)
                <= sum(_numel(om.shapes[i]) if i in om.shapes else om.consts[i].size for i in ins)):
            static.update(outs)
            om.at_load.update(outs)
            continue
        keep.append(n)
    if om.at_load:
        om.notes.append(f"{len(om.at_load)} tensors computed from weights alone (such as a transposed tied weight) "
                        "evaluated once at load, as onnxruntime's constant folding does; they count as weights")
    return keep


def _drop_dead(nodes: list, outputs: set[str]) -> list:
    """The nodes whose results reach a graph output (what onnxruntime keeps after removing dead nodes)."""
    needed = set(outputs)
    keep = []
    for n in reversed(nodes):
        if any(o in needed for o in n.output if o):
            keep.append(n)
            needed.update(i for i in n.input if i)
    return keep[::-1]


def name_nodes(m) -> None:
    """Name each unnamed node as onnxruntime does (``OpType_i``, i its index among the nodes that are not Constant:
    onnxruntime turns Constants into initializers as it loads), so a profile joins by name either way."""
    i = 0
    for node in m.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            continue
        if not node.name:
            node.name = f"{node.op_type}_{i}"
        i += 1


def _constant_value(node, path: Path) -> np.ndarray | None:
    """A Constant node's value (its tensor read as onnx_data.tensor_value reads any), else None: a sparse value, or
    an external one of more than FOLD_LIMIT elements, stays a node."""
    from onnx import helper

    for a in node.attribute:
        if a.name == "value" and a.HasField("t"):
            if is_external(a.t) and _numel(a.t.dims) > FOLD_LIMIT:
                return None
            return tensor_value(a.t, path, f"Constant node {node.name or node.output[0]!r} attribute 'value'")
        v = helper.get_attribute_value(a)
        if a.name in ("value_float", "value_int"):
            return np.asarray(v)
        if a.name in ("value_floats", "value_ints"):
            return np.asarray(list(v))
    return None


def stored_format(m) -> str:
    """The opmap format the model's float weights are stored in, by elements: fp16, bf16 or fp32."""
    by: dict[int, int] = {}
    for t in m.graph.initializer:
        if t.data_type in FLOAT_ELEMS:
            by[t.data_type] = by.get(t.data_type, 0) + _numel(t.dims)
    top = max(by, key=by.get) if by else 1
    return {10: "fp16", 16: "bf16"}.get(top, "fp32")


# -- the workload ---------------------------------------------------------------------------------------------

def is_onnx_target(target: str) -> bool:
    return target.lower().endswith(".onnx")


def load_onnx(target: str, batch: int = 1, seq: int | None = None, dtype: str = "fp32",
              dims: dict[str, int] | None = None, overrides=()) -> Workload:
    """The ONNX file ``target`` as a Workload carrying its OpGraph (no module: nothing is executed)."""
    from opmap.workloads.onnx_ops import build_graph

    if batch < 1:
        raise OpmapError(f"batch must be at least 1, got {batch}")
    check_requestable(dtype)
    path = Path(target)
    m = read_model(path)
    om = infer(m, path, batch, seq, dict(dims or {}))
    graph = build_graph(om, build_dtype(dtype), overrides)
    bound = ", ".join(f"{k}={v}" for k, v in om.dims.items()) or "none (static shapes)"
    notes = (f"ONNX model {path.name} (opset {om.opset}, producer {m.producer_name or '?'} "
             f"{m.producer_version or ''}".rstrip() + f"); dynamic dims bound: {bound}",
             f"float tensors priced at {build_dtype(dtype)} (--dtype {dtype}); integer tensors at their own type")
    seq_v = next((v for k, v in om.dims.items() if SEQ_NAMES.match(k)), None)
    batch_v = next((v for k, v in om.dims.items() if BATCH_NAMES.match(k)), batch)
    return Workload(path.name, None, None, batch_v, seq_v, notes, graph=graph)
