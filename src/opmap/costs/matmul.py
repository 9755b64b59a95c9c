"""Matrix-engine families: GEMM (mm, addmm, bmm, baddbmm, linear, matmul, einsum, mv, dot) and convolution.

GEMM of (M x K) by (K x N): 2*M*N*K FLOPs (a multiply-add is 2), M*N*K MACs. The bias or beta*C of addmm /
baddbmm is vector work (M*N adds). These match torch.utils.flop_counter for the FLOPs it counts.

Convolution: 2 * N * Cout * prod(output spatial) * (Cin / groups) * prod(kernel) for a forward convolution;
for a transposed one the roles of input and output swap: 2 * N * Cin * prod(input spatial) * (Cout / groups)
* prod(kernel). Same formula as torch.utils.flop_counter.conv_flop_count. The bias is N*Cout*prod(out) adds.
"""

from __future__ import annotations

from dataclasses import replace

from opmap.costs.base import OpCost, io_cost, prod, rule
from opmap.graph import Node
from opmap.ops import MatrixFamily, MatrixProblem


def _a_transposed(node: Node) -> bool:
    """The left operand is a transposed view (column-major [M, K]): BLAS libraries run it on another path."""
    a = node.input("mat1") or node.input("batch1") or (node.inputs[0] if node.inputs else None)
    if a is None or len(a.shape) < 2 or len(a.stride) < 2:
        return False
    return a.stride[-2] == 1 and a.shape[-2] > 1 and a.shape[-1] > 1 and a.stride[-1] != 1


def _b_row_major(node: Node) -> bool:
    """The right operand is row-major [K, N] (not a transposed weight view): with a transposed left operand
    this is a weight gradient's layout, x.T @ dy."""
    b = node.input("mat2") or node.input("batch2") or (node.inputs[1] if len(node.inputs) > 1 else None)
    if b is None or len(b.shape) < 2 or len(b.stride) < 2:
        return False
    return b.stride[-1] == 1 and b.shape[-1] > 1


def _gemm(node: Node, m: int, n: int, k: int, batch: int = 1, bias_elems: int = 0) -> OpCost:
    mac = batch * m * n * k
    family = MatrixFamily.GEMM  # curves by operand layout (hardware/curves.py)
    if _a_transposed(node):
        family = MatrixFamily.GEMM_WGRAD if _b_row_major(node) else MatrixFamily.GEMM_TA
    reads = None
    if bias_elems and node.args.get("beta") == 0:
        # beta = 0 (Megatron's baddbmm for the attention scores): BLAS neither reads C nor adds it
        reads = [t for name, t in zip(node.input_names, node.inputs) if name != "self"]
        bias_elems = 0
    return io_cost(node, reads=reads, matrix_flops=2.0 * mac, macs=float(mac), vector_flops=float(bias_elems),
                   problem=MatrixProblem(family, int(batch), int(m), int(n), int(k)))


@rule("mm")
def mm_cost(node: Node) -> OpCost:
    """mm(A[M,K], B[K,N])."""
    a, b = node.inputs[0].shape, node.inputs[1].shape
    return _gemm(node, a[0], b[1], a[1])


@rule("addmm")
def addmm_cost(node: Node) -> OpCost:
    """addmm(C, A[M,K], B[K,N]) = beta*C + alpha*A@B: the GEMM plus M*N vector adds."""
    a, b = node.input("mat1").shape, node.input("mat2").shape
    return _gemm(node, a[0], b[1], a[1], bias_elems=a[0] * b[1])


@rule("bmm")
def bmm_cost(node: Node) -> OpCost:
    """bmm(A[B,M,K], B[B,K,N])."""
    a, b = node.inputs[0].shape, node.inputs[1].shape
    return _gemm(node, a[1], b[2], a[2], batch=a[0])


@rule("baddbmm")
def baddbmm_cost(node: Node) -> OpCost:
    """baddbmm(C, A[B,M,K], B[B,K,N]): the batched GEMM plus B*M*N adds."""
    a, b = node.input("batch1").shape, node.input("batch2").shape
    return _gemm(node, a[1], b[2], a[2], batch=a[0], bias_elems=a[0] * a[1] * b[2])


@rule("addbmm")
def addbmm_cost(node: Node) -> OpCost:
    """addbmm: sum over the batch of A_i @ B_i, added to C."""
    a, b = node.input("batch1").shape, node.input("batch2").shape
    return _gemm(node, a[1], b[2], a[2], batch=a[0], bias_elems=a[0] * a[1] * b[2])


@rule("linear")
def linear_cost(node: Node) -> OpCost:
    """linear(x[..., K], W[N, K], b): GEMM with M = prod(leading dims)."""
    x, w = node.input("input").shape, node.input("weight").shape
    m = prod(x[:-1])
    bias = m * w[0] if node.input("bias") is not None else 0
    return _gemm(node, m, w[0], x[-1], bias_elems=bias)


