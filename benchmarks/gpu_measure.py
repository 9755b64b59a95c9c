"""On a lent GPU: time the GEMM and attention shapes of issue 10 and set them beside opmap's catalog prediction.

The shapes are those of benchmarks/reference (square GEMMs, the NVIDIA guide's 1792^2, FlashAttention-3's
attention shapes). Each is timed with CUDA events (opmap.timing.time_op: warm-up, repeats, median) and
predicted on the catalog entry the device's name matches (hardware/match.py), through the same pipeline as
gpu_reference.py. Writes OUT/gpu_measure.json and prints a table. Run by benchmarks/gpu_checks.sh.

    OUT=/tmp/gpu python benchmarks/gpu_measure.py
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# Steady load (issue 20's lead): LLM serving shapes (M = decode batch, K = 8192 hidden, N = a 70B layer's widths)
# in bf16 (a @ b) and fp8 (torch._scaled_mm, per-tensor scales), each run back to back for STEADY_WARM_S before
# STEADY_S of timed calls: the device at its power-limited clocks, as a serving run keeps it. Predicted with
# repeats = inf (opmap's steady-load pricing: the catalog's sustained rates). Measured / predicted far from 1 at
# small M is the small-GEMM inefficiency the tile model lacks (Azure's 2048^3 sweeps: 1.24x on an H100).
STEADY = [(m, n, k) for m in (256, 1024, 4096) for n, k in ((8192, 8192), (28672, 8192), (8192, 28672))]
STEADY += [(2048, 2048, 2048), (8192, 8192, 8192)]
STEADY_WARM_S, STEADY_S = 1.0, 1.0
# Attention dropout (issue 22's lead: the GPT rows trained with attention dropout 0.1 fit an attention ~2.5-3x
# slower than FlashAttention-2's no-dropout rate; the Llama rows, without dropout, fit that rate): one causal SDPA
# call forward + backward at p = 0 and p = 0.1, interleaved, per backend torch offers, bf16, at (batch, heads, seq,
# head dim) of Megatron-Core's weak-scaling 1.7B / 7.1B on one GPU and NeMo's GPT3-5B. The ratio p 0.1 / p 0 per
# backend is the number the lead needs; the MATH backend (scores in memory) is the unfused reference.
DROPOUT_SHAPES = [(2, 16, 4096, 128), (4, 32, 2048, 128)]
DROPOUT_BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
GEMMS = [(8192, 8192, 8192, "bf16"), (4096, 4096, 4096, "bf16"), (1792, 1792, 1792, "fp16"),
         (16384, 12288, 12288, "fp16"), (64, 12288, 12288, "fp16"), (2048, 2048, 13312, "bf16")]
ATTENTION = [(128, 2048, 128, False), (128, 2048, 128, True), (16, 16384, 128, False), (32, 16384, 64, False)]


def main() -> int:
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_reference import predict_attention, predict_gemm
    from opmap.hardware import get_hardware
    from opmap.hardware.match import match_datasheet
    from opmap.precision import torch_dtype
    from opmap.timing import time_op

    if not torch.cuda.is_available():
        print("gpu_measure: no CUDA device here; run it on a GPU (benchmarks/gpu_checks.sh)", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    cat = match_datasheet(name)
    if cat is None:
        print(f"gpu_measure: no catalog entry matches {name!r}", file=sys.stderr)
        return 2
    hw = get_hardware(cat)
    rows = []
    for m, n, k, dt in GEMMS:
        tdt = torch_dtype(dt)
        a, b = torch.randn(m, k, device=dev, dtype=tdt), torch.randn(k, n, device=dev, dtype=tdt)
        s = time_op(lambda a=a, b=b: a @ b, dev, repeats=10, min_time_s=0.05)
        pred, bound = predict_gemm(m, n, k, dt, hw)
        rows.append({"kind": "gemm", "shape": f"{m}x{n}x{k}", "dtype": dt, "measured_s": s.median_s,
                     "predicted_s": pred, "ratio": pred / s.median_s, "bound": str(bound),
                     "measured_flops_per_s": 2.0 * m * n * k / s.median_s, **s.spread()})
    for bh, sq, d, causal in ATTENTION:
        q = torch.randn(1, bh, sq, d, device=dev, dtype=torch.float16)
        s = time_op(lambda q=q, c=causal: F.scaled_dot_product_attention(q, q, q, is_causal=c), dev, repeats=10,
                    min_time_s=0.05)
        pred, bound = predict_attention(bh, sq, d, causal, "fp16", hw)
        rows.append({"kind": "attention_fwd", "shape": f"bh {bh} s {sq} d {d}{' causal' if causal else ''}",
                     "dtype": "fp16", "measured_s": s.median_s, "predicted_s": pred, "ratio": pred / s.median_s,
                     "bound": str(bound), **s.spread()})
    rows += steady_rows(hw, dev)
    rows += dropout_rows(dev)
    for r in rows:
        if "error" in r:
            print(f"{r['kind']:14s} {r['shape']:26s} {r['dtype']:5s} not run: {r['error']}")
            continue
        if r["kind"] == "attention_dropout":
            print(f"{r['kind']:14s} {r['shape']:26s} {r['backend']:20s} p 0: {r['p0_s'] * 1e3:8.3f} ms  p 0.1: "
                  f"{r['p01_s'] * 1e3:8.3f} ms  ratio {r['dropout_ratio']:.2f}")
            continue
        print(f"{r['kind']:14s} {r['shape']:26s} {r['dtype']:5s} measured {r['measured_s'] * 1e3:9.4f} ms  "
              f"predicted {r['predicted_s'] * 1e3:9.4f} ms  pred/meas {r['ratio']:.2f}  {r['bound']}")
    out = Path(os.environ.get("OUT", "out/gpu"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_measure.json").write_text(json.dumps({"device": name, "catalog": cat, "torch": torch.__version__,
                                                      "rows": rows}, indent=1) + "\n")
    return 0


def dropout_rows(dev, shapes=DROPOUT_SHAPES, backends=DROPOUT_BACKENDS, dtype=None) -> list[dict]:
    """Forward + backward of one causal SDPA call at dropout 0 and 0.1 per backend and shape, the two timed
    interleaved (opmap.timing.time_interleaved): rows with both medians and their ratio, or the error a backend
    gave (a backend that cannot run the shape, or dropout, on this device)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from opmap.timing import time_interleaved

    dtype = dtype or torch.bfloat16
    rows = []
    for b, h, sq, d in shapes:
        q, k, v = (torch.randn(b, h, sq, d, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
        grad = torch.randn(b, h, sq, d, device=dev, dtype=dtype)
        for name in backends:
            def step(p, backend=getattr(SDPBackend, name)):
                with sdpa_kernel(backend):
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
                q.grad = k.grad = v.grad = None
                out.backward(grad)

            shape = f"b {b} h {h} s {sq} d {d} causal"
            try:
                s0, s1 = time_interleaved([lambda: step(0.0), lambda: step(0.1)], dev, rounds=5, min_time_s=0.02)
            except RuntimeError as e:
                rows.append({"kind": "attention_dropout", "shape": shape, "dtype": str(dtype), "backend": name,
                             "error": str(e)[:200]})
                continue
            rows.append({"kind": "attention_dropout", "shape": shape, "dtype": str(dtype), "backend": name,
                         "p0_s": s0.median_s, "p01_s": s1.median_s, "dropout_ratio": s1.median_s / s0.median_s,
                         "causal_flops_fwd_bwd": 3.5 * 2 * b * h * sq * sq * d})
    return rows


def _loop_s(fn, dev, warm_s: float, timed_s: float) -> tuple[float, int]:
    """Seconds per call of ``fn`` run back to back: ``warm_s`` of calls first, then about ``timed_s`` between two
    CUDA events (one pair around the whole loop: no sync between calls)."""
    import time

    import torch

    end = time.perf_counter() + warm_s
    n = 0
    while time.perf_counter() < end:
        fn()
        n += 1
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize(dev)
    calls = max(10, int(timed_s / max(time.perf_counter() - t0, 1e-6)))
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(calls):
        fn()
    b.record()
    torch.cuda.synchronize(dev)
    return a.elapsed_time(b) / 1e3 / calls, calls


def steady_rows(hw, dev) -> list[dict]:
    """The STEADY shapes in bf16 and fp8 (where the device has it) under steady load, beside opmap's steady-load
    prediction (the sustained rate: repeats = inf)."""
    import math

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_reference import predict_gemm

    rows = []
    fp8 = hasattr(torch, "float8_e4m3fn") and "fp8" in hw.matrix_peak_flops_per_s
    for fmt in ("bf16", "fp8") if fp8 else ("bf16",):
        for m, n, k in STEADY:
            a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
            if fmt == "fp8":
                a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
                one = torch.ones((), device=dev, dtype=torch.float32)
                fn = (lambda a8=a8, w8=w8, one=one:
                      torch._scaled_mm(a8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
            else:
                fn = lambda a=a, w=w: a @ w.t()  # noqa: E731
            try:
                s, calls = _loop_s(fn, dev, STEADY_WARM_S, STEADY_S)
            except RuntimeError as e:  # a torch build without this fp8 GEMM: say so, keep the rest
                rows.append({"kind": "gemm_steady", "shape": f"{m}x{n}x{k}", "dtype": fmt, "error": str(e)[:200]})
                continue
            pred, bound = predict_gemm(m, n, k, fmt, hw, repeats=math.inf)
            rows.append({"kind": "gemm_steady", "shape": f"{m}x{n}x{k}", "dtype": fmt, "measured_s": s,
                         "predicted_s": pred, "ratio": pred / s, "bound": str(bound), "calls": calls,
                         "measured_flops_per_s": 2.0 * m * n * k / s})
    return rows


if __name__ == "__main__":
    sys.exit(main())
