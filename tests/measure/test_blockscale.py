"""The block-scaled emulation: blocks computed by hand, element grids enumerated from their bit layouts, fp8
rounding against torch's own float8 casts, E8M0 scales against torch.float8_e8m0fnu, and MX / NVFP4 against
torchao's prototype mx_formats where it is installed (the dev extra)."""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from opmap.errors import OpmapError
from opmap.measure.blockscale import (
    E2M1,
    E2M3,
    E3M2,
    E4M3,
    E5M2,
    fp8_block_qdq,
    mx_quantize,
    nvfp4_quantize,
    qdq,
    round_to,
)


def grid(ebits: int, mbits: int, bias: int, max_normal: float) -> torch.Tensor:
    """Every non-negative value of a sign / exponent / mantissa layout (exponent field 0: subnormals
    0.m x 2^(1 - bias); else 1.m x 2^(E - bias)), those above ``max_normal`` (NaN codes) left out."""
    vals = set()
    for e, m in itertools.product(range(2 ** ebits), range(2 ** mbits)):
        v = (m / 2 ** mbits) * 2.0 ** (1 - bias) if e == 0 else (1 + m / 2 ** mbits) * 2.0 ** (e - bias)
        if v <= max_normal:
            vals.add(v)
    return torch.tensor(sorted(vals))


def test_fp4_grid_is_the_mx_spec_list():
    # OCP MX v1.0 sec. 5.3.3: FP4 E2M1 represents 0, 0.5, 1, 1.5, 2, 3, 4, 6
    assert grid(2, 1, 1, 6.0).tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert round_to(grid(2, 1, 1, 6.0), E2M1).tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6]


@pytest.mark.parametrize("elem,layout", [(E2M1, (2, 1, 1, 6.0)), (E2M3, (2, 3, 1, 7.5)), (E3M2, (3, 2, 3, 28.0)),
                                         (E4M3, (4, 3, 7, 448.0))])
def test_rounding_is_to_the_nearest_grid_value(elem, layout):
    g = grid(*layout)
    assert g.max().item() == elem.max_normal
    x = torch.rand(4000, generator=torch.Generator().manual_seed(1)) * elem.max_normal * 1.2
    x = torch.cat([x, -x])
    got = round_to(x, elem)
    dist = (x.abs().unsqueeze(-1) - g).abs()
    best = g[dist.argmin(-1)] * x.sign()
    tie = (dist.sort(-1).values[:, :2].diff(dim=-1).squeeze(-1) == 0)  # exact midpoints: checked below
    assert torch.equal(got[~tie], best[~tie])
    assert (got.abs() <= elem.max_normal).all()  # saturated, never past the largest normal


def test_ties_round_to_even_mantissa():
    # E2M1 midpoints: 0.25 (0 | 0.5) -> 0; 0.75 -> 1; 1.25 -> 1; 1.75 -> 2; 2.5 (2 | 3) -> 2; 3.5 -> 4; 5 -> 4
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -2.5])
    assert round_to(x, E2M1).tolist() == [0, 1, 1, 2, 2, 4, 4, -2]


@pytest.mark.parametrize("elem,dt", [(E4M3, torch.float8_e4m3fn), (E5M2, torch.float8_e5m2)])
def test_fp8_rounding_matches_torchs_casts(elem, dt):
    g = torch.Generator().manual_seed(2)
    x = torch.cat([torch.randn(20000, generator=g) * 10 ** k for k in (-8, -5, -3, 0, 2)])
    x = x.clamp(-elem.max_normal, elem.max_normal)  # torch's casts give NaN past the max; ours saturate
    assert torch.equal(round_to(x, elem), x.to(dt).float())


def test_mxfp4_block_by_hand():
    # row 0, block 0: amax 7.5 -> X = 2^(floor(log2 7.5) - 2) = 2^0 = 1 (E2M1's emax is 2: 6 = 1.5 x 2^2);
    # 7.5 saturates to 6, 5.1 -> 6, 4.9 -> 4, 2.6 -> 3, -2.4 -> -2, 3.5 -> 4 (tie, even), 1.25 -> 1 (tie, even),
    # 0.3 -> 0.5, 0.2 -> 0. Block 1: amax 0.3 -> X = 2^(-2 - 2) = 1/16; 0.3 x 16 = 4.8 -> 4 -> 0.25,
    # 0.1 x 16 = 1.6 -> 1.5 -> 0.09375
    x = torch.zeros(1, 64)
    x[0, :9] = torch.tensor([7.5, 5.1, 4.9, 2.6, -2.4, 3.5, 1.25, 0.3, 0.2])
    x[0, 32:34] = torch.tensor([0.3, 0.1])
    b = mx_quantize(x, E2M1)
    assert b.scales.flatten().tolist() == [1.0, 1 / 16]
    y = b.dequantize()
    assert y[0, :9].tolist() == [6, 6, 4, 3, -2, 4, 1, 0.5, 0]
    assert y[0, 32:34].tolist() == [0.25, 0.09375]
    assert (y[0, 9:32] == 0).all() and (y[0, 34:] == 0).all()


