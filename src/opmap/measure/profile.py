"""The profile pipeline: run the workload for real, attribute measured time to nodes, join to the prediction.

``Profile.to_dict`` is profile.json: analysis.json (same nodes, same ids) plus a ``measured`` block on every
node and the run-level blocks ``latency``, ``profiler``, ``mfu``, ``stall_fraction``, ``energy``,
``accuracy`` and ``tags``. The method of each figure travels beside it.

Memory-stall fraction, roofline-estimated (no hardware counters are read on this path). Per node, with
the calibrated ceilings of the hardware profile the prediction used::

    compute_busy = min(measured, matrix FLOPs / matrix peak + vector work / vector peak)
    memory_stall = min(measured - compute_busy, max(0, bytes / bandwidth - compute_busy))
    other        = measured - compute_busy - memory_stall      (dispatch, inefficiency, unexplained)

A layer type's fractions are its sums over its nodes divided by its measured time.
"""

from __future__ import annotations

import platform
import re
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from opmap import __version__
from opmap.analyze import Analysis, analyze_graph
from opmap.capture import capture
from opmap.errors import OpmapError
from opmap.hardware.spec import HardwareSpec
from opmap.measure.attribute import Attribution, attribute
from opmap.measure.energy import EnergyReading, measure_energy
from opmap.measure.runner import LatencyStats, ProfiledRun, make_call, profile_iterations, time_iterations
from opmap.predict import TRANSCENDENTAL_SLOTS, mfu, resolve_precision
from opmap.workloads.zoo import Workload, check_device

TAGS_VERSION = 1
MFU_FORMULA = "MFU = model matrix FLOPs / (p50 latency x dense matrix peak at the compute dtype)"
STALL_METHOD = ("roofline-estimated: per node, compute-busy = FLOPs at the calibrated peaks, memory-stall = "
                "time beyond that which the bytes at the calibrated bandwidth explain, other = the rest")

# Catalog entries a CUDA device name maps to (torch.cuda.get_device_name spellings). CPUs are not matched
# automatically: a datasheet peak is for a whole socket, a VM or a thread-limited run has a slice of it.
DATASHEET_MATCH = (
    ("h200", r"\bH200\b"), ("h100-pcie", r"\bH100\b.*PCIe"), ("h100-sxm", r"\bH100\b"), ("b200", r"\bB200\b"),
    ("a100-pcie-40gb", r"\bA100\b.*PCIE.*40GB"), ("a100-sxm-80gb", r"\bA100\b"), ("l40s", r"\bL40S\b"),
    ("l4", r"\bL4\b"), ("mi300x", r"MI300X"), ("mi250x", r"MI250X"),
)


def match_datasheet(device_name: str) -> str | None:
    for name, pattern in DATASHEET_MATCH:
        if re.search(pattern, device_name, re.IGNORECASE):
            return name
    return None


