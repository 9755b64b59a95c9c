"""One kernel's per-device time under a layout (opmap.mapping.device_time): the rules worked by hand on rows built
here (Megatron-LM's splits: Shoeybi et al. 2019 for tp, Korthikanti et al. 2022 for sp), and both of its callers,
the Sharder and serve's Pricer, giving those values on a zoo model and a Hugging Face config.json."""

from __future__ import annotations

from pathlib import Path

import pytest

from opmap.hardware import get_hardware
from opmap.mapping.device_time import KernelRow, device_time, tp_split
from opmap.mapping.roles import SPLIT_ROLES
from opmap.mapping.sharding import Parallelism
from opmap.phases.runtime import get_runtime
from opmap.serve.pricer import Pricer
from opmap.serve.resolve import Resolved
from opmap.workloads.phases import PhaseSpec

TINY = str(Path(__file__).resolve().parents[2] / "examples" / "tiny-llama.json")

# a GEMM of 64 tokens by a 4096 x 4096 bf16 weight on an H100 SXM (989 TFLOP/s dense bf16, 3.35 TB/s: the
# datasheet's figures, used here only as numbers to divide): 2 M K N FLOPs over the matrix rate, the weight's bytes
# over the memory rate, a 2 us launch
FLOPS = 2 * 64 * 4096 * 4096  # 2.147e9
MATRIX_S = FLOPS / 989e12  # 2.171 us
MEMORY_S = 4096 * 4096 * 2 / 3.35e12  # 10.016 us: memory-bound
LAUNCH_S = 2e-6


def row(role: str = "column", **kw) -> KernelRow:
    base: dict = dict(role=role, pos=0, phase="forward", matrix_s=MATRIX_S, vector_s=0.0, memory_s=MEMORY_S,
                overhead_s=LAUNCH_S, extra_s=0.0, weight_fraction=1.0, kv_narrow=False, sdpa=False,
                matrix_flops=FLOPS, attention_backward=False)
    base.update(kw)
    return KernelRow(**base, busy_s=max(base["matrix_s"], base["vector_s"], base["memory_s"]))


def test_a_column_gemm_over_tp2_halves_its_flops_and_weight_reads():
    # FLOPs / 2 over the matrix rate = 1.085 us, weight bytes / 2 over the memory rate = 5.008 us: the max, plus the
    # launch (not split)
    want = max(FLOPS / 2 / 989e12, 4096 * 4096 * 2 / 2 / 3.35e12) + 2e-6
    assert device_time(row(), Parallelism(tp=2), kv_heads=8) == pytest.approx(want, rel=1e-12)
    assert want == pytest.approx(7.0081e-6, rel=1e-4)
    assert device_time(row("row"), Parallelism(tp=2), kv_heads=8) == pytest.approx(want, rel=1e-12)


def test_split_rules_worked_by_hand():
    busy = MEMORY_S
    # a K / V projection at tp 8 over 2 KV heads: each KV head on 4 ranks, the work over 2
    assert device_time(row(kv_narrow=True), Parallelism(tp=8), 2) == pytest.approx(busy / 2 + LAUNCH_S)
    assert tp_split("column", True, 8, 2) == 2 and tp_split("column", False, 8, 2) == 8
    assert tp_split("replicated", True, 8, 2) == 1 and tp_split("column", True, 8, 0) == 8
    # attention past the KV heads: query work over tp 8, the KV read over the 2 KV heads
    a = row(matrix_s=8e-6, memory_s=10e-6, sdpa=True)
    assert device_time(a, Parallelism(tp=8), 2) == pytest.approx(max(8e-6 / 8, 10e-6 / 2) + LAUNCH_S)
    # a replicated kernel (a norm) splits over tp only under sequence parallelism (Korthikanti et al. 2022)
    n = row("replicated", matrix_s=0.0, vector_s=1e-6, memory_s=4e-6)
    assert device_time(n, Parallelism(tp=4), 8) == pytest.approx(4e-6 + LAUNCH_S)
    assert device_time(n, Parallelism(tp=4, sp=True), 8) == pytest.approx(1e-6 + LAUNCH_S)
    # the optimizer: over tp x pp, and dp from ZeRO 1 (2 x 2 x 4 = 16)
    o = row("optimizer", matrix_s=0.0, memory_s=32e-6, extra_s=16e-6)
    p = dict(tp=2, pp=2, dp=4, devices=16, global_batch=4)
    assert device_time(o, Parallelism(**p, zero=1), 8) == pytest.approx(48e-6 / 16 + LAUNCH_S)
    assert device_time(o, Parallelism(**p), 8) == pytest.approx(48e-6 / 4 + LAUNCH_S)
    # an expert over ep 2 (inside dp 2): its weight reads halve, its matrix work and launch as the batch's tokens
    # double on it: weight share 3/4 of 8 us -> 3 us, the activations' 2 us whole
    e = row("expert_column", matrix_s=1e-6, memory_s=8e-6, weight_fraction=0.75)
    assert device_time(e, Parallelism(ep=2, dp=2, devices=2), 8) == pytest.approx(5e-6 + LAUNCH_S / 2)


def _by_hand(k, role: str, tp: int) -> float:
    """A kernel of the unsharded analysis at tp (at most the KV heads, no sp): its terms and the time past them over
    tp when it is split, its launch whole."""
    t = k.time
    busy = max(t.matrix_s, t.vector_s, t.memory_s)
    extra = max(0.0, t.predicted_s - busy - t.overhead_s)
    return (busy + extra) / (tp if role in SPLIT_ROLES else 1) + t.overhead_s


@pytest.mark.parametrize("model", ["llama-3-8b", TINY])
def test_sharder_and_pricer_give_the_hand_worked_times(model):
    hw0 = get_hardware("h100-sxm")
    rt = get_runtime(hw0, "engine")
    pricer = Pricer(Resolved.build(model, "bf16"), rt.apply(hw0), "bf16", 2, 1, rt)
    a, s = pricer._analyze(lambda: pricer.m.prefill(64), PhaseSpec("prefill"), 2, ("prefill", 1, 64))
    assert s.geo.kv_heads >= 2
    sh = s.shard(Parallelism(tp=2, devices=2))
    want = [_by_hand(k, s.roles.role.get(k.kernel.anchor, "replicated"), 2) for k in a.kernel_results]
    assert sum(r.role == "column" for r in s.rows) >= 2 and any(r.sdpa for r in s.rows)
    assert sh.kernel_s == pytest.approx(want, rel=1e-12)
    t = pricer._terms(a, s)
    coll = sum(c.predicted_s * c.count for c in sh.collectives) / 2  # per block: 2 blocks captured
    assert coll > 0
    for b in (0, 1):
        blk = coll + sum(w for r, w in zip(s.rows, want) if r.pos == b)
        assert t["blk"][b] == pytest.approx(blk, rel=1e-12)
    assert t["pre"] == pytest.approx(sum(w for r, w in zip(s.rows, want) if r.pos < 0), rel=1e-12)
