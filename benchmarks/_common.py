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
