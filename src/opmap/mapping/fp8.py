"""fp8 training as Transformer Engine runs it: which GEMMs of a captured training step take fp8 operands, and the
cast kernels that feed them, added to the graph as nodes of their own (costed by opmap.costs.fp8).

In fp8 (TE's ``te.Linear`` / ``LayerNormLinear`` / ``LayerNormMLP``, as Megatron-core and NeMo build them): every
weight GEMM of the repeated blocks, i.e. the Linear layers (roles column, row and the experts'), all three GEMMs:
fprop (input e4m3 x weight e4m3), dgrad (output gradient e5m2 x weight e4m3), wgrad (input e4m3 x output gradient
e5m2). In bf16: the embedding, the LM head (TE and Megatron keep the first and last layers out of fp8), the MoE
router, and the attention core (Q K^T, softmax, x V: TE's fused attention runs bf16 unless fp8 attention is asked
for). The casts (``fp8_cast_transpose``: bf16 in, fp8 and its transpose out, amax reduced in the pass):

- each distinct activation a Linear reads, once per microstep in forward (q, k and v reading one norm output share
  one cast, as TE's fused QKV Linear does);
- each Linear's output gradient, once per microstep in backward (to e5m2);
- each weight, once per iteration (phase ``optimizer``: TE caches the fp8 weight and its transpose across the
  microbatches of a step, Megatron passes ``is_first_microbatch``);
- one amax-history and scale update for all of them per iteration (``fp8_scale_update``).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, replace
from typing import ClassVar

from opmap.costs.base import OpCost
from opmap.graph import Node, OpGraph, TensorMeta
from opmap.mapping.roles import Roles, _source, infer_roles, phase_of
from opmap.ops import GEMM_OPS

FP8_ROLES = frozenset({"column", "row", "expert_column", "expert_row"})
# TE's DelayedScaling recipe default amax_history_len (transformer_engine.common.recipe.DelayedScaling)
AMAX_HISTORY = 1024
CAST_OP = "opmap.fp8_cast_transpose.default"
SCALE_OP = "opmap.fp8_scale_update.default"


@dataclass(frozen=True)
class Fp8Plan:
    """A training graph with TE's fp8 cast kernels appended, and which of its nodes run on the fp8 matrix rate."""

    graph: OpGraph
    fp8_nodes: frozenset[int]  # the Linear layers' GEMMs (forward and backward): fp8 operands, fp8 rate
    bf16_matrix: tuple[str, ...]  # what stays in bf16 among the matrix ops, for the assumptions
    casts: int  # cast kernels added (per microstep and per iteration together)
    notes: tuple[str, ...]


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    st, acc = [], 1
    for s in reversed(shape):
        st.append(acc)
        acc *= s
    return tuple(reversed(st))


def _fp8(shape: tuple[int, ...], fmt: str, producer: int) -> tuple[TensorMeta, TensorMeta]:
    """The fp8 copy of a tensor (flattened to 2-D: rows x last dim) and its transpose."""
    rows = 1
    for s in shape[:-1]:
        rows *= s
    two = (rows, shape[-1]) if shape else (1, 1)
    t = (two[1], two[0])
    return (TensorMeta(two, fmt, _contiguous(two), producer), TensorMeta(t, fmt, _contiguous(t), producer))


def _cast(nid: int, like: Node, x: TensorMeta, fmt: str, phase: str, what: str) -> Node:
    return Node(nid, CAST_OP, like.module, like.module_class, like.layer_type, (x,), _fp8(tuple(x.shape), fmt, nid),
                ("input",), {"phase": phase, "fp8": what})


def fp8_linears(graph: OpGraph, roles: Roles) -> list[Node]:
    """The forward GEMMs TE runs in fp8: those of the blocks' Linear layers (roles column, row and the experts'),
    a weight among their inputs."""
    return [n for n in graph.nodes if phase_of(n) == "forward" and n.packet in GEMM_OPS
            and roles.role.get(n.id) in FP8_ROLES and any(t.param is not None for t in n.inputs)]


