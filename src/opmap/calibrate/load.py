"""Was the host quiet while calibration measured? A profile measured while other processes held the CPUs reads
low (at load 9.5 on 2 cores: vector fp32 16.4 MFLOP/s and a 16.4 MB/s bandwidth, 100-1000x under the quiet
host's, issue 35), and every prediction made with it inherits the error; such a profile is never stored as the
host's (profile_file.write_profile).

The readings, all from the OS (hardware/host.py) and the run's own timings:

- before the run, a short window (PRECHECK_S, the process idle): the share of the allowed CPUs' time (its
  affinity mask) that other processes took (/proc/stat's busy time less this process's CPU time), beside the
  1-minute load average per allowed CPU;
- over the run: the same share, and this process's CPU time per wall second (a run the scheduler kept waiting
  gets little CPU time for its wall time);
- the spread of the repeated timings: the median, over the timed rows, of the slowest sample over the fastest
  (repeat measurements that disagree).

The verdict: busy (with its reasons) when others took BUSY_SHARE of the CPUs' time, when a CPU run got under
MIN_OWN_CPU CPU seconds a wall second, or when the repeats disagree by UNSTABLE_SPREAD; a warning from WARN_SHARE.
Where the OS has no /proc/stat, the load average stands in for the others' share (BUSY_LOAD per CPU); where it
has one, the load average is shown but not judged (it counts every CPU of the host, not only the allowed ones).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from opmap.hardware.host import allowed_cpus, cpu_busy_s, load_average

BUSY_SHARE = 0.25  # others held a quarter of the allowed CPUs' time: the timed threads waited for a CPU
WARN_SHARE = 0.10  # others held a tenth: figures may read low, said
MIN_OWN_CPU = 0.5  # a CPU run that got under half a CPU second per wall second spent most of its time descheduled
UNSTABLE_SPREAD = 2.0  # repeats of one shape whose slowest sample is twice the fastest, at the median over rows
BUSY_LOAD = 2.0  # without /proc/stat: a 1-minute load average of twice the CPUs is an oversubscribed host
PRECHECK_S = 0.5  # the window read before the run


@dataclass(frozen=True)
class Clock:
    """One reading: wall time, this process's CPU time (every thread), the allowed CPUs' busy time (all
    processes; None without /proc/stat)."""

    wall_s: float
    own_s: float
    busy_s: float | None
    cpus: int

    @staticmethod
    def now() -> Clock:
        cpus = allowed_cpus()
        return Clock(time.perf_counter(), time.process_time(), cpu_busy_s(cpus), len(cpus))


def window(before: Clock, after: Clock) -> dict[str, float]:
    """What happened between two readings: wall seconds, this process's CPU seconds and their ratio, and (with
    /proc/stat) the share of the allowed CPUs' time other processes took, 0 to 1."""
    wall = max(after.wall_s - before.wall_s, 1e-9)
    own = max(after.own_s - before.own_s, 0.0)
    out = {"wall_s": wall, "own_cpu_s": own, "own_cpu_per_wall": own / wall}
    if before.busy_s is not None and after.busy_s is not None:
        others = max(after.busy_s - before.busy_s - own, 0.0)
        out["others_cpu_share"] = min(1.0, others / (wall * before.cpus))
    return out


def precheck(seconds: float = PRECHECK_S) -> dict[str, Any]:
    """The host before a run: others' share of the allowed CPUs over ``seconds`` (this process asleep), the load
    average, and the verdict on them (``busy``, ``reasons``, ``warnings``)."""
    before = Clock.now()
    time.sleep(seconds)
    w = window(before, Clock.now())
    d: dict[str, Any] = {"cpus": before.cpus, "window_s": w["wall_s"]}
    if "others_cpu_share" in w:
        d["others_cpu_share"] = w["others_cpu_share"]
    load = load_average()
    if load is not None:
        d["load_average_1m"] = load
    return {**d, **_verdict(d, "before the run")}


def spread(rows: list[dict]) -> dict[str, float]:
    """The median, over timed rows (each with min_s and max_s), of the slowest sample over the fastest."""
    ratios = [r["max_s"] / r["min_s"] for r in rows if r.get("min_s", 0) > 0 and "max_s" in r]
    return {"rows": float(len(ratios)), "median_max_over_min": statistics.median(ratios) if ratios else 1.0}


def conditions(pre: dict[str, Any], before: Clock, after: Clock, rows: list[dict], cpu_run: bool) -> dict[str, Any]:
    """The whole record a profile carries under [calibration.conditions]: the precheck, the run's window, the
    spread, the load average after, and the verdict over all of them (``busy``, ``reasons``, ``warnings``)."""
    run = window(before, after)
    readings = {k: v for k, v in pre.items() if k not in ("busy", "reasons", "warnings")}
    d: dict[str, Any] = {"cpus": before.cpus, "before": readings, "run": run, "spread": spread(rows)}
    load = load_average()
    if load is not None:
        d["load_average_1m_after"] = load
    flat = {"cpus": before.cpus, **run, **({"load_average_1m": load} if load is not None else {}),
            "median_max_over_min": d["spread"]["median_max_over_min"]}
    v = _verdict(flat, "during the run", cpu_run)
    v["reasons"] = pre["reasons"] + v["reasons"]
    v["warnings"] = pre["warnings"] + v["warnings"]
    v["busy"] = bool(v["reasons"])
    return {**d, **v}


def _verdict(d: dict[str, Any], when: str, cpu_run: bool = False) -> dict[str, Any]:
    """Busy (reasons) or quiet (warnings, maybe) from one set of readings."""
    reasons: list[str] = []
    warnings: list[str] = []
    cpus = d["cpus"]
    share = d.get("others_cpu_share")
    if share is not None:
        said = f"other processes took {share:.0%} of the {cpus} CPUs' time {when}"
        if share >= BUSY_SHARE:
            reasons.append(said)
        elif share >= WARN_SHARE:
            warnings.append(said)
    elif d.get("load_average_1m") is not None and d["load_average_1m"] >= BUSY_LOAD * cpus:
        reasons.append(f"the load average was {d['load_average_1m']:.1f} on {cpus} CPUs {when}")
    if cpu_run and d.get("own_cpu_per_wall", MIN_OWN_CPU) < MIN_OWN_CPU:
        reasons.append(f"the run got {d['own_cpu_per_wall']:.2f} CPU seconds a wall second {when}")
    if d.get("median_max_over_min", 1.0) >= UNSTABLE_SPREAD:
        reasons.append(f"repeats of one shape disagreed (slowest / fastest {d['median_max_over_min']:.2f} at the "
                       "median row)")
    return {"busy": bool(reasons), "reasons": reasons, "warnings": warnings}


def summary(cond: dict[str, Any]) -> str:
    """The verdict in one line: its reasons (or warnings), then the load average where there is one."""
    load = cond.get("load_average_1m_after", cond.get("load_average_1m", cond.get("before", {}).get(
        "load_average_1m")))
    said = list(cond.get("reasons") or cond.get("warnings") or [])
    return "; ".join(said + ([f"1-minute load average {load:.1f} on {cond['cpus']} CPUs"] if load is not None else []))