@dataclass
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
    tags: dict[str, Any] = field(default_factory=dict)
    around: LatencyStats | None = None  # plain iterations adjacent to the profiled ones
    drift: dict[str, Any] | None = None  # calibration_check at profile time

    # -- per node ---------------------------------------------------------------------------------------
    def stall_split(self, i: int) -> tuple[float, float, float]:
        """(compute-busy, memory-stall, other) seconds of node ``i`` (roofline-estimated)."""
        t = self.attribution.timings.get(i)
        if t is None:
            return 0.0, 0.0, 0.0
        r = self.analysis.results[i]
        hw, prec = self.analysis.hardware, self.analysis.precision
        m = t.median_s
        compute = (r.cost.matrix_flops / prec.matrix_peak_flops_per_s
                   + (r.cost.vector_flops + TRANSCENDENTAL_SLOTS * r.cost.transcendental_flops)
                   / prec.vector_peak_flops_per_s)
        busy = min(m, compute)
        stall = min(m - busy, max(0.0, r.cost.bytes / hw.memory_bandwidth_bytes_per_s - busy))
        return busy, stall, m - busy - stall

    def measured_block(self, i: int) -> dict[str, Any] | None:
        t = self.attribution.timings.get(i)
        if t is None:
            return None
        r = self.analysis.results[i]
        busy, stall, other = self.stall_split(i)
        m = t.median_s
        d = t.to_dict()
        d.update({
            "achieved_flops_per_s": r.cost.flops / m if m > 0 else 0.0,
            "achieved_matrix_flops_per_s": r.cost.matrix_flops / m if m > 0 else 0.0,
            "achieved_bytes_per_s": r.cost.bytes / m if m > 0 else 0.0,
            "predicted_over_measured": r.pred.predicted_s / m if m > 0 else None,
            "compute_busy_s": busy, "memory_stall_s": stall, "other_s": other,
        })
        return d

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
    def mfu_block(self) -> dict[str, Any]:
        a = self.analysis
        flops = a.total.matrix_flops
        p50 = self.latency.p50_s
        mp = a.hardware.matrix_peak_flops_per_s[a.precision.matrix]
        out: dict[str, Any] = {
            "formula": MFU_FORMULA, "model_matrix_flops": flops, "latency_s": p50, "dtype": a.precision.matrix,
            "calibrated": {"peak_flops_per_s": mp.value, "kind": mp.kind, "source": mp.source,
                           "mfu": mfu(flops, p50, a.precision)},
        }
        if self.datasheet is not None:
            dp = self.datasheet.matrix_peak_flops_per_s.get(a.precision.matrix)
            if dp is not None and dp.value:
                out["datasheet"] = {"hardware": self.datasheet.name, "peak_flops_per_s": dp.value,
                                    "kind": dp.kind, "source": dp.source, "mfu": flops / (p50 * dp.value)}
            else:
                out["datasheet"] = {"hardware": self.datasheet.name, "mfu": None,
                                    "why": f"{self.datasheet.name} lists no {a.precision.matrix} matrix peak"}
        else:
            out["datasheet"] = {"mfu": None, "why": self.datasheet_why}
        # Hardware FLOPs differ from model FLOPs where a kernel computes work the model does not need
        # (recomputation, the masked half of a causal product). The eager inference run does neither:
        # attention kernels that skip the masked half are counted at what they compute.
        out["hfu"] = {"mfu": None, "why": "hardware FLOPs equal model FLOPs in this run (no recomputation; "
                                          "causal attention counted at the half it computes)"}
        return out

    def to_dict(self) -> dict[str, Any]:
        d = self.analysis.to_dict()
        d["kind"] = "profile"
        for i, nd in enumerate(d["nodes"]):
            nd["measured"] = self.measured_block(i)
        for kd in d.get("kernels", []):  # eager runs one kernel per node: a kernel's time is its nodes'
            ts = [self.attribution.timings.get(i) for i in kd["nodes"]]
            kd["measured_s"] = sum(t.median_s for t in ts) if ts and all(ts) else None
            kd["predicted_over_measured"] = (kd["predicted_s"] / kd["measured_s"]) if kd["measured_s"] else None
        lts = self.layer_types()
        for lt, s in d["layer_types"].items():
            s["measured"] = lts.get(lt)
        pred = self.analysis.predicted_latency_s
        p50 = self.latency.p50_s
        att = self.attribution
        d["latency"] = {**self.latency.to_dict(), "warmup": self.warmup, "mode": self.mode,
                        "method": "perf_counter around each iteration, no profiler attached"
                                  + ("; torch.cuda.synchronize before each clock read" if self.device.startswith("cuda") else "")}
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
        d["mfu"] = self.mfu_block()
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
        d["calibration_check"] = self.drift
        d["tags"] = self.tags
        return d


