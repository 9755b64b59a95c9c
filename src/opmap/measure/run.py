"""Measure a workload and join it to its prediction: the orchestration of ``opmap profile``.

``run_profile`` builds nothing itself: it takes a built workload, captures its graph on the device it runs
on (so the graph is the one that runs), predicts it, runs warm-up, a plain timed loop (the latency
distribution), one profiled iteration with shapes (the matching), the profiled iterations, plain ones
after them (the overhead's reference), and a calibration check; then attributes the events to nodes and
returns a ``Profile`` (profile.py).
"""

from __future__ import annotations

import contextlib
import platform
import time
import uuid
from collections.abc import Callable, Sequence

import torch

from opmap import __version__
from opmap.analyze import Analysis, analyze_graph
from opmap.calibrate import calibration_check, device_name
from opmap.capture import capture
from opmap.capture.training import OPTIMIZERS, AdamW, sgd_step, training_loss
from opmap.errors import OpmapError
from opmap.hardware.match import match_datasheet
from opmap.hardware.spec import HardwareSpec, get_hardware
from opmap.measure.attribute import attribute
from opmap.measure.energy import timed_iterations_with_energy
from opmap.measure.profile import Profile
from opmap.measure.runner import make_call, profile_iterations
from opmap.phases.step import with_figures
from opmap.precision import RUNNABLE, resolve_precision
from opmap.tags import Tags
from opmap.timing import LatencyStats, time_iterations
from opmap.workloads.zoo import Workload, check_device

PROFILE_DTYPES = RUNNABLE  # torch dtypes a real run executes in


def check_profile(device: str, dtype: str) -> None:
    """What a profile can run, checked before anything is calibrated, built or captured: a real device that
    is present here (cpu, cuda) and a torch dtype."""
    if device not in ("cpu", "cuda"):
        raise OpmapError(f"profile runs on a real device; accepted: cpu, cuda (got {device!r})")
    if dtype not in PROFILE_DTYPES:
        raise OpmapError(f"profile runs torch dtypes; accepted: {', '.join(PROFILE_DTYPES)} (got {dtype!r}; "
                         "quantized formats: opmap analyze for the prediction, opmap quality for the error)")
    check_device(device, ("cpu", "cuda"))


@contextlib.contextmanager
def fast_path(enabled: bool):
    """PyTorch's fused inference fast path for transformer encoder layers and multi-head attention, set for
    the duration (restored after)."""
    prev = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(enabled)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(prev)


@contextlib.contextmanager
def fp32_math(dtype: str):
    """CUDA matmuls and cuDNN convolutions of fp32 tensors run in TF32 exactly when the dtype priced is tf32, for
    the duration (restored after). torch's own defaults differ from each other (torch docs, "TensorFloat-32 (TF32) on
    Ampere (and later) devices": torch.backends.cuda.matmul.allow_tf32 False, torch.backends.cudnn.allow_tf32
    True): an fp32 profile ran its convolutions at the TF32 rate against the fp32 peak, a tf32 one its matmuls at
    the fp32 rate against the TF32 peak. CPUs have no TF32: the flags change nothing there."""
    tf32 = dtype == "tf32"
    prev = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev


def telemetry_tags(w: Workload, a: Analysis, device: str, device_name: str, mode: str) -> Tags:
    """Stable, versioned tags: the keys and their meaning only change with ``tags_version``."""
    return Tags("profile", run_id=uuid.uuid4().hex, time_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                workload=w.name, batch=w.batch, seq=w.seq, dtype=a.precision.requested, mode=mode, device=device,
                device_name=device_name, hardware_profile=a.hardware.name, host=platform.node(),
                threads=torch.get_num_threads(), torch_version=torch.__version__, opmap_version=__version__,
                python_version=platform.python_version())


def first_shape(node) -> tuple[int, ...]:
    """The node's first non-scalar input shape, as the profiler's record_shapes would show it."""
    return next((tuple(t.shape) for t in node.inputs if len(t.shape)), ())


OPTIMIZER_NAMES = {"adamw": "AdamW", "adamw-fused": "AdamW (fused)", "sgd": "SGD"}