@rule("matmul")
def matmul_cost(node: Node) -> OpCost:
    """matmul with broadcasting: 1-D operands get a unit dimension, leading dims broadcast."""
    a, b = list(node.inputs[0].shape), list(node.inputs[1].shape)
    if len(a) == 1:
        a = [1] + a
    if len(b) == 1:
        b = b + [1]
    batch_a, batch_b = a[:-2], b[:-2]
    nd = max(len(batch_a), len(batch_b))
    batch_a = [1] * (nd - len(batch_a)) + batch_a
    batch_b = [1] * (nd - len(batch_b)) + batch_b
    batch = prod(max(x, y) for x, y in zip(batch_a, batch_b))
    return _gemm(node, a[-2], b[-1], a[-1], batch=batch)


@rule("mv", "addmv")
def mv_cost(node: Node) -> OpCost:
    """Matrix-vector product: 2*M*K FLOPs (memory-bound on every device, but matrix work)."""
    m = node.input("mat").shape
    bias = m[0] if node.packet == "addmv" else 0
    return _gemm(node, m[0], 1, m[1], bias_elems=bias)


@rule("dot", "vdot")
def dot_cost(node: Node) -> OpCost:
    return _gemm(node, 1, 1, node.inputs[0].shape[0])


def _expand_ellipsis(specs: list[str], shapes: list[tuple[int, ...]], out: str | None):
    """Replace ``...`` by fresh index letters, right-aligned as einsum broadcasts."""
    nd = max((len(shp) - (len(sp) - 3) for sp, shp in zip(specs, shapes) if "..." in sp), default=0)
    fresh = "".join(c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in "".join(specs))[:nd]
    new = []
    for sp, shp in zip(specs, shapes):
        if "..." in sp:
            k = len(shp) - (len(sp) - 3)
            sp = sp.replace("...", fresh[nd - k:])
        new.append(sp)
    if out is not None and "..." in out:
        out = out.replace("...", fresh)
    return new, out


@rule("einsum")
def einsum_cost(node: Node) -> OpCost:
    """einsum, contracted pairwise left to right: each step costs the product of the sizes of every index
    in either operand (MACs); its result keeps the indices the output or a later operand still needs."""
    eq = str(node.args.get("equation", "")).replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    specs = lhs.split(",")
    shapes = [t.shape for t in node.inputs]
    specs, out = _expand_ellipsis(specs, shapes, rhs if "->" in eq else None)
    sizes: dict[str, int] = {}
    for spec, shp in zip(specs, shapes):
        for ch, s in zip(spec, shp):
            sizes[ch] = max(sizes.get(ch, 1), int(s))
    if out is None:  # implicit output: indices that appear once, sorted
        allc = "".join(specs)
        out = "".join(sorted(c for c in set(allc) if allc.count(c) == 1))
    total = 0
    cur = set(specs[0])
    for i, spec in enumerate(specs[1:], start=1):
        both = cur | set(spec)
        total += prod(sizes[c] for c in both)
        keep = set(out) | set("".join(specs[i + 1:]))
        cur = both & keep
    if len(specs) == 1:  # a single-operand einsum is a reduction or a permutation
        return io_cost(node, vector_flops=float(prod(shapes[0])))
    return io_cost(node, matrix_flops=2.0 * total, macs=float(total))  # no single GEMM shape: peak rate


_CONV = ("convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
         "conv_transpose3d", "mkldnn_convolution", "cudnn_convolution", "cudnn_convolution_transpose",
         "miopen_convolution", "_slow_conv2d_forward", "slow_conv3d_forward", "slow_conv_transpose2d",
         "thnn_conv2d", "_conv_depthwise2d", "conv_depthwise3d", "slow_conv_dilated2d")


@rule(*_CONV)
def conv_cost(node: Node) -> OpCost:
    """Convolution of any dimensionality, stride, dilation and groups, transposed or not."""
    x = node.input("input") or node.inputs[0]
    w = node.input("weight") or node.inputs[1]
    out = node.outputs[0]
    transposed = bool(node.args.get("transposed", False)) or "transpose" in node.packet
    n = x.shape[0]
    if transposed:
        # weight is [Cin, Cout/groups, *k]; each input pixel scatters into Cout/groups * prod(k) outputs
        mac = n * prod(x.shape[2:]) * prod(w.shape)
    else:
        # weight is [Cout, Cin/groups, *k]; each output pixel gathers Cin/groups * prod(k) inputs
        mac = n * prod(out.shape[2:]) * prod(w.shape)
    bias = out.numel if node.input("bias") is not None else 0
    groups = int(node.args.get("groups", 1) or 1)
    if transposed:  # per group: X[N*in pixels, Cin/g] @ W[Cin/g, Cout/g * kernel], then col2im
        gm, gn, gk = n * prod(x.shape[2:]), w.shape[1] * prod(w.shape[2:]), w.shape[0] // groups
    else:  # per group: im2col(X)[N*out pixels, Cin/g * kernel] @ W^T[Cin/g * kernel, Cout/g]
        gm, gn, gk = n * prod(out.shape[2:]), w.shape[0] // groups, prod(w.shape[1:])
    return replace(io_cost(node, matrix_flops=2.0 * mac, macs=float(mac), vector_flops=float(bias)),
                   problem=MatrixProblem(MatrixFamily.CONV, groups, int(gm), int(gn), int(gk)))

