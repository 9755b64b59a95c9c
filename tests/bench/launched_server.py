"""Helpers of the bench tests that use the launched server (conftest.py holds the fixtures)."""

from __future__ import annotations

import json
import os
from pathlib import Path

# A Llama-shaped decoder small enough that a CPU step is about a millisecond: 2 layers, hidden 128, 4 heads, FFN
# 352, vocabulary 2048, context 1024 (positions: the HTTP 400 past the context is tested at 1024 tokens). The
# repository ships it as examples/tiny-llama.json (the README's `bench --launch examples/tiny-llama.json`).
TINY_CONFIG_PATH = Path(__file__).resolve().parents[2] / "examples" / "tiny-llama.json"
TINY_CONFIG = json.loads(TINY_CONFIG_PATH.read_text())


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of another user took the id: not ours
        return False
    try:  # a zombie (exited, not reaped) is not running
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


# The timing tests compare latencies of a few milliseconds. Where other work keeps more runnable threads than this
# limit per core (1-minute load average), a run can lose whole timeslices that another did not, and a timing
# comparison says more about the neighbours than about the code: those tests then check everything but their
# ratios and skip those, saying so. This suite's own server and client add about 2 runnable threads.
MAX_LOAD_PER_CORE = 2.0


def oversubscribed() -> str | None:
    """Why timing ratios cannot be trusted on this machine now (None: they can)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    load = os.getloadavg()[0]
    if load > MAX_LOAD_PER_CORE * cores:
        return (f"the cores are oversubscribed (1-minute load average {load:.1f} on {cores} cores, over "
                f"{MAX_LOAD_PER_CORE:g} per core): timing ratios not asserted")
    return None
