"""A plain Triton GEMM with its configuration as arguments: what gpu.py times for a Triton GEMM candidate.

The kernel is the textbook tiled form (Triton's matmul tutorial, python/tutorials/03-matrix-multiplication.py
in triton-lang/triton): one program per BLOCK_M x BLOCK_N tile of C, grouped along M for L2 reuse, a K loop of
BLOCK_K steps accumulating in fp32 with masked edge loads. Imported only on a CUDA host with Triton; not run on
this CPU-only machine (no CUDA device: untested on hardware here).
"""

from __future__ import annotations

import triton
import triton.language as tl

GROUP_M = 8  # tiles of C grouped along M so a group's B columns stay in L2 (the tutorial's value)


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    per_group = GROUP * tiles_n
    first_m = (pid // per_group) * GROUP
    group_rows = min(tiles_m - first_m, GROUP)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        left = K - k * BLOCK_K
        x = tl.load(a, mask=(rm[:, None] < M) & (rk[None, :] < left), other=0.0)
        y = tl.load(b, mask=(rk[:, None] < left) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(x, y)
        a += BLOCK_K * stride_ak
        b += BLOCK_K * stride_bk
    c = c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(a, b, block_m: int, block_n: int, block_k: int, stages: int, warps: int):
    """C = A @ B (A [M, K], B [K, N], any strides) with the given tile, pipeline stages and warps."""
    import torch

    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
    _matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                         c.stride(1), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP=GROUP_M,
                         num_stages=stages, num_warps=warps)
    return c
