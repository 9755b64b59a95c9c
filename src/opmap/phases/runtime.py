"""The runtime a step runs under, as a stated assumption with sourced overheads.

- ``eager``: every kernel is a host launch (PyTorch eager, HF generate): each kernel pays the device's
  ``launch_overhead_s`` (the catalog's).
- ``graphs``: a decode (or prefill) step is captured once and replayed as one graph (CUDA graphs, HIP graphs,
  HPU graph mode): one graph launch per step, and inside it each kernel still pays the gap a graph has
  between dependent kernels (the grid drains, the next one fills).
- ``engine``: graphs plus the kernels serving engines ship (TensorRT-LLM, vLLM, SGLang): the fusion plan
  ``engine`` (fused attention including paged decode attention, norm / RoPE / activation fused, GEMM epilogues)
  and the scheduler's host time per step (batch formation, block tables, sampling bookkeeping) that a graph
  replay does not hide.
- ``engine-eager``: an engine run with its graphs off: the engine's fused kernels and scheduler, each kernel a
  host launch (the device's ``launch_overhead_s``, as eager). Where production runs were published so: vLLM
  ``--enforce-eager`` (AMD's MLPerf v4.1 harness), NVIDIA's MLPerf v4.1 Llama-2-70B harness (``use_graphs =
  False``), TensorRT-LLM's Triton backend before v0.15 (no CUDA-graph option).

A ``Runtime`` is applied by ``Runtime.apply(hw)``: the device with its per-kernel overhead replaced by the
runtime's, so the time model, the kernel rows and the sharded layouts (opmap.mapping.sharding) all price the
same per-kernel cost; ``per_step_s`` is then added once per step by whoever prices steps (prefill, decode,
serving). The overheads per software stack live in ``opmap/hardware/runtimes.toml`` (typed and sourced like
the catalog)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

from opmap.errors import OpmapError
from opmap.hardware.spec import HardwareSpec, Value
from opmap.record import key

if TYPE_CHECKING:
    from opmap.analyze import Analysis

RUNTIMES = ("eager", "graphs", "engine", "engine-eager")
RUNTIME_HELP = ("eager (a host launch per kernel), graphs (one graph launch per step), engine (graphs plus a "
                "serving engine's fused kernels and scheduler) or engine-eager (the engine's kernels and "
                "scheduler with graphs off: a host launch per kernel)")


@dataclass(frozen=True)
class Runtime:
    """The runtime ``name`` on one device: seconds per kernel and per step, each with its source."""

    # the record (a report's ``runtime`` block, read back by ``from_dict``): each Value under its ``_s`` name
    RECORD: ClassVar[tuple[str, ...]] = ("name", "stack", "fusion", "per_kernel", "per_step_s", "graph_launch",
                                         "step_host")
    name: str
    # what each kernel pays on top of its busy time (launch, or the in-graph gap)
    per_kernel: Value = field(metadata=key(name="per_kernel_s"))
    graph_launch: Value | None = field(metadata=key(name="graph_launch_s"))  # one graph replay per step (eager: None)
    step_host: Value | None = field(metadata=key(name="step_host_s"))  # the engine scheduler's host time per step
    fusion: str  # the fusion policy the step's kernels are planned with (opmap.mapping.fusion.POLICIES)
    stack: str  # the software stack the values come from (cuda-graphs, hip-graphs, ...)

    @property
    def per_kernel_s(self) -> float:
        return float(self.per_kernel.value)

    @property
    def kv_write(self) -> str:
        """How a decode step under this runtime stores its new K and V (opmap.workloads.phases.KV_WRITES): eager is
        transformers' own DynamicCache, which appends by torch.cat; every other runtime writes one token in place
        (an engine's paged blocks; transformers' StaticCache, which CUDA graphs need)."""
        return "append" if self.name == "eager" else "in-place"

    @property
    def per_step_s(self) -> float:
        return sum(float(v.value) for v in (self.graph_launch, self.step_host) if v is not None)

    def apply(self, hw: HardwareSpec) -> HardwareSpec:
        """``hw`` with its per-kernel overhead replaced by this runtime's (every other field as it was)."""
        if self.graph_launch is None:  # every kernel a host launch: the device's own launch overhead
            return hw
        return replace(hw, fields={**hw.fields, "launch_overhead_s": self.per_kernel})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Runtime:
        """The runtime a report's ``runtime`` block (its ``record``) was written from."""
        def value(v: dict[str, Any] | None) -> Value | None:
            return Value(**v) if v is not None else None

        per_kernel = value(d["per_kernel_s"])
        assert per_kernel is not None
        return cls(d["name"], per_kernel, value(d["graph_launch_s"]), value(d["step_host_s"]), d["fusion"], d["stack"])

    def line(self) -> str:
        """One line for a report header: the analysis sheet's and opmap serve's."""
        if self.name == "eager":
            return f"runtime eager: a host launch per kernel ({self.per_kernel_s * 1e6:.3g} us)"
        if self.graph_launch is None:
            host = float(self.step_host.value) * 1e6 if self.step_host is not None else 0.0
            return (f"runtime {self.name} ({self.stack} stack, graphs off): a host launch per kernel "
                    f"({self.per_kernel_s * 1e6:.3g} us), {host:.3g} us scheduler gap per step, fusion {self.fusion}")
        launch = float(self.graph_launch.value) if self.graph_launch is not None else 0.0
        s = (f"runtime {self.name} ({self.stack}): one graph launch per step ({launch * 1e6:.3g} us), "
             f"{self.per_kernel_s * 1e6:.3g} us between kernels")
        if self.step_host is not None:
            s += (f", {float(self.step_host.value) * 1e6:.3g} us scheduler gap per step (what overlapped scheduling "
                  f"leaves exposed), fusion {self.fusion}")
        return s


