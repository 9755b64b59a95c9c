"""A Chrome / Perfetto trace of a profile: measured ops and predicted kernels on two tracks, joined by node id.

Open it in https://ui.perfetto.dev or chrome://tracing. Track "measured" holds every matched node of each
profiled iteration at its real start and duration (CPU wall time, or device time on CUDA laid at the op's
start); track "predicted" lays the same nodes end to end from the iteration's start at their predicted
times, so the two drift apart exactly where the time model is wrong. Each event's args carry the node id,
module, layer type, FLOPs, bytes, predicted and measured time. The run's telemetry tags are in
``otherData``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from opmap.measure.profile import Profile
from opmap.record import key
from opmap.report.sheet import op_label


@dataclass(frozen=True)
class TraceEvent:
    """One event of the Chrome trace format: ``ph`` "M" (metadata: a process's or a track's name, in ``args``)
    or "X" (a complete event: ``ts_us`` its start, ``dur_us`` its duration, in microseconds). Its record is the
    event in the format's names (``ts``, ``dur``), its unset fields left out."""

    name: str
    ph: str
    pid: int
    tid: int | None = field(default=None, metadata=key(omit="none"))  # the track; None: the process's metadata
    ts_us: float | None = field(default=None, metadata=key(name="ts", omit="none"))
    dur_us: float | None = field(default=None, metadata=key(name="dur", omit="none"))
    # the format's free key / value pairs, shown beside the event
    args: dict[str, Any] | None = field(default=None, metadata=key(omit="none"))


@dataclass(frozen=True)
class OtherData:
    """The trace format's free block (``otherData``): the run's telemetry tags and the trace's schema name."""

    opmap_tags: dict[str, Any]
    schema: str


@dataclass(frozen=True)
class ChromeTrace:
    """A trace opmap writes (trace.json, PAGE_trace.json): its events, the run's telemetry tags and the schema
    name (``otherData.schema``: how ``opmap report`` knows a trace it may replace). Its record is the trace file's
    JSON in Chrome's trace event format's own (camel-case) keys: the events, the time unit, the tags and schema."""

    RECORD: ClassVar[tuple[str, ...]] = ("events", "displayTimeUnit", "otherData")
    displayTimeUnit: ClassVar[str] = "ms"  # noqa: N815 (the format's key)
    events: tuple[TraceEvent, ...] = field(metadata=key(name="traceEvents"))
    tags: dict[str, Any]
    schema: str

    @property
    def otherData(self) -> OtherData:  # noqa: N802 (the format's key)
        return OtherData(self.tags, self.schema)


def _names(pid: int, process: str, tracks: list[tuple[int, str]]) -> list[TraceEvent]:
    """The metadata events naming the process and its tracks."""
    return [TraceEvent("process_name", "M", pid, args={"name": process}),
            *(TraceEvent("thread_name", "M", pid, tid, args={"name": name}) for tid, name in tracks)]


def chrome_trace(p: Profile) -> ChromeTrace:
    a = p.analysis
    pid = 1
    events = _names(pid, f"opmap {a.workload} on {p.device_name}",
                    [(1, "measured"), (2, f"predicted ({a.hardware.name})"), (0, "iterations")])
    device_time = p.attribution.timebase == "device"
    for it, matches in enumerate(p.attribution.matches):
        if not matches:
            continue
        t0 = matches[0].event.start_us
        span_end = max(m.event.end_us for m in matches)
        events.append(TraceEvent(f"iteration {it}", "X", pid, 0, t0, span_end - t0, {}))
        cursor = t0
        for m in matches:
            r = a.results[m.node]
            meas_us = m.event.device_us if device_time else m.event.cpu_us
            args = {"node": r.node.id, "module": r.node.module, "layer_type": r.node.layer_type,
                    "flops": r.cost.flops, "bytes": r.cost.bytes, "predicted_us": r.pred.predicted_s * 1e6,
                    "measured_us": meas_us, "bound": r.pred.bound}
            name = op_label(r.node.op)
            events.append(TraceEvent(name, "X", pid, 1, m.event.start_us, max(meas_us, 0.001), args))
            if r.pred.predicted_s > 0:
                events.append(TraceEvent(name, "X", pid, 2, cursor, r.pred.predicted_s * 1e6, args))
            cursor += r.pred.predicted_s * 1e6
    return ChromeTrace(tuple(events), p.tags.to_dict() if p.tags is not None else {}, "opmap trace 1")


def tagged_torch_trace_json(p: Profile) -> str | None:
    """The profiler's own trace with the run's telemetry tags added to its metadata, as the JSON text
    torch_trace.json holds (None: the profile kept no trace). The trace is torch's format, passed through."""
    from opmap.validate import json_text

    if p.profiled.trace is None:
        return None
    t = dict(p.profiled.trace)
    other = dict(t.get("otherData", {}))
    other["opmap_tags"] = p.tags.to_dict() if p.tags is not None else {}
    t["otherData"] = other
    return json_text(t)


def kernel_trace(kernels: list[dict[str, Any]], tags: dict[str, Any], title: str) -> ChromeTrace:
    """A Chrome trace of a run's kernel rows (the run store's, or an analysis.json's): track "predicted" lays
    the kernels end to end at their predicted times and, where measured, track "measured" at their measured
    times (one profiled iteration's per-kernel time, laid end to end: the real start times are in the profile's
    own trace.json). Each event's args carry the kernel's layer type, bound, FLOPs, bytes and both times."""
    pid = 1
    events = _names(pid, title, [(1, "measured (end to end)"), (2, "predicted")])
    cursor = {1: 0.0, 2: 0.0}
    for k in kernels:
        args = {"kernel": k.get("idx"), "layer_type": k.get("layer_type"), "bound": k.get("bound"),
                "flops": k.get("flops"), "bytes": k.get("bytes"), "predicted_us": (k.get("predicted_s") or 0) * 1e6,
                "measured_us": None if k.get("measured_s") is None else k["measured_s"] * 1e6}
        for tid, col in ((1, "measured_s"), (2, "predicted_s")):
            t = k.get(col)
            if t:
                events.append(TraceEvent(str(k.get("name")), "X", pid, tid, cursor[tid], t * 1e6, args))
                cursor[tid] += t * 1e6
    return ChromeTrace(tuple(events), tags, "opmap kernel trace 1")
