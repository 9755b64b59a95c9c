"""Scaled dot product attention, every CPU and CUDA variant, as one fused kernel.

For queries (B, H, Sq, D), keys (B, Hkv, Sk, D) and values (B, Hkv, Sk, Dv), over P query-key pairs per
head: matrix FLOPs = 2*B*H*P*D (Q K^T) + 2*B*H*P*Dv (P V); vector work on the P scores per head: scale,
running max, subtract, sum, divide (5 per score) plus one exp (transcendental). Dense P = Sq*Sk, the count
torch.utils.flop_counter uses.

Causal (``is_causal``; ``custom_mask_type`` 1 or 2 in the xformers-style kernels): the fused kernels skip
masked blocks, so P counts only the unmasked pairs, sum over queries i of min(i + 1, Sk) for PyTorch's
top-left-aligned mask (Sq*(Sq+1)/2 when Sq == Sk); the skipped half goes to ``skipped_flops`` and the
node says so. An explicit ``attn_mask`` is dense work: the kernel computes every score and then masks.

Attention with sinks (gpt-oss: opmap.capture.functions.sink_attention) is recorded as the kernel serving engines
run for it (FlashInfer's and TensorRT-LLM's attention with ``sinks``, vLLM's FlashAttention-3 ``s_aux``): no mask
read, the causal mask aligned to the last key and the sliding window kernel parameters (args ``causal_align``
"bottom-right" and ``window``), so P counts the pairs the kernel computes (opmap.ops.end_aligned_pairs: per query at
most ``window`` keys); the sinks are one logit per head added to the softmax's denominator (its H values read; one
exp and add per query row, counted with the row's softmax).

Chunked local attention (Llama 4's chunked layers: opmap.capture.functions.chunked_attention) is recorded as the
kernel engines run for it (TensorRT-LLM's ``attention_chunk_size``, vLLM's chunked local attention): args ``chunk``
and ``q_offset`` (the first query's absolute position), so P counts the causal pairs inside each query's chunk
(opmap.ops.chunked_pairs: for S = n C + r tokens from position 0, n C (C + 1) / 2 + r (r + 1) / 2) and K and V are
read only where a query's chunk reaches them (opmap.ops.chunked_keys_read: a decode step at position p reads
p - floor(p / C) C + 1 keys of the cache, at most C).

Bytes: a fused kernel reads Q, K, V (and the mask, if any) once (V once with K where it is a view of K's first
columns: ``values_in_keys``) and writes the output (plus the
log-sum-exp where the variant returns it); the S x S scores never reach device memory.

Dropout (``dropout_p`` above 0, a training call): the kernel draws a random number per score from the Philox
counter generator, compares it with the threshold and zeroes or scales the probability; the backward draws the
same numbers again to rebuild the mask. Counted as integer work on the vector unit, ``DROPOUT_OPS_PER_SCORE``
forward and ``DROPOUT_BWD_OPS_PER_SCORE`` backward, one vector op each (an A100 SM has as many INT32 lanes as FP32,
64; a Hopper SM half as many, 64 against 128, so there the count is low by 2x), and the problem is marked
``dropout``: where a measured no-dropout curve prices the kernel, the kernel's measured dropout factor scales it
instead (opmap.hardware.curves).

Layouts: the ``_scaled_dot_product_*`` ops and ``scaled_dot_product_attention`` take (B, H, S, D);
``_flash_attention_forward`` and ``_efficient_attention_forward`` take (B, S, H, D).
"""

from __future__ import annotations

from dataclasses import replace

from opmap.costs.base import OpCost, io_cost, prod, rule
from opmap.graph import Node, TensorMeta
from opmap.ops import (
    AttentionHeads,
    MatrixFamily,
    MatrixProblem,
    causal_pairs,
    chunked_keys_read,
    chunked_pairs,
    end_aligned_pairs,
)

BHSD = ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_fused_attention_overrideable")
BSHD = ("_flash_attention_forward", "_efficient_attention_forward")
VECTOR_PER_SCORE = 5  # scale, max, subtract, sum, divide
EXP_PER_SCORE = 1
# Philox-4x32-10 (Salmon et al. 2011, SC'11): 10 rounds of two 32 x 32 -> 64-bit multiplies, two three-way xors and
# two key bumps, about 70 integer instructions a call for 128 random bits. FlashAttention-2 takes 8 bits a score
# (csrc/flash_attn/src/dropout.h), 16 scores a call: ~4.4 instructions a score for the draw, then extracting the
# byte, the compare and the select: 8 forward; the backward draws again and masks both P and dP: 9
DROPOUT_OPS_PER_SCORE = 8
DROPOUT_BWD_OPS_PER_SCORE = 9


