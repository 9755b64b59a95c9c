"""GPU candidates: Triton GEMM configurations against cuBLAS, Triton flash-attention blocks against torch's SDPA.

Enumerated and ranked by the cost model's own GPU tilers (mapping/tiling.py), so they run (and are tested) on
the meta device against a catalog GPU; timed only on a CUDA device, through opmap.timing.time_interleaved,
which reads CUDA events there.

- GEMM: every legal tile of ``tile_candidates`` that a plain Triton matmul runs (one K loop per tile: no
  split-K, no Stream-K) becomes a Triton config (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps), predicted
  at that tile's time; cuBLAS is one candidate predicted at the best tile of the whole search (the library
  picks its own tile, split-K and Stream-K included).
- Attention: each legal flash tile of ``attention_candidates`` (Br query rows, Bc key rows) is a Triton
  flash-attention config; torch's SDPA (flash backend) is one candidate at the best tile.

num_warps follows Triton's matmul tutorial configurations (python/tutorials/03-matrix-multiplication.py in
triton-lang/triton: 8 warps for the 128x256 / 256x128 tiles, 4 for smaller ones). Not run here: this host
has no CUDA device, so the GPU timing path (``gpu_runnable``) is untested on hardware.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from opmap.explore.tune.signatures import Signature
from opmap.hardware.spec import HardwareSpec


@dataclass(frozen=True)
class GpuCandidate:
    """A library call (cublas, sdpa) or a Triton kernel configuration."""

    backend: str  # cublas | triton_gemm | sdpa | triton_attention
    block_m: int = 0
    block_n: int = 0
    block_k: int = 0
    stages: int = 0
    warps: int = 0

    @property
    def label(self) -> str:
        if self.backend in ("cublas", "sdpa"):
            return self.backend
        k = f"x{self.block_k}" if self.block_k else ""
        return f"{self.backend} {self.block_m}x{self.block_n}{k} stages={self.stages} warps={self.warps}"

    def to_dict(self) -> dict:
        return {"label": self.label, **asdict(self)}


def num_warps(bm: int, bn: int) -> int:
    """Triton's tutorial choice: 8 warps from a 128x256 tile up, else 4."""
    return 8 if bm * bn >= 128 * 256 else 4


def _common(hw: HardwareSpec, dtype: str) -> dict:
    from opmap.precision import resolve_precision

    p = resolve_precision(hw, dtype)
    return {"sram_per_unit": hw.sram_per_unit_bytes or 0.0, "units": int(hw.compute_units),
            "l2_bytes": hw.l2_bytes or 0.0, "peak_flops_per_s": p.matrix_rate_flops_per_s,
            "bandwidth_bytes_per_s": hw.memory_rate_bytes_per_s}, p


def gemm_candidates(sig: Signature, hw: HardwareSpec) -> list[tuple[GpuCandidate, float]]:
    """(candidate, predicted seconds) for a GEMM signature on GPU ``hw``, fastest predicted first."""
    from opmap.mapping.tiling import tile_candidates

    m, n, k, _ = sig.shape
    common, p = _common(hw, sig.dtype)
    tiles = tile_candidates(1, m, n, k, p.operand_format, **common, sram_bytes_per_s=hw.sram_bytes_per_s,
                            min_bm=hw.mma_min_m, dense_peak_flops_per_s=p.matrix_peak_flops_per_s,
                            stream_k=hw.stream_k_gemm)
    lo = hw.launch_overhead_s
    out: dict[GpuCandidate, float] = {GpuCandidate("cublas"): tiles[0].time_s + lo}
    for t in tiles:
        if t.split_k == 1 and not t.stream_k:
            c = GpuCandidate("triton_gemm", t.bm, t.bn, t.bk, t.stages, num_warps(t.bm, t.bn))
            out.setdefault(c, t.time_s + lo)
    return sorted(out.items(), key=lambda cp: cp[1])