def plan_fp8_training(graph: OpGraph) -> Fp8Plan:
    """The fp8 GEMMs of a captured training step and the graph with their casts appended (module docstring). The
    attention core stays bf16 (TE's default; fp8 attention, TE's NVTE_FP8_DPA, is not modelled)."""
    roles = infer_roles(graph)
    nodes = list(graph.nodes)
    linear = fp8_linears(graph, roles)
    modules = {n.module for n in linear}
    fp8_nodes = frozenset(n.id for n in nodes if n.packet in GEMM_OPS and n.module in modules
                          and phase_of(n) in ("forward", "backward"))
    added: list[Node] = []
    nid = len(nodes)
    seen_x: set = set()
    seen_w: set[str] = set()
    fp8_tensors = 0
    for f in linear:
        x = next((t for t in f.inputs if t.param is None and len(t.shape) >= 2), None)
        if x is not None:
            key = (_source(nodes, x.producer), x.numel)
            if key not in seen_x:
                seen_x.add(key)
                added.append(_cast(nid, f, x, "float8_e4m3fn", "forward", f"input of {f.module}: e4m3 + transpose"))
                nid += 1
                fp8_tensors += 1
    for f in linear:
        y = f.outputs[0]
        dy = TensorMeta(tuple(y.shape), y.dtype, tuple(y.stride))
        added.append(_cast(nid, f, dy, "float8_e5m2", "backward", f"output gradient of {f.module}: e5m2 + transpose"))
        nid += 1
        fp8_tensors += 1
    for f in linear:
        for w in (t for t in f.inputs if t.param is not None and t.param not in seen_w and len(t.shape) >= 2):
            seen_w.add(w.param)
            added.append(_cast(nid, f, w, "float8_e4m3fn", "optimizer",
                               f"weight {w.param}: e4m3 + transpose, once per iteration"))
            nid += 1
            fp8_tensors += 1
    if added:
        hist = TensorMeta((fp8_tensors, AMAX_HISTORY), "float32", (AMAX_HISTORY, 1))
        scale = TensorMeta((fp8_tensors,), "float32", (1,))
        added.append(Node(nid, SCALE_OP, "", "", "other", (hist, scale), (hist, scale), ("amax_history", "scale"),
                          {"phase": "optimizer", "fp8": f"amax history ({AMAX_HISTORY}) and scale update of "
                                                        f"{fp8_tensors} fp8 tensors, once per iteration"}))
    bf16 = _bf16_matrix(nodes, fp8_nodes, roles)
    notes = (f"fp8 training (Transformer Engine): {len(fp8_nodes)} GEMMs of {len(modules)} Linear layers in fp8 "
             f"(fprop e4m3 x e4m3, dgrad e5m2 x e4m3, wgrad e4m3 x e5m2, fp32 accumulate, bf16 out), at the fp8 rate; "
             f"in bf16 at the bf16 rate: {', '.join(bf16) or 'no other GEMM'}; the embedding is a lookup (bf16)",
             f"{len(added)} fp8 kernels added: {len(seen_x)} activation casts per microstep, {len(linear)} gradient "
             f"casts per microstep, {len(seen_w)} weight casts and one amax / scale update per iteration (each cast "
             "reads the bf16 tensor, writes the fp8 copy and its transpose, amax fused: delayed scaling)")
    g = replace(graph, nodes=tuple(nodes) + tuple(added))
    return Fp8Plan(g, fp8_nodes, bf16, len(added) - (1 if added else 0), notes)


def _bf16_matrix(nodes, fp8_nodes, roles) -> tuple[str, ...]:
    """What runs on the matrix engine in bf16: named by role (LM head, router, attention core, other)."""
    out: dict[str, None] = {}
    for n in nodes:
        matrix_op = n.packet in GEMM_OPS or "attention" in n.op
        if n.id in fp8_nodes or not matrix_op:
            continue
        r = roles.role.get(n.id)
        if r == "vocab":
            out["LM head (vocabulary GEMM, forward and backward)"] = None
        elif r == "router":
            out["MoE router"] = None
        elif "attention" in n.op or (n.packet in ("bmm", "baddbmm") and roles.block.get(n.id)):
            out["attention core (Q K^T, softmax, x V; forward and backward)"] = None
        elif any(t.param is not None for t in n.inputs) or phase_of(n) == "backward":
            out[f"GEMMs outside the blocks ({n.module or 'top level'})"] = None
    return tuple(out)


def fp8_operand_bytes(costs: list[OpCost], fp8_nodes: frozenset[int]) -> list[OpCost]:
    """The fp8 GEMMs' reads at one byte an element: their operands are the casts' fp8 copies (activations, output
    gradients, weights), not the bf16 tensors the capture recorded; the bf16 (or fp32 wgrad) output is unchanged."""
    return [replace(c, bytes_read=c.bytes_read / 2.0, param_bytes_read=c.param_bytes_read / 2.0)
            if i in fp8_nodes else c for i, c in enumerate(costs)]


