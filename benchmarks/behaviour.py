"""Behaviour snapshot: the same analyses written before and after a change, compared number by number.

A refactor must not change what opmap predicts. ``write DIR`` runs every zoo model through the CLI's
library path (eager and compiler fusion, on several devices and precisions: datasheet GPUs, a fallback
precision, a catalog CPU, and a calibrated CPU profile so the measured-curve path is covered), a training
capture, and one real ``opmap profile`` run, and writes each result's JSON plus its sheets. ``compare A B``
compares two such folders: every number equal within a relative 1e-9, every string equal, except the
fields that measure time or name the run (listed in ``IGNORED``). Exit 0 when they agree, 1 when not.

    .venv/bin/python benchmarks/behaviour.py write /tmp/before     # before the change
    .venv/bin/python benchmarks/behaviour.py write /tmp/after      # after it
    .venv/bin/python benchmarks/behaviour.py compare /tmp/before /tmp/after

The calibrated profile is made once (``--calibration FILE``, default DIR/../behaviour-local.toml, a quick
calibration) and reused by both runs, so both read the same curves.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

MODELS = ("gpt2", "bert-base", "vit-b16", "resnet50", "llama-3-8b", "llama-3-70b", "mixtral-8x7b")
# (hardware, dtype): datasheet GPUs, a precision fallback (A100 has no fp8), weight-only int4, a catalog
# CPU (cache blocking), and the calibrated CPU profile (measured curves; filled in at run time).
DEVICES = (("h100-sxm", "bf16"), ("a100-sxm-80gb", "fp8"), ("l4", "int4"), ("xeon-8480", "bf16"), ("CAL", "fp32"))
SEQ = {"llama-3-8b": 512, "llama-3-70b": 512, "mixtral-8x7b": 512}  # shorter: the check is of numbers, not scale
# Fields that measure time on this machine or name the run: they differ between any two runs.
IGNORED = {"measured", "latency", "profiler", "mfu", "stall_fraction", "energy", "accuracy", "calibration_check",
           "tags", "measured_s", "measured_samples_s", "predicted_over_measured", "torch_version", "opmap_version",
           "python_version",
           }


def write(out: Path, cal: Path) -> int:
    import torch

    from opmap.analyze import analyze_graph
    from opmap.capture import capture
    from opmap.hardware import get_hardware, load_spec_file
    from opmap.report.sheet import write_outputs
    from opmap.workloads import build_zoo

    torch.set_num_threads(2)
    if not cal.exists():
        subprocess.run([sys.executable, "-m", "opmap.cli", "calibrate", "--quick", "--out", str(cal)], check=True)
    out.mkdir(parents=True, exist_ok=True)
    for name in MODELS:
        for dtype in sorted({d for _, d in DEVICES}):
            w = build_zoo(name, 1, SEQ.get(name), dtype if dtype != "int4" else "bf16")
            g = capture(w.module, w.inputs)
            for hw_name, dt in DEVICES:
                if dt != dtype:
                    continue
                hw = load_spec_file(cal) if hw_name == "CAL" else get_hardware(hw_name)
                for fusion in ("eager", "compiler"):
                    a = analyze_graph(g, w, hw, dt, (), fusion)
                    write_outputs(a, out / f"{name}-{hw_name.lower()}-{dt}-{fusion}")
            print(name, dtype, flush=True)
    for name in ("resnet50", "gpt2"):  # training captures on meta: forward, backward, optimizer
        w = build_zoo(name, 2, 64 if name == "gpt2" else None, "fp32")
        g = capture(w.module, w.inputs, train=True)
        for fusion in ("eager", "compiler"):
            write_outputs(analyze_graph(g, w, get_hardware("h100-sxm"), "fp32", (), fusion),
                          out / f"{name}-train-h100-fp32-{fusion}")
    subprocess.run([sys.executable, "-m", "opmap.cli", "profile", "bert-base", "--seq", "32", "--iters", "3",
                    "--profile-iters", "2", "--warmup", "1", "--hardware", str(cal), "--out", str(out / "profile")],
                   check=True, stdout=subprocess.DEVNULL)
    return 0


def _diff(a, b, path: str, out: list[str]) -> None:
    if len(out) > 40:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k in IGNORED:
                continue
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'after' if k in b else 'before'}")
                continue
            _diff(a[k], b[k], f"{path}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{path}: {len(a)} items before, {len(b)} after")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(x, y, f"{path}[{i}]", out)
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15):
            out.append(f"{path}: {a!r} before, {b!r} after")
    elif a != b:
        out.append(f"{path}: {str(a)[:100]!r} before, {str(b)[:100]!r} after")


def compare(before: Path, after: Path) -> int:
    bad = 0
    dirs = sorted(p.name for p in before.iterdir() if p.is_dir())
    for d in dirs:
        name = "profile.json" if d == "profile" else "analysis.json"
        fa, fb = before / d / name, after / d / name
        if not fb.exists():
            print(f"{d}: missing after")
            bad += 1
            continue
        diffs: list[str] = []
        _diff(json.loads(fa.read_text()), json.loads(fb.read_text()), d, diffs)
        if d != "profile":
            for csv in ("kernels.csv", "sheet.csv"):
                if (before / d / csv).read_text() != (after / d / csv).read_text():
                    diffs.append(f"{d}/{csv} differs")
        if diffs:
            bad += 1
            print("\n".join(diffs[:20]))
    print(f"{len(dirs) - bad} of {len(dirs)} results agree" + ("" if not bad else f"; {bad} differ"))
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("out", type=Path)
    w.add_argument("--calibration", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = ap.parse_args()
    if args.cmd == "write":
        return write(args.out, args.calibration or args.out.parent / "behaviour-local.toml")
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
