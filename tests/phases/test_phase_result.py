"""The typed figures of a phase (opmap.phases.result): a step time is the sum of its parts, checked when the value is
made, and a decode step's throughput is its batch over its step time, on a Hugging Face config and a zoo model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from opmap.phases.result import Decode, DecodeFloor, PalmFlops, PhaseResult, Prefill, TrainStep

pytest.importorskip("transformers")

from opmap.hardware import get_hardware  # noqa: E402
from opmap.phases.runtime import get_runtime  # noqa: E402
from opmap.phases.step import analyze_phase, capture_phase  # noqa: E402
from opmap.record import record
from opmap.workloads.phases import PhaseSpec, check_phase, phase_workload  # noqa: E402

TINY = str(Path(__file__).resolve().parents[2] / "examples" / "tiny-llama.json")  # a Hugging Face config.json
BATCH = 4


def _train(step_s: float) -> TrainStep:
    # 2 microsteps x (1.0 ms + 0.25 ms recompute) + 0.3 ms bubble + 0.2 ms exposed + 0.5 ms optimizer = 3.5 ms
    return TrainStep(recompute="selective", recompute_note="", optimizer="adamw", microbatch=1, global_batch=2, dp=1,
                     zero=0, microsteps=2, devices=1, step_s=step_s, microstep_s=1.0e-3, recompute_s=0.25e-3,
                     bubble_s=0.3e-3, exposed_comm_s=0.2e-3, optimizer_s=0.5e-3, tokens_per_s=0.0,
                     tokens_per_s_per_device=0.0, model_flops=0.0, hardware_flops=0.0, recompute_flops=0.0,
                     attention_recompute_flops=0.0, executed_matrix_flops=0.0, model_flops_per_s_per_device=0.0,
                     hardware_flops_per_s_per_device=0.0, mfu=0.0, hfu=0.0, dense_peak_flops_per_s=1.0,
                     palm_flops_per_token=PalmFlops(0.0, 0, 0, 0.0), model_flops_per_token=0.0, mfu_definition="",
                     bound="compute")


def test_a_train_step_is_the_sum_of_its_parts():
    t = _train(3.5e-3)
    assert t.step_s == t.iteration_s == pytest.approx(2 * (1.0e-3 + 0.25e-3) + 0.3e-3 + 0.2e-3 + 0.5e-3)
    assert record(t)["step_s"] == record(t)["iteration_s"] == 3.5e-3


def test_a_train_step_whose_parts_do_not_add_up_raises():
    with pytest.raises(ValueError, match="not the sum of its parts"):
        _train(3.0e-3)  # 0.5 ms short of 2 x 1.25 + 0.3 + 0.2 + 0.5 ms
    with pytest.raises(ValueError, match="not the sum of its parts"):
        replace(_train(3.5e-3), bubble_s=0.0)  # a part changed without the step time


def test_a_phase_result_whose_parts_do_not_add_up_raises():
    with pytest.raises(ValueError, match="not the sum of its parts"):
        Prefill(2.0e-3, 1.5e-3, 0.2e-3, "memory", 10, BATCH, "")  # 1.5 + 0.2 ms is not 2 ms


@pytest.mark.parametrize("target", [TINY, "llama-3-8b"])
def test_decode_step_is_its_parts_and_its_throughput_batch_over_step(target):
    """Under the engine runtime: time per output token = the kernels' time + the runtime's per-step time (a graph
    launch + the engine's scheduler gap, opmap/hardware/runtimes.toml); tokens/s = batch / time per output token
    (one new token per sequence per step)."""
    h = get_hardware("h100-sxm")
    rt = get_runtime(h, "engine")
    spec = replace(check_phase(PhaseSpec("decode", 128), target, BATCH), kv_write=rt.kv_write)
    w = phase_workload(target, spec, BATCH, None, "bf16")
    a = analyze_phase(capture_phase(w, spec), w, h, "bf16", spec, fusion=rt.fusion, runtime=rt).analysis
    f = a.phase_figures
    assert isinstance(f, PhaseResult) and f.name == "decode"
    assert f.runtime_per_step_s == rt.per_step_s > 0
    assert f.kernel_time_s == a.predicted_latency_s
    assert f.step_s == pytest.approx(f.kernel_time_s + f.runtime_per_step_s, rel=1e-12)
    assert f.tokens_per_s == pytest.approx(BATCH / f.step_s, rel=1e-12)
    assert a.headline == ("time per output token", f.step_s)
    d = record(a.phase_figures)
    assert d["tpot_s"] == f.step_s and d["tokens_per_s"] == f.tokens_per_s and d["kv_len"] == 128


def test_phase_blocks_keep_their_keys_in_order():
    """analysis.json's ``phase`` block, as schema 2 writes it: the step time under the phase's own name (ttft_s,
    tpot_s), decode's floor figures around its bound, the layout only under several devices."""
    pre = Prefill(2.0e-3, 1.5e-3, 0.5e-3, "matrix", 10, 64, "p")
    assert list(record(pre)) == ["name", "ttft_s", "bound", "kernel_time_s", "runtime_per_step_s", "kernels", "text"]
    assert record(pre)["name"] == "prefill" and record(pre)["ttft_s"] == 2.0e-3
    dec = Decode(2.0e-3, 1.5e-3, 0.5e-3, "memory", 10, BATCH, "d", floor=DecodeFloor(512, 1e9, 2e8, 1e-3, "b"),
                 devices=2, layout="tp2")
    assert list(record(dec)) == ["name", "kv_len", "tpot_s", "tokens_per_s", "bound", "weights_bytes",
                                 "kv_cache_read_bytes", "lower_bound_s", "lower_bound_basis", "kernel_time_s",
                                 "runtime_per_step_s", "kernels", "text", "devices", "layout"]
    assert record(dec)["tokens_per_s"] == BATCH / 2.0e-3 and record(dec)["kv_len"] == 512
    with pytest.raises(TypeError):
        Decode(2.0e-3, 1.5e-3, 0.5e-3, "memory", 10, BATCH, "d")  # no floor
