"""Serving calibrated from measurement on this machine's CPU (issue 39's target): after ``opmap calibrate
--from-bench`` on runs at concurrency 1, 4 and 16, the prediction of held-out runs at 2 and 8 within 0.85-1.18 of
measured for TTFT p50 and output tokens/s, in two rounds that agree (uncalibrated, the model alone: 0.67-1.5).

Each run is one whole CLI run, as a user runs it: ``opmap bench --launch`` on a 2-layer Llama config (random
weights, hidden 128, fp32; a real ``transformers serve``), 48 measured requests of 32 prompt and 32 output tokens
(4 warm-up), closed loop, written with --out. A round runs the five concurrencies twice, in the order 1 2 4 8 16
16 8 4 2 1 (drift cancels), fits a profile on the six runs at 1, 4 and 16 (``opmap calibrate --from-bench``), and
predicts the four runs at 2 and 8 from their own records with the profile (a concurrency's figure: the geometric
mean of its two runs' predicted / measured; opmap.bench.predict.predict_run, ``stack=``: the same join ``opmap bench
--predict --stack`` prints), beside the model alone. The device is the calibrated CPU (``--hardware local``; a quick
calibration is written first where none exists).

Run:  PYTHONPATH=src python benchmarks/bench_stack_calibration.py [--rounds 2]
Writes benchmarks/results/bench_stack_calibration.json."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import machine, now_iso, write_json  # noqa: E402
from bench_predict_cpu import TINY_CONFIG, _hardware, _opmap  # noqa: E402

TARGET = (0.85, 1.18)
FIT, HELD = (1, 4, 16), (2, 8)
FIGS = (("ttft", "p50"), ("output_tokens", "per_s"))


def _run(config: Path, c: int, out: Path) -> str:
    r = _opmap(["bench", "--launch", str(config), "--concurrency", str(c), "--requests", "48", "--warmup", "4",
                "--input-len", "32", "--output-len", "32", "--no-store", "--min-duration", "0", "--min-queries", "0",
                "--out", str(out)])
    return "" if r.returncode == 0 else (r.stderr.strip().splitlines() or ["?"])[-1]


def _held_out(run_dir: Path, profile: Path, config: Path, hw: str) -> dict:
    from dataclasses import replace

    from opmap.bench.predict import engine_policy, predict_run
    from opmap.bench.run_files import read_run
    from opmap.calibrate.stack_profile import read_stack_profile
    from opmap.serve.model_cost import model_table_cost

    run = read_run(run_dir)
    s = run.launched
    prof = read_stack_profile(profile)
    cost = replace(model_table_cost(str(config), hw, "fp32", runtime="engine"), kv_capacity_tokens=s.kv_tokens)
    rep = predict_run(run.result, cost, engine_policy(s.max_batch_tokens, s.page_tokens), stack=prof)
    out = {}
    for p in rep.predictions:
        rows = {(r["metric"], r["stat"]): r["ratio"] for r in p.rows}
        out[p.name] = {f"{m} {k}": rows[(m, k)] for m, k in FIGS}
    return out


# Each concurrency is run twice in a round, in the order 1 2 4 8 16 16 8 4 2 1 (ABBA): a host that drifts (another
# tenant, clock or cache state) over the round's ~5 minutes moves both halves of a pair oppositely, so the fitted and
# the held-out runs share the same mean conditions. With the fit first and the held-out last (the first design) the
# held-out runs took all the drift: the same code read c = 8 output tok/s 0.79-2.00 over three rounds of one session.
ORDER = (1, 2, 4, 8, 16, 16, 8, 4, 2, 1)


def _order() -> list[tuple[int, str]]:
    seen: dict[int, int] = {}
    out = []
    for c in ORDER:
        seen[c] = seen.get(c, 0) + 1
        out.append((c, f"c{c}{'ab'[seen[c] - 1]}"))
    return out


def _geomean(xs: list[float | None]) -> float | None:
    import math

    if not xs or any(x is None or x <= 0 for x in xs):
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _round(config: Path, hw: str, d: Path) -> dict:
    runs = _order()
    errors = {name: _run(config, c, d / name) for c, name in runs}
    if any(errors.values()):
        return {"error": {c: e for c, e in errors.items() if e}}
    prof = d / "stack.json"
    args = ["calibrate", "--hardware", hw, "--dtype", "fp32", "--out", str(prof)]
    for c, name in runs:
        if c in FIT:
            args += ["--from-bench", str(d / name)]
    r = _opmap(args)
    if r.returncode != 0:
        return {"error": {"calibrate": (r.stderr.strip().splitlines() or ["?"])[-1]}}
    profile = json.loads(prof.read_text())
    per_run = {name: _held_out(d / name, prof, config, hw) for c, name in runs if c in HELD}
    held = {}
    for c in HELD:
        names = [name for cc, name in runs if cc == c]
        held[c] = {v: {fig: _geomean([per_run[n][v][fig] for n in names]) for fig in per_run[names[0]][v]}
                   for v in per_run[names[0]]}
    return {"profile": {k: v["value"] for k, v in profile["parameters"].items()},
            "fit_residuals": profile["residuals"], "held_out": held, "held_out_per_run": per_run}


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="opmap-stackcal-") as tmp:
        tmp = Path(tmp)
        config = tmp / "tiny-llama.json"
        config.write_text(json.dumps(TINY_CONFIG))
        hw = _hardware(tmp)
        rounds = []
        for k in range(a.rounds):
            d = tmp / f"round{k}"
            d.mkdir()
            rounds.append(_round(config, hw, d))
    t = Table(title=f"held-out runs: predicted / measured (target {TARGET[0]}-{TARGET[1]} with the profile)")
    for col in ("round", "concurrency", "figure", "model alone", "model + stack profile"):
        t.add_column(col)
    ok = True
    for k, r in enumerate(rounds):
        if "error" in r:
            t.add_row(str(k), "-", "error", str(r["error"])[:80], "")
            ok = False
            continue
        for c, variants in r["held_out"].items():
            for fig in variants["model"]:
                alone, cal = variants["model"][fig], variants["model+stack"][fig]
                ok &= cal is not None and TARGET[0] <= cal <= TARGET[1]
                t.add_row(str(k), str(c), fig, f"{alone:.3f}" if alone else "-", f"{cal:.3f}" if cal else "-")
    Console().print(t)
    verdict = "PASS" if ok else "FAIL"
    Console().print(f"{verdict}: every held-out figure with the profile within {TARGET[0]}-{TARGET[1]} in "
                    f"{a.rounds} rounds")
    write_json("bench_stack_calibration", {"schema_version": 1, "when": now_iso(), "machine": machine(),
                                           "config": {"fit": FIT, "held_out": HELD, "target": TARGET,
                                                      "rounds": a.rounds, "order": ORDER},
                                           "rounds": rounds, "verdict": verdict})
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
