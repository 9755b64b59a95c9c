"""A training step's figures on one device (opmap.phases.train) and under a layout (opmap.phases.sharded): one set
of per-device fields whose parts add up to the step (step_s = microsteps x (microstep_s + recompute_s) + bubble_s +
exposed_comm_s + optimizer_s), selective recomputation that never shortens the step, and HFU >= MFU (Korthikanti et
al. 2022: hardware FLOPs are the model FLOPs plus what is recomputed)."""

from __future__ import annotations

import functools

import pytest
import torch

from opmap.hardware import get_hardware
from opmap.mapping.sharding import Parallelism, shard
from opmap.phases.sharded import sharded_phase_figures
from opmap.phases.step import analyze_phase, capture_phase
from opmap.phases.train import train_activations
from opmap.record import record
from opmap.workloads.llama import Llama, LlamaConfig
from opmap.workloads.phases import PhaseSpec, check_phase
from opmap.workloads.zoo import Workload

H100 = get_hardware("h100-sxm")
# two blocks of fused (SDPA) attention with grouped KV heads: small enough to capture in a second on meta
SMALL = LlamaConfig(vocab_size=1000, dim=128, n_layer=2, n_head=4, n_kv_head=2, ffn_dim=256, max_seq=512)
MB, SEQ = 2, 64
POLICIES = ("none", "selective", "full")
LAYOUT = {"tp": 2, "pp": 2, "dp": 2, "microbatch": MB, "global_batch": 16}  # 16 / (2 x 2) = 4 microbatches


@functools.cache
def _train(recompute: str, global_batch: int = 8):
    with torch.device("meta"):
        m = Llama(SMALL).to(torch.bfloat16)
        ids = torch.zeros(MB, SEQ, dtype=torch.long)
    w = Workload("small-llama", m, (ids,), MB, SEQ)
    spec = check_phase(PhaseSpec("train", recompute=recompute, microbatch=MB, global_batch=global_batch),
                       "small-llama", MB)
    saved, act = train_activations(w, recompute)
    return analyze_phase(capture_phase(w, spec), w, H100, "bf16", spec, saved=saved, activations=act).analysis


@functools.cache
def _sharded(recompute: str):
    a = _train(recompute)
    sh = shard(a, Parallelism(**LAYOUT, recompute=recompute))
    return sh, record(sharded_phase_figures(a.phase_figures, sh, a))


def _parts(f) -> float:
    return f["microsteps"] * (f["microstep_s"] + f["recompute_s"]) + f["bubble_s"] + f["exposed_comm_s"] + \
        f["optimizer_s"]


@pytest.mark.parametrize("recompute", POLICIES)
def test_step_equals_its_parts_on_one_device(recompute):
    f = record(_train(recompute).phase_figures)
    assert f["microsteps"] == 8 // MB and f["devices"] == 1
    assert f["step_s"] == pytest.approx(_parts(f), rel=0.01)
    assert f["step_s"] == f["iteration_s"] and f["bubble_s"] == 0 and f["exposed_comm_s"] == 0
    assert f["tokens_per_s_per_device"] == pytest.approx(8 * SEQ / f["step_s"])


@pytest.mark.parametrize("recompute", POLICIES)
def test_step_equals_its_parts_under_a_layout(recompute):
    """tp 2 x pp 2 x dp 2: per device, the slowest stage's microbatches, the 1F1B bubble (Narayanan et al. 2021:
    (pp - 1) / vp microbatch slots, here one), the collectives left exposed and the optimizer's share."""
    sh, f = _sharded(recompute)
    assert f["microsteps"] == 4 and f["devices"] == 8
    assert f["step_s"] == pytest.approx(_parts(f), rel=0.01)
    assert f["step_s"] == sh.step_s == f["iteration_s"]
    assert f["bubble_s"] == pytest.approx((2 - 1) / 1 * sh.microbatch_s)
    assert f["exposed_comm_s"] > 0  # two TP all-reduces a block each way are not overlapped
    # the optimizer step per device: the parameters one device holds (a quarter under tp 2 x pp 2) at ZeRO 0
    assert f["optimizer_s"] < _train(recompute).phase_figures.optimizer_s
    assert f["tokens_per_s_per_device"] == pytest.approx(f["tokens_per_s"] / 8)
    assert f["tokens_per_s"] == pytest.approx(16 * SEQ / f["step_s"])


