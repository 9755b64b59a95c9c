"""``opmap profile model.onnx``: run an ONNX model in onnxruntime, time it, attribute onnxruntime's measured node
times to the predicted nodes, and return the same ``Profile`` the torch path makes (profile.py).

- Latency: ``InferenceSession.run`` in a plain loop (no profiler), opmap.timing.time_iterations (the one timer).
- Attribution: a second session with onnxruntime's profiler on (``SessionOptions.enable_profiling``) runs the
  profiled iterations; its JSON trace is parsed (never executed). Each ``Node`` event (``<node name>_kernel_time``,
  ``dur`` in microseconds) belongs to the ONNX node of that name, and a predicted node's measured time is the sum of
  the events of the ONNX nodes it covers (one, or the several a fused node stands for: MatMul + bias Add, the
  decomposed attention chain). ``SequentialExecutor::Execute`` spans delimit the iterations. Events of nodes the
  prediction folded away (shape arithmetic onnxruntime computes at run time with dynamic dims) are unattributed.
- Both sessions run the graph as the file holds it, node for node (ORT_DISABLE_ALL): every onnxruntime level that
  rewrites the graph removes or renames nodes (ENABLE_BASIC already folds BatchNormalization into the Conv before
  it), and the join is by name. The shape arithmetic the prediction folds then runs as small nodes of its own: its
  time is reported as unattributed.
- Providers: the CPU provider, or CUDA's when ``device`` is cuda (the trace then times each node's kernels on the
  device thread as onnxruntime reports them).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from opmap.analyze import analyze_graph
from opmap.errors import OpmapError
from opmap.hardware.spec import HardwareSpec
from opmap.measure.attribute import Attribution, NodeTiming
from opmap.measure.energy import timed_iterations_with_energy
from opmap.measure.profile import Profile
from opmap.measure.runner import ProfiledRun
from opmap.timing import LatencyStats, time_iterations
from opmap.workloads.zoo import Workload

KERNEL_SUFFIX = "_kernel_time"
ITERATION_EVENT = "SequentialExecutor::Execute"


def providers(device: str, dtype: str = "fp32") -> list:
    """onnxruntime's execution providers for ``device``. CUDA's runs fp32 GEMMs and convolutions in TF32 unless told
    not to (onnxruntime's CUDAExecutionProviderInfo: "By default, enable TF32 to speed up float GEMM/MatMul or cuDNN
    convolution", ``use_tf32{true}``): an fp32 model then ran at the TF32 rate against the fp32 peak (7.4x it on an
    H100 SXM: 494.7 against 66.9 TFLOP/s dense, NVIDIA's datasheet), an MFU past 100%. TF32 exactly when the dtype
    priced is tf32."""
    if device != "cuda":
        return ["CPUExecutionProvider"]
    return [("CUDAExecutionProvider", {"use_tf32": "1" if dtype == "tf32" else "0"}), "CPUExecutionProvider"]


def session(path: Path, device: str, profile_dir: str | None = None, dtype: str = "fp32"):
    import torch

    from opmap.workloads.onnx import require

    require("onnxruntime")
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3  # errors only: warnings about unused initializers are not the user's problem
    # onnxruntime's own default is a thread per physical core, whatever torch (and so the calibration the prediction
    # reads: `opmap calibrate` times torch's intra-op threads) uses: with OMP_NUM_THREADS=1 the calibrated peak is one
    # thread's and the run took every core (predicted / measured 16 on 16 cores, an MFU past 100%). The run uses
    # the threads the calibration does.
    so.intra_op_num_threads = torch.get_num_threads()
    if profile_dir is not None:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(profile_dir, "ort")
    if device == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
        raise OpmapError("--device cuda: this onnxruntime has no CUDA provider (onnxruntime-gpu); accepted: cpu")
    try:
        return ort.InferenceSession(str(path), so, providers=providers(device, dtype))
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own types; one line for the user
        text = str(e).strip().splitlines()
        raise OpmapError(f"onnxruntime cannot load {path}: {text[0][:300] if text else type(e).__name__}") from None


def parse_trace(text: str) -> list[tuple[float, list[tuple[str, float]]]]:
    """onnxruntime's profile JSON -> per iteration: (its span in seconds, [(node name, microseconds)]).
    Iterations are the ``SequentialExecutor::Execute`` spans; node events are those inside one."""
    try:
        events = json.loads(text)
    except json.JSONDecodeError as e:
        raise OpmapError(f"onnxruntime's profile is not JSON ({e.msg}); the trace is truncated") from None
    if not isinstance(events, list):
        raise OpmapError("onnxruntime's profile is not a list of trace events")
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
                   if isinstance(e, dict) and e.get("name") == ITERATION_EVENT and "dur" in e)
    nodes = [(float(e["ts"]), str(e["name"])[:-len(KERNEL_SUFFIX)], float(e.get("dur", 0.0))) for e in events
             if isinstance(e, dict) and e.get("cat") == "Node" and str(e.get("name", "")).endswith(KERNEL_SUFFIX)]
    out = []
    for s, t in spans:
        out.append(((t - s) / 1e6, [(n, d) for ts, n, d in nodes if s <= ts <= t]))
    return out


def join(analysis, iterations: list[tuple[float, list[tuple[str, float]]]]) -> Attribution:
    """Measured node times onto the predicted nodes by ONNX node name (see the module docstring)."""
    owner: dict[str, int] = {}
    for i, r in enumerate(analysis.results):
        for name in r.node.args.get("onnx_nodes") or [r.node.args.get("onnx_node")]:
            if name:
                owner.setdefault(str(name), i)
    per: dict[int, list[float]] = {}
    sums, coverage = [], 1.0
    kernels = {i for i, r in enumerate(analysis.results) if r.cost.kernel}
    for _span, events in iterations:
        acc: dict[int, float] = {}
        for name, us in events:
            i = owner.get(name)
            if i is not None:
                acc[i] = acc.get(i, 0.0) + us / 1e6
        for i, s in acc.items():
            per.setdefault(i, []).append(s)
        sums.append(sum(acc.values()))
        if kernels:
            coverage = min(coverage, len(set(acc) & kernels) / len(kernels))
    if not iterations:
        coverage = 0.0
    timings = {i: NodeTiming(statistics.median(ts), min(ts), max(ts), len(ts), (), tuple(ts)) for i, ts in per.items()}
    return Attribution(timings, coverage, statistics.median(s for s, _ in iterations) if iterations else 0.0,
                       statistics.median(sums) if sums else 0.0, "cpu")


def run_onnx_profile(workload: Workload, path: Path, hw: HardwareSpec, dtype: str, device: str = "cpu", *,
                     warmup: int = 3, iters: int = 20, profile_iters: int = 5, datasheet: HardwareSpec | None = None,
                     progress: Callable[[str, int], None] | None = None) -> Profile:
    """Time ``workload`` (an ONNX file's graph, ``load_onnx``) in onnxruntime and join it to its prediction."""
    import torch

    from opmap.measure.run import telemetry_tags

    if iters < 1 or profile_iters < 1 or warmup < 0:
        raise OpmapError(f"iterations must be positive (got --iters {iters}, --profile-iters {profile_iters}, "
                         f"--warmup {warmup})")
    step = progress or (lambda _s, _n: None)
    analysis = analyze_graph(workload.graph, workload, hw, dtype)
    sess = session(path, device, dtype=dtype)
    import onnxruntime as ort

    x = _feeds(sess, _bound_shapes(sess, workload))
    call = lambda: sess.run(None, x)  # noqa: E731
    dev = torch.device("cpu")  # onnxruntime's run returns when its work is done: no device sync to add
    lat, energy = timed_iterations_with_energy(call, dev, device, warmup, iters, step)
    step("profiled iterations", 0)
    with tempfile.TemporaryDirectory(prefix="opmap-ort-") as tmp:
        psess = session(path, device, tmp, dtype)
        psess.run(None, x)  # the profiled session's first run pays its own set-up: not an iteration
        walls = time_iterations(lambda: psess.run(None, x), dev, profile_iters, lambda: step("profiled iterations", 1))
        trace_path = psess.end_profiling()
        text = Path(trace_path).read_text()
    iterations = parse_trace(text)[1:]  # the set-up run first
    att = join(analysis, iterations)
    after = time_iterations(call, dev, profile_iters)
    around = LatencyStats(lat.times_s[-profile_iters:] + after.times_s)
    prof = ProfiledRun([(span, []) for span, _ in iterations], walls, None)
    name = f"onnxruntime {ort.__version__} {sess.get_providers()[0]}"
    why = "" if datasheet is not None else ("CPUs are not matched to a datasheet automatically (a datasheet peak is "
                                            "for the whole socket); pass --datasheet NAME")
    return Profile(analysis, device, name, lat, warmup, prof, att, energy, datasheet, why,
                   mode="inference (onnxruntime)", tags=telemetry_tags(workload, analysis, device, name, "inference"),
                   around=around, drift=None)


def _bound_shapes(sess, workload: Workload) -> dict[str, tuple[int, ...]]:
    """Each session input's shape with its dynamic dims bound as the analysis bound them (the graph's inputs)."""
    names = [i.name for i in sess.get_inputs()]
    if len(names) != len(workload.graph.inputs):
        raise OpmapError(f"onnxruntime sees {len(names)} inputs, the analysis {len(workload.graph.inputs)}; "
                         "the model's inputs are ambiguous")
    return {k: tuple(m.shape) for k, m in zip(names, workload.graph.inputs)}


def _feeds(sess, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    types = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
             "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_}
    out = {}
    for i in sess.get_inputs():
        dt = types.get(i.type)
        if dt is None:
            raise OpmapError(f"input {i.name!r} has type {i.type}; profile feeds float, int and bool tensors")
        shape = shapes[i.name]
        if np.issubdtype(dt, np.floating):
            out[i.name] = rng.standard_normal(shape).astype(dt)
        else:
            out[i.name] = (np.ones if "mask" in i.name.lower() else np.zeros)(shape, dtype=dt)
    return out
