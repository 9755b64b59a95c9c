"""A sweep against the same points analysed one by one: wall time side by side, interleaved.

Claim under test (issue 12): a sweep whose points change only shapes does not capture each point again (the
batch shape family, opmap.explore.shapes): a 2 x 8 prefill sweep of llama-3-8b (seq 512, 2048; batch 1 to 128)
runs faster than analysing its 16 points one by one (build, capture, predict each), and gives the same
latencies. Both sides run in this process, alternately, three times; the table gives the median and the spread.

Run:  .venv/bin/python benchmarks/bench_sweep.py        Writes benchmarks/results/bench_sweep.json.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODEL, SEQS, BATCHES = "llama-3-8b", (512, 2048), (1, 2, 4, 8, 16, 32, 64, 128)


def one_by_one(hw) -> list[float]:
    from opmap.analyze import analyze
    from opmap.workloads import build_zoo

    return [analyze(build_zoo(MODEL, b, s, "bf16"), hw, "bf16").predicted_latency_s for s in SEQS for b in BATCHES]


def swept(hw) -> list[float]:
    from opmap.explore.sweep import sweep

    # inline (workers=1): the claim is re-pricing against capturing, not parallelism (bench_engine.py times that)
    return [p.latency_s for p in sweep(MODEL, hw, BATCHES, SEQS, "prefill", "bf16", workers=1).points]


def main() -> int:
    sys.path.insert(0, str(HERE))
    from rich.console import Console
    from rich.table import Table

    from _common import SCHEMA_VERSION, machine, now_iso, write_json
    from opmap.hardware import get_hardware

    hw = get_hardware("h100-sxm")
    times: dict[str, list[float]] = {"one by one": [], "sweep": []}
    same = True
    for _ in range(3):
        for name, fn in (("one by one", one_by_one), ("sweep", swept)):
            t0 = time.perf_counter()
            lat = fn(hw)
            times[name].append(time.perf_counter() - t0)
            if name == "one by one":
                ref = lat
            else:
                same = same and all(abs(a - b) <= 1e-12 * b for a, b in zip(lat, ref))
    med = {k: statistics.median(v) for k, v in times.items()}
    t = Table(title=f"{MODEL}: {len(SEQS) * len(BATCHES)} prefill points on h100-sxm (3 interleaved runs)")
    for c in ("how", "median s", "spread s", "points/s"):
        t.add_column(c)
    for k, v in times.items():
        t.add_row(k, f"{med[k]:.2f}", f"{min(v):.2f}-{max(v):.2f}", f"{len(SEQS) * len(BATCHES) / med[k]:.2f}")
    con = Console()
    con.print(t)
    ratio = med["sweep"] / med["one by one"]
    con.print(f"sweep / one by one: {ratio:.2f}; same latencies: {same}")
    path = write_json(Path(__file__).stem, {"schema_version": SCHEMA_VERSION, "benchmark": "bench_sweep",
                                            "created": now_iso(), "machine": machine(), "times_s": times,
                                            "median_s": med, "ratio": ratio, "same_latencies": same,
                                            "pass": ratio < 1.0 and same})
    con.print(f"wrote {path}")
    return 0 if ratio < 1.0 and same else 1


if __name__ == "__main__":
    sys.exit(main())
