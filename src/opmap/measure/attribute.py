"""Attribute measured time to graph nodes.

The profiler records every dispatcher call of an iteration, composite ops included (``aten::linear``
around ``aten::t`` and ``aten::addmm``), nested by time. The capture saw the same forward pass at the level
below composite decomposition, in the same order. So one walk in start order matches them:

- an event whose name is the next unmatched node's op is that node; its whole subtree (children such as
  the ``aten::copy_`` inside ``aten::_to_copy``, or the backend kernel inside
  ``aten::scaled_dot_product_attention``) belongs to it and is not matched again;
- any other event is a container (a composite op) or an op the capture did not see; the walk goes into it;
- where the run and the capture diverge (a composite op that decomposed differently, a view the profiler
  did not record) the walk resynchronises on the nearest later node with the same name and first input
  shape; the nodes it steps over stay unmatched and lower the coverage, which is reported.

A node's measured time is the inclusive duration of its event: CPU wall time on the CPU, the summed
duration of the device kernels launched under it on CUDA (the profiler links kernels to ops through
correlation ids). Time the walk cannot place (Python between ops, unmatched events) is reported as
``unattributed``, never spread over nodes.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    """One profiler event of one iteration (microsecond times, as the profiler gives them)."""

    name: str
    start_us: float
    end_us: float
    device_us: float = 0.0  # kernel time launched under this op and its children (CUDA); 0 on the CPU
    kernels: tuple[str, ...] = ()  # names of those kernels
    first_shape: tuple[int, ...] | None = None  # the first non-scalar input's shape (record_shapes); None: unknown

    @property
    def cpu_us(self) -> float:
        return self.end_us - self.start_us


def profiler_name(op: str) -> str:
    """'aten.addmm.default' -> 'aten::addmm' (the profiler's spelling of the overload packet)."""
    ns, _, rest = op.partition(".")
    return f"{ns}::{rest.split('.')[0]}" if rest else op


@dataclass(frozen=True)
class Match:
    node: int  # index into the node list
    event: Event


LOOKAHEAD = 48  # nodes the walk may step over to resynchronise after the run and the capture diverge


def match_iteration(ops: Sequence[str], events: Iterable[Event], skippable: Iterable[int] = (),
                    first_shapes: Sequence[tuple[int, ...] | None] | None = None) -> list[Match]:
    """Match one iteration's events to the nodes' op sequence (see the module docstring).

    An event matches the next unmatched node with its name, or, where the run and the capture diverge
    (a composite op that took another path, a view the profiler did not record), the nearest node within
    LOOKAHEAD with its name and the same first input shape; the nodes stepped over stay unmatched. Nodes in
    ``skippable`` (no kernel) may be stepped over on a name match alone.
    """
    return _walk(ops, events, skippable, first_shapes)[0]


def _walk(ops, events, skippable=(), first_shapes=None) -> tuple[list[Match], list[tuple[str, int | None]]]:
    """The matches, and the template: every event the walk looked at, with the node it matched or None."""
    names = [profiler_name(op) for op in ops]
    skip = set(skippable)
    shapes = list(first_shapes) if first_shapes is not None else [None] * len(names)
    ordered = sorted(events, key=lambda e: (e.start_us, -e.end_us))
    out: list[Match] = []
    template: list[tuple[str, int | None]] = []
    j = 0
    inside_until = float("-inf")  # end of the last matched event: its subtree is taken
    for ev in ordered:
        if j >= len(names):
            break
        if ev.start_us < inside_until:
            continue
        hit = None
        only_skippable = True
        for k in range(j, min(len(names), j + LOOKAHEAD)):
            if names[k] == ev.name:
                same = ev.first_shape is None or shapes[k] is None or ev.first_shape == shapes[k]
                if (k == j or only_skippable) and same or same and ev.first_shape is not None:
                    hit = k
                    break
            only_skippable = only_skippable and k in skip
        template.append((ev.name, hit))
        if hit is not None:
            out.append(Match(hit, ev))
            j = hit + 1
            inside_until = ev.end_us
    return out, template


def match_with_template(events: Iterable[Event], template: Sequence[tuple[str, int | None]]) -> list[Match] | None:
    """Replay a template walk on another iteration of the same program (recorded without shapes): the
    events it visits must carry the template's names in the template's order; None where they do not."""
    ordered = sorted(events, key=lambda e: (e.start_us, -e.end_us))
    out: list[Match] = []
    t = 0
    inside_until = float("-inf")
    for ev in ordered:
        if t >= len(template):
            break
        if ev.start_us < inside_until:
            continue
        name, hit = template[t]
        if name != ev.name:
            return None
        t += 1
        if hit is not None:
            out.append(Match(hit, ev))
            inside_until = ev.end_us
    return out if t == len(template) else None


@dataclass(frozen=True)
class NodeTiming:
    """A node's measured time over the profiled iterations."""

    median_s: float
    min_s: float
    max_s: float
    samples: int
    kernels: tuple[str, ...] = ()
    values: tuple[float, ...] = ()  # the time of each profiled iteration (the run store's per-kernel samples)

    def to_dict(self) -> dict:
        d = {"measured_s": self.median_s, "min_s": self.min_s, "max_s": self.max_s, "samples": self.samples}
        if self.kernels:
            d["kernels"] = list(self.kernels)
        return d


@dataclass(frozen=True)
class Attribution:
    timings: dict[int, NodeTiming]  # node index -> timing (absent: the node was never matched)
    coverage: float  # matched nodes over nodes that launch a kernel, worst iteration
    iteration_s: float  # median profiled iteration (the marker's span)
    attributed_s: float  # median over iterations of the summed node times
    timebase: str  # "cpu" (wall time of the op) or "device" (kernel time)
    matches: tuple[tuple[Match, ...], ...] = ()  # per iteration, for the trace

    @property
    def unattributed_s(self) -> float:
        return max(0.0, self.iteration_s - self.attributed_s)


def attribute(ops: Sequence[str], kernel_nodes: Sequence[int], iterations: Sequence[tuple[float, Sequence[Event]]],
              use_device_time: bool = False, first_shapes: Sequence[tuple[int, ...] | None] | None = None,
              template_events: Sequence[Event] | None = None) -> Attribution:
    """Join ``iterations`` (each: its span in seconds and its events) to the nodes named by ``ops``.

    ``kernel_nodes`` are the indices of nodes that launch a kernel; coverage is measured over them (views
    are matched too when the profiler shows them, but nothing is lost when it does not).
    ``template_events``: one iteration recorded with shapes; its walk (name and shape matching) is
    replayed on the timed iterations, recorded without shapes (record_shapes costs time), falling back to a
    walk by name where an iteration does not follow the template.
    """
    skippable = [i for i in range(len(ops)) if i not in set(kernel_nodes)]
    template = _walk(ops, template_events, skippable, first_shapes)[1] if template_events is not None else None
    per_node: dict[int, list[float]] = {}
    kernels: dict[int, tuple[str, ...]] = {}
    sums, coverage = [], 1.0
    want = set(kernel_nodes)
    all_matches = []
    for _span, events in iterations:
        matches = match_with_template(events, template) if template is not None else None
        if matches is None:
            matches = match_iteration(ops, events, skippable, first_shapes)
        all_matches.append(tuple(matches))
        got = {m.node for m in matches}
        if want:
            coverage = min(coverage, len(got & want) / len(want))
        total = 0.0
        for m in matches:
            t = (m.event.device_us if use_device_time else m.event.cpu_us) / 1e6
            per_node.setdefault(m.node, []).append(t)
            if m.event.kernels:
                kernels[m.node] = m.event.kernels
            total += t
        sums.append(total)
    if not iterations:
        coverage = 0.0
    timings = {i: NodeTiming(statistics.median(ts), min(ts), max(ts), len(ts), kernels.get(i, ()), tuple(ts))
               for i, ts in per_node.items()}
    return Attribution(timings, coverage,
                       statistics.median(s for s, _ in iterations) if iterations else 0.0,
                       statistics.median(sums) if sums else 0.0,
                       "device" if use_device_time else "cpu", tuple(all_matches))
