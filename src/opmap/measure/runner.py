"""Run a workload for real: a plain timed loop for the latency distribution, then profiled iterations.

The latency figures come from the plain loop (no profiler attached; opmap.timing.time_iterations), so they
are what a user sees; the profiler's iterations only serve attribution, and their wall time is compared
with the plain loop's to state the profiler's overhead.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from opmap.measure.attribute import Event
from opmap.timing import LatencyStats, sync

ITER_MARK = "opmap.iter."
# The progress lines kineto (torch.profiler's C++ side) writes to stderr at each profiler start and stop:
# "USDT:2026-01-01 08:00:00 123:123 SyncActivityProfilerHandler.cpp:52] profiler_start" (STAGE, INFO and
# VERBOSE lines where its log level lets them through). Its WARNING and ERROR lines are kept.
KINETO_PROGRESS = re.compile(rb"^(USDT|STAGE|INFO|VERBOSE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+ \S+\.\w+:\d+\] ")


@contextlib.contextmanager
def quiet_profiler() -> Iterator[None]:
    """Hold what is written to the process's stderr (file descriptor 2, where kineto's C++ logger writes)
    while the profiler runs, then pass every line but kineto's progress lines on: real errors and warnings
    still reach stderr, after the profiled iterations. (KINETO_LOG_LEVEL cannot do it: the level that hides
    the progress lines hides the errors too, and kineto reads it once per process.)"""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = b"".join(line for line in held.read().splitlines(keepends=True)
                            if not KINETO_PROGRESS.match(line))
            if kept:
                os.write(2, kept)


def make_call(module: torch.nn.Module, inputs: Any, kwargs: dict | None = None) -> Callable[[], Any]:
    """The forward pass as a no-argument function, inputs as the workload gives them."""
    kwargs = kwargs or {}
    if isinstance(inputs, dict):
        return lambda: module(**inputs, **kwargs)
    if isinstance(inputs, (tuple, list)):
        return lambda: module(*inputs, **kwargs)
    return lambda: module(inputs, **kwargs)


def _subtree_kernels(e) -> tuple[str, ...]:
    names = [k.name for k in getattr(e, "kernels", ())]
    for c in e.cpu_children:
        names.extend(_subtree_kernels(c))
    return tuple(names)


def _device_us(e) -> float:
    if hasattr(e, "device_time_total"):  # torch >= 2.4; cuda_time_total before
        return float(e.device_time_total or 0.0)
    return float(getattr(e, "cuda_time_total", 0.0) or 0.0)


def _first_shape(e, recorded: bool) -> tuple[int, ...] | None:
    if not recorded:
        return None
    for shp in getattr(e, "input_shapes", None) or ():
        if shp and all(isinstance(x, int) for x in shp):
            return tuple(shp)
    return ()


@dataclass
class ProfiledRun:
    iterations: list[tuple[float, list[Event]]]  # per iteration: marker span (s), the events inside it
    wall: LatencyStats  # perf_counter per profiled iteration, comparable with the plain loop
    trace: dict | None  # the profiler's own Chrome trace, parsed (None when not asked for)


def profile_iterations(call: Callable[[], Any], device: torch.device, n: int, *, record_shapes: bool = True,
                       keep_trace: bool = True, progress: Callable[[], None] | None = None) -> ProfiledRun:
    """``n`` iterations under torch.profiler (CPU ops; CUDA kernels too on a GPU), each in its own marker."""
    import json

    from torch.profiler import ProfilerActivity, profile, record_function

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    walls = []
    with quiet_profiler(), profile(activities=acts, record_shapes=record_shapes) as prof:
        call()  # the profiler's first iteration pays its own set-up: run one outside the markers
        sync(device)
        for i in range(n):
            sync(device)
            t0 = time.perf_counter()
            with record_function(f"{ITER_MARK}{i}"):
                call()
                sync(device)
            walls.append(time.perf_counter() - t0)
            if progress:
                progress()
    events = list(prof.events())
    marks = sorted((e for e in events if e.name.startswith(ITER_MARK)), key=lambda e: e.time_range.start)
    iterations = []
    for m in marks:
        s, t = m.time_range.start, m.time_range.end
        inside = [Event(e.name, float(e.time_range.start), float(e.time_range.end), _device_us(e),
                        _subtree_kernels(e) if device.type == "cuda" else (), _first_shape(e, record_shapes))
                  for e in events
                  if e is not m and e.thread == m.thread and s <= e.time_range.start and e.time_range.end <= t]
        iterations.append(((t - s) / 1e6, inside))
    trace = None
    if keep_trace:
        fd, tmp = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            prof.export_chrome_trace(tmp)
            with open(tmp) as f:
                trace = json.load(f)
        finally:
            os.unlink(tmp)
    return ProfiledRun(iterations, LatencyStats(tuple(walls)), trace)
