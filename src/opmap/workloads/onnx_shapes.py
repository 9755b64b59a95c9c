"""Output shapes of onnxruntime's contrib ops (com.microsoft), which ONNX shape inference does not know: without
them inference stops at the first such node and nothing after it has a shape. Each rule takes the node's input
shapes (None where unknown) and attributes and returns its output shapes (None: not derivable); the shapes
follow onnxruntime's contrib op schemas (onnxruntime/core/graph/contrib_ops/bert_defs.cc).
"""

from __future__ import annotations

from collections.abc import Callable

from opmap.workloads.onnx_model import attrs

Shape = tuple[int, ...]
Rule = Callable[[list, dict], list]


def _same(ins: list, a: dict) -> list:
    """Elementwise: the first input's shape (bias and skip inputs broadcast into it)."""
    return [ins[0]]


def _skip_norm(ins: list, a: dict) -> list:
    """output, mean, inv_std_var (the row statistics), input_skip_bias_sum."""
    x = ins[0]
    return [x, (*x[:-1], 1), (*x[:-1], 1), x]


def _attention(ins: list, a: dict) -> list:
    """output (B, S, v_hidden); present (2, B, H, past + S, head size)."""
    x, w = ins[0], ins[1]
    if w is None:
        return []
    sizes = [int(s) for s in a.get("qkv_hidden_sizes", [])] or [w[1] // 3] * 3
    heads = int(a.get("num_heads", 1))
    past = ins[4] if len(ins) > 4 else None
    total = x[1] + (past[3] if past is not None and len(past) == 5 else 0)
    return [(*x[:-1], sizes[2]), (2, x[0], heads, total, sizes[1] // heads)]


def _mha(ins: list, a: dict) -> list:
    """output (B, Sq, heads x value head size); present key / value (B, H, past + Sk, head size)."""
    q, k, v = (ins + [None, None])[:3]
    heads = int(a.get("num_heads", 1))
    if k is None and len(q) == 5:  # packed QKV (B, S, H, 3, D)
        return [(q[0], q[1], q[2] * q[4])]
    if v is None:
        return []
    v_hidden = v[2] if len(v) == 3 else v[1] * v[3]
    sk = k[1] if len(k) == 3 else k[2]
    past = ins[6] if len(ins) > 6 else None
    total = sk + (past[2] if past is not None else 0)
    d = (k[2] // heads) if len(k) == 3 else k[3]
    return [(q[0], q[1], v_hidden), (q[0], heads, total, d), (q[0], heads, total, v_hidden // heads)]


def _gqa(ins: list, a: dict) -> list:
    """output (B, S, heads x D); present key / value (B, kv heads, past + S, D)."""
    q, k = ins[0], ins[1] if len(ins) > 1 else None
    qh, kvh = int(a.get("num_heads", 1)), int(a.get("kv_num_heads", 1))
    d = q[2] // (qh + 2 * kvh) if k is None else q[2] // qh
    past = ins[3] if len(ins) > 3 else None
    total = q[1] + (past[2] if past is not None else 0)
    return [(q[0], q[1], qh * d), (q[0], kvh, total, d), (q[0], kvh, total, d)]


def _fused_matmul(ins: list, a: dict) -> list:
    x, y = list(ins[0]), list(ins[1])
    if a.get("transA"):
        x[-2], x[-1] = x[-1], x[-2]
    if a.get("transB"):
        y[-2], y[-1] = y[-1], y[-2]
    lead = max(x[:-2], y[:-2], key=len)
    return [(*lead, x[-2], y[-1])]


def _embed_norm(ins: list, a: dict) -> list:
    """output (B, S, hidden) from the word table's width; mask_index (B,)."""
    ids, table = ins[0], ins[2] if len(ins) > 2 else None
    if table is None:
        return []
    return [(ids[0], ids[1], table[1]), (ids[0],)]


CONTRIB_SHAPES: dict[str, Rule] = {
    "SkipLayerNormalization": _skip_norm, "SkipSimplifiedLayerNormalization": _skip_norm,
    "SimplifiedLayerNormalization": _same, "LayerNormalization": _same,
    "BiasGelu": _same, "FastGelu": _same, "Gelu": _same, "QuickGelu": _same, "BiasAdd": _same,
    "RotaryEmbedding": _same, "BiasSoftmax": _same,
    "Attention": _attention, "MultiHeadAttention": _mha, "GroupQueryAttention": _gqa,
    "FusedMatMul": _fused_matmul, "EmbedLayerNormalization": _embed_norm,
}


def contrib_shapes(nodes, shapes: dict[str, Shape], elem: dict[str, int]) -> list[tuple[str, Shape, int]]:
    """(tensor name, shape, element type) for each contrib-op output whose shape is now derivable and not yet
    known; the element type is the first input's (token-id inputs give way to the first float one)."""
    out = []
    for n in nodes:
        rule = CONTRIB_SHAPES.get(n.op_type) if n.domain == "com.microsoft" else None
        if rule is None or not n.input or n.input[0] not in shapes:
            continue
        if all(o in shapes for o in n.output if o):
            continue
        ins = [shapes.get(i) if i else None for i in n.input]
        try:
            got = rule(ins, attrs(n))
        except (TypeError, IndexError, ValueError, ZeroDivisionError):
            continue  # an input it needs is unknown or of another rank: left without a shape
        et = next((elem[i] for i in n.input if i and elem.get(i) in (1, 10, 11, 16)), elem.get(n.input[0], 1))
        out.extend((o, tuple(int(d) for d in s), et) for o, s in zip(n.output, got)
                   if o and o not in shapes and s is not None)
    return out