def telemetry_tags(w: Workload, a: Analysis, device: str, device_name: str, mode: str) -> dict[str, Any]:
    """Stable, versioned tags: the keys and their meaning only change with ``tags_version``."""
    return {
        "tags_version": TAGS_VERSION, "run_id": uuid.uuid4().hex,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "workload": w.name, "batch": w.batch, "seq": w.seq, "dtype": a.precision.requested, "mode": mode,
        "device": device, "device_name": device_name, "hardware_profile": a.hardware.name,
        "host": platform.node(), "threads": torch.get_num_threads(),
        "torch_version": torch.__version__, "opmap_version": __version__,
        "python_version": platform.python_version(),
    }


def device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    from opmap.hardware.calibrate import fingerprint

    return str(fingerprint(dev)["model"])


def first_shape(node) -> tuple[int, ...]:
    """The node's first non-scalar input shape, as the profiler's record_shapes would show it."""
    return next((tuple(t.shape) for t in node.inputs if len(t.shape)), ())


DRIFT_TOLERANCE = 0.10  # beyond this, the device is not in the state it was calibrated in: say so


def calibration_check(hw: HardwareSpec, dev: torch.device) -> dict[str, Any] | None:
    """Re-time one calibrated GEMM (the one nearest 1024^3 in log2 m, n, k, in nn.Linear's layout) now, beside the profile's
    figure: a loaded or throttled device shows as a ratio away from 1, which explains a prediction that
    drifted with it. None for a profile without a calibration, or for a calibration of another device."""
    from opmap.hardware.calibrate import DTYPES, time_op

    cal = hw.calibration or {}
    if not str(cal.get("device", "")).startswith(dev.type):
        return None
    rows = [r for r in cal.get("matmul", []) if r.get("layout", "nt") == "nt" and r["dtype"] == "fp32"]
    if not rows:
        return None
    import math

    r = min(rows, key=lambda r: sum(abs(math.log2(r[x]) - 10) for x in ("m", "n", "k")))
    a = torch.randn(r["m"], r["k"], device=dev, dtype=DTYPES["fp32"])
    w = torch.randn(r["n"], r["k"], device=dev, dtype=DTYPES["fp32"])
    with torch.no_grad():
        s = time_op(lambda: torch.mm(a, w.t()), dev, repeats=5, min_time_s=0.01)
    now = 2.0 * r["m"] * r["n"] * r["k"] / s.median_s
    ratio = now / r["flops_per_s"]
    return {"what": f"matmul fp32 {r['m']}x{r['n']}x{r['k']} (x @ W.T)", "calibrated_flops_per_s": r["flops_per_s"],
            "now_flops_per_s": now, "ratio": ratio, "within_tolerance": abs(ratio - 1.0) <= DRIFT_TOLERANCE,
            "tolerance": DRIFT_TOLERANCE}


def train_step_fn(module, inputs) -> Callable[[], Any]:
    """One training step as the capture records it: forward, training_loss, backward, SGD update."""
    from opmap.capture.tracer import sgd_step, training_loss

    params = [p for p in module.parameters() if p.is_floating_point()]
    for p in params:
        p.requires_grad_(True)
    fwd = make_call(module, inputs)

    def step():
        loss = training_loss(fwd())
        loss.backward()
        sgd_step(params)

    return step


PROFILE_DTYPES = ("fp32", "tf32", "bf16", "fp16")


def check_profile(device: str, dtype: str) -> None:
    """What a profile can run, checked before anything is calibrated, built or captured: a real device that
    is present here (cpu, cuda) and a torch dtype."""
    if device not in ("cpu", "cuda"):
        raise OpmapError(f"profile runs on a real device; accepted: cpu, cuda (got {device!r})")
    if dtype not in PROFILE_DTYPES:
        raise OpmapError(f"profile runs torch dtypes; accepted: {', '.join(PROFILE_DTYPES)} (got {dtype!r}; "
                         "quantized formats: opmap analyze for the prediction, opmap quality for the error)")
    check_device(device, ("cpu", "cuda"))


