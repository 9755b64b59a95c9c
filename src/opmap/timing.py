"""Timing on a real device: synchronise, time repeats, summarise. One helper for calibration and profiles.

- ``sync(device)``: wait for queued device work (CUDA); a no-op on the CPU.
- ``time_op(fn, device)``: microbenchmark timings of a short call, each sample enough back-to-back calls to
  last ``min_time_s`` (``time.perf_counter`` on the CPU, CUDA events on a GPU), a second round when the
  first is disturbed (max over min above 3: another tenant); ``Sample`` holds them with median and spread.
- ``time_interleaved(fns, device)``: the same samples for several candidates at once, one sample of each per
  round in an order rotated every round, so a load that comes and goes (another tenant) falls on all of them
  alike; what an autotuner compares (explore/tune) and what calibration's per-format ceilings use.
- ``time_iterations(call, device, n)``: one ``perf_counter`` reading per iteration, a synchronize before
  each clock read on CUDA (so queued kernels count); ``LatencyStats`` holds the distribution (p50, p95,
  p99, mean, std, IQR).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Sample:
    """Repeated timings of one microbenchmark, seconds per call."""

    times_s: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    def spread(self) -> dict[str, float]:
        ts = sorted(self.times_s)
        q = statistics.quantiles(ts, n=4) if len(ts) >= 4 else [ts[0], statistics.median(ts), ts[-1]]
        return {"min_s": ts[0], "max_s": ts[-1], "iqr_s": q[2] - q[0], "samples": len(ts)}


def time_op(fn: Callable[[], object], device: torch.device, *, warmup: int = 2, repeats: int = 7,
            min_time_s: float = 0.02) -> Sample:
    """Median-ready timings of ``fn``: each sample runs enough back-to-back calls to last ``min_time_s``."""
    once = _warm_once(fn, device, warmup)
    calls = max(1, int(min_time_s / once))
    repeats = max(3, min(repeats, int(0.4 / (once * calls)) or 3))  # about 0.4 s per microbenchmark at most
    out: list[float] = []
    for _ in range(2):  # a second round when the first is disturbed (max over min above 3: another tenant)
        out += _samples(fn, device, repeats, calls)
        if max(out) <= 3.0 * min(out):
            break
    return Sample(tuple(out))


def time_interleaved(fns: Sequence[Callable[[], object]], device: torch.device, *, warmup: int = 2,
                     rounds: int = 5, min_time_s: float = 0.005) -> list[Sample]:
    """Timings of each of ``fns``, seconds per call: each warmed up, its calls per sample sized to last
    ``min_time_s`` (at least one call), then ``rounds`` rounds taking one sample of every fn, the order rotated
    each round (fn i first in round i). A Sample per fn, in the order given."""
    calls = [max(1, int(min_time_s / _warm_once(fn, device, warmup))) for fn in fns]
    out: list[list[float]] = [[] for _ in fns]
    n = len(fns)
    for r in range(max(1, rounds)):
        for j in range(n):
            i = (r + j) % n
            out[i] += _samples(fns[i], device, 1, calls[i])
    return [Sample(tuple(ts)) for ts in out]


def _warm_once(fn: Callable[[], object], device: torch.device, warmup: int) -> float:
    """``warmup`` calls of ``fn``, then the seconds one more call takes (at least 0.1 us)."""
    for _ in range(warmup):
        fn()
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return max(time.perf_counter() - t0, 1e-7)


def _samples(fn: Callable[[], object], device: torch.device, repeats: int, calls: int) -> list[float]:
    out = []
    for _ in range(repeats):
        if device.type == "cuda":
            import torch

            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / 1e3 / calls)
        else:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            out.append((time.perf_counter() - t0) / calls)
    return out


@dataclass(frozen=True)
class LatencyStats:
    """A latency distribution, seconds per iteration."""

    times_s: tuple[float, ...]

    def quantile(self, q: float) -> float:
        """Linear interpolation between closest ranks (numpy's default, 'inclusive' in statistics)."""
        ts = sorted(self.times_s)
        if len(ts) == 1:
            return ts[0]
        pos = q * (len(ts) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(ts) - 1)
        return ts[lo] + (ts[hi] - ts[lo]) * (pos - lo)

    @property
    def p50_s(self) -> float:
        return self.quantile(0.50)

    @property
    def mean_s(self) -> float:
        return statistics.fmean(self.times_s)

    def to_dict(self) -> dict[str, float | int]:
        ts = self.times_s
        return {"p50_s": self.p50_s, "p95_s": self.quantile(0.95), "p99_s": self.quantile(0.99),
                "mean_s": self.mean_s, "std_s": statistics.stdev(ts) if len(ts) > 1 else 0.0,
                "min_s": min(ts), "max_s": max(ts),
                "iqr_s": self.quantile(0.75) - self.quantile(0.25), "n": len(ts)}


def time_iterations(call: Callable[[], Any], device: torch.device, n: int,
                    progress: Callable[[], None] | None = None) -> LatencyStats:
    """``n`` iterations of ``call``, one clock reading around each (synchronised on CUDA)."""
    out = []
    for _ in range(n):
        sync(device)
        t0 = time.perf_counter()
        call()
        sync(device)
        out.append(time.perf_counter() - t0)
        if progress:
            progress()
    return LatencyStats(tuple(out))
