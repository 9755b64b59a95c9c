"""Noise between runs: the warm-up rule, a run's robust time, who counts as a repeat of a run, and the minimum
effect a verdict needs on this host.

Within one run, iterations are close together; two runs of the same code, one after the other, differ by more
(different processes: allocator state, clocks, page placement). A rank test on one run's iterations against
another's sees that difference as significant, so a run-level verdict needs the noise *between* runs:

- **warm-up rule** (applied to every sample series: a run's latencies, a kernel's profiled iterations): the
  leading samples are dropped while each exceeds the median of the samples after it by more than
  ``WARMUP_Z`` robust standard deviations (1.4826 x their median absolute deviation, floored at ``MAD_FLOOR`` of
  their median): Iglewicz & Hoaglin's modified z-score above 3.5, applied to the leading run of the series
  only, and never to more than half of it.
- **a run's time**: the median of its samples after the warm-up rule; runs are compared on log scale.
- **repeats**: runs of the same kind, configuration tags (``SAME_TAGS``: workload ... graph_hash, the git
  commit, torch, and the command without its output options) and host fingerprint (device model, device,
  threads, host name; the profile's own tags).
- **noise floor**: with the log run times of side A (A and its repeats) and side B (B and its repeats), the
  pooled within-side standard deviation ``s`` (``dof`` = runs - 2); the floor is the one-sided 99.5% bound of
  a same-code difference of the two sides' means: ``t(0.995, dof) x s x sqrt(1/n_a + 1/n_b)`` (Student's t,
  estimated ``s``), as a relative change ``exp(.) - 1``. With fewer than ``MIN_DOF`` degrees of freedom the
  floor is not measured: the run's verdict is then inconclusive (store/compare.py), never a floor assumed for
  it; a kernel's floor is assumed (``ASSUMED_KERNEL_NOISE``), for verdicts that are shown, not gated on.
- **minimum effect** of a verdict = max(the stated ``--min-effect``, the floor).
"""

from __future__ import annotations

import math
import shlex
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

WARMUP_Z = 3.5  # Iglewicz & Hoaglin (1993), "How to Detect and Handle Outliers": |modified z| > 3.5
MAD_SIGMA = 1.4826  # MAD x 1.4826 estimates a normal's standard deviation
MAD_FLOOR = 0.01  # a series flatter than 1% of its median counts as 1% wide (no division by a zero MAD)
MIN_DOF = 2  # fewer degrees of freedom than this: the spread is not an estimate (t(0.995, 1) = 63.7)
# where no repeats measure the floor: same-code kernel medians moved by up to 29% (opmap issue 19); the assumed
# kernel floor sits just above that. No run floor is assumed: whole same-code runs differed by 9-13% (issue 19),
# then by up to 29% between processes on a quiet host (issue 35), so a run's verdict needs its noise measured
ASSUMED_KERNEL_NOISE = 0.30
# the tags a repeat shares with its run (with the host fingerprint and the run kind)
SAME_TAGS = ("workload", "hardware", "phase", "precision", "batch", "seq", "fusion", "parallelism", "graph_hash",
             "git_commit", "torch_version")
# options of a command that do not change what is measured (where it writes, how much it prints)
OUTPUT_OPTIONS = ("--out", "--store", "--rows")

# Student's t, one-sided 0.995 quantile by degrees of freedom (NIST/SEMATECH e-Handbook of Statistical Methods,
# 1.3.6.7.2, "Critical values of the Student's t distribution"); beyond 30 linear in 1 / dof between the rows
T995 = {1: 63.657, 2: 9.925, 3: 5.841, 4: 4.604, 5: 4.032, 6: 3.707, 7: 3.499, 8: 3.355, 9: 3.250, 10: 3.169,
        11: 3.106, 12: 3.055, 13: 3.012, 14: 2.977, 15: 2.947, 16: 2.921, 17: 2.898, 18: 2.878, 19: 2.861,
        20: 2.845, 21: 2.831, 22: 2.819, 23: 2.807, 24: 2.797, 25: 2.787, 26: 2.779, 27: 2.771, 28: 2.763,
        29: 2.756, 30: 2.750, 40: 2.704, 60: 2.660, 100: 2.626, 1000: 2.581}
Z995 = 2.576  # the normal's 0.995 quantile (infinite dof)


def t995(dof: int) -> float:
    """Student's t one-sided 0.995 quantile at ``dof`` degrees of freedom (>= 1)."""
    if dof < 1:
        raise ValueError(f"t needs at least 1 degree of freedom, got {dof}")
    if dof in T995:
        return T995[dof]
    rows = sorted(T995.items()) + [(math.inf, Z995)]
    for (d0, t0), (d1, t1) in zip(rows, rows[1:]):
        if d0 < dof < d1:
            w = (1 / d0 - 1 / dof) / (1 / d0 - (0 if d1 == math.inf else 1 / d1))
            return t0 + w * (t1 - t0)
    return Z995


