"""The shapes and sizes calibration measures (full grid for a profile, quick grid for smoke tests)."""

from __future__ import annotations

# The formats calibrated.
FORMATS = ("fp32", "bf16", "fp16")
# GEMM (m, n, k) in nn.Linear's layout (x[m,k] @ W[n,k].T): m from decode-like to large batches, n and k
# across the weight sizes of the zoo; the time model interpolates between these points (hardware/curves.py).
FULL_GRID = tuple((m, n, k) for m in (16, 64, 256, 1024, 4096) for n in (256, 1024, 4096)
                  for k in (256, 1024, 4096)) + (
    (16, 32768, 1024), (128, 32768, 512), (512, 32768, 256))  # vocabulary-wide heads (LM heads: 30k-150k)
QUICK_GRID = ((128, 128, 128), (256, 256, 256), (16, 512, 512))
# The same GEMM with the left operand a transposed view (x.t() @ W.T): BLAS takes another path for it.
FULL_GRID_TA = tuple((m, n, k) for m in (64, 256, 1024) for n in (256, 1024) for k in (256, 1024))
QUICK_GRID_TA = ((128, 128, 128),)
# A weight gradient, x.T @ dy (left operand transposed, right row-major): m and n the layer's features, k the
# tokens of the step, so wide m, n and short k.
FULL_GRID_WGRAD = tuple((m, n, k) for m in (256, 1024, 4096) for n in (256, 1024, 4096) for k in (64, 256, 1024))
QUICK_GRID_WGRAD = ((128, 128, 64),)
# Convolutions (batch, Cin, Cout, image side, kernel, stride): ResNet's stem, 3x3 and 1x1 layers at each
# stage, and ViT's 16x16 patch embedding, at batch 1 and 8; each is stored as its implicit GEMM.
FULL_CONV = tuple((b, *c) for b in (1, 8) for c in (
    (3, 64, 224, 7, 2), (64, 64, 56, 3, 1), (64, 256, 56, 1, 1), (256, 64, 56, 1, 1), (128, 128, 28, 3, 1),
    (512, 128, 28, 1, 1), (256, 256, 14, 3, 1), (1024, 256, 14, 1, 1), (512, 512, 7, 3, 1),
    (2048, 512, 7, 1, 1), (3, 768, 224, 16, 16),
    (64, 64, 16, 3, 1), (256, 64, 16, 1, 1)))  # small images (64 px inputs: 16 px stages), where formats rank apart
QUICK_CONV = ((1, 16, 16, 16, 3, 1),)
# Fused attention (batch * heads, sequence, head dim), causal and not.
FULL_ATTN = tuple((12, s, 64) for s in (64, 128, 256, 512, 1024, 2048))
QUICK_ATTN = ((2, 32, 16),)
FULL_SIZES = tuple(2 ** p for p in range(16, 29, 2))  # 64 KiB .. 256 MiB per buffer (8x a 32 MiB LLC)
QUICK_SIZES = (2 ** 16, 2 ** 20)
FRESH_MIN_BYTES = 2 ** 20  # fresh-output writes are timed from 1 MiB up (smaller blocks are recycled by malloc)
# The skip rule never assumes a rate below this per thread (a scalar 2-FLOP fused multiply-add per cycle at 1 GHz
# is 2e9): a first shape stalled by the scheduler must not skip the whole grid behind it
SKIP_FLOOR_PER_THREAD = 1e9
# The time budget of a full calibration: under a minute (issue 23), split per format and family, seconds. A load
# that slows every shape (other tenants on a shared host) cannot stretch the run: the shapes past their family's
# share are skipped and listed, the smaller shapes of each family (measured first) kept. 3 formats x 10 s, 6 s of
# bandwidth, plus the ceilings and the vector rates (20 s under the load this was tuned on: 2 cores, load ~7)
BUDGET_S = {"gemm": 3.2, "gemm_ta": 1.2, "gemm_wgrad": 1.6, "conv": 2.8, "attention": 1.2, "bandwidth": 6.0}
MAX_CALL_S = 0.05  # a shape whose one call would take longer (slow dtype on this device) is skipped, and said
# Each format's ceiling (run._ceilings): a square GEMM whose one call takes about this long at the best grid rate
# (large enough for the dispatched kernel's sustained rate, short enough for a one-minute calibration), side <= max
CEILING_CALL_S = 0.05
CEILING_MAX = 4096
# A pointwise add of this many fp32 elements splits over every intra-op thread: ATen parallelises from its
# GRAIN_SIZE of 32768 elements up (aten/src/ATen/Parallel.h, ``constexpr int64_t GRAIN_SIZE = 32768``)
PARALLEL_ELEMS = 2 ** 18
VECTOR_ELEMS = 2 ** 17  # 512 KiB of fp32: inside a per-core L2, so the vector rate is not a bandwidth


def grid(quick: bool) -> dict[str, tuple]:
    """The shape sets of one run, by family."""
    if quick:
        return {"gemm": QUICK_GRID, "gemm_ta": QUICK_GRID_TA, "gemm_wgrad": QUICK_GRID_WGRAD,
                "conv": QUICK_CONV, "attention": QUICK_ATTN,
                "sizes": QUICK_SIZES}
    return {"gemm": FULL_GRID, "gemm_ta": FULL_GRID_TA, "gemm_wgrad": FULL_GRID_WGRAD, "conv": FULL_CONV,
            "attention": FULL_ATTN, "sizes": FULL_SIZES}


def steps(quick: bool) -> int:
    """How many progress steps ``calibrate`` reports (for a progress bar's total)."""
    g = grid(quick)
    backward = sum(1 for x in g["conv"] if x[1] != 3)
    per_format = len(g["gemm"]) + len(g["gemm_ta"]) + len(g["gemm_wgrad"]) + len(g["conv"]) + 2 * len(g["attention"])
    return len(FORMATS) * per_format + backward + len(g["sizes"]) + 8
