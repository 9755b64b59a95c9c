"""Attention in ONNX graphs, priced by the fused-attention rule (costs/attention.py).

Decomposed attention, as torch.onnx.export writes scaled_dot_product_attention::

    Q [-> Transpose(0,2,1,3)] [-> Mul by a scalar] ----\\
    K -> Transpose [-> Mul by a scalar] ------------- MatMul [-> Mul / Div by a scalar] [-> Add mask | Where]
                                                         -> Softmax(last axis) -> MatMul <- [Transpose] <- V

becomes one scaled_dot_product_attention node over the chain's source tensors: a fused kernel reads Q, K, V
once and writes O, the S x S scores never reach memory. A mask whose value is known (folded, or an initializer)
and is exactly PyTorch's top-left causal mask (key j <= query i kept) makes the node causal, as torch's
is_causal: the masked half is counted as skipped FLOPs, not computed. Any other mask is an explicit attn_mask
(dense work), as the rule counts it. Each intermediate must feed only the chain, else nothing is fused.

Attention ops: ai.onnx Attention (opset 23; is_causal), com.microsoft Attention (the packed QKV projection, then
attention; ``unidirectional`` is causal), MultiHeadAttention and GroupQueryAttention (always causal).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opmap.graph import TensorMeta
from opmap.workloads.onnx_fold import value_at_load
from opmap.workloads.onnx_model import attrs, contiguous

MS = "com.microsoft"
MASKED = -1e4  # an additive mask entry at or below this keeps a score out of the softmax
BHSD_FROM_BSHD = [0, 2, 1, 3]


@dataclass
class Fused:
    """One recognised attention: emitted at the P @ V MatMul (``key``), the other nodes absorbed."""

    key: Any
    absorbed: list = field(default_factory=list)
    q: tuple[str, tuple[int, ...]] = ("", ())
    k: tuple[str, tuple[int, ...]] = ("", ())
    v: tuple[str, tuple[int, ...]] = ("", ())
    causal: bool = False
    mask: str | None = None
    out: str = ""  # the tensor the kernel writes: P @ V, or its (B, S, H, D) transpose when that is absorbed
    note: str = ("decomposed attention (MatMul, scale, mask, Softmax, MatMul) priced as one fused kernel; a known "
                 "lower-triangular mask as causal (masked half skipped, as torch's is_causal)")

    def emit(self, b) -> None:
        ins = [("query", b.meta(self.q[0], self.q[1])), ("key", b.meta(self.k[0], self.k[1])),
               ("value", b.meta(self.v[0], self.v[1]))]
        if self.mask is not None:
            ins.append(("attn_mask", b.meta(self.mask)))
        names = [n.name or n.output[0] for n in (*self.absorbed, self.key)]
        b.add(self.key, "scaled_dot_product_attention", ins, [self.out or self.key.output[0]],
              {"is_causal": self.causal, "onnx_nodes": names})


def _scalar(b, name: str) -> bool:
    v = b.om.value(name, 16)
    return v is not None and v.size == 1


def _only_feeds(b, name: str, nodes) -> bool:
    cons = b.consumers.get(name, [])
    ids = {id(n) for n in nodes}
    return bool(cons) and all(id(c) in ids for c in cons) and name not in {o.name for o in b.om.model.graph.output}


def _causal_keep(keep: np.ndarray, sq: int, sk: int) -> bool:
    try:
        full = np.broadcast_to(keep, (*keep.shape[:-2], sq, sk)) if keep.ndim >= 2 else None
    except ValueError:
        return False
    if full is None:
        return False
    tri = np.tril(np.ones((sq, sk), dtype=bool))
    return bool(np.all(full.reshape(-1, sq, sk) == tri))


def _keep(b, mask: str) -> np.ndarray | None:
    """Which scores an attention mask keeps, where its value is known (folded, an initializer, or computed at load
    from constants): a boolean mask keeps True, an additive one the entries above MASKED; None: unknown."""
    v = value_at_load(b.om, mask)
    if v is None:
        return None
    return v.astype(bool) if v.dtype == np.bool_ else v > MASKED


def _walk_scores(b, sm, producer):
    """From the Softmax up to the Q K^T MatMul: (MatMul node, chain nodes, mask name, keep-array or None)."""
    chain, mask, keep = [], None, None
    x = producer.get(sm.input[0])
    for _ in range(4):
        if x is None or x.op_type == "MatMul" or len(b.consumers.get(x.output[0], [])) != 1:
            break
        ins = [i for i in x.input]
        if x.op_type in ("Mul", "Div") and len(ins) == 2 and _scalar(b, ins[1]):
            nxt = ins[0]
        elif x.op_type == "Mul" and len(ins) == 2 and _scalar(b, ins[0]):
            nxt = ins[1]
        elif x.op_type == "Add" and mask is None and len(ins) == 2:
            a0, a1 = (producer.get(i) for i in ins)
            pick = 0 if a0 is not None and a0.op_type in ("MatMul", "Mul", "Div") else 1
            nxt, mask = ins[pick], ins[1 - pick]
            keep = _keep(b, mask)
        elif x.op_type == "Where" and mask is None and len(ins) == 3:
            if _scalar(b, ins[2]):
                nxt, mask, flip = ins[1], ins[0], False
            elif _scalar(b, ins[1]):
                nxt, mask, flip = ins[2], ins[0], True
            else:
                break
            v = value_at_load(b.om, mask)
            keep = None if v is None else (~v.astype(bool) if flip else v.astype(bool))
        else:
            break
        chain.append(x)
        x = producer.get(nxt)
    if x is None or x.op_type != "MatMul" or len(b.consumers.get(x.output[0], [])) != 1:
        return None
    return x, chain, mask, keep


def _source(b, name: str, producer, absorbed: list, perm=None, also=()) -> str:
    """Walk up from a Q / K / V operand through scalar scalings and (``perm``) a transpose that feed only the
    chain, absorbing them; the tensor the fused kernel reads."""
    for _ in range(6):  # scalings, views and transposes: the dynamo exporter writes K^T as four of them
        p = producer.get(name)
        if p is None or not _only_feeds(b, name, [*absorbed, *also]):
            break
        if p.op_type in ("Mul", "Div") and len(p.input) == 2 and _scalar(b, p.input[1]) \
                or p.op_type == "Mul" and len(p.input) == 2 and _scalar(b, p.input[0]):
            absorbed.append(p)
            name = p.input[1] if p.op_type == "Mul" and _scalar(b, p.input[0]) else p.input[0]
            continue
        if p.op_type in ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"):
            absorbed.append(p)  # a view: the kernel reads the tensor under it
            name = p.input[0]
            continue
        if p.op_type == "Transpose":
            got = list(attrs(p).get("perm", []))
            if perm is None or got == perm:
                absorbed.append(p)
                name = p.input[0]
                continue
        break
    return name


def _nan_guard(b, sm) -> tuple[str, list] | None:
    """The probabilities P @ V reads: the Softmax output, or past the guard the dynamo exporter writes for fully
    masked rows (Softmax -> IsNaN -> Where(isnan, 0, softmax): a NaN row read as zeros), which a fused kernel does
    in its own softmax. (P's name, the guard's nodes); None when the Softmax feeds anything else as well."""
    out = sm.output[0]
    cons = b.consumers.get(out, [])
    if len(cons) == 1:
        return out, []
    nan = next((c for c in cons if c.op_type == "IsNaN"), None)
    where = next((c for c in cons if c.op_type == "Where"), None)
    if len(cons) != 2 or nan is None or where is None or len(where.input) != 3:
        return None
    if where.input[0] != nan.output[0] or where.input[2] != out or not _scalar(b, where.input[1]) \
            or len(b.consumers.get(nan.output[0], [])) != 1:
        return None
    return where.output[0], [nan, where]


def find_attention(b) -> dict[int, Fused]:
    """Every decomposed attention in the live graph, keyed by id of its P @ V MatMul."""
    producer = {o: n for n in b.om.live for o in n.output if o}
    out: dict[int, Fused] = {}
    for sm in b.om.live:
        if sm.op_type != "Softmax" or sm.domain not in ("", "ai.onnx") or not b.known(sm):
            continue
        rank = len(b.om.shapes[sm.input[0]])
        if int(attrs(sm).get("axis", -1)) % rank != rank - 1:
            continue
        guarded = _nan_guard(b, sm)
        cons = b.consumers.get(guarded[0], []) if guarded is not None else []
        if len(cons) != 1 or cons[0].op_type != "MatMul" or cons[0].input[0] != guarded[0]:
            continue
        pv = cons[0]
        walked = _walk_scores(b, sm, producer)
        if walked is None or not b.known(pv) or not b.known(walked[0]):
            continue
        qk, chain, mask, keep = walked
        chain = [*chain, *guarded[1]]
        a_shape, k_shape = b.om.shapes[qk.input[0]], b.om.shapes[qk.input[1]]
        v_shape = b.om.shapes[pv.input[1]]
        if len(a_shape) < 2 or len(k_shape) < 2:
            continue
        sq, sk = a_shape[-2], k_shape[-1]
        absorbed = [qk, *chain, sm]
        q = _source(b, qk.input[0], producer, absorbed, BHSD_FROM_BSHD)
        k = _source(b, qk.input[1], producer, absorbed, None)
        v = _source(b, pv.input[1], producer, absorbed, BHSD_FROM_BSHD, also=(pv,))
        out_name = pv.output[0]
        after = b.consumers.get(out_name, [])
        if len(after) == 1 and after[0].op_type == "Transpose" and _only_feeds(b, out_name, after) and \
                list(attrs(after[0]).get("perm", [])) == BHSD_FROM_BSHD:
            absorbed.append(after[0])  # the kernel writes (B, S, H, D) directly, as flash kernels lay O out
            out_name = after[0].output[0]
        causal = keep is not None and _causal_keep(keep, sq, sk)
        if keep is not None and bool(np.all(keep)):
            mask = None  # nothing masked
        f = Fused(pv, absorbed, (q, tuple(a_shape)), (k, (*k_shape[:-2], sk, k_shape[-2])), (v, tuple(v_shape)),
                  causal, None if causal else mask, out_name)
        out[id(pv)] = f
    return out


def packed_splits(b, fused: dict[int, Fused]) -> set[int]:
    """Splits whose every output a fused attention reads (through views), and a transpose feeding only such a
    split: the packed QKV projection the kernel reads in place, so they are views, not copies."""
    sources = {t[0] for f in fused.values() for t in (f.q, f.k, f.v)}
    splits = [n for n in b.om.live if n.op_type == "Split" and all(o in sources for o in n.output if o)]
    producer = {o: n for n in b.om.live for o in n.output if o}
    out = {id(n) for n in splits}
    for n in splits:  # a transpose that only lays out the packed QKV for the split: the kernel reads it strided
        p = producer.get(n.input[0])
        if p is not None and p.op_type == "Transpose" and _only_feeds(b, n.input[0], [n]):
            out.add(id(p))
    return out


# -- attention ops ----------------------------------------------------------------------------------------------

def _heads(shape: tuple[int, ...], heads: int) -> tuple[int, ...]:
    """(B, S, heads * D) -> (B, heads, S, D); 4-D shapes are taken as (B, H, S, D) already."""
    if len(shape) == 4:
        return tuple(shape)
    bsz, s, hidden = shape
    return (bsz, heads, s, hidden // max(heads, 1))


def _sdpa(b, node, q: TensorMeta, k: TensorMeta, v: TensorMeta, causal: bool, mask: TensorMeta | None) -> None:
    ins = [("query", q), ("key", k), ("value", v)] + ([("attn_mask", mask)] if mask is not None and not causal
                                                       else [])
    b.add(node, "scaled_dot_product_attention", ins, [node.output[0]], {"is_causal": causal})


def _reshaped(t: TensorMeta, shape: tuple[int, ...]) -> TensorMeta:
    return TensorMeta(tuple(shape), t.dtype, contiguous(tuple(shape)), t.producer, t.param)


def onnx_attention(b, node, a) -> None:
    """ai.onnx Attention (opset 23): Q, K, V as (B, H, S, D) or (B, S, hidden) with q_num_heads / kv_num_heads. A
    mask whose value is known and is the top-left causal mask makes the node causal (as in decomposed attention)."""
    q, k, v = b.input(node, 0), b.input(node, 1), b.input(node, 2)
    qh, kvh = int(a.get("q_num_heads", 0) or 1), int(a.get("kv_num_heads", 0) or 1)
    pk = b.input(node, 4)
    q4, k4, v4 = _heads(q.shape, qh), _heads(k.shape, kvh), _heads(v.shape, kvh)
    if pk is not None:  # the cache holds earlier keys: attention runs over past + new
        k4 = (*k4[:2], k4[2] + pk.shape[2], k4[3])
        v4 = (*v4[:2], v4[2] + pk.shape[2], v4[3])
    causal, mask = bool(a.get("is_causal", 0)), b.input(node, 3)
    keep = _keep(b, node.input[3]) if mask is not None and not causal else None
    if keep is not None and (_causal_keep(keep, q4[2], k4[2]) or bool(np.all(keep))):
        # the dynamo exporter passes HF's causal mask (an initializer once the shapes are fixed) with is_causal 0
        causal, mask = not bool(np.all(keep)), None
    _sdpa(b, node, _reshaped(q, q4), _reshaped(k, k4), _reshaped(v, v4), causal, mask)


def ms_attention(b, node, a) -> None:
    """com.microsoft Attention: input (B, S, Hin) @ weights (Hin, 3 * hidden) + bias, then attention over
    num_heads heads (``unidirectional``: causal; a mask_index or attention_bias: an explicit mask)."""
    x, w, bias = b.input(node, 0), b.input(node, 1), b.input(node, 2)
    heads = int(a.get("num_heads", 1))
    n3 = w.shape[1]
    wt = TensorMeta((n3, w.shape[0]), w.dtype, (1, n3), w.producer, w.param)  # the weight as linear reads it
    qkv = (*x.shape[:-1], n3)
    b.add(node, "linear", [("input", x), ("weight", wt), ("bias", bias)], [TensorMeta(qkv, x.dtype, contiguous(qkv))])
    sizes = [int(s) for s in a.get("qkv_hidden_sizes", [])] or [n3 // 3] * 3
    bsz, s = x.shape[0], x.shape[1]
    past = b.input(node, 4)
    sk = s + (past.shape[3] if past is not None and len(past.shape) == 5 else 0)
    q = b.inner((bsz, heads, s, sizes[0] // heads), node.input[0])
    k = b.inner((bsz, heads, sk, sizes[1] // heads), node.input[0])
    v = b.inner((bsz, heads, sk, sizes[2] // heads), node.input[0])
    mask = b.input(node, 3) or b.input(node, 5)
    _sdpa(b, node, q, k, v, bool(a.get("unidirectional", 0)), mask)


def ms_multihead(b, node, a) -> None:
    """com.microsoft MultiHeadAttention: query (B, S, D); key / value (B, Sk, D) or (B, H, Sk, Dh); packed
    QKV in a 5-D query (B, S, H, 3, Dh) when key is absent."""
    q, k, v = b.input(node, 0), b.input(node, 1), b.input(node, 2)
    heads = int(a.get("num_heads", 1))
    if k is None and len(q.shape) == 5:  # packed QKV
        bsz, s, h, _, d = q.shape
        q4 = k4 = v4 = (bsz, h, s, d)
        k = v = q
    else:
        q4, k4, v4 = _heads(q.shape, heads), _heads(k.shape, heads), _heads(v.shape, heads)
    pk = b.input(node, 6)
    if pk is not None:
        k4 = (*k4[:2], k4[2] + pk.shape[2], k4[3])
        v4 = (*v4[:2], v4[2] + pk.shape[2], v4[3])
    mask = b.input(node, 4) or b.input(node, 5)
    _sdpa(b, node, _reshaped(q, q4), _reshaped(k, k4), _reshaped(v, v4), bool(a.get("unidirectional", 0)), mask)


def ms_gqa(b, node, a) -> None:
    """com.microsoft GroupQueryAttention: causal attention of num_heads query heads over kv_num_heads KV heads;
    the keys span the present cache (output 1) where its shape is known."""
    q, k, v = b.input(node, 0), b.input(node, 1), b.input(node, 2)
    qh, kvh = int(a.get("num_heads", 1)), int(a.get("kv_num_heads", 1))
    bsz, s, hidden = q.shape
    if k is None:  # packed QKV: hidden = (qh + 2 kvh) * d
        d = hidden // (qh + 2 * kvh)
        k = v = q
    else:
        d = hidden // qh
    present = b.meta(node.output[1]) if len(node.output) > 1 and node.output[1] else None
    sk = present.shape[2] if present is not None and len(present.shape) == 4 else s
    _sdpa(b, node, _reshaped(q, (bsz, qh, s, d)), _reshaped(k, (bsz, kvh, sk, d)), _reshaped(v, (bsz, kvh, sk, d)),
          True, None)


ATTENTION_OPS = {("", "Attention"): onnx_attention, (MS, "Attention"): ms_attention,
                 (MS, "MultiHeadAttention"): ms_multihead, (MS, "GroupQueryAttention"): ms_gqa}
