"""The host CPU as the OS describes it: model name (/proc/cpuinfo) and cache sizes (sysfs). Read in one place."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The first ``model name`` line of /proc/cpuinfo, else ``platform.processor()``, else "unknown CPU"."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpu_caches(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> dict[str, int]:
    """Per-core L1d and L2 and the last-level cache, in bytes, as the OS reports them (sysfs)."""
    out: dict[str, int] = {}
    try:
        for idx in sorted(root.glob("index*")):
            level = int((idx / "level").read_text())
            kind = (idx / "type").read_text().strip()
            size = (idx / "size").read_text().strip()
            mult = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(size[-1], 1)
            nbytes = int(size.rstrip("KMG")) * mult
            if kind in ("Data", "Unified"):
                out[{1: "l1d_bytes", 2: "l2_per_core_bytes"}.get(level, "llc_bytes")] = nbytes
    except (OSError, ValueError):
        pass
    return out
