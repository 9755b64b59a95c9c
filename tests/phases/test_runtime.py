"""The runtime a step runs under (opmap.phases.runtime): eager, graphs and engine step times against their closed
forms, the stacks' sourced overheads, and where a runtime does not apply."""

from __future__ import annotations

import pytest

from opmap.errors import OpmapError
from opmap.hardware import get_hardware
from opmap.hardware.runtimes import stack_for, stacks
from opmap.hardware.spec import KINDS
from opmap.phases.runtime import RUNTIMES, check_runtime, get_runtime
from opmap.phases.step import analyze_phase, capture_phase
from opmap.record import record
from opmap.workloads.phases import PhaseSpec, check_phase, phase_workload

# The overheads the closed forms use, each from its source (not from the code under test):
EAGER_LAUNCH_S = 4e-6  # h100-sxm.toml launch_overhead_s: ~4 us per op in eager mode (assumed)
GRAPH_GAP_S = 0.5e-6  # NVIDIA blog, Getting Started with CUDA Graphs (2019): 3.4 us per 2.9 us kernel in a graph
GRAPH_LAUNCH_S = 15e-6  # ahrefs/ocannl issue 488: a replayed graph costs ~15 us fixed + 0.58 us per node
ENGINE_GAP_S = 160e-6  # vLLM PR 11133: 150-170 us between decode steps under asynchronous scheduling


@pytest.fixture(scope="module")
def h100():
    return get_hardware("h100-sxm")


@pytest.fixture(scope="module")
def gpt2_decode():
    spec = check_phase(PhaseSpec("decode", 128), "gpt2", 4)
    w = phase_workload("gpt2", spec, 4, None, "bf16")
    return spec, w, capture_phase(w, spec)


def _step(gpt2_decode, hw, name):
    spec, w, g = gpt2_decode
    rt = get_runtime(hw, name)
    return analyze_phase(g, w, hw, "bf16", spec, fusion=rt.fusion, runtime=rt).analysis


def _busy_s(a) -> float:
    """Each kernel's time less the per-kernel overhead it pays (the roofline adds the overhead to the busy max)."""
    return sum(k.time.predicted_s - k.time.overhead_s for k in a.kernel_results)


def test_graph_against_eager_for_a_fixed_kernel_list(h100):
    """Four kernels busy 3, 40, 1 and 250 us: eager pays a launch each, a graph the in-graph gap each and one
    graph launch for the step."""
    from opmap.roofline import roofline

    busy = (3e-6, 40e-6, 1e-6, 250e-6)

    def step(name):
        rt = get_runtime(h100, name)
        hw = rt.apply(h100)
        return sum(roofline(memory_s=b, overhead_s=hw.launch_overhead_s).predicted_s for b in busy) + rt.per_step_s

    assert step("eager") == pytest.approx(sum(busy) + 4 * EAGER_LAUNCH_S, rel=1e-12)
    assert step("graphs") == pytest.approx(sum(busy) + 4 * GRAPH_GAP_S + GRAPH_LAUNCH_S, rel=1e-12)
    assert step("engine") == pytest.approx(sum(busy) + 4 * GRAPH_GAP_S + GRAPH_LAUNCH_S + ENGINE_GAP_S, rel=1e-12)


