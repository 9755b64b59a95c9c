"""A profile: a measured run joined to its prediction, and its JSON (profile.json); run.py makes one.

``Profile.to_dict`` is profile.json: analysis.json (same nodes, same ids) plus a ``measured`` block on every
node and the run-level blocks ``latency``, ``profiler``, ``mfu``, ``stall_fraction``, ``energy``,
``accuracy`` and ``tags``. The method of each figure travels beside it.

Memory-stall fraction, roofline-estimated (no hardware counters are read on this path). Per node, from the
terms its prediction used (the calibrated shape curves, bandwidth curve and vector rates where the hardware
profile has them; roofline.stall_split)::

    compute_busy = min(measured, matrix_s + vector_s)
    memory_stall = min(measured - compute_busy, max(0, memory_s - compute_busy))
    other        = measured - compute_busy - memory_stall      (dispatch, inefficiency, unexplained)

A layer type's fractions are its sums over its nodes divided by its measured time.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, ClassVar

from opmap.analyze import Analysis
from opmap.calibrate.drift import DriftCheck
from opmap.hardware.spec import HardwareSpec
from opmap.measure.attribute import Attribution, NodeTiming
from opmap.measure.energy import EnergyReading
from opmap.measure.runner import ProfiledRun
from opmap.predict import mfu
from opmap.record import key, record
from opmap.roofline import stall_split
from opmap.tags import Tags
from opmap.timing import LatencyStats

PROFILE_SCHEMA_VERSION = 1

MFU_FORMULA = "MFU = model matrix FLOPs / (p50 latency x dense matrix peak at the compute dtype)"
# The widest a prediction may miss the measurement, either way, before the profile says so: past it the prediction is
# for other hardware than the run's, or the run is not the work priced (a calibrated CPU profile predicts eager
# PyTorch within about 2x; every held-out row of the tests sits inside 3x).
RATIO_LIMIT = 3.0
STALL_METHOD = ("roofline-estimated: per node, compute-busy = the predicted matrix and vector time (calibrated "
                "curves at its shape), memory-stall = time beyond that which its bytes at the bandwidth curve "
                "explain, other = the rest")

_STATED = key(omit="none")  # a peak's figures where it has one, the reason where there is no MFU


@dataclass(frozen=True, kw_only=True)
class PeakMfu:
    """MFU against one peak: the device it belongs to (the datasheet's), the peak with its kind and source, the
    MFU, or None and why (no datasheet, no peak at the dtype; HFU: not stated)."""

    hardware: str | None = field(default=None, metadata=_STATED)
    peak_flops_per_s: float | None = field(default=None, metadata=_STATED)
    kind: str | None = field(default=None, metadata=_STATED)
    source: str | None = field(default=None, metadata=_STATED)
    mfu: float | None
    why: str | None = field(default=None, metadata=_STATED)


@dataclass(frozen=True)
class MfuBlock:
    """profile.json's ``mfu`` (``Profile.mfu_block``): the formula, its inputs, MFU against the calibrated peak
    and against the datasheet's, and HFU (not stated: this run computes no FLOPs the model does not need)."""

    RECORD: ClassVar[tuple[str, ...]] = ("formula", "model_matrix_flops", "latency_s", "dtype", "calibrated",
                                         "datasheet", "hfu")
    formula: ClassVar[str] = MFU_FORMULA
    # Hardware FLOPs differ from model FLOPs where a kernel computes work the model does not need (recomputation,
    # the masked half of a causal product). The eager inference run does neither: attention kernels that skip the
    # masked half are counted at what they compute.
    hfu: ClassVar[PeakMfu] = PeakMfu(mfu=None, why="hardware FLOPs equal model FLOPs in this run (no recomputation; "
                                                   "causal attention counted at the half it computes)")
    model_matrix_flops: float
    latency_s: float  # the p50
    dtype: str  # the matrix format
    calibrated: PeakMfu
    datasheet: PeakMfu


@dataclass(frozen=True)
class MeasuredNode:
    """One node as measured: its timing, the rates it achieved over its median time, its predicted over measured
    time and the roofline-estimated split of that time (compute-busy, memory-stall, other; they add up to it).
    Its record is profile.json's ``measured`` block of a node: the timing's keys in place, then the figures."""

    timing: NodeTiming = field(metadata=key(flatten=True))
    achieved_flops_per_s: float
    achieved_matrix_flops_per_s: float
    achieved_bytes_per_s: float
    predicted_over_measured: float | None
    compute_busy_s: float
    memory_stall_s: float
    other_s: float

    @property
    def measured_s(self) -> float:
        """The median over the profiled iterations."""
        return self.timing.median_s


@dataclass(frozen=True)
class Profile:
    analysis: Analysis
    device: str
    device_name: str
    latency: LatencyStats
    warmup: int
    profiled: ProfiledRun
    attribution: Attribution
    energy: EnergyReading
    datasheet: HardwareSpec | None
    datasheet_why: str
    mode: str = "inference"
    tags: Tags | None = None  # the run's telemetry tags (measure.run.telemetry_tags)
    around: LatencyStats | None = None  # plain iterations adjacent to the profiled ones
    drift: DriftCheck | None = None  # calibration_check at profile time
    optimizer: dict[str, Any] | None = None  # a training step's optimizer: its state predicted and in the run

    # -- per node ---------------------------------------------------------------------------------------
    def stall_split(self, i: int) -> tuple[float, float, float]:
        """(compute-busy, memory-stall, other) seconds of node ``i``: roofline.stall_split of its measured time
        against the terms its prediction used."""
        t = self.attribution.timings.get(i)
        if t is None:
            return 0.0, 0.0, 0.0
        return stall_split(t.median_s, self.analysis.results[i].pred)

    def measured_block(self, i: int) -> MeasuredNode | None:
        """Node ``i`` as measured (None where no profiler event matched it)."""
        t = self.attribution.timings.get(i)
        if t is None:
            return None
        r = self.analysis.results[i]
        busy, stall, other = self.stall_split(i)
        m = t.median_s
        return MeasuredNode(t, r.cost.flops / m if m > 0 else 0.0, r.cost.matrix_flops / m if m > 0 else 0.0,
                            r.cost.bytes / m if m > 0 else 0.0, r.pred.predicted_s / m if m > 0 else None,
                            busy, stall, other)

    # -- per layer type ---------------------------------------------------------------------------------
    def layer_types(self) -> dict[str, dict[str, Any]]:
        acc: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for i, r in enumerate(self.analysis.results):
            a = acc[r.node.layer_type]
            a["predicted_s"] += r.pred.predicted_s
            t = self.attribution.timings.get(i)
            if t is not None:
                busy, stall, other = self.stall_split(i)
                a["measured_s"] += t.median_s
                a["compute_busy_s"] += busy
                a["memory_stall_s"] += stall
                a["other_s"] += other
        total = sum(a["measured_s"] for a in acc.values())
        out = {}
        for lt, a in sorted(acc.items(), key=lambda kv: -kv[1]["measured_s"]):
            m = a["measured_s"]
            out[lt] = {"measured_s": m, "predicted_s": a["predicted_s"],
                       "share_of_measured": m / total if total else 0.0,
                       "predicted_over_measured": a["predicted_s"] / m if m else None,
                       "compute_busy": a["compute_busy_s"] / m if m else 0.0,
                       "memory_stall": a["memory_stall_s"] / m if m else 0.0,
                       "other": a["other_s"] / m if m else 0.0}
        return out

    # -- run level --------------------------------------------------------------------------------------
    def mfu_block(self) -> MfuBlock:
        """profile.json's ``mfu``: the model's matrix FLOPs over the p50 latency, against the calibrated peak and
        the datasheet's (or why not); HFU not stated (``MfuBlock.hfu``)."""
        a = self.analysis
        flops = a.total.matrix_flops
        p50 = self.latency.p50_s
        mp = a.hardware.matrix_peak_flops_per_s[a.precision.matrix]
        calibrated = PeakMfu(peak_flops_per_s=mp.value, kind=mp.kind, source=mp.source,
                             mfu=mfu(flops, p50, a.precision))
        if self.datasheet is not None:
            dp = self.datasheet.matrix_peak_flops_per_s.get(a.precision.matrix)
            if dp is not None and dp.value:
                datasheet = PeakMfu(hardware=self.datasheet.name, peak_flops_per_s=dp.value, kind=dp.kind,
                                    source=dp.source, mfu=flops / (p50 * dp.value))
            else:
                datasheet = PeakMfu(hardware=self.datasheet.name, mfu=None,
                                    why=f"{self.datasheet.name} lists no {a.precision.matrix} matrix peak")
        else:
            datasheet = PeakMfu(mfu=None, why=self.datasheet_why)
        return MfuBlock(flops, p50, a.precision.matrix, calibrated, datasheet)

    def warnings(self, block: MfuBlock, ratio: float | None) -> list[str]:
        """The figures that cannot be right, each in one line with what it suggests: an MFU above 100% of a peak
        (MFU = FLOPs / (time x peak) cannot pass 1: the FLOPs, the time or the peak is wrong) and a predicted /
        measured ratio beyond RATIO_LIMIT either way."""
        out = []
        hw = self.analysis.hardware.name
        for which, b in (("calibrated", block.calibrated), ("datasheet", block.datasheet)):
            if b.mfu is not None and b.mfu > 1.0:
                name = b.hardware or hw
                out.append(f"MFU {b.mfu:.0%} of the {which} peak ({name}, {b.peak_flops_per_s:.3g} FLOP/s) is "
                           "impossible (above 100%): the FLOPs, the time or the peak is wrong. The peak may not be "
                           f"this device's ({self.device_name}: profile with --hardware local), or was calibrated "
                           "on a loaded host (recalibrate on a quiet one); or the run does less work, or runs a "
                           "faster math mode (TF32 for fp32), than the prediction counts")
        if ratio is not None and not 1 / RATIO_LIMIT <= ratio <= RATIO_LIMIT:
            out.append(f"predicted / measured {ratio:.3g} is beyond {RATIO_LIMIT:g}x either way: the prediction "
                       f"({hw}) is not for this run's device ({self.device_name}), or its profile is stale or was "
                       "calibrated under load, or the run is not the work priced (another dtype, math mode or "
                       "optimizer)")
        return out

    def to_dict(self) -> dict[str, Any]:
        """A computed shape: analysis.json with every node and kernel joined to its measurement."""
        d = self.analysis.to_dict()
        # profile.json versions on its own: analysis.json's version 2 only added keys profile.json carries along
        d["schema_version"] = PROFILE_SCHEMA_VERSION
        d["kind"] = "profile"
        for i, nd in enumerate(d["nodes"]):
            m = self.measured_block(i)
            nd["measured"] = record(m) if m is not None else None
        for kd in d.get("kernels", []):  # eager runs one kernel per node: a kernel's time is its nodes'
            ts = [self.attribution.timings.get(i) for i in kd["nodes"]]
            kd["measured_s"] = sum(t.median_s for t in ts) if ts and all(ts) else None
            kd["predicted_over_measured"] = (kd["predicted_s"] / kd["measured_s"]) if kd["measured_s"] else None
            # per profiled iteration, the kernel's nodes summed (opmap compare's per-kernel rank test reads them)
            vs = [t.values for t in ts] if ts and all(ts) else []
            kd["measured_samples_s"] = ([sum(x) for x in zip(*vs)] if vs and len({len(v) for v in vs}) == 1
                                        else None)
            busy = [self.stall_split(i) for i in kd["nodes"]] if kd["measured_s"] else []
            kd["memory_stall_s"] = sum(b[1] for b in busy) if busy else None
        lts = self.layer_types()
        for lt, s in d["layer_types"].items():
            s["measured"] = lts.get(lt)
        pred = self.analysis.predicted_latency_s
        p50 = self.latency.p50_s
        att = self.attribution
        d["latency"] = {**self.latency.to_dict(), "samples_s": list(self.latency.times_s), "warmup": self.warmup,
                        "mode": self.mode,
                        "method": "perf_counter around each iteration, no profiler attached"
                                  + ("; torch.cuda.synchronize before each clock read"
                                     if self.device.startswith("cuda") else "")}
        plain = (self.around or self.latency).p50_s
        prof = self.profiled.wall.p50_s
        d["profiler"] = {
            "iterations": len(self.profiled.iterations), "record_shapes": "one extra iteration (the matching)",
            "timebase": att.timebase,
            "wall_p50_s": prof, "adjacent_plain_p50_s": plain, "overhead": prof / plain - 1.0 if plain else None,
            "overhead_method": "p50 of the profiled iterations over p50 of the plain iterations adjacent to them",
            "coverage": att.coverage, "iteration_s": att.iteration_s, "attributed_s": att.attributed_s,
            "unattributed_s": att.unattributed_s,
            "method": "profiler events matched to graph nodes in execution order by aten op name; a matched "
                      "event's subtree belongs to its node" + ("; device time = kernels under the op, linked by "
                                                               "correlation id" if att.timebase == "device" else ""),
        }
        block = self.mfu_block()
        d["mfu"] = record(block)
        d["stall_fraction"] = {"method": STALL_METHOD,
                               "layer_types": {lt: {k: s[k] for k in ("compute_busy", "memory_stall", "other",
                                                                       "measured_s")}
                                               for lt, s in lts.items()}}
        en = self.energy.to_dict(len(self.latency.times_s))
        if en["joules"] is not None and en["joules"] > 0:
            iters = len(self.latency.times_s)
            en["flops_per_joule"] = self.analysis.total.flops * iters / en["joules"]
        d["energy"] = en
        d["accuracy"] = {
            "predicted_s": pred, "measured_p50_s": p50, "predicted_over_measured": pred / p50 if p50 else None,
            "layer_types": {lt: s["predicted_over_measured"] for lt, s in lts.items()},
        }
        d["calibration_check"] = record(self.drift) if self.drift is not None else None
        d["optimizer"] = self.optimizer
        d["warnings"] = self.warnings(block, d["accuracy"]["predicted_over_measured"])
        d["tags"] = self.tags.to_dict() if self.tags is not None else {}
        return d