def check_runtime(name: str) -> str:
    if name not in RUNTIMES:
        raise OpmapError(f"unknown runtime {name!r}; accepted: {RUNTIME_HELP}")
    return name


def get_runtime(hw: HardwareSpec, name: str) -> Runtime:
    """The runtime ``name`` on ``hw``, its overheads from the device's software stack
    (opmap.hardware.runtimes)."""
    from opmap.hardware.runtimes import stack_for

    check_runtime(name)
    if name == "eager":
        return Runtime("eager", hw.fields["launch_overhead_s"], None, None, "eager", "eager")
    stack = stack_for(hw)
    if name == "engine-eager":
        return Runtime(name, hw.fields["launch_overhead_s"], None, stack.values["engine_step_host_s"], "engine",
                       stack.name)
    return Runtime(name, stack.values["graph_kernel_gap_s"], stack.values["graph_launch_s"],
                   stack.values["engine_step_host_s"] if name == "engine" else None,
                   "engine" if name == "engine" else "eager", stack.name)


def with_runtime(a: Analysis, runtime) -> Analysis:
    """``a`` with the runtime it ran under (an opmap.phases.runtime.Runtime, applied to the device before the
    analysis: ``Runtime.apply``) in its assumptions: the prefill and decode figures add its per-step time once
    per step, and the report's header names it."""
    return replace(a, assumptions=replace(a.assumptions, runtime=runtime, runtime_line=runtime.line()))


def with_confidence(a: Analysis, group: int = 1) -> Analysis:
    """``a`` with how far to trust its figures (opmap.hardware.trust) in its assumptions: the weakest of the matrix
    rate of the format priced, the memory rate, the links a collective group of ``group`` devices crosses and the
    runtime's overheads."""
    from opmap.hardware.trust import confidence, moe_input

    s = a.assumptions
    extra = (moe_input(a.hardware, s.dtype, s.moe_grid),) if s.moe_grid else ()
    c = confidence(a.hardware, s.dtype, s.runtime.name if s.runtime is not None else "eager", group, extra=extra)
    return replace(a, assumptions=replace(s, confidence=c))


def runtime_text(a: Analysis) -> str:
    rt, step = a.assumptions.runtime, a.runtime_per_step_s
    if rt is None or not step:
        return ""
    return f", {a.kernels} kernels + {step * 1e6:.3g} us per step ({rt.name})"