def test_eager_graphs_engine_step_times_are_the_closed_forms(h100, gpt2_decode):
    eager, graphs, engine, engine_eager = (_step(gpt2_decode, h100, n) for n in RUNTIMES)
    n = eager.kernels
    # eager: sum(busy) + n x launch, nothing per step
    assert eager.phase_figures.step_s == pytest.approx(_busy_s(eager) + n * EAGER_LAUNCH_S, rel=1e-9)
    # graphs: the same kernels, each paying the in-graph gap, plus one graph launch per step
    assert graphs.kernels == n and _busy_s(graphs) == pytest.approx(_busy_s(eager), rel=1e-12)
    assert graphs.phase_figures.step_s == pytest.approx(_busy_s(eager) + n * GRAPH_GAP_S + GRAPH_LAUNCH_S, rel=1e-9)
    assert eager.phase_figures.step_s - graphs.phase_figures.step_s == pytest.approx(
        n * (EAGER_LAUNCH_S - GRAPH_GAP_S) - GRAPH_LAUNCH_S, rel=1e-9)
    # engine: the engine fusion plan's fewer kernels, the gap each, one graph launch and the scheduler's gap
    m = engine.kernels
    assert m < n and engine.plan.policy == "engine" and engine.plan.eager_kernels == n
    assert engine.phase_figures.step_s == pytest.approx(
        _busy_s(engine) + m * GRAPH_GAP_S + GRAPH_LAUNCH_S + ENGINE_GAP_S, rel=1e-9)
    assert engine.phase_figures.runtime_per_step_s == pytest.approx(GRAPH_LAUNCH_S + ENGINE_GAP_S)
    # engine-eager: the engine's kernels, each a host launch, no graph launch, the scheduler's gap
    assert engine_eager.kernels == m and _busy_s(engine_eager) == pytest.approx(_busy_s(engine), rel=1e-12)
    assert engine_eager.phase_figures.step_s == pytest.approx(
        _busy_s(engine) + m * EAGER_LAUNCH_S + ENGINE_GAP_S, rel=1e-9)
    assert engine_eager.phase_figures.runtime_per_step_s == pytest.approx(ENGINE_GAP_S)
    # the headline is the phase's: the JSON total and the MFU at it
    for a in (eager, graphs, engine, engine_eager):
        assert a.to_dict(nodes=False)["totals"]["predicted_latency_s"] == a.phase_figures.step_s


def test_apply_replaces_only_the_per_kernel_overhead(h100):
    assert get_runtime(h100, "eager").apply(h100) is h100
    g = get_runtime(h100, "graphs").apply(h100)
    gap = g.fields["launch_overhead_s"]
    assert gap.value == GRAPH_GAP_S and gap.kind == "measured" and "Getting Started with CUDA Graphs" in gap.source
    assert g.launch_overhead_s == GRAPH_GAP_S and g.memory_bandwidth_bytes_per_s == h100.memory_bandwidth_bytes_per_s
    rt = get_runtime(h100, "engine")
    assert rt.fusion == "engine" and rt.stack == "cuda-graphs" and rt.per_step_s == GRAPH_LAUNCH_S + ENGINE_GAP_S
    d = record(rt)
    assert d["step_host_s"]["kind"] == "measured" and "11133" in d["step_host_s"]["source"]
    assert "runtime engine (cuda-graphs)" in rt.line() and get_runtime(h100, "graphs").fusion == "eager"
    ee = get_runtime(h100, "engine-eager")
    assert ee.apply(h100) is h100 and ee.fusion == "engine" and ee.per_step_s == ENGINE_GAP_S
    assert ee.graph_launch is None and "graphs off" in ee.line()


def test_every_stack_value_is_typed_and_sourced():
    for st in stacks().values():
        for key, v in st.values.items():
            assert v.kind in KINDS and len(v.source) > 40, (st.name, key)
    # NVIDIA's stack is measured throughout; AMD's in-graph gap is the published per-node HIP figure (ROCm
    # rocm-systems issue 10834: 3.865 us per node of a 941-kernel graph on gfx1100)
    assert {v.kind for v in stacks()["cuda-graphs"].values.values()} == {"measured"}
    assert stack_for(get_hardware("mi300x")).values["graph_kernel_gap_s"].value == 3.8e-6
    assert stack_for(get_hardware("gaudi3")).name == "hpu-graphs"


def test_unknown_runtime_and_train_under_graphs_are_refused(h100):
    with pytest.raises(OpmapError, match="unknown runtime 'jit'; accepted: eager"):
        check_runtime("jit")
    with pytest.raises(OpmapError, match="runtime graphs prices serving steps"):
        analyze_phase(None, None, h100, "bf16", PhaseSpec("train"), runtime=get_runtime(h100, "graphs"))


@pytest.mark.parametrize("name", ["eager", "graphs", "engine", "engine-eager"])
@pytest.mark.parametrize("device", ["h100-sxm", "mi300x", "gaudi3"])
def test_a_runtime_block_reads_back_as_the_runtime(name, device):
    """A report's runtime block (Runtime.to_dict: serve.json's and analysis.json's assumptions) is the runtime it
    was written from, so its line is printed by the one function, Runtime.line."""
    from opmap.hardware import get_hardware
    from opmap.phases.runtime import Runtime, get_runtime

    rt = get_runtime(get_hardware(device), name)
    assert Runtime.from_dict(record(rt)) == rt
