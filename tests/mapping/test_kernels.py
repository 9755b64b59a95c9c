"""Kernel rows: layout and layout transforms, formats per precision policy, fusion changing the prediction."""

from __future__ import annotations

import pytest

from opmap.analyze import analyze
from opmap.hardware import get_hardware
from opmap.workloads import build_zoo, with_layout


@pytest.fixture(scope="module")
def resnet_cl():
    # captured on the CPU: meta's convolution kernel returns NCHW strides whatever the input's layout
    w = with_layout(build_zoo("resnet50", 1, 64, "fp32", "cpu"), "channels_last")
    return analyze(w, get_hardware("l4"), "fp32")


def test_channels_last_input_is_a_layout_transform_kernel(resnet_cl):
    first = resnet_cl.kernel_results[0]
    assert first.why.startswith("layout transform NCHW -> NHWC")
    # the 1x3x64x64 fp32 image is read once and written once in the new order
    assert first.kernel.min_bytes == 2 * 3 * 64 * 64 * 4
    convs = [k for k in resnet_cl.kernel_results if k.kernel.kernel_class == "matrix" and "NHWC" in k.layout]
    # all 53 convolutions run on channels-last activations (at 2x2 and below both orders coincide)
    assert len(convs) >= 40


def test_gemm_layout_and_quantized_format():
    a = analyze(build_zoo("gpt2", 1, 32, "int8"), get_hardware("h100-sxm"), "int8")
    gemm = next(k for k in a.kernel_results if a.results[k.kernel.anchor].node.op == "aten.addmm.default")
    assert gemm.layout == "A N, B T (x @ W.T)"
    assert "weights int8" in gemm.format and "accumulate int32" in gemm.format
    norm = next(k for k in a.kernel_results if k.kernel.kernel_class == "reduction")
    assert norm.format == "bf16 storage, fp32 compute"
    assert "unverified" in a.assumptions.precision_evidence


def test_compiler_fusion_lowers_a_memory_bound_prediction():
    w = build_zoo("resnet50", 8, None, "fp16")
    hw = get_hardware("l4")
    eager, fused = analyze(w, hw, "fp16", fusion="eager"), analyze(w, hw, "fp16", fusion="compiler")
    assert fused.kernels < eager.kernels
    assert fused.predicted_latency_s < eager.predicted_latency_s
    assert fused.to_dict()["fusion"]["bytes_saved"] > 0


@pytest.mark.parametrize("fusion,dtype", [("eager", "bf16"), ("engine", "fp8")])
def test_a_repeated_kernel_is_mapped_once_as_mapping_each_would(tmp_path, monkeypatch, fusion, dtype):
    """map_kernels maps each distinct kernel signature once and hands the kernels that repeat it its row: on
    DeepSeek-R1's published config cut to 2 layers (a dense one, then a MoE one: 256 experts, 8 a token, 64
    tokens), eager at bf16 and engine fusion at fp8 (stored weights rescaled, the LM head and router kept bf16),
    every row equals the one mapping each kernel on its own gives (a signature per kernel), field for field, and
    the mappings are far fewer than the kernels (the routed experts' kernels repeat)."""
    import json

    pytest.importorskip("transformers")
    from hf_family_configs import DEEPSEEK_R1, shallow
    from opmap.analyze import analyze_graph
    from opmap.capture import capture
    from opmap.mapping import kernels as km
    from opmap.record import record
    from opmap.workloads import load_workload

    p = tmp_path / "config.json"
    p.write_text(json.dumps(shallow(DEEPSEEK_R1, 2)))
    w = load_workload(str(p), 1, 64, "bf16")
    g = capture(w.module, w.inputs)
    hw = get_hardware("h200")
    calls = [0]
    one = km._map_kernel

    def counted(*a, **k):
        calls[0] += 1
        return one(*a, **k)

    monkeypatch.setattr(km, "_map_kernel", counted)
    memo = analyze_graph(g, w, hw, dtype, fusion=fusion)
    assert 0 < calls[0] < len(memo.kernel_results) / 5
    calls[0] = 0
    monkeypatch.setattr(km, "_signature", lambda k, *a: k.id)  # every kernel its own signature: mapped alone
    each = analyze_graph(g, w, hw, dtype, fusion=fusion)
    assert calls[0] == len(each.kernel_results)
    assert [record(k) for k in memo.kernel_results] == [record(k) for k in each.kernel_results]