def test_mxfp4_amax_5_block():
    # the example: amax 5.0 -> X = 2^(2 - 2) = 1; 5.0 is the 4 | 6 midpoint -> 4 (even mantissa)
    x = torch.full((32,), 1.1)
    x[7] = 5.0
    b = mx_quantize(x, E2M1)
    assert b.scales.item() == 1.0
    assert b.dequantize()[7].item() == 4.0 and b.dequantize()[0].item() == 1.0


@pytest.mark.parametrize("elem,emax", [(E4M3, 8), (E5M2, 15), (E2M3, 2), (E3M2, 4), (E2M1, 2)])
def test_mx_scales_are_e8m0(elem, emax):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 256, generator=g) * torch.logspace(-20, 20, 256)
    b = mx_quantize(x, elem)
    amax = x.reshape(8, 8, 32).abs().amax(-1)
    want = torch.tensor([[2.0 ** (math.floor(math.log2(a)) - emax) for a in row] for row in amax.tolist()])
    assert torch.equal(b.scales.squeeze(-1), want)
    # each scale is a power of two E8M0 holds: torch's own e8m0 dtype round-trips it unchanged
    assert torch.equal(b.scales.to(torch.float8_e8m0fnu).float(), b.scales)
    assert (b.elements.abs() <= elem.max_normal).all()


def test_nvfp4_block_by_hand():
    # tensor amax 2688 = 6 x 448 -> per-tensor s2 = 1. Block 0: scale 2688 / 6 = 448 (E4M3's max, exact);
    # 1000 / 448 = 2.23 -> 2 -> 896; -1500 / 448 = -3.35 -> -3 -> -1344; 200 / 448 = 0.45 -> 0.5 -> 224;
    # 100 / 448 = 0.22 -> 0. Block 1: amax 10 -> 10 / 6 = 1.667 -> E4M3 (quantum 1/8 in [1, 2)) 13/8 = 1.625;
    # 10 / 1.625 = 6.15 saturates to 6 -> 9.75; 3 / 1.625 = 1.85 -> 2 -> 3.25; -1 / 1.625 = -0.62 -> -0.5
    x = torch.zeros(32)
    x[:5] = torch.tensor([2688.0, 1000.0, -1500.0, 200.0, 100.0])
    x[16:19] = torch.tensor([10.0, 3.0, -1.0])
    b = nvfp4_quantize(x)
    assert b.scales.flatten().tolist() == [448.0, 1.625]
    y = b.dequantize()
    assert y[:5].tolist() == [2688.0, 896.0, -1344.0, 224.0, 0.0]
    assert y[16:19].tolist() == [9.75, 3.25, -0.8125]


def test_nvfp4_per_tensor_scale_keeps_block_scales_in_e4m3():
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(4)) * 1e6
    b = nvfp4_quantize(x)
    s2 = x.abs().max() / (6 * 448)
    sb = b.scales / s2  # the stored E4M3 block scales
    assert sb.max().item() == pytest.approx(448.0, rel=1e-6)
    assert torch.equal(round_to(sb, E4M3), torch.round(sb * 2 ** 20) / 2 ** 20)  # on E4M3's grid (up to fp32 noise)


def test_fp8_block_weights_and_activations_by_hand():
    # weight [256, 128]: rows 0-127 amax 448 -> scale 1; rows 128-255 amax 672 -> scale 1.5.
    # 0.3 -> scale 1: quantum 1/32 in [0.25, 0.5): 9.6 -> 10 -> 0.3125; scale 1.5: 0.2 in [0.125, 0.25), quantum
    # 1/64: 12.8 -> 13 -> 0.203125 x 1.5 = 0.3046875
    w = torch.full((256, 128), 0.3)
    w[0, 0], w[200, 5] = 448.0, 672.0
    q = fp8_block_qdq(w, weight=True)
    assert q[5, 5].item() == 0.3125 and q[130, 7].item() == 0.3046875
    # activations [2, 256]: 1 x 128 tiles, each row and tile its own scale
    a = torch.full((2, 256), 0.3)
    a[0, 0], a[0, 200], a[1, 3] = 448.0, 672.0, 672.0
    qa = fp8_block_qdq(a, weight=False)
    assert qa[0, 5].item() == 0.3125 and qa[0, 130].item() == 0.3046875 and qa[1, 5].item() == 0.3046875
    assert qa[1, 130].item() == pytest.approx(0.3, rel=1e-6)  # amax 0.3: 0.3 / (0.3 / 448) = 448 exactly


def test_ragged_last_dimension_and_dtype_kept():
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    for fmt in ("mxfp8", "mxfp6", "mxfp4", "nvfp4", "fp8-block"):
        y = qdq(x, fmt, weight=True)
        assert y.shape == x.shape and y.dtype == torch.bfloat16
    assert torch.equal(qdq(torch.zeros(4, 32), "nvfp4", weight=False), torch.zeros(4, 32))
    with pytest.raises(OpmapError, match="accepted: mxfp8, mxfp6, mxfp4, nvfp4, fp8-block"):
        qdq(x, "int3", weight=False)