def attention_candidates(sig: Signature, hw: HardwareSpec) -> list[tuple[GpuCandidate, float]]:
    """(candidate, predicted seconds) for an attention signature on GPU ``hw``, fastest predicted first."""
    from opmap.mapping.tiling import attention_candidates as tiles_for

    b, h, sq, sk, d, causal = sig.shape
    common, p = _common(hw, sig.dtype)
    tiles = tiles_for(b * h, sq, sk, d, p.operand_format, causal=bool(causal), **common)
    lo = hw.launch_overhead_s
    out: dict[GpuCandidate, float] = {GpuCandidate("sdpa"): tiles[0].time_s + lo}
    for t in tiles:
        out.setdefault(GpuCandidate("triton_attention", t.bm, t.bn, 0, t.stages, num_warps(t.bm, t.bn)),
                       t.time_s + lo)
    return sorted(out.items(), key=lambda cp: cp[1])


def gpu_candidates(sig: Signature, hw: HardwareSpec) -> list[tuple[GpuCandidate, float]]:
    """The ranked GPU candidates of ``sig`` (GEMM and attention; other families have none here)."""
    if sig.family == "gemm":
        return gemm_candidates(sig, hw)
    if sig.family == "attention":
        return attention_candidates(sig, hw)
    return []


def gpu_runnable(sig: Signature, cand: GpuCandidate, device: str = "cuda") -> Callable[[], object]:
    """A call that runs ``cand`` once on the CUDA device (cuBLAS through torch.mm, SDPA, or the Triton GEMM of
    triton_matmul.py); the caller times it with opmap.timing.time_interleaved. Triton attention configs are
    ranked but not timed (no Triton flash kernel ships with opmap): OpmapError says so."""
    import torch

    from opmap.errors import OpmapError
    from opmap.precision import torch_dtype

    dt = torch_dtype(sig.dtype)
    if sig.family == "gemm":
        m, n, k, _ = sig.shape
        a, w = torch.randn(m, k, device=device, dtype=dt), torch.randn(n, k, device=device, dtype=dt)
        if cand.backend == "cublas":
            return lambda: torch.mm(a, w.t())
        from opmap.explore.tune.triton_matmul import matmul

        return lambda: matmul(a, w.t(), cand.block_m, cand.block_n, cand.block_k, cand.stages, cand.warps)
    if sig.family == "attention" and cand.backend == "sdpa":
        b, h, sq, sk, d, causal = sig.shape
        q, kk, v = (torch.randn(b, h, s, d, device=device, dtype=dt) for s in (sq, sk, sk))
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, kk, v, is_causal=bool(causal))
    raise OpmapError(f"{cand.label} is ranked, not timed: opmap has no Triton flash-attention kernel to run it")


def tune_gpu(sigs: list[Signature], hw: HardwareSpec, top_k: int, rounds: int,
             device: str = "cuda") -> list[dict]:
    """Per GEMM / attention signature on a CUDA device: the GPU candidates ranked by the cost model, the top
    ``top_k`` that can be timed (a Triton flash config cannot, see gpu_runnable) timed interleaved with CUDA
    events (opmap.timing.time_interleaved), the fastest median chosen. The library call (cuBLAS, SDPA) is the
    default and is always timed. Not run on hardware yet: this host has no CUDA device."""
    import torch

    from opmap.timing import time_interleaved

    out = []
    for sig in sigs:
        ranked = gpu_candidates(sig, hw)
        if not ranked:
            continue
        default = next(c for c, _ in ranked if c.backend in ("cublas", "sdpa"))
        timed = [c for c, _ in ranked if c.backend in ("cublas", "sdpa", "triton_gemm")][:top_k]
        timed += [default] if default not in timed else []
        with torch.no_grad():
            samples = time_interleaved([gpu_runnable(sig, c, device) for c in timed], torch.device(device),
                                       rounds=rounds)
        meas = dict(zip(timed, samples))
        chosen = min(timed, key=lambda c: meas[c].median_s)
        out.append({"signature": sig.to_dict(), "default": default.to_dict(), "chosen": chosen.to_dict(),
                    "default_s": meas[default].median_s, "chosen_s": meas[chosen].median_s,
                    "gain": meas[default].median_s / meas[chosen].median_s,
                    "candidates": [{**c.to_dict(), "predicted_s": p, "predicted_rank": i + 1, "timed": c in meas,
                                    "default": c == default,
                                    **({"measured_s": meas[c].median_s, **meas[c].spread()} if c in meas else {})}
                                   for i, (c, p) in enumerate(ranked)]})
    return out
