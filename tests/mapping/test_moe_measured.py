"""MoE layers priced off the device's measured MoE grid (opmap.mapping.moe_measured): published Hugging Face MoE
configs decoded on B200 and H200, the layer's grouped GEMMs summing to the grid's measured latency for that shape
and token count (read from the catalog file here), the experts module's other kernels inside the measured call,
layouts re-read at their own tokens, tp and ep, and the assumptions and confidence naming the grid."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from hf_family_configs import GPT_OSS_120B, QWEN3_30B_A3B, shallow  # noqa: E402
from opmap.hardware import get_hardware  # noqa: E402
from opmap.mapping.sharding import Parallelism, Sharder  # noqa: E402
from opmap.phases.runtime import get_runtime, with_confidence  # noqa: E402
from opmap.phases.step import analyze_phase, capture_phase  # noqa: E402
from opmap.report.sheet import assumption_lines  # noqa: E402
from opmap.workloads.phases import PhaseSpec, check_phase, phase_workload  # noqa: E402

CATALOG = Path(__file__).resolve().parents[2] / "src" / "opmap" / "hardware" / "catalog"
BATCH, KV_LEN = 64, 1024  # 64 decode tokens enter each MoE layer: a count the tables measure


def measured_us(device: str, fmt: str, shape: list[int], tokens: int) -> float:
    """The catalog file's latency at a measured token count (exact) for one shape, as opmap reads it: the running
    minimum from the largest count down (opmap.hardware.moe_grid)."""
    j = json.loads((CATALOG / f"{device}.moe.json").read_text())
    e = next(e for e in j["tables"][fmt]["shapes"] if e["shape"] == shape)
    return min(e["latency_us"][e["tokens"].index(tokens):])


def decode(tmp_path, cfg: dict, device: str, dtype: str):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    h = get_hardware(device)
    rt = get_runtime(h, "engine")
    spec = replace(check_phase(PhaseSpec("decode", KV_LEN), str(path), BATCH), kv_write=rt.kv_write)
    w = phase_workload(str(path), spec, BATCH, None, dtype)
    return analyze_phase(capture_phase(w, spec), w, h, dtype, spec, fusion=rt.fusion, runtime=rt).analysis


def _layer(a, layer: int):
    """(grouped GEMM kernels, other kernels of the experts module) of one MoE layer."""
    pre = f"model.layers.{layer}.mlp.experts"
    mods = [(k, a.graph.nodes[k.kernel.anchor].module) for k in a.kernel_results]
    grouped = [k for k, m in mods if k.kernel.grouped > 1 and m == pre]
    inside = [k for k, m in mods if k.kernel.grouped <= 1 and (m == pre or m.startswith(pre + "."))]
    return grouped, inside


@pytest.mark.parametrize("device,dtype", [("b200", "w4a8-mxfp4"), ("h200", "mxfp4")])
def test_gpt_oss_moe_layer_is_the_measured_latency(tmp_path, device, dtype):
    c = GPT_OSS_120B  # hidden 2880, expert width 2880, top 4 of 128 (openai/gpt-oss-120b config.json)
    shape = [c["hidden_size"], c["intermediate_size"], c["num_experts_per_tok"], c["num_local_experts"], 1, 1]
    a = decode(tmp_path, shallow(c, 2), device, dtype)
    want = measured_us(device, dtype, shape, BATCH) * 1e-6
    grouped, inside = _layer(a, 1)
    assert len(grouped) == 2  # gate-up and down
    assert sum(k.time.matrix_s for k in grouped) == pytest.approx(want, rel=1e-9)
    # gate and up 2 x 2880 wide, down 2880: 2/3 and 1/3 of the layer
    assert sorted(k.time.matrix_s / want for k in grouped) == pytest.approx([1 / 3, 2 / 3], rel=1e-9)
    for k in grouped:  # the kernel's time: its share of the measured layer and one launch
        assert k.predicted_s == pytest.approx(k.time.matrix_s + k.time.overhead_s, rel=1e-12)
        assert "measured MoE layer" in k.why and "grouped GEMM of" in k.why
    assert inside and all(k.predicted_s == 0 for k in inside)  # bias adds, combine: inside the measured call
    assert f"{device}.moe.json" in a.assumptions.moe_grid
    assert any(x.startswith("moe: MoE layers off the measured grid") for x in assumption_lines(a))
    c = with_confidence(a).assumptions.confidence
    assert any(i.name == f"MoE layer time {dtype}" and i.kind == "measured" for i in c.trust.inputs)


def test_dp_attention_reads_the_grid_at_the_ep_groups_tokens(tmp_path):
    """DEP2 (attention data parallel over 2 GPUs, experts over 2): each rank's 64 tokens meet on the EP group, so
    one GPU's layer is the table's 128 tokens at moe_ep 2 (64 of the 128 experts)."""
    c = GPT_OSS_120B
    a = decode(tmp_path, shallow(c, 2), "b200", "w4a8-mxfp4")
    s = Sharder(a)
    sh = s.shard(Parallelism(tp=1, dp=2, ep=2, dp_attention=True))
    want = measured_us("b200", "w4a8-mxfp4", [2880, 2880, 4, 128, 1, 2], 2 * BATCH) * 1e-6
    rows = [(t, r) for t, r in zip(sh.kernel_s, s.rows) if r.pos == 1 and r.moe is not None]
    launches = sum(r.overhead_s for _, r in rows)
    assert sum(t for t, _ in rows) == pytest.approx(want + launches, rel=1e-9)


def test_qwen3_moe_on_b200_nvfp4_is_the_measured_latency(tmp_path):
    c = QWEN3_30B_A3B  # hidden 2048, expert width 768, top 8 of 128 (Qwen/Qwen3-30B-A3B config.json)
    shape = [c["hidden_size"], c["moe_intermediate_size"], c["num_experts_per_tok"], c["num_experts"], 1, 1]
    a = decode(tmp_path, shallow(c, 2), "b200", "nvfp4")
    grouped, _ = _layer(a, 1)
    want = measured_us("b200", "nvfp4", shape, BATCH) * 1e-6
    assert sum(k.time.matrix_s for k in grouped) == pytest.approx(want, rel=1e-9)


def test_a_device_without_a_grid_is_priced_as_before(tmp_path):
    """The H100 PCIe has no measured MoE grid: the grouped GEMMs keep the time model's price (their FLOPs at the
    format's rate or their bytes at the memory rate), and nothing is said of a grid."""
    a = decode(tmp_path, shallow(QWEN3_30B_A3B, 2), "h100-pcie", "bf16")
    grouped, inside = _layer(a, 1)
    assert a.assumptions.moe_grid is None
    assert all(k.moe is None and "measured MoE" not in k.why for k in grouped)
    assert all(k.predicted_s > 0 for k in inside)
    assert not math.isnan(sum(k.predicted_s for k in grouped))


def test_the_zoo_mixtral_moe_layer_is_the_measured_latency():
    """The zoo's Mixtral 8x7B (a ModuleList of experts: hidden 4096, expert width 14336, top 2 of 8) decoded on the
    H200 in bf16: each layer's grouped GEMMs (w1, w3 and w2, or w1 and w3 merged) sum to the table's Mixtral
    latency at 64 tokens."""
    from test_expert_parallel import decode as zoo_decode  # the decode step of a model at h200, bf16

    from opmap.mapping.fusion import expert_gemm_key

    a = zoo_decode("mixtral-8x7b", BATCH, 256)
    want = measured_us("h200", "bf16", [4096, 14336, 2, 8, 1, 1], BATCH) * 1e-6
    layers: dict[str, float] = {}
    for k in a.kernel_results:
        if k.kernel.grouped > 1:
            c = expert_gemm_key(a.graph.nodes[k.kernel.anchor])[0]
            layers[c] = layers.get(c, 0.0) + k.time.matrix_s
    assert len(layers) == 32
    assert all(v == pytest.approx(want, rel=1e-9) for v in layers.values())
    assert "h200.moe.json" in a.assumptions.moe_grid