def test_error_orders_by_mantissa_bits():
    # on N(0, 1) data the error follows the element's mantissa: E4M3 (mxfp8) and E2M3 (mxfp6) both keep 3 bits,
    # E5M2 2, E2M1 (mxfp4, nvfp4) 1; each bit fewer doubles the rounding step
    x = torch.randn(64, 1024, generator=torch.Generator().manual_seed(6))
    err = {f: ((qdq(x, f, False) - x).norm() / x.norm()).item() for f in ("mxfp8", "mxfp6", "mxfp4", "nvfp4")}
    err["e5m2"] = ((mx_quantize(x, E5M2).dequantize() - x).norm() / x.norm()).item()
    assert err["mxfp6"] / err["mxfp8"] == pytest.approx(1, abs=0.2)
    assert max(err["mxfp8"], err["mxfp6"]) < err["e5m2"] < err["nvfp4"] < err["mxfp4"]
    assert 0.05 < err["mxfp4"] < 0.2  # nvfp4's 16-element, non-power-of-two scales beat mxfp4's


# -- torchao (its prototype mx_formats): an independent implementation of the same formats -------------------------
# installed by `make setup` beside the environment (.venv/ref-torchao), not in it: transformers imports torchao when
# it is importable, and its CUDA kernels' load failures would reach every command's stderr. So torchao runs in a
# subprocess with that folder on its path, on the tensor this test saved; its result comes back as a file.
TORCHAO_REF = Path(__file__).resolve().parents[2] / ".venv" / "ref-torchao"

MX_THEIRS = """
import sys, torch
from torchao.prototype.mx_formats import mx_tensor as mx
from torchao.prototype.mx_formats.constants import DTYPE_FP6_E2M3, DTYPE_FP6_E3M2
x, fmt = torch.load(sys.argv[1]), sys.argv[3]
dt = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e2m3": DTYPE_FP6_E2M3, "e3m2": DTYPE_FP6_E3M2,
      "e2m1": torch.float4_e2m1fn_x2}[fmt]
scale, data = mx.to_mx(x, dt, 32)
torch.save(mx.to_dtype(data, scale, dt, 32, torch.float32), sys.argv[2])
"""

NVFP4_THEIRS = """
import sys, torch
from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4
from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale
x = torch.load(sys.argv[1])
s2 = per_tensor_amax_to_scale(x.abs().amax())
scale, packed = nvfp4_quantize(x, 16, s2)
rows = x.shape[0]
out = f4_unpacked_to_f32(unpack_uint4(packed)).reshape(rows, -1, 16) * (scale.float() * s2).reshape(rows, -1, 1)
torch.save({"x": out.reshape(x.shape), "s2": s2}, sys.argv[2])
"""


def torchao_says(code: str, x: torch.Tensor, tmp_path, *args: str):
    """What torchao computes from ``x`` (``code`` run in a subprocess with the reference folder on its path)."""
    if not (TORCHAO_REF / "torchao").is_dir():
        pytest.fail(f"torchao's reference is not installed at {TORCHAO_REF}: run `make setup`")
    src, out = tmp_path / "x.pt", tmp_path / "theirs.pt"
    torch.save(x, src)
    env = {**os.environ, "PYTHONPATH": str(TORCHAO_REF)}
    p = subprocess.run([sys.executable, "-c", code, str(src), str(out), *args], env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return torch.load(out)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m3", "e3m2", "e2m1"])
def test_mx_matches_torchao(fmt, tmp_path):
    elem = {"e4m3": E4M3, "e5m2": E5M2, "e2m3": E2M3, "e3m2": E3M2, "e2m1": E2M1}[fmt]
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(7)) * torch.logspace(-3, 3, 256)
    assert torch.equal(mx_quantize(x, elem).dequantize(), torchao_says(MX_THEIRS, x, tmp_path, fmt))


def test_nvfp4_matches_torchao(tmp_path):
    # block maxima within 10x of the tensor's: every E4M3 block scale is normal (torchao clamps a scale to E4M3's
    # smallest normal, 2^-6, where ModelOpt and a plain cast keep subnormals)
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(8)) * torch.logspace(-0.5, 0.5, 256)
    theirs = torchao_says(NVFP4_THEIRS, x, tmp_path)
    ours = nvfp4_quantize(x)
    assert (ours.scales / theirs["s2"]).min() >= 2 ** -6
    assert torch.equal(ours.dequantize(), theirs["x"])


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "fp8-block"])
def test_a_tall_weight_in_row_chunks_is_the_whole_tensor_s(fmt, monkeypatch):
    """qdq splits a weight into row chunks (bounded memory): the blocks and NVFP4's per-tensor scale are those
    of the whole tensor, so the result is the same as in one piece."""
    import opmap.measure.blockscale as bs

    w = torch.randn(384, 96, generator=torch.Generator().manual_seed(9))
    w[300, 7] = 40.0  # the tensor's amax in the last chunk: NVFP4's s2 must still see it in the first
    whole = qdq(w, fmt, weight=True)
    monkeypatch.setattr(bs, "ROW_CHUNK", 128)
    assert torch.equal(qdq(w, fmt, weight=True), whole)