def dropout_p(node: Node) -> float:
    """The attention call's dropout probability (0 outside training or where the call names none)."""
    p = node.args.get("dropout_p") or 0.0
    return float(p) if isinstance(p, (int, float)) else 0.0


def is_causal(node: Node) -> bool:
    if node.args.get("is_causal"):
        return True
    return node.args.get("custom_mask_type") in (1, 2)


def values_in_keys(k: TensorMeta, v: TensorMeta) -> bool:
    """Whether the values are the keys' first columns, read with them (MLA's absorbed decode: keys the latent and
    RoPE key, kv_lora_rank + qk_rope_head_dim wide, values the latent, a view of the keys; FlashMLA reads each
    cached token's entry once): the same shape but a narrower last dimension, the same strides, keys packed row by
    row (a V of its own, or one split from a fused K/V projection, has another row pitch)."""
    return (k.dtype == v.dtype and k.shape[:-1] == v.shape[:-1] and v.shape[-1] < k.shape[-1]
            and k.stride == v.stride and len(k.stride) >= 2 and k.stride[-1] == 1 and k.stride[-2] == k.shape[-1])


@rule(*BHSD, *BSHD)
def sdpa_cost(node: Node) -> OpCost:
    """Fused attention: products on the matrix engine, softmax on the vector unit, Q/K/V/O traffic."""
    q, k, v = node.input("query"), node.input("key"), node.input("value")
    if node.packet in BSHD:  # (B, S, H, D)
        b, sq, h, d = q.shape
        sk, dv, hkv = k.shape[1], v.shape[3], k.shape[2]
    else:  # (..., H, S, D); leading dims multiply into the batch
        *lead, h, sq, d = q.shape if len(q.shape) >= 3 else (1, *q.shape)
        b = prod(lead)
        sk, dv = k.shape[-2], v.shape[-1]
        hkv = k.shape[-3] if len(k.shape) >= 3 else 1
    dense = sq * sk
    causal = is_causal(node) and not any(n in ("attn_mask", "attn_bias", "bias") for n in node.input_names)
    given = None  # pairs counted otherwise than the family says (a window, a mask aligned to the last key)
    chunk = node.args.get("chunk")
    chunk = chunk if causal and isinstance(chunk, int) and chunk > 0 else None
    q0 = node.args.get("q_offset")
    q0 = q0 if isinstance(q0, int) else None
    w = node.args.get("window")
    window = w if isinstance(w, int) and not isinstance(w, bool) and w > 0 else 0
    if chunk is not None:
        given = chunked_pairs(sq, sk, chunk, q0)
        causal = given < dense
    elif causal and node.args.get("causal_align") == "bottom-right":
        given = end_aligned_pairs(sq, sk, window or None)
        causal = given < dense
    pairs = given if given is not None else causal_pairs(sq, sk) if causal else dense
    # the KV span a measured decode-attention table is read at: a window's, or the keys a chunked call reads
    heads_window = chunked_keys_read(sq, sk, chunk, q0) if chunk is not None else window if given is not None else 0
    per_pair = 2 * d + 2 * dv
    matrix = float(b * h * pairs * per_pair)
    skipped = float(b * h * (dense - pairs) * per_pair)
    # outputs beyond the attention result (logsumexp, rng state, debug mask) are small; the first output is O
    written = sum(t.nbytes for t in node.outputs if len(t.shape) == 4) or node.outputs[0].nbytes
    drop = dropout_p(node) > 0.0
    per_score = VECTOR_PER_SCORE + (DROPOUT_OPS_PER_SCORE if drop else 0)
    reads = [t for t in node.inputs if not (t is v and values_in_keys(k, v))]
    cost = io_cost(node, reads=reads, written=written, matrix_flops=matrix, macs=matrix / 2,
                   vector_flops=float(b * h * pairs * per_score),
                   transcendental_flops=float(b * h * pairs * EXP_PER_SCORE), skipped_flops=skipped,
                   problem=MatrixProblem(MatrixFamily.ATTENTION_CAUSAL if causal else MatrixFamily.ATTENTION,
                                         int(b * h), int(sq), int(sk), int(d), dropout=drop,
                                         pairs=given if given is not None and given != causal_pairs(sq, sk) else None,
                                         heads=AttentionHeads(int(h), int(hkv) if h % max(hkv, 1) == 0 else int(h),
                                                              heads_window, k.itemsize)))
    if chunk is None:
        return cost
    # a chunked kernel reads K and V only where some query's chunk reaches (the keys before the first query's chunk
    # start are held in the cache, never read)
    kv = sum(t.storage_bytes for t in reads if (t is k or t is v) and t.param is None)
    unread = kv * (1.0 - chunked_keys_read(sq, sk, chunk, q0) / sk)
    return replace(cost, bytes_read=cost.bytes_read - unread)
