"""Shared helpers for the benchmark scripts: machine description, atomic JSON output, stats."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    import torch

    from opmap.hardware.host import cpu_model

    return {
        "processor": platform.processor(),
        "cpu_model": cpu_model(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
    }


def write_json(stem: str, payload: dict[str, Any]) -> Path:
    """Write ``payload`` to results/<stem>.json via a temp file and os.replace (atomic on POSIX)."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"{stem}.json"
    tmp = RESULTS_DIR / f"{stem}.json.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=2, sort_keys=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out)
    return out


def summarize(samples: list[float]) -> dict[str, Any]:
    return {
        "median_s": statistics.median(samples),
        "min_s": min(samples),
        "max_s": max(samples),
        "samples_s": samples,
    }


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def timed_fit(src: str, fit_args: list[str], cold: bool, progress: bool = False) -> dict[str, Any]:
    """``opmap fit FIT_ARGS --no-store`` in a fresh process with ``src`` on its path: fit.json's body (``fit``), wall
    and CPU seconds (the command and its pool workers: the children's rusage) and the 1-minute load when it started.
    ``cold``: an empty capture cache. ``progress``: its stderr (the progress bar) goes to this terminal, else it is
    kept for the error. A failed run stops the benchmark with its error."""
    import resource
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONPATH=src)
        if cold:
            env["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")
        out = Path(tmp) / "fit"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "opmap.cli", "fit", *fit_args, "--no-store", "--out", str(out)],
                           env=env, stdout=subprocess.PIPE, stderr=None if progress else subprocess.PIPE, text=True,
                           timeout=3600, stdin=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if p.returncode:
            why = "its error is above" if progress else (p.stderr or "").strip()[-400:]
            raise SystemExit(f"opmap fit failed (exit {p.returncode}): {why}")
        fit = json.loads((out / "fit.json").read_text())
    return {"fit": fit, "wall_s": wall, "load_1min": load,
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}
