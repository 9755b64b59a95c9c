"""A Chrome / Perfetto trace of a profile: measured ops and predicted kernels on two tracks, joined by node id.

Open it in https://ui.perfetto.dev or chrome://tracing. Track "measured" holds every matched node of each
profiled iteration at its real start and duration (CPU wall time, or device time on CUDA laid at the op's
start); track "predicted" lays the same nodes end to end from the iteration's start at their predicted
times, so the two drift apart exactly where the time model is wrong. Each event's args carry the node id,
module, layer type, FLOPs, bytes, predicted and measured time. The run's telemetry tags are in
``otherData``.
"""

from __future__ import annotations

from typing import Any

from opmap.measure.profile import Profile
from opmap.report.sheet import op_label


def chrome_trace(p: Profile) -> dict[str, Any]:
    a = p.analysis
    pid = 1
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"opmap {a.workload} on {p.device_name}"}},
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": 1, "args": {"name": "measured"}},
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": 2, "args": {"name": f"predicted ({a.hardware.name})"}},
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "iterations"}},
    ]
    device_time = p.attribution.timebase == "device"
    for it, matches in enumerate(p.attribution.matches):
        if not matches:
            continue
        t0 = matches[0].event.start_us
        span_end = max(m.event.end_us for m in matches)
        events.append({"name": f"iteration {it}", "ph": "X", "pid": pid, "tid": 0, "ts": t0,
                       "dur": span_end - t0, "args": {}})
        cursor = t0
        for m in matches:
            r = a.results[m.node]
            meas_us = m.event.device_us if device_time else m.event.cpu_us
            args = {"node": r.node.id, "module": r.node.module, "layer_type": r.node.layer_type,
                    "flops": r.cost.flops, "bytes": r.cost.bytes, "predicted_us": r.pred.predicted_s * 1e6,
                    "measured_us": meas_us, "bound": r.pred.bound}
            name = op_label(r.node.op)
            events.append({"name": name, "ph": "X", "pid": pid, "tid": 1, "ts": m.event.start_us,
                           "dur": max(meas_us, 0.001), "args": args})
            if r.pred.predicted_s > 0:
                events.append({"name": name, "ph": "X", "pid": pid, "tid": 2, "ts": cursor,
                               "dur": r.pred.predicted_s * 1e6, "args": args})
            cursor += r.pred.predicted_s * 1e6
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"opmap_tags": p.tags, "schema": "opmap trace 1"}}


def tagged_torch_trace(p: Profile) -> dict[str, Any] | None:
    """The profiler's own trace, with the run's telemetry tags added to its metadata."""
    if p.profiled.trace is None:
        return None
    t = dict(p.profiled.trace)
    other = dict(t.get("otherData", {}))
    other["opmap_tags"] = p.tags
    t["otherData"] = other
    return t


def kernel_trace(kernels: list[dict[str, Any]], tags: dict[str, Any], title: str) -> dict[str, Any]:
    """A Chrome trace of a run's kernel rows (the run store's, or an analysis.json's): track "predicted" lays
    the kernels end to end at their predicted times and, where measured, track "measured" at their measured
    times (one profiled iteration's per-kernel time, laid end to end: the real start times are in the profile's
    own trace.json). Each event's args carry the kernel's layer type, bound, FLOPs, bytes and both times."""
    pid = 1
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": title}},
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": 1, "args": {"name": "measured (end to end)"}},
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": 2, "args": {"name": "predicted"}},
    ]
    cursor = {1: 0.0, 2: 0.0}
    for k in kernels:
        args = {"kernel": k.get("idx"), "layer_type": k.get("layer_type"), "bound": k.get("bound"),
                "flops": k.get("flops"), "bytes": k.get("bytes"), "predicted_us": (k.get("predicted_s") or 0) * 1e6,
                "measured_us": None if k.get("measured_s") is None else k["measured_s"] * 1e6}
        for tid, key in ((1, "measured_s"), (2, "predicted_s")):
            t = k.get(key)
            if t:
                events.append({"name": str(k.get("name")), "ph": "X", "pid": pid, "tid": tid, "ts": cursor[tid],
                               "dur": t * 1e6, "args": args})
                cursor[tid] += t * 1e6
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"opmap_tags": tags, "schema": "opmap kernel trace 1"}}