def test_selective_recompute_never_shortens_the_step():
    """Selective recomputation runs the attention core again (Megatron-Core checkpoints core_attention, fused or
    not): the step grows by it, on one device and under the layout, and the note never says it adds nothing."""
    none, sel, full = (record(_train(r).phase_figures) for r in POLICIES)
    assert sel["step_s"] > none["step_s"] and sel["recompute_s"] > 0
    assert full["step_s"] >= sel["step_s"]
    assert "adds nothing" not in sel["recompute_note"]
    (_, n), (_, s) = _sharded("none"), _sharded("selective")
    assert s["step_s"] > n["step_s"] and s["recompute_s"] > 0
    assert s["microstep_s"] == pytest.approx(n["microstep_s"])  # the recomputation is its own part


@pytest.mark.parametrize("recompute", POLICIES)
def test_hfu_is_at_least_mfu(recompute):
    """Both count attention dense; HFU adds the recomputed FLOPs (the flash backward's scores at least)."""
    for f in (record(_train(recompute).phase_figures), _sharded(recompute)[1]):
        assert f["hfu"] > f["mfu"] > 0
        assert f["hardware_flops"] == pytest.approx(f["model_flops"] + f["recompute_flops"]
                                                    + f["attention_recompute_flops"])
        assert "HFU >= MFU" in f["mfu_definition"]


def test_the_phase_line_names_the_step_and_its_parts():
    _, f = _sharded("selective")
    t = f["text"]
    assert f"iteration {f['step_s'] * 1e3:.4g} ms per device" in t and "pipeline bubble" in t
    assert "exposed communication" in t and "recompute" in t and "request" not in t


@functools.cache
def _gpt_train(dropout: float, kernel: str | None = None):
    from opmap.hardware import with_attention_kernel
    from opmap.workloads.gpt2 import GPT2, GPT2Config

    cfg = GPT2Config(vocab_size=1000, block_size=512, n_layer=2, n_head=4, n_embd=512, dropout=dropout)
    with torch.device("meta"):
        m = GPT2(cfg).to(torch.bfloat16)
        ids = torch.zeros(2, 512, dtype=torch.long)
    w = Workload("small-gpt", m, (ids,), 2, 512)
    spec = check_phase(PhaseSpec("train", microbatch=2, global_batch=2), "small-gpt", 2)
    hw = with_attention_kernel(H100, kernel)
    return analyze_phase(capture_phase(w, spec), w, hw, "bf16", spec).analysis


def _attention_matrix_s(a) -> float:
    return sum(r.pred.matrix_s for r in a.results if r.cost.problem is not None and r.cost.problem.family.attention)


def test_attention_dropout_costs_the_kernels_measured_factor_and_says_so():
    """GPT-style attention dropout 0.1 on the catalog's H100 (cuDNN, the kernel Transformer Engine runs): the fused
    attention's forward and backward take 0.614 / 0.594 ms of the no-dropout time (TransformerEngine issue 3312, an
    H200 at 16 heads of 128, sbhd), and the assumptions name the factor; without dropout they say nothing of it.
    FlashAttention-2 has no measured pair on sm90: priced at its no-dropout rows, and the line says so."""
    plain, dropped = _gpt_train(0.0), _gpt_train(0.1)
    assert _attention_matrix_s(dropped) / _attention_matrix_s(plain) == pytest.approx(0.614 / 0.594, rel=1e-3)
    assert plain.assumptions.attention_dropout is None
    line = dropped.assumptions.attention_dropout
    assert "cudnn runs 1.03x its no-dropout time" in line and "3312" in line
    fa2 = _gpt_train(0.1, "fa2")
    assert "priced at fa2's no-dropout rate" in fa2.assumptions.attention_dropout
    assert _attention_matrix_s(fa2) == pytest.approx(_attention_matrix_s(_gpt_train(0.0, "fa2")))


def test_the_dropout_line_reads_a_calibration_that_names_no_kernel():
    """A local calibration measures the one kernel its machine runs and names none: its unnamed dropout row prices
    the calls and the line says so (not 'no measured attention kernel')."""
    from dataclasses import replace

    from opmap.assumptions import attention_dropout_line
    from opmap.hardware import with_attention_dropout

    rows = [{k: v for k, v in r.items() if k != "kernel"} for r in H100.calibration["attention"]
            if r["kernel"] == "cudnn"]
    cal = {k: v for k, v in H100.calibration.items() if k not in ("attention_kernel", "attention_dropout")}
    local = with_attention_dropout(replace(H100, calibration={**cal, "attention": rows}), 1.5, "measured here")
    assert local.curves.attention_dropout == 1.5
    line = attention_dropout_line(local)
    assert "runs 1.5x its no-dropout time" in line and "measured here" in line
    bare = replace(H100, calibration={**cal, "attention": rows})
    assert "no-dropout rate" in attention_dropout_line(bare)
