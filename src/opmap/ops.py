"""The op taxonomy: which aten ops are pointwise, which alias, which move data; causal pair counting.

Capture (layer types), costs (rules), mapping (fusion, layouts) and calibration all classify ops the same
way, so the sets live here once. Names are aten overload packets (``aten.add.Tensor`` -> ``add``);
in-place variants (``add_``) share their out-of-place op's class.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

# Elementwise ops (unary, binary, ternary): each output element depends on the same-index input elements.
# costs/pointwise.py weighs each one in FLOPs; a test checks the two lists agree.
POINTWISE_OPS = frozenset({
    # binary arithmetic
    "add", "sub", "rsub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "maximum", "minimum",
    "fmax", "fmin", "pow", "atan2", "hypot", "xlogy", "copysign",
    # comparisons and logic
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not", "logical_xor",
    "bitwise_and", "bitwise_or", "bitwise_not", "bitwise_xor", "isnan", "isinf",
    # ternary
    "where", "masked_fill", "addcmul", "addcdiv", "lerp", "clamp", "clip", "hardtanh",
    # unary
    "neg", "abs", "sign", "sgn", "reciprocal", "square", "floor", "ceil", "round", "trunc", "frac",
    "clamp_min", "clamp_max", "relu", "relu6", "threshold", "leaky_relu", "hardswish", "hardsigmoid", "nan_to_num",
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "sin", "cos", "tan",
    "asin", "acos", "atan", "sinh", "cosh", "tanh", "erf", "erfc", "erfinv", "sigmoid", "silu",
    "softplus", "mish", "elu", "selu", "celu", "logit", "gelu", "glu", "tril", "triu",
    # dropout as CUDA runs it (one fused kernel: draw, compare, scale; the mask written beside the output)
    "native_dropout", "native_dropout_backward",
})

# Ops that alias their input but whose schema does not say so.
EXTRA_VIEW_OPS = frozenset({"_unsafe_view", "lift_fresh", "_reshape_alias", "_unsafe_view_copy"})

# Ops that move or materialise data without arithmetic: the data_movement layer type when no module decides.
DATA_MOVEMENT_OPS = frozenset({
    "cat", "stack", "copy", "copy_", "clone", "_to_copy", "contiguous", "index_select", "gather", "scatter",
    "scatter_", "index", "index_put", "index_put_", "repeat", "repeat_interleave", "roll", "flip", "pad",
    "constant_pad_nd", "narrow_copy", "split_with_sizes_copy", "permute_copy", "embedding", "fill_", "zero_",
    "zeros", "ones", "full", "empty", "empty_like", "zeros_like", "ones_like", "full_like", "arange",
    "new_zeros", "new_empty", "new_ones", "new_full", "empty_strided", "scalar_tensor", "lift_fresh_copy",
})

# Copies that may change a tensor's memory order (a layout transform when they do).
COPY_OPS = frozenset({"clone", "_to_copy", "copy_", "copy", "contiguous"})

# Convolution and GEMM overload packets whose operand layout a kernel row names.
CONV_OPS = frozenset({"convolution", "_convolution", "mkldnn_convolution", "cudnn_convolution"})
GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm"})


def packet(op: str) -> str:
    """``aten.addmm.default`` -> ``addmm``."""
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 else parts[0]


def base_name(name: str) -> str:
    """``add_`` -> ``add``: in-place variants share the class (and the cost rule) of their out-of-place op."""
    return name[:-1] if name.endswith("_") and not name.startswith("_") else name


def is_pointwise(op: str) -> bool:
    """Whether a full aten op name (``aten.add_.Tensor``) is an elementwise op."""
    return "." in op and base_name(op.split(".")[1]) in POINTWISE_OPS


def causal_pairs(sq: int, sk: int) -> int:
    """Unmasked (query, key) pairs under PyTorch's causal mask (top-left aligned: key j <= query i):
    the sum over queries i of min(i + 1, Sk); Sq * (Sq + 1) / 2 when Sq == Sk."""
    if sq <= sk:
        return sq * (sq + 1) // 2
    return sk * (sk + 1) // 2 + (sq - sk) * sk


def end_aligned_pairs(sq: int, sk: int, window: int | None = None) -> int:
    """Unmasked (query, key) pairs under a causal mask aligned to the last key, as a decode or chunked-prefill
    kernel applies it (FlashAttention 2.1+'s ``causal``, FlashInfer's, TensorRT-LLM's): query i of Sq sits at
    position p = Sk - Sq + i and sees keys max(0, p - window + 1) .. p, at most ``window`` of them (a sliding window
    as a kernel parameter: FlashAttention's ``window_size=(window - 1, 0)``, FlashInfer's ``window_left``). With
    f(n) = sum over t = 1..n of min(t, window): f(Sk) - f(Sk - Sq); Sq (Sq + 1) / 2 when Sq == Sk and no window
    binds, Sk for one query (a decode step)."""
    def f(n: int) -> int:
        if window is None or n <= window:
            return n * (n + 1) // 2
        return window * (window + 1) // 2 + (n - window) * window
    if sq > sk:  # queries before the first key see none of them
        sq = sk
    return f(sk) - f(sk - sq)


def chunked_pairs(sq: int, sk: int, chunk: int, q_offset: int | None = None) -> int:
    """Unmasked (query, key) pairs under chunked local attention (Llama 4's chunked layers: a token attends to the
    tokens of its own ``chunk``-token chunk up to itself, chunks starting at position 0), as a chunked kernel counts
    them (TensorRT-LLM's ``attention_chunk_size``, vLLM's chunked-local attention): query i of Sq at absolute
    position p = q_offset + i sees keys c(p) .. p, c(p) = floor(p / chunk) * chunk, of the Sk keys, which end with
    the last query (positions q_offset + Sq - Sk .. q_offset + Sq - 1; a key before the first held one is not seen).
    ``q_offset`` None: Sk - Sq (the keys start at position 0). From 0 (prefill of S = n chunk + r tokens):
    n chunk (chunk + 1) / 2 + r (r + 1) / 2. Summed per chunk the queries touch: a chunk's queries a .. b from a
    first key L give sum (p - L + 1) = (b - a + 1)(a + b) / 2 - (L - 1)(b - a + 1)."""
    if chunk <= 0:
        raise ValueError(f"chunk must be positive, got {chunk}")
    q0 = sk - sq if q_offset is None else q_offset
    first_key = q0 + sq - sk  # absolute position of the first held key
    total = 0
    a = q0
    while a < q0 + sq:
        start = (a // chunk) * chunk
        b = min(q0 + sq - 1, start + chunk - 1)
        low = max(start, first_key)
        lo = max(a, low)
        if lo <= b:
            n = b - lo + 1
            total += n * (lo + b) // 2 - (low - 1) * n
        a = b + 1
    return total


def chunked_keys_read(sq: int, sk: int, chunk: int, q_offset: int | None = None) -> int:
    """The distinct keys of Sk that chunked local attention's queries see (``chunked_pairs``: the keys from the first
    query's chunk start, or the first held key, to the last query): what a chunked kernel reads of K and V. A decode
    step at position p reads p - c(p) + 1 of them, at most ``chunk``."""
    q0 = sk - sq if q_offset is None else q_offset
    first_key = q0 + sq - sk
    low = max((max(q0, 0) // chunk) * chunk, first_key)
    return max(0, min(sk, q0 + sq - low))


def expected_experts(experts: int, top_k: int, tokens: float) -> float:
    """Expected distinct experts that ``tokens`` tokens activate under top-k of E with uniform, independent
    routing: each token leaves a given expert unchosen with probability 1 - k / E, so E (1 - (1 - k / E)^b)
    (k at b = 1, E as b grows). A decode step reads each active expert's weights once."""
    if experts <= 0 or tokens <= 0:
        return 0.0
    k = min(top_k, experts)
    return experts * (1.0 - (1.0 - k / experts) ** tokens)


def active_experts(experts: int, top_k: int, tokens: int) -> int:
    """The experts a meta capture runs for ``tokens`` tokens: the expected distinct count
    (``expected_experts``) rounded up, never more than the tokens' assignments (tokens x k) nor E; k for
    one token, E once the batch is large."""
    if tokens <= 0:
        return 0
    e = math.ceil(expected_experts(experts, top_k, tokens) - 1e-9)
    return max(1, min(experts, tokens * min(top_k, experts), e))


class MatrixFamily(StrEnum):
    """The matrix-engine problem families, each with its own efficiency curve in a calibrated profile."""

    GEMM = "gemm"  # batch x [m, k] @ [k, n], right operand as nn.Linear stores it (x @ W.T)
    GEMM_TA = "gemm_ta"  # the same with the left operand a transposed view (MLP-Mixer's token mixing)
    GEMM_WGRAD = "gemm_wgrad"  # left operand transposed, right row-major: a weight gradient, x.T @ dy
    CONV = "conv"  # convolution as an implicit GEMM: m = N * output pixels, n = Cout, k = Cin / groups * kernel
    CONV_BWD = "conv_bwd"  # convolution_backward: one forward-sized implicit GEMM per gradient it makes
    ATTENTION = "attention"  # fused attention: m = Sq, n = Sk, k = head dim
    ATTENTION_CAUSAL = "attention_causal"
    # fused attention's backward (five GEMMs over the forward's pairs): its own curve where one is measured, the
    # forward's otherwise
    ATTENTION_BWD = "attention_bwd"
    ATTENTION_BWD_CAUSAL = "attention_bwd_causal"

    @property
    def gemm_like(self) -> bool:
        """Tiled as a GEMM (conv as implicit GEMM); attention gets flash tiles instead."""
        return self in (MatrixFamily.GEMM, MatrixFamily.GEMM_TA, MatrixFamily.GEMM_WGRAD, MatrixFamily.CONV,
                        MatrixFamily.CONV_BWD)

    @property
    def attention(self) -> bool:
        return self in (MatrixFamily.ATTENTION, MatrixFamily.ATTENTION_CAUSAL, MatrixFamily.ATTENTION_BWD,
                        MatrixFamily.ATTENTION_BWD_CAUSAL)

    @property
    def causal(self) -> bool:
        return self in (MatrixFamily.ATTENTION_CAUSAL, MatrixFamily.ATTENTION_BWD_CAUSAL)

    @property
    def backward(self) -> bool:
        return self in (MatrixFamily.ATTENTION_BWD, MatrixFamily.ATTENTION_BWD_CAUSAL)

    @property
    def parent(self) -> MatrixFamily | None:
        """The family whose curve stands in when this one was not measured."""
        return {MatrixFamily.ATTENTION_CAUSAL: MatrixFamily.ATTENTION, MatrixFamily.GEMM_TA: MatrixFamily.GEMM,
                MatrixFamily.ATTENTION_BWD_CAUSAL: MatrixFamily.ATTENTION_BWD,
                MatrixFamily.ATTENTION_BWD: MatrixFamily.ATTENTION,
                MatrixFamily.GEMM_WGRAD: MatrixFamily.GEMM_TA,
                MatrixFamily.CONV_BWD: MatrixFamily.CONV}.get(self)


@dataclass(frozen=True)
class AttentionHeads:
    """What a fused attention call's problem folds into its batch (sequences x query heads): the query heads, the KV
    heads (grouped-query attention reads each once for its group), the sliding window (0: none) and the bytes per
    element of its K and V, so a measured per-configuration table (opmap.hardware.attention_grid) can price it."""

    heads: int
    kv_heads: int
    window: int = 0
    kv_itemsize: float = 2.0


@dataclass(frozen=True)
class MatrixProblem:
    """The matrix-engine work of one op, for shape-dependent efficiency and tiling.

    ``batch`` counts independent problems of m x n x k: the batch of a bmm, the groups of a grouped
    convolution, batch x heads of attention. ``dropout``: fused attention that drops scores (a training call with
    ``dropout_p`` above 0), which a measured no-dropout curve prices through its kernel's dropout factor
    (opmap.hardware.curves). ``pairs``: attention's unmasked (query, key) pairs per problem where the kernel
    counts them otherwise than ``attention_pairs`` does from the family alone (a sliding window, a causal mask
    aligned to the last key: ``end_aligned_pairs``); None: m x n, or PyTorch's top-left causal count. ``heads``:
    fused attention's query and KV heads, window and KV element bytes (``AttentionHeads``)."""

    family: MatrixFamily
    batch: int
    m: int
    n: int
    k: int
    dropout: bool = False
    pairs: int | None = None
    heads: AttentionHeads | None = None  # fused attention: its heads (None elsewhere, or where not known)

    @property
    def attention_pairs(self) -> int:
        """(query, key) pairs per problem an attention kernel computes (m = queries, n = keys)."""
        if self.pairs is not None:
            return self.pairs
        return causal_pairs(self.m, self.n) if self.family.causal else self.m * self.n

    @property
    def flops(self) -> float:
        """2 x batch x m x n x k: one GEMM of this shape (a multiply-add is 2 FLOPs)."""
        return 2.0 * self.batch * self.m * self.n * self.k

    @property
    def batched_gemm(self) -> bool:
        return self.family in (MatrixFamily.GEMM, MatrixFamily.GEMM_TA, MatrixFamily.GEMM_WGRAD) and self.batch > 1


class VectorKind(StrEnum):
    """Vector families with a measured rate of their own in a calibrated profile; each is a reduction (a
    kernel class of its own in the mapping). Plain pointwise work has no kind."""

    SOFTMAX = "softmax"
    LAYER_NORM = "layer_norm"
    BATCH_NORM = "batch_norm"  # inference: normalise with the running statistics
    BATCH_NORM_TRAIN = "batch_norm_train"  # training forward: batch statistics first (a reduction), then normalise
    BATCH_NORM_BACKWARD = "batch_norm_backward"
    POOL = "pool"
    REDUCE = "reduce"


class KernelClass(StrEnum):
    """What a kernel mostly is, from its anchor node."""

    MATRIX = "matrix"  # runs on the matrix engine
    REDUCTION = "reduction"  # a vector family that reduces (softmax, norms, pooling, reductions)
    VECTOR = "vector"  # pointwise
    DATA_MOVEMENT = "data_movement"  # copies, gathers, layout transforms
    COLLECTIVE = "collective"  # communication between devices
