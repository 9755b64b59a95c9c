"""Operator signatures: the distinct (family, shape, dtype, layout) of a captured graph's tunable operators.

A signature is what one mapping choice applies to: every node with the same GEMM / convolution / attention /
norm shape, dtype and operand layout runs the same kernel, so it is tuned once and the choice applies to all of
them (``modules``: the module paths whose calls it covers; ``count``: how many nodes).

Families and their shape tuples (all sizes in elements):

- ``gemm``: ``(m, n, k, bias)``: ``x[m, k] @ W[n, k].T (+ b)``, nn.Linear's layout (aten addmm / mm);
- ``conv``: ``(batch, cin, h, w, cout, kh, kw, stride, padding, dilation, groups, bias)``: a 2-D convolution;
- ``attention``: ``(batch, heads, sq, sk, d, causal)``: scaled_dot_product_attention;
- ``layer_norm``: ``(rows, features)``; ``batch_norm``: ``(batch, channels, h, w)`` (inference statistics).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

from opmap.graph import Node, OpGraph

FAMILIES = ("gemm", "conv", "attention", "layer_norm", "batch_norm")
# the tensor dtypes a signature can carry, as the capture names them -> opmap's format names
DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
_BATCH_NORM = frozenset({"native_batch_norm", "_native_batch_norm_legit_no_training", "batch_norm"})
_ATTENTION = frozenset({"scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
                        "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention"})


@dataclass(frozen=True)
class Signature:
    """One distinct tunable operator: family, shape (see the module docstring), dtype, operand layout."""

    family: str
    shape: tuple[int, ...]
    dtype: str  # fp32 / bf16 / fp16
    layout: str  # "nt" (x @ W.T), "nchw" / "channels_last" (conv, batch norm), "bhsd" (attention), "rows"
    modules: tuple[str, ...] = field(default=(), compare=False)
    count: int = field(default=1, compare=False)

    @property
    def key(self) -> str:
        """A stable text key: family, shape, dtype and layout (what the cache and tune.json index by)."""
        return f"{self.family}:{'x'.join(str(s) for s in self.shape)}:{self.dtype}:{self.layout}"

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.key.encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        return {"key": self.key, "family": self.family, "shape": list(self.shape), "dtype": self.dtype,
                "layout": self.layout, "count": self.count, "modules": list(self.modules)}


def _layout4(stride: tuple[int, ...], shape: tuple[int, ...]) -> str:
    """channels_last when the channel dimension is the innermost (stride 1) of a 4-D NCHW tensor."""
    return "channels_last" if len(shape) == 4 and stride[1] == 1 and shape[1] > 1 else "nchw"


def node_signature(n: Node) -> Signature | None:
    """The signature of one node, or None for a node no tuner here maps (views, pointwise ops, ...)."""
    p = n.packet
    if not n.inputs:
        return None
    dtype = DTYPES.get(n.inputs[0].dtype if p != "addmm" else n.inputs[1].dtype)
    if dtype is None:
        return None
    if p in ("addmm", "mm") and n.module_class == "Linear":
        x, wt = (n.inputs[1], n.inputs[2]) if p == "addmm" else (n.inputs[0], n.inputs[1])
        if len(x.shape) != 2 or len(wt.shape) != 2:
            return None
        return Signature("gemm", (x.shape[0], wt.shape[1], x.shape[1], int(p == "addmm")), dtype, "nt")
    if p == "convolution" and not n.args.get("transposed") and len(n.inputs[0].shape) == 4:
        x, w = n.inputs[0], n.inputs[1]
        a = n.args
        if len(set(a.get("stride", [1]))) != 1 or len(set(a.get("padding", [0]))) != 1:
            return None  # asymmetric strides or padding: not a shape this tuner enumerates
        return Signature("conv", (*x.shape, w.shape[0], w.shape[2], w.shape[3], a["stride"][0], a["padding"][0],
                                  a.get("dilation", [1])[0], a.get("groups", 1), int(len(n.inputs) > 2)),
                         dtype, _layout4(x.stride, x.shape))
    if p in _ATTENTION and len(n.inputs) >= 3 and len(n.inputs[0].shape) == 4:
        q, k = n.inputs[0], n.inputs[1]
        if len(n.inputs) > 3 or n.args.get("dropout_p", 0.0):
            return None  # an explicit mask or dropout: left at its default
        b, h, sq, d = q.shape
        return Signature("attention", (b, h, sq, k.shape[2], d, int(bool(n.args.get("is_causal")))), dtype, "bhsd")
    if p == "native_layer_norm":
        x = n.inputs[0]
        feats = math.prod(n.args.get("normalized_shape") or x.shape[-1:])
        return Signature("layer_norm", (x.numel // feats, feats), dtype, "rows")
    if p in _BATCH_NORM and len(n.inputs[0].shape) == 4 and not n.args.get("training"):
        x = n.inputs[0]
        return Signature("batch_norm", tuple(x.shape), dtype, _layout4(x.stride, x.shape))
    return None


def signatures(graph: OpGraph) -> list[Signature]:
    """The distinct tunable signatures of ``graph``, in order of first appearance, each with its node count and
    the module paths its nodes were called from."""
    seen: dict[Signature, tuple[list[str], int]] = {}
    for n in graph.nodes:
        s = node_signature(n)
        if s is None:
            continue
        mods, c = seen.get(s, ([], 0))
        if n.module not in mods:
            mods.append(n.module)
        seen[s] = (mods, c + 1)
    return [Signature(s.family, s.shape, s.dtype, s.layout, tuple(m), c) for s, (m, c) in seen.items()]