@dataclass(frozen=True)
class Fp8Training:
    """analysis.json's ``assumptions.fp8_training``: what is fp8 and what is not, and the rate each runs at. Its
    record: the recipe, the fp8 GEMMs and what runs in fp8, what stays bf16 and its rate, the casts, the weights and
    saved activations, the MFU denominator, the plan's notes (``RECORD``; the sentences are the class's)."""

    RECORD: ClassVar[tuple[str, ...]] = ("recipe", "fp8_gemms", "fp8", "bf16", "bf16_matrix_rate_flops_per_s",
                                         "cast_kernels", "weights", "activations_saved", "mfu_denominator", "notes")
    recipe: ClassVar[str] = ("Transformer Engine delayed scaling: per-tensor scales from the amax history "
                             f"({AMAX_HISTORY} steps), e4m3 forward, e5m2 gradients (the HYBRID format)")
    fp8: ClassVar[str] = ("Linear layers of the repeated blocks, all three GEMMs: fprop e4m3 x e4m3, dgrad e5m2 x "
                          "e4m3, wgrad e4m3 x e5m2; fp32 accumulate, bf16 output")
    weights: ClassVar[str] = ("bf16 weights with an fp32 master copy and fp32 AdamW moments; the fp8 weight and its "
                              "transpose cached for the iteration (1 + 1 B per parameter)")
    activations_saved: ClassVar[str] = ("each Linear's input saved for the weight gradient as its fp8 copy, 1 byte "
                                        "an element (as TE saves it); the rest at the captured bf16 / fp32")
    mfu_denominator: ClassVar[str] = ("the fp8 dense matrix peak (the step's matrix format); against the bf16 peak "
                                      "MFU and HFU scale by fp8 peak / bf16 peak")
    fp8_gemms: int
    bf16: tuple[str, ...]  # what stays bf16: the plan's matrix ops, the embedding lookup, the vector work
    bf16_matrix_rate_flops_per_s: float
    cast_kernels: int
    notes: tuple[str, ...]


def fp8_assumptions(plan: Fp8Plan, bf16) -> Fp8Training:
    """What an fp8 training analysis assumes (``Fp8Training``) of ``plan`` (``bf16``: the
    opmap.precision.Precision the bf16 matrix work runs at)."""
    return Fp8Training(len(plan.fp8_nodes),
                       (*plan.bf16_matrix, "embedding lookup", "norms, activations, softmax (fp32 compute)"),
                       bf16.matrix_rate_flops_per_s, plan.casts, tuple(plan.notes))


def cast_formats(kernels, nodes) -> tuple:
    """The kernel rows (opmap.mapping.kernels.KernelResult) with each cast's format named: "bf16 -> fp8 e4m3
    (+ transpose)" for activations and weights, e5m2 for gradients."""
    fmt = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}
    out = []
    for k in kernels:
        n = nodes[k.kernel.anchor]
        if n.op == CAST_OP:
            k = replace(k, format=f"bf16 -> fp8 {fmt[n.outputs[0].dtype]} (+ transpose)")
        out.append(k)
    return tuple(out)


# fp8 inference as the quantizers ship it: NVIDIA ModelOpt's FP8 configs (the checkpoints TensorRT-LLM builds and
# vLLM serves, nvidia/*-FP8 among them) quantize every Linear but those its _default_disabled_quantizer_cfg turns off,
# "*lm_head*" and the MoE routers ("*router*", "*block_sparse_moe.gate*", "*mlp.gate.*")
# (NVIDIA/TensorRT-Model-Optimizer, modelopt/torch/quantization/config.py): those stay bf16.
FP8_INFERENCE_BF16_ROLES = ("vocab", "router")
FP8_INFERENCE_NOTE = ("{fmt} inference as ModelOpt quantizes a checkpoint (its default config keeps *lm_head* and the "
                      "MoE routers out of {fmt}): {what} in bf16, at the bf16 rate with 2-byte weights; every other "
                      "Linear in {fmt}")


def inference_bf16_nodes(graph: OpGraph, unquantized: tuple[str, ...] = ()) -> tuple[frozenset[int],
                                                                                   tuple[str, ...]]:
    """The GEMMs a quantized checkpoint keeps in bf16 (the LM head, the MoE router, and the modules the checkpoint's
    quantization_config leaves unquantized: ``unquantized``, patterns as transformers matches them), and what they
    are."""
    roles = infer_roles(graph)
    keep = {n.id: roles.role.get(n.id) for n in graph.nodes
            if n.packet in GEMM_OPS and roles.role.get(n.id) in FP8_INFERENCE_BF16_ROLES}
    names = {"vocab": "the LM head", "router": "the MoE router"}
    what = [names[r] for r in keep.values()]
    if unquantized:
        hit = [n.id for n in graph.nodes if n.packet in GEMM_OPS and n.id not in keep
               and any(t.param is not None for t in n.inputs) and module_matches(n.module, unquantized)]
        keep.update(dict.fromkeys(hit, "checkpoint"))
        if hit:
            what.append("the checkpoint's unquantized modules (" + ", ".join(unquantized) + ")")
    return frozenset(keep), tuple(dict.fromkeys(what))


def module_matches(module: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``module`` (a module path) is, or sits under, one of ``patterns``: a name, or a pattern with ``*``
    standing for one path segment or more (transformers' modules_to_not_convert: ``model.layers.*.self_attn``)."""
    for p in patterns:
        if module == p or module.startswith(p + ".") or fnmatch.fnmatchcase(module, p) or \
                fnmatch.fnmatchcase(module, p + ".*"):
            return True
    return False
