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
    for r in rows:
        print(f"{r['kind']:14s} {r['shape']:26s} {r['dtype']:5s} measured {r['measured_s'] * 1e3:9.4f} ms  "
              f"predicted {r['predicted_s'] * 1e3:9.4f} ms  pred/meas {r['ratio']:.2f}  {r['bound']}")
    out = Path(os.environ.get("OUT", "out/gpu"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_measure.json").write_text(json.dumps({"device": name, "catalog": cat, "torch": torch.__version__,
                                                      "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
