"""``opmap bench --launch --predict`` on this machine's CPU: measured against predicted (issue 21's target: TTFT p50
and output tokens/s predicted within 0.67-1.5 of measured, at concurrency 1 and at a load near saturation).

Each round is one whole CLI run, as a user runs it: a real ``transformers serve`` launched from a 2-layer Llama
config (random weights, hidden 128, 0.93M parameters, fp32: a CPU step of about a millisecond), 48 measured
requests of 32 prompt and 32 output tokens (4 warm-up) in a closed loop at the given concurrency, the server's
overhead probed before and after, and the same workload simulated on the calibrated CPU (``--hardware local``;
a quick calibration is written first when none exists). The concurrencies are interleaved round by round so
both meet the same neighbours; the table gives each round's ratios and their median. A prediction-accuracy
target is timing, so it lives here and not in a unit test (tests/bench/test_bench_predict.py checks the join by hand
and a coarse sanity band on the real server).

Run:  PYTHONPATH=src python benchmarks/bench_predict_cpu.py [--rounds 3] [--concurrency 1,8]
Writes benchmarks/results/bench_predict_cpu.json."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import machine, now_iso, write_json  # noqa: E402

TARGET = (0.67, 1.5)
TINY_CONFIG = {"model_type": "llama", "vocab_size": 2048, "hidden_size": 128, "intermediate_size": 352,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
               "max_position_embeddings": 1024, "torch_dtype": "float32"}


def _opmap(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(HERE.parent / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "opmap.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _hardware(tmp: Path) -> str:
    from opmap.hardware.local import cache_path

    if cache_path("cpu").is_file():
        return "local"
    out = tmp / "local.toml"
    r = _opmap(["calibrate", "--quick", "--out", str(out), "--no-store"])
    if r.returncode != 0:
        raise SystemExit(f"calibrate failed: {r.stderr.strip().splitlines()[-1:]}")
    return str(out)


def _round(config: Path, hw: str, concurrency: int, out: Path) -> dict:
    r = _opmap(["bench", "--launch", str(config), "--concurrency", str(concurrency), "--requests", "48",
                "--warmup", "4", "--input-len", "32", "--output-len", "32", "--predict", "--hardware", hw,
                "--no-store", "--min-duration", "0", "--min-queries", "0", "--out", str(out)])
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1]}
    rep = json.loads((out / "bench_predict.json").read_text())
    rows = {(x["metric"], x["stat"]): x for x in rep["predictions"]["model+overhead"]["rows"]}
    model = {(x["metric"], x["stat"]): x for x in rep["predictions"]["model"]["rows"]}
    pick = {"ttft_p50": ("ttft", "p50"), "tpot_p50": ("tpot", "p50"), "output_tokens_per_s": ("output_tokens", "per_s")}
    return {k: {"measured": rows[v]["measured"], "predicted": rows[v]["predicted"], "ratio": rows[v]["ratio"],
                "model_alone_ratio": model[v]["ratio"]} for k, v in pick.items()} | {
        "overhead": rep.get("overhead"), "load_average": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", default="1,8")
    a = ap.parse_args(argv)
    levels = [int(c) for c in a.concurrency.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="opmap-bench-predict-"))
    config = tmp / "config.json"
    config.write_text(json.dumps(TINY_CONFIG))
    hw = _hardware(tmp)
    runs: dict[int, list[dict]] = {c: [] for c in levels}
    for i in range(a.rounds):
        for c in levels:
            runs[c].append(_round(config, hw, c, tmp / f"r{i}-c{c}"))
    t = Table(title=f"opmap bench --launch --predict on this CPU ({a.rounds} rounds, load average now "
                    f"{os.getloadavg()[0]:.1f}): predicted / measured, model + measured server overhead")
    for col in ("concurrency", "figure", "measured (median)", "predicted (median)", "ratio per round", "median",
                "in 0.67-1.5"):
        t.add_column(col)
    summary = {}
    for c in levels:
        ok = [r for r in runs[c] if "error" not in r]
        for k in ("ttft_p50", "tpot_p50", "output_tokens_per_s"):
            ratios = [r[k]["ratio"] for r in ok if r[k]["ratio"] is not None]
            if not ratios:
                continue
            med = statistics.median(ratios)
            summary[f"c{c}_{k}"] = med
            t.add_row(str(c), k, f"{statistics.median(r[k]['measured'] for r in ok):.4g}",
                      f"{statistics.median(r[k]['predicted'] for r in ok):.4g}",
                      ", ".join(f"{x:.2f}" for x in ratios), f"{med:.2f}",
                      "-" if k == "tpot_p50" else ("yes" if TARGET[0] <= med <= TARGET[1] else "NO"))
    Console(width=160).print(t)
    path = write_json("bench_predict_cpu", {"schema_version": 1, "when": now_iso(), "machine": machine(),
                                            "config": {"rounds": a.rounds, "concurrency": levels,
                                                       "model": TINY_CONFIG, "hardware": hw},
                                            "target": list(TARGET), "summary": summary, "runs": runs})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
