"""The host CPU as the OS describes it: model name (/proc/cpuinfo), cache sizes (sysfs), the CPUs this process may
run on (its affinity), the time they spent busy (/proc/stat) and the load average. Read in one place."""

from __future__ import annotations

import os
import platform
from pathlib import Path

# /proc/stat's per-CPU columns after the name: user nice system idle iowait irq softirq steal guest guest_nice
# (proc(5)); busy is every column but idle and iowait, and not guest / guest_nice (already counted in user / nice)
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)


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


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity mask), else every CPU the OS counts."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def cpu_busy_s(cpus: list[int], stat: Path = Path("/proc/stat")) -> float | None:
    """Seconds ``cpus`` have spent busy since boot, by every process on them (user, nice, system, irq, softirq and
    steal: time a hypervisor gave to another guest); None where the OS has no /proc/stat."""
    want = {f"cpu{i}" for i in cpus}
    try:
        lines = stat.read_text().splitlines()
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    ticks, seen = 0, 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if name in want:
            cols = rest.split()
            ticks += sum(int(cols[i]) for i in _BUSY_COLUMNS if i < len(cols))
            seen += 1
    return ticks / tick if seen else None


def load_average() -> float | None:
    """The 1-minute load average (runnable and uninterruptible tasks, smoothed), None where the OS has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