class TrainStep:
    """One training step as the capture records it: forward, training_loss, backward, and the ``optimizer``'s update
    by the same code the capture runs (opmap.capture.training: AdamW with fp32 moments, and fp32 master weights
    under mixed precision, as torch.optim.AdamW; or plain SGD). AdamW's state is made here, before any timing."""

    def __init__(self, module, inputs, optimizer: str = "adamw"):
        if optimizer not in OPTIMIZERS:
            raise OpmapError(f"unknown optimizer {optimizer!r}; accepted: {', '.join(OPTIMIZERS)}")
        self.params = [p for p in module.parameters() if p.is_floating_point()]
        for p in self.params:
            p.requires_grad_(True)
        self.fwd = make_call(module, inputs)
        self.opt = AdamW(self.params, fused=optimizer == "adamw-fused") if optimizer.startswith("adamw") else None

    def __call__(self) -> None:
        training_loss(self.fwd()).backward()
        if self.opt is not None:
            self.opt.step()
        else:
            sgd_step(self.params)

    @property
    def state_bytes(self) -> float:
        """Bytes the optimizer holds beside the model: AdamW's two moments and any fp32 master weights; SGD none."""
        if self.opt is None:
            return 0.0
        held = self.opt.m + self.opt.v + [w for w in self.opt.master if w is not None]
        return float(sum(t.numel() * t.element_size() for t in held))


def _train_analysis(analysis: Analysis, optimizer: str) -> Analysis:
    """A training capture's analysis with the figures and memory of ``optimizer``'s step: the figures name it, and
    SGD (no momentum) holds no optimizer state where the memory fit assumes AdamW's."""
    from dataclasses import replace

    from opmap.phases.fp8 import with_fp8_figures
    from opmap.phases.train import train_figures
    from opmap.workloads.phases import PhaseSpec

    spec = PhaseSpec("train", optimizer=optimizer)
    a = analysis.assumptions
    figures = with_fp8_figures(analysis, train_figures(analysis, spec, int(a.batch or 1), int(a.seq or 1)))
    out = replace(analysis, phase_figures=figures)
    if optimizer == "sgd":
        m = out.memory
        notes = tuple(x for x in m.assumptions if not x.startswith("AdamW"))
        out = replace(out, fit=replace(m, optimizer_bytes=0.0, assumptions=notes + (
            "SGD without momentum: no optimizer state",)))
    return out


def run_profile(workload: Workload, hw: HardwareSpec, dtype: str, device: str, *, warmup: int = 3,
                iters: int = 20, profile_iters: int = 5, overrides: Sequence[tuple[str, str]] = (),
                datasheet: HardwareSpec | None = None, progress: Callable[[str, int], None] | None = None,
                train: bool = False, optimizer: str = "adamw") -> Profile:
    """Measure ``workload`` (built on ``device``) and join it to its prediction on ``hw``.

    ``train``: a training step per iteration (train mode; forward, loss, backward, the ``optimizer``'s update:
    adamw, adamw-fused or sgd, captured and measured alike) instead of an inference forward (eval, no grad).

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
    call = TrainStep(module, workload.inputs, optimizer) if train else make_call(module, workload.inputs)
    name = device_name(dev)
    why = ""
    if datasheet is None:
        if dev.type == "cuda":
            match = match_datasheet(name)
            datasheet = get_hardware(match) if match else None
            why = "" if match else f"no catalog entry matches {name!r}; pass --datasheet NAME"
        else:
            why = ("CPUs are not matched to a datasheet automatically (a datasheet peak is for the whole socket); "
                   "pass --datasheet NAME")
    with torch.enable_grad() if train else torch.no_grad(), fp32_math(dtype), contextlib.ExitStack() as stack:
        step("capturing the graph on the device", 0)
        graph = capture(module, workload.inputs, overrides=overrides, train=train, optimizer=optimizer)
        module.train(train)
        analysis = analyze_graph(graph, workload, hw, dtype, overrides)
        analysis = _train_analysis(analysis, optimizer) if train else with_figures(analysis)
        if any(n.startswith("fast path:") for n in graph.notes):
            # the capture could only record the unfused path: measure that path, so the join is like for like
            stack.enter_context(fast_path(False))
        lat, energy = timed_iterations_with_energy(call, dev, device, warmup, iters, step)
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
    around = LatencyStats(lat.times_s[-profile_iters:] + after.times_s)
    opt = None
    if train:
        opt = {"name": optimizer, "predicted_state_bytes": analysis.memory.optimizer_bytes,
               "measured_state_bytes": call.state_bytes,
               "method": "the update opmap.capture.training runs in the capture and in every timed step (AdamW: "
                         "torch.optim.AdamW's per-parameter update, two fp32 moments, fp32 master weights under "
                         "mixed precision); measured state: the bytes of the optimizer's tensors in this run"}
    return Profile(analysis, device, name, lat, warmup, profiled, att, energy, datasheet, why,
                   mode=(f"training step (forward, loss, backward, {OPTIMIZER_NAMES[optimizer]} update)" if train
                         else "inference"), optimizer=opt,
                   tags=telemetry_tags(workload, analysis, device, name, "train" if train else "inference"),
                   around=around, drift=drift)
