"""A phase's step: capture the step the phase names, run it through the pipeline (opmap.analyze), and set the
phase's figures and memory fit on the result. ``with_figures`` gives a bare pipeline result the figures of the
step it holds (a forward pass: prefill; a training capture: one iteration at its captured batch)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from opmap.analyze import Analysis, analyze_graph
from opmap.capture import capture
from opmap.errors import OpmapError
from opmap.graph import OpGraph
from opmap.hardware.spec import HardwareSpec
from opmap.mapping.activations import SavedActivations
from opmap.mapping.memory import MemoryFit
from opmap.phases.decode import decode_figures, decode_fit
from opmap.phases.fp8 import with_fp8_figures
from opmap.phases.prefill import prefill_figures
from opmap.phases.result import PhaseResult, TrainStep
from opmap.phases.runtime import with_runtime
from opmap.phases.train import train_figures, train_fit
from opmap.workloads.zoo import Workload


def default_figures(a: Analysis) -> PhaseResult | TrainStep:
    """The figures of the step a bare pipeline result holds: a training capture's iteration (one microstep, its
    optimizer step, at the captured batch and sequence), else the forward pass as prefill."""
    if a.assumptions.training:
        from opmap.workloads.phases import PhaseSpec

        return with_fp8_figures(a, train_figures(a, PhaseSpec("train"), int(a.assumptions.batch or 1),
                                                 int(a.assumptions.seq or 1)))
    return prefill_figures(a)


def with_figures(a: Analysis) -> Analysis:
    """``a`` with its phase figures set (``default_figures``) unless a phase set them already."""
    return a if a.phase_figures is not None else replace(a, phase_figures=default_figures(a))


@dataclass(frozen=True)
class PhaseAnalysis:
    """A phase's result: the analysis of the captured step (the prefill pass, the decode step, one training
    microstep with its optimizer step) with the phase figures and the memory fit set on it."""

    spec: Any  # opmap.workloads.phases.PhaseSpec
    analysis: Analysis

    @property
    def figures(self) -> PhaseResult | TrainStep:
        f = self.analysis.phase_figures
        assert f is not None  # analyze_phase sets them
        return f

    @property
    def memory(self) -> MemoryFit:
        return self.analysis.memory


def analyze_phase(graph: OpGraph, workload: Workload, hw: HardwareSpec, dtype: str, spec,
                  overrides: Sequence[tuple[str, str]] = (), fusion: str = "eager", plan_file=None,
                  evidence: str = "", saved: SavedActivations | None = None,
                  activations: Callable[[int, int], float] | None = None, runtime=None,
                  steady: bool = False) -> PhaseAnalysis:
    """Cost, map and predict the captured step of ``spec`` (``capture_phase``) and add the phase's figures and
    memory fit. Train: ``activations(microbatch, seq)``, the bytes kept for backward (``train_activations``: the
    measured saved tensors of the module under the recompute policy); ``saved`` the measurement at the captured
    shape (for its notes). ``runtime``: an opmap.phases.runtime.Runtime for ``hw`` (the catalog device, not yet
    applied): its per-kernel overhead replaces the device's and its per-step time is added once per step (None:
    the catalog's eager launch, nothing per step); the fusion policy stays the caller's ``fusion``. ``steady``:
    the step repeats under steady load (a serving run): a power-limited card runs it at its sustained rate."""
    if runtime is not None and spec.train and runtime.name != "eager":
        raise OpmapError(f"runtime {runtime.name} prices serving steps (prefill, decode); a training step runs "
                         "eager here: use runtime eager")
    if runtime is not None:
        hw = runtime.apply(hw)
    a = analyze_graph(graph, workload, hw, dtype, overrides, fusion, plan_file, evidence,
                      repeats=math.inf if steady else 1)
    if runtime is not None:
        a = with_runtime(a, runtime)
    assumptions = replace(a.assumptions, phase=spec)
    a = replace(a, assumptions=assumptions)
    if spec.decode:
        figures = decode_figures(a, spec.kv_len)
        fit = decode_fit(a, workload, spec.kv_len)
    elif spec.train:
        mb, seq = workload.batch, workload.seq or 1
        fit = train_fit(a, spec, mb, seq, saved, activations)
        figures = with_fp8_figures(a, train_figures(a, spec, mb, seq))
    else:
        figures = prefill_figures(a)
        fit = None
    a = replace(a, assumptions=assumptions, phase_figures=figures, fit=fit)
    return PhaseAnalysis(spec, a)


def capture_phase(workload: Workload, spec, overrides: Sequence[tuple[str, str]] = ()) -> OpGraph:
    """Capture the step ``spec`` names: a training step (forward, loss, backward, optimizer) for train, the
    forward otherwise (the decode workload carries its KV cache as inputs)."""
    if spec.train:
        return capture(workload.module, workload.inputs, overrides=overrides, train=True, optimizer=spec.optimizer)
    return capture(workload.module, workload.inputs, overrides=overrides)
