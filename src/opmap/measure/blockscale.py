"""Numeric emulation of the block-scaled formats: quantize-dequantize in fp32 on the CPU.

Every function takes a float tensor and returns an fp32 tensor of the same shape holding exactly the values the
format can represent (the element times its scale), so a model run on them computes what a kernel in the format
would, up to its accumulation order.

- **Elements** (``round_to``): round-to-nearest-even onto a small float grid (sign, ``ebits`` exponent bits,
  ``mbits`` mantissa bits, subnormals), saturated to the largest normal. The grids are OCP Microscaling Formats
  (MX) Specification v1.0 (Open Compute Project, Sept 2023) sec. 5.3.2-5.3.3 (FP6 E2M3 max 7.5, E3M2 max 28; FP4
  E2M1 max 6, values 0, 0.5, 1, 1.5, 2, 3, 4, 6) and the OCP 8-bit Floating Point Specification (OFP8) v1.0 for
  FP8 (E4M3 max 448, no infinities; E5M2 max 57344).
- **MX** (``mx_qdq``): blocks of k = 32 along the last (reduction) dimension, one E8M0 scale each,
  X = 2^(floor(log2(amax_block)) - emax_elem) (MX spec sec. 6.3, "minimally supported" conversion), elements
  round(V / X) saturated to the element's max normal. emax_elem: E4M3 8, E5M2 15, E2M3 2, E3M2 4, E2M1 2 (the
  exponent of each format's largest normal).
- **NVFP4** (``nvfp4_qdq``): E2M1 elements, blocks of 16, an FP8 E4M3 scale per block and an fp32 scale per
  tensor, as NVIDIA TensorRT Model Optimizer computes them (modelopt/torch/quantization/qtensor/nvfp4_tensor.py,
  ``NVFP4QTensor``): per-tensor s2 = amax_tensor / (6 * 448), so the largest block scale is 448, E4M3's max;
  block scale amax_block / (6 * s2) cast to E4M3 (a zero one set to 1); elements round(V / (scale_e4m3 * s2))
  onto E2M1. NVIDIA's blog "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference" (June 2025)
  describes the same two levels. Activations here take their per-tensor scale from the tensor itself (dynamic);
  a deployed model calibrates it once (static amax), which can only be coarser.
- **fp8-block** (``fp8_block_qdq``): DeepSeek-V3 Technical Report (arXiv 2412.19437) sec. 3.3.1: E4M3 with an
  fp32 scale amax / 448 per 1 x 128 tile of activations (per token, per 128 channels) and per 128 x 128 block of
  weights.

A last dimension that is not a whole number of blocks is padded with zeros for the block maxima (zeros never
raise an amax) and cut back after.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from opmap.errors import OpmapError


@dataclass(frozen=True)
class Minifloat:
    """A small float element format: ``ebits`` exponent bits with ``bias``, ``mbits`` mantissa bits, subnormals,
    ``max_normal`` its largest finite value (saturation bound)."""

    name: str
    ebits: int
    mbits: int
    bias: int
    max_normal: float

    @property
    def emax(self) -> int:
        """The exponent of the largest normal (MX spec Table 1's emax_elem)."""
        return math.floor(math.log2(self.max_normal))

    @property
    def min_exp(self) -> int:
        """The exponent of the smallest normal, 1 - bias: subnormals share its quantum."""
        return 1 - self.bias


# OFP8 v1.0: E4M3 (bias 7, the all-ones mantissa at the top exponent is NaN, so max 1.75 x 2^8 = 448),
# E5M2 (bias 15, IEEE-like, max 1.75 x 2^15 = 57344)
E4M3 = Minifloat("e4m3", 4, 3, 7, 448.0)
E5M2 = Minifloat("e5m2", 5, 2, 15, 57344.0)
# MX spec v1.0 sec. 5.3.2: FP6 E2M3 (bias 1, max 1.875 x 2^2 = 7.5), E3M2 (bias 3, max 1.75 x 2^4 = 28);
# sec. 5.3.3: FP4 E2M1 (bias 1, max 1.5 x 2^2 = 6); no infinities or NaN in any of the three
E2M3 = Minifloat("e2m3", 2, 3, 1, 7.5)
E3M2 = Minifloat("e3m2", 3, 2, 3, 28.0)
E2M1 = Minifloat("e2m1", 2, 1, 1, 6.0)
ELEMENTS = {m.name: m for m in (E4M3, E5M2, E2M3, E3M2, E2M1)}

MX_BLOCK = 32  # MX spec v1.0 sec. 5.2: k = 32 for every concrete MX format
E8M0_MIN_EXP, E8M0_MAX_EXP = -127, 127  # MX spec sec. 5.4: E8M0 encodes 2^-127 .. 2^127 (0xFF is NaN)
NVFP4_BLOCK = 16  # NVIDIA's NVFP4: one E4M3 scale per 16 elements
FP8_TILE = 128  # DeepSeek-V3 sec. 3.3.1: 1 x 128 activation tiles, 128 x 128 weight blocks


def round_to(x: torch.Tensor, elem: Minifloat) -> torch.Tensor:
    """``x`` rounded to the nearest value of ``elem`` (ties to even), saturated to +-max_normal; fp32.

    The quantum of a value in [2^e, 2^(e+1)) is 2^(e - mbits), e never below the smallest normal's exponent
    (subnormals); dividing by a power of two is exact, so torch.round (half to even) does the rounding."""
    x = x.float()
    a = x.abs()
    _, e = torch.frexp(a)  # a = m x 2^e with m in [0.5, 1): floor(log2 a) = e - 1
    exp = (e - 1).clamp(min=elem.min_exp)
    quantum = torch.ldexp(torch.ones_like(a), exp - elem.mbits)
    q = (torch.round(a / quantum) * quantum).clamp(max=elem.max_normal)
    return torch.copysign(q, x)


def _blocks(x: torch.Tensor, k: int) -> torch.Tensor:
    """``x`` (fp32) as [..., blocks, k] along its last dimension, zero-padded to a whole number of blocks."""
    n = x.shape[-1]
    pad = (-n) % k
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    return x.reshape(*x.shape[:-1], (n + pad) // k, k)


def _unblock(xb: torch.Tensor, n: int) -> torch.Tensor:
    return xb.reshape(*xb.shape[:-2], -1)[..., :n]


@dataclass(frozen=True)
class Blocked:
    """A tensor in a block-scaled format: ``elements`` (fp32 values on the element grid, [..., blocks, k]) and
    ``scales`` ([..., blocks, 1], each block's whole scale, the per-tensor one folded in); ``n`` the last
    dimension's length before padding."""

    elements: torch.Tensor
    scales: torch.Tensor
    n: int

    def dequantize(self) -> torch.Tensor:
        return _unblock(self.elements * self.scales, self.n)


def mx_quantize(x: torch.Tensor, elem: Minifloat, block: int = MX_BLOCK) -> Blocked:
    """MX spec v1.0 sec. 6.3: per block of ``block`` along the last dimension, the E8M0 scale
    X = 2^(floor(log2(amax)) - emax_elem) (clamped to E8M0's 2^-127 .. 2^127) and the elements V / X rounded
    to ``elem`` (saturating). A block of zeros keeps zeros (its scale is then immaterial)."""
    xb = _blocks(x.float(), block)
    amax = xb.abs().amax(-1, keepdim=True)
    _, e = torch.frexp(amax)
    shared = (e - 1 - elem.emax).clamp(E8M0_MIN_EXP, E8M0_MAX_EXP)
    scale = torch.ldexp(torch.ones_like(amax), shared)
    return Blocked(round_to(xb / scale, elem), scale, x.shape[-1])


def nvfp4_quantize(x: torch.Tensor, block: int = NVFP4_BLOCK, tensor_amax: float | None = None) -> Blocked:
    """NVFP4 as TensorRT Model Optimizer's ``NVFP4QTensor`` computes it (module docstring): the per-tensor
    s2 = amax / (6 x 448) (``tensor_amax``: the whole tensor's, where ``x`` is a slice of it), block scales
    amax_block / (6 x s2) rounded to E4M3 (a zero one set to 1), elements rounded to E2M1. A block whose scale
    underflows E4M3 dequantizes to zeros."""
    xb = _blocks(x.float(), block)
    amax = xb.abs().amax() if tensor_amax is None else torch.tensor(float(tensor_amax))
    s2 = amax / (E2M1.max_normal * E4M3.max_normal)
    if s2 == 0:  # an all-zero tensor
        return Blocked(torch.zeros_like(xb), torch.ones_like(xb[..., :1]), x.shape[-1])
    sb = xb.abs().amax(-1, keepdim=True) / (E2M1.max_normal * s2)
    sb = round_to(torch.where(sb == 0, torch.ones_like(sb), sb), E4M3)
    scale = sb * s2
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    elems = torch.where(scale == 0, torch.zeros_like(xb), round_to(xb / safe, E2M1))
    return Blocked(elems, scale, x.shape[-1])


def _fp8_scaled(xb: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """E4M3 quantize-dequantize of ``xb`` with an fp32 scale amax / 448 over ``dims`` (a zero amax: scale 1)."""
    amax = xb.abs().amax(dim=dims, keepdim=True)
    s = torch.where(amax == 0, torch.ones_like(amax), amax / E4M3.max_normal)
    return round_to(xb / s, E4M3) * s


def fp8_block_qdq(x: torch.Tensor, weight: bool) -> torch.Tensor:
    """DeepSeek-V3's fine-grained fp8: per 1 x 128 tile along the last dimension (activations), or per
    128 x 128 block of the last two dimensions (``weight``: [out, in], the block spanning 128 outputs and 128
    inputs); E4M3 with an fp32 scale amax / 448 each."""
    x = x.float()
    if not weight or x.dim() < 2:
        xb = _blocks(x, FP8_TILE)
        return _unblock(_fp8_scaled(xb, (-1,)), x.shape[-1])
    rows, cols = x.shape[-2:]
    padr = (-rows) % FP8_TILE
    xp = torch.nn.functional.pad(_blocks(x, FP8_TILE).reshape(*x.shape[:-1], -1), (0, 0, 0, padr))
    lead = xp.shape[:-2]
    xb = xp.reshape(*lead, (rows + padr) // FP8_TILE, FP8_TILE, -1, FP8_TILE)
    q = _fp8_scaled(xb, (-3, -1)).reshape(*lead, rows + padr, -1)
    return q[..., :rows, :cols]


# the element format each MX format uses in opmap (formats.toml's encoding): MX spec Table 1 allows E5M2 for
# MXFP8 and E3M2 for MXFP6 too; these are the defaults OCP's own emulation library (microxcaling) and the
# serving stacks (vLLM, TensorRT-LLM) run
MX_ELEMENTS = {"mxfp8": E4M3, "mxfp6": E2M3, "mxfp4": E2M1}
BLOCK_FORMATS = (*MX_ELEMENTS, "nvfp4", "fp8-block")


ROW_CHUNK = 64 * FP8_TILE  # rows a weight is processed in at once (whole 128-row blocks): bounded temporaries


def qdq(x: torch.Tensor, fmt: str, weight: bool) -> torch.Tensor:
    """``x`` quantize-dequantized to ``fmt`` (one of ``BLOCK_FORMATS``) along its last dimension, in ``x``'s
    dtype; ``weight``: a Linear's weight ([out, in]; fp8-block takes 128 x 128 blocks of it). A 2-D weight is
    processed ``ROW_CHUNK`` rows at a time (every block lies within a chunk; NVFP4 gets the whole tensor's
    amax), so an LM head's temporaries stay bounded; the result is the same."""
    if fmt not in BLOCK_FORMATS:
        raise OpmapError(f"no block-scaled emulation of {fmt!r}; accepted: {', '.join(BLOCK_FORMATS)}")
    if weight and x.dim() == 2 and x.shape[0] > ROW_CHUNK:
        amax = float(x.detach().abs().amax())
        return torch.cat([_qdq(x[i:i + ROW_CHUNK], fmt, weight, amax) for i in range(0, x.shape[0], ROW_CHUNK)])
    return _qdq(x, fmt, weight, None)


def _qdq(x: torch.Tensor, fmt: str, weight: bool, tensor_amax: float | None) -> torch.Tensor:
    if fmt in MX_ELEMENTS:
        y = mx_quantize(x, MX_ELEMENTS[fmt]).dequantize()
    elif fmt == "nvfp4":
        y = nvfp4_quantize(x, tensor_amax=tensor_amax).dequantize()
    else:
        y = fp8_block_qdq(x, weight)
    return y.to(x.dtype)


METHOD = {
    "mxfp8": "MX (OCP MX v1.0): E4M3 elements, an E8M0 scale per 32 along K",
    "mxfp6": "MX (OCP MX v1.0): E2M3 elements, an E8M0 scale per 32 along K",
    "mxfp4": "MX (OCP MX v1.0): E2M1 elements, an E8M0 scale per 32 along K",
    "nvfp4": "NVFP4 (TensorRT Model Optimizer): E2M1 elements, an E4M3 scale per 16 along K and an fp32 scale "
             "per tensor (activations: dynamic amax)",
    "fp8-block": "fp8 block (DeepSeek-V3 sec. 3.3.1): E4M3, fp32 scales per 1 x 128 activation tile and per "
                 "128 x 128 weight block",
}