def run_profile(workload: Workload, hw: HardwareSpec, dtype: str, device: str, *, warmup: int = 3, iters: int = 20,
                profile_iters: int = 5, overrides: Sequence[tuple[str, str]] = (), datasheet: HardwareSpec | None = None,
                progress: Callable[[str, int], None] | None = None, train: bool = False) -> Profile:
    """Measure ``workload`` (built on ``device``) and join it to its prediction on ``hw``.

    ``train``: a training step per iteration (train mode; forward, loss, backward, SGD update) instead of
    an inference forward (eval, no grad).

    ``progress(stage, advance)`` is called once per iteration (``advance`` 1) and at stage changes (0).
    """
    if iters < 1 or profile_iters < 1 or warmup < 0:
        raise OpmapError(f"iterations must be positive (got --iters {iters}, --profile-iters {profile_iters}, "
                         f"--warmup {warmup})")
    dev = torch.device(device)
    check_profile(dev.type, dtype)
    resolve_precision(hw, dtype)  # a dtype the hardware lacks fails before the capture runs
    step = progress or (lambda _s, _n: None)
    module = workload.module.train(train)
    call = train_step_fn(module, workload.inputs) if train else make_call(module, workload.inputs)
    name = device_name(dev)
    why = ""
    if datasheet is None:
        if dev.type == "cuda":
            from opmap.hardware.spec import catalog

            match = match_datasheet(name)
            datasheet = catalog()[match] if match else None
            why = "" if match else f"no catalog entry matches {name!r}; pass --datasheet NAME"
        else:
            why = ("CPUs are not matched to a datasheet automatically (a datasheet peak is for the whole socket); "
                   "pass --datasheet NAME")
    with torch.enable_grad() if train else torch.no_grad():
        step("capturing the graph on the device", 0)
        graph = capture(module, workload.inputs, overrides=overrides, train=train)
        module.train(train)
        analysis = analyze_graph(graph, workload, hw, dtype, overrides)
        step("warm-up", 0)
        for _ in range(warmup):
            call()
            step("warm-up", 1)
        holder: dict[str, LatencyStats] = {}

        def timed() -> float:
            holder["lat"] = time_iterations(call, dev, iters, lambda: step("timed iterations", 1))
            return sum(holder["lat"].times_s)

        step("timed iterations", 0)
        _, energy = measure_energy(timed, device)
        step("profiled iterations", 0)
        # one iteration with record_shapes fixes how events map to nodes (names and input shapes); the timed
        # profiled iterations run without it, since recording shapes slows a long iteration measurably
        shaped = profile_iterations(call, dev, 1, record_shapes=True, keep_trace=False)
        profiled = profile_iterations(call, dev, profile_iters, record_shapes=False,
                                      progress=lambda: step("profiled iterations", 1))
        # plain iterations right after the profiled ones: the overhead compares profiled iterations with the
        # plain ones around them (the last of the timed loop and these), so slow drift on a shared machine
        # does not read as profiler overhead
        after = time_iterations(call, dev, profile_iters)
        step("calibration check", 0)
        drift = calibration_check(hw, dev)
    ops = [n.op for n in graph.nodes]
    kernel_nodes = [i for i, r in enumerate(analysis.results) if r.cost.kernel]
    att = attribute(ops, kernel_nodes, profiled.iterations, use_device_time=dev.type == "cuda",
                    first_shapes=[first_shape(n) for n in graph.nodes],
                    template_events=shaped.iterations[0][1] if shaped.iterations else None)
    around = LatencyStats(holder["lat"].times_s[-profile_iters:] + after.times_s)
    p = Profile(analysis, device, name, holder["lat"], warmup, profiled, att, energy, datasheet, why,
                mode="training step (forward, loss, backward, SGD update)" if train else "inference", around=around,
                drift=drift)
    p.tags = telemetry_tags(workload, analysis, device, name, "train" if train else "inference")
    return p
