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
from dataclasses import dataclass, field
from typing import ClassVar

from opmap.hardware.host import allowed_cpus, cpu_busy_s, load_average
from opmap.record import key

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


@dataclass(frozen=True)
class Window:
    """What happened between two readings: wall seconds, this process's CPU seconds, and (with /proc/stat) the
    share of the allowed CPUs' time other processes took, 0 to 1 (None without it). Its record ([calibration.
    conditions.run]) puts the CPU seconds a wall second after the CPU seconds, the share only where read."""

    RECORD: ClassVar[tuple[str, ...]] = ("wall_s", "own_cpu_s", "own_cpu_per_wall", "others_cpu_share")
    wall_s: float
    own_cpu_s: float
    others_cpu_share: float | None = field(metadata=key(omit="none"))

    @property
    def own_cpu_per_wall(self) -> float:
        return self.own_cpu_s / self.wall_s


@dataclass(frozen=True)
class LoadVerdict:
    """Busy (its ``reasons``) or quiet (``warnings``, maybe). Its record: busy, the reasons, the warnings."""

    RECORD: ClassVar[tuple[str, ...]] = ("busy", "reasons", "warnings")
    reasons: tuple[str, ...]
    warnings: tuple[str, ...]

    @property
    def busy(self) -> bool:
        return bool(self.reasons)


@dataclass(frozen=True)
class Precheck:
    """The host before a run: others' share of the allowed CPUs over a ``window_s`` window (None without
    /proc/stat), the 1-minute load average (None where the OS has none), and the verdict on them. Its record
    ([calibration.conditions.before]) is the readings, each only where read; the verdict is the conditions'."""

    cpus: int
    window_s: float
    others_cpu_share: float | None = field(metadata=key(omit="none"))
    load_average_1m: float | None = field(metadata=key(omit="none"))
    verdict: LoadVerdict = field(metadata=key(skip=True))

    @property
    def busy(self) -> bool:
        return self.verdict.busy


@dataclass(frozen=True)
class Spread:
    """The median, over ``rows`` timed rows, of the slowest sample over the fastest (1.0 without rows)."""

    RECORD: ClassVar[tuple[object, ...]] = (("rows_written", key("rows")), "median_max_over_min")
    rows: int
    median_max_over_min: float

    @property
    def rows_written(self) -> float:
        """``rows`` as the profile file holds it: a float (5.0), as its first files did."""
        return float(self.rows)


@dataclass(frozen=True)
class Conditions:
    """The host's load before and over a calibration, and the verdict over all of it. Its record is what a
    profile carries under [calibration.conditions]: the readings (the load average after only where read), then
    the verdict's busy, reasons and warnings in place."""

    cpus: int
    before: Precheck
    run: Window
    spread: Spread
    load_average_1m_after: float | None = field(metadata=key(omit="none"))
    verdict: LoadVerdict = field(metadata=key(flatten=True))

    @property
    def busy(self) -> bool:
        return self.verdict.busy


def window(before: Clock, after: Clock) -> Window:
    """What happened between two readings: wall seconds, this process's CPU seconds, and (with /proc/stat) the
    share of the allowed CPUs' time other processes took, 0 to 1."""
    wall = max(after.wall_s - before.wall_s, 1e-9)
    own = max(after.own_s - before.own_s, 0.0)
    share = None
    if before.busy_s is not None and after.busy_s is not None:
        others = max(after.busy_s - before.busy_s - own, 0.0)
        share = min(1.0, others / (wall * before.cpus))
    return Window(wall, own, share)


def precheck(seconds: float = PRECHECK_S) -> Precheck:
    """The host before a run: others' share of the allowed CPUs over ``seconds`` (this process asleep), the load
    average, and the verdict on them."""
    before = Clock.now()
    time.sleep(seconds)
    w = window(before, Clock.now())
    load = load_average()
    return Precheck(before.cpus, w.wall_s, w.others_cpu_share, load,
                    _verdict(before.cpus, "before the run", w.others_cpu_share, load))


def spread(rows: list[dict]) -> Spread:
    """The median, over timed rows (each with min_s and max_s), of the slowest sample over the fastest."""
    ratios = [r["max_s"] / r["min_s"] for r in rows if r.get("min_s", 0) > 0 and "max_s" in r]
    return Spread(len(ratios), statistics.median(ratios) if ratios else 1.0)


def conditions(pre: Precheck, before: Clock, after: Clock, rows: list[dict], cpu_run: bool) -> Conditions:
    """The whole record a profile carries under [calibration.conditions]: the precheck, the run's window, the
    spread, the load average after, and the verdict over all of them (the precheck's reasons and warnings first)."""
    run = window(before, after)
    sp = spread(rows)
    load = load_average()
    v = _verdict(before.cpus, "during the run", run.others_cpu_share, load,
                 run.own_cpu_per_wall if cpu_run else None, sp.median_max_over_min)
    return Conditions(before.cpus, pre, run, sp, load, LoadVerdict(pre.verdict.reasons + v.reasons,
                                                                   pre.verdict.warnings + v.warnings))


def _verdict(cpus: int, when: str, share: float | None, load: float | None, own_cpu_per_wall: float | None = None,
             median_max_over_min: float = 1.0) -> LoadVerdict:
    """Busy (reasons) or quiet (warnings, maybe) from one set of readings: others' share of the CPUs (else the
    load average), this process's CPU seconds a wall second (a CPU run only: None otherwise), the spread."""
    reasons: list[str] = []
    warnings: list[str] = []
    if share is not None:
        said = f"other processes took {share:.0%} of the {cpus} CPUs' time {when}"
        if share >= BUSY_SHARE:
            reasons.append(said)
        elif share >= WARN_SHARE:
            warnings.append(said)
    elif load is not None and load >= BUSY_LOAD * cpus:
        reasons.append(f"the load average was {load:.1f} on {cpus} CPUs {when}")
    if own_cpu_per_wall is not None and own_cpu_per_wall < MIN_OWN_CPU:
        reasons.append(f"the run got {own_cpu_per_wall:.2f} CPU seconds a wall second {when}")
    if median_max_over_min >= UNSTABLE_SPREAD:
        reasons.append(f"repeats of one shape disagreed (slowest / fastest {median_max_over_min:.2f} at the "
                       "median row)")
    return LoadVerdict(tuple(reasons), tuple(warnings))


def summary(cond: Precheck | Conditions) -> str:
    """The verdict in one line: its reasons (or warnings), then the load average where there is one."""
    if isinstance(cond, Conditions):
        load = cond.load_average_1m_after if cond.load_average_1m_after is not None else cond.before.load_average_1m
    else:
        load = cond.load_average_1m
    said = list(cond.verdict.reasons or cond.verdict.warnings)
    return "; ".join(said + ([f"1-minute load average {load:.1f} on {cond.cpus} CPUs"] if load is not None else []))