def drop_warmup(xs: Sequence[float]) -> tuple[list[float], int]:
    """(the samples after the warm-up rule, how many leading samples it dropped); see the module docstring."""
    xs = [float(x) for x in xs]
    drop = 0
    while drop < len(xs) // 2:
        rest = xs[drop + 1:]
        med = statistics.median(rest)
        mad = statistics.median(abs(r - med) for r in rest)
        if xs[drop] <= med + WARMUP_Z * max(MAD_SIGMA * mad, MAD_FLOOR * abs(med)):
            break
        drop += 1
    return xs[drop:], drop


def run_time(xs: Sequence[float]) -> float | None:
    """A series' robust time, s: the median after the warm-up rule (None without samples)."""
    kept, _ = drop_warmup(xs)
    return statistics.median(kept) if kept else None


def host_fingerprint(payload: dict[str, Any]) -> str | None:
    """The measuring host of a profile run, from the telemetry tags its profile carries: device model, device,
    threads, host name (None where the run has none: a predicted run, or a record made by hand)."""
    t = payload.get("tags") if isinstance(payload.get("tags"), dict) else {}
    parts = {k: t.get(k) for k in ("device_name", "device", "threads", "host")}
    if all(v is None for v in parts.values()):
        return None
    return (f"{parts['device_name'] or '?'} ({parts['device'] or '?'}, {parts['threads'] or '?'} threads) "
            f"on {parts['host'] or '?'}")


def measuring_command(command: Any) -> str | None:
    """A recorded command without the options that do not change the measurement (OUTPUT_OPTIONS)."""
    if not command:
        return None
    try:
        words = shlex.split(str(command))
    except ValueError:
        return str(command)
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
            continue
        name = w.split("=", 1)[0]
        if name in OUTPUT_OPTIONS or w == "--no-store":
            skip = "=" not in w and w != "--no-store"
            continue
        out.append(w)
    return shlex.join(out)


def repeat_key(kind: str, tags: dict[str, Any], payload: dict[str, Any]) -> tuple:
    """What a repeat of a run shares with it: kind, SAME_TAGS, the measuring command, the host fingerprint."""
    return (kind, *(str(tags.get(t)) for t in SAME_TAGS), measuring_command(tags.get("command")),
            host_fingerprint(payload))


@dataclass(frozen=True)
class Floor:
    """The smallest relative change two sides of ``n_a`` and ``n_b`` runs tell apart from noise on this host.

    ``noise``: the floor as a relative change (0.12: 12%); ``measured``: from repeats (else assumed); ``sd_log``:
    the pooled between-run standard deviation of log run times; ``dof`` its degrees of freedom; ``t`` the
    quantile used. Its record (compare's ``kernel_floor``) writes ``rule``, the sentence it composes, after them."""

    RECORD: ClassVar[tuple[Any, ...]] = (..., "rule")
    noise: float
    measured: bool
    n_a: int
    n_b: int
    sd_log: float | None = None
    dof: int = 0
    t: float | None = None

    @property
    def rule(self) -> str:
        """How the floor was found, in a sentence."""
        if not self.measured:
            return (f"assumed {self.noise:.0%}: between-run noise not measured here ({self.n_a} + {self.n_b} runs; "
                    "record repeats with the same tags or use --rerun N)")
        return (f"measured {self.noise:.1%} = exp(t(0.995, {self.dof} dof) {self.t:.3g} x between-run sd "
                f"{self.sd_log:.3g} x sqrt(1/{self.n_a} + 1/{self.n_b})) - 1")


def pooled_sd(groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    """(pooled within-group standard deviation, its degrees of freedom = values - groups), groups of logs."""
    ss = sum(sum((x - statistics.fmean(g)) ** 2 for x in g) for g in groups if g)
    dof = sum(len(g) - 1 for g in groups if g)
    return (math.sqrt(ss / dof) if dof > 0 else 0.0), dof


def floor(groups: Sequence[Sequence[float]], n_a: int, n_b: int, assumed: float) -> Floor:
    """The noise floor of a difference between a mean over ``n_a`` runs and one over ``n_b`` runs, from the
    spread within ``groups`` (log run times of repeats: several groups pool), else ``assumed``."""
    sd, dof = pooled_sd(groups)
    if dof < MIN_DOF:
        return Floor(assumed, False, n_a, n_b)
    t = t995(dof)
    return Floor(math.expm1(t * sd * math.sqrt(1 / n_a + 1 / n_b)), True, n_a, n_b, sd, dof, t)
