"""End-to-end analysis of zoo models against closed-form FLOP formulas and published figures."""

from __future__ import annotations

import json

import pytest

from opmap.analyze import SCHEMA_VERSION


def test_gpt2_matrix_flops_closed_form(analysis_of):
    """Forward FLOPs of GPT-2 (Kaplan et al. 2020, table 1 form): per layer 24*T*d^2 for the four GEMMs
    (QKV 6Td^2, out 2Td^2, MLP 16Td^2), attention 4*T*S*d dense (causal: S(S+1)/2 pairs), LM head 2*T*d*V."""
    b, s, d, L, V = 2, 128, 768, 12, 50257
    t = b * s
    a = analysis_of("gpt2", b, s)
    tot = a.to_dict()["totals"]
    gemm = L * 24 * t * d * d + 2 * t * d * V
    attn_causal = L * 4 * b * d * (s * (s + 1) // 2)
    assert tot["matrix_flops"] == gemm + attn_causal
    assert tot["skipped_flops"] == L * 4 * b * d * (s * s - s * (s + 1) // 2)
    assert tot["params"] == 124_439_808


def test_llama3_8b_matrix_flops_closed_form(analysis_of):
    b, s, d, L, V, kv, ffn = 1, 64, 4096, 32, 128256, 1024, 14336
    t = b * s
    a = analysis_of("llama-3-8b", b, s, "bf16")
    per_layer = 2 * t * (d * d + 2 * d * kv + d * d) + 2 * t * 3 * d * ffn + 4 * d * (s * (s + 1) // 2)
    assert a.total.matrix_flops == L * per_layer + 2 * t * d * V


def test_mixtral_expert_flops_balanced(analysis_of):
    """Top-2 of 8: T*k token-expert pairs, each a SwiGLU of 3 GEMMs; router 2*T*d*E."""
    b, s, d, ffn, E, k = 1, 32, 4096, 14336, 8, 2
    t = b * s
    a = analysis_of("mixtral-8x7b", b, s, "bf16")
    expert = sum(r.cost.matrix_flops for r in a.results if r.node.layer_type == "moe_expert")
    router = sum(r.cost.matrix_flops for r in a.results if r.node.layer_type == "moe_router")
    assert expert == 32 * 2 * t * k * 3 * d * ffn
    assert router == 32 * 2 * t * d * E


@pytest.mark.parametrize("name,macs", [
    # torchvision model cards, "GFLOPS" column (multiply-adds, fvcore convention): resnet50 4.09, vit_b_16 17.56
    ("resnet50", 4.09e9),
    ("vit-b16", 17.56e9),
])
def test_vision_macs_match_torchvision_cards(analysis_of, name, macs):
    a = analysis_of(name, 1, 224)
    assert a.total.macs == pytest.approx(macs, rel=0.005)


def test_analysis_json_contract(analysis_of):
    a = analysis_of("bert-base", 1, 32)
    d = json.loads(json.dumps(a.to_dict()))
    assert d["schema_version"] == SCHEMA_VERSION
    for k in ("hardware", "dtype", "batch", "seq", "torch_version", "opmap_version"):
        assert k in d["assumptions"]
    for k in ("params", "flops", "matrix_flops", "bytes", "predicted_latency_s", "predicted_mfu"):
        assert k in d["totals"]
    for lt in d["layer_types"].values():
        assert set(lt) >= {"flops", "bytes", "predicted_s", "bound"}
    ids = [n["id"] for n in d["nodes"]]
    assert ids == list(range(len(ids)))
    for n in d["nodes"]:
        assert set(n) >= {"id", "op", "module", "layer_type", "flops", "matrix_flops", "bytes", "intensity",
                          "predicted_s", "bound", "inputs", "outputs"}
        for t in n["inputs"]:
            assert t.get("producer") is None or t["producer"] < n["id"]  # edges point backwards
    assert d["uncounted"] == {}
    tot = d["totals"]
    # the total is the fusion plan's kernels plus the non-kernel nodes (views, allocations)
    assert tot["predicted_latency_s"] == pytest.approx(
        sum(k["predicted_s"] for k in d["kernels"])
        + sum(n["predicted_s"] for n in d["nodes"] if n["bound"] in ("view", "alloc")))
    assert sorted(i for k in d["kernels"] for i in k["nodes"]) == [
        n["id"] for n in d["nodes"] if n["bound"] not in ("view", "alloc")]
    assert d["fusion"]["policy"] == "eager" and d["fusion"]["kernels"] == tot["kernels"]
    assert tot["flops"] == pytest.approx(sum(lt["flops"] for lt in d["layer_types"].values()))


def test_layer_types_of_gpt2(analysis_of):
    d = analysis_of("gpt2", 1, 64).to_dict()
    lts = d["layer_types"]
    assert {"attention", "mlp", "norm", "head", "embedding", "elementwise"} <= set(lts)
    # mlp GEMMs are 16Td^2 of the 24Td^2 per layer
    t, dm = 64, 768
    assert lts["mlp"]["matrix_flops"] == 12 * 16 * t * dm * dm
    assert lts["head"]["matrix_flops"] == 2 * t * dm * 50257


def test_bad_options_fail_before_the_capture(monkeypatch):
    from opmap.analyze import analyze
    from opmap.errors import OpmapError
    from opmap.hardware import get_hardware
    from opmap.workloads import build_zoo

    monkeypatch.setattr("opmap.analyze.capture", lambda *a, **k: pytest.fail("captured"))
    w, hw = build_zoo("gpt2", 1, 8), get_hardware("h100-sxm")
    with pytest.raises(OpmapError, match="unknown fusion policy 'xla'"):
        analyze(w, hw, "bf16", fusion="xla")
    with pytest.raises(OpmapError, match="fusion plan /no/plan.json does not exist"):
        analyze(w, hw, "bf16", plan_file="/no/plan.json")
    with pytest.raises(OpmapError, match="unknown dtype 'fp5'"):  # fp4 is an alias resolved per device
        analyze(w, hw, "fp5")


@pytest.mark.parametrize("dtype,hw,fits", [("fp32", "l4", False), ("bf16", "l4", True), ("int4", "l4", True),
                                           ("fp32", "h200", True)])
def test_memory_fit_of_the_weights_at_their_stored_format(analysis_of, dtype, hw, fits):
    a = analysis_of("llama-3-8b", 1, 8, dtype, hw)
    m = json.loads(json.dumps(a.to_dict()))["totals"]["memory_fit"]
    stored = {"fp32": 4, "bf16": 2, "int4": 0.5 + 2 / 128}[dtype]
    # a format narrower than bf16 quantizes the Linear weights only: the embedding table (Llama 3: 128,256 x 4,096)
    # stays at 2 bytes (opmap.mapping.memory.held_weight_bytes)
    embedding = 128256 * 4096 * (2 - stored) if stored < 2 else 0
    assert m["weights_bytes"] == pytest.approx(a.graph.params * stored + embedding, rel=1e-9)
    assert m["device_memory_bytes"] == a.hardware.memory_bytes and m["fits"] is fits
    assert m["text"].startswith("fits: " if fits else "does not fit: ")


def test_memory_fit_counts_the_kv_cache_and_finds_the_largest_batch_and_context(analysis_of):
    """Inference on one L4 (24 GiB): weights 2 B x 8.03 B, KV cache 131,072 B per token (2 x 32 layers x 8 KV
    heads x 128 x 2 B, read off the graph), activations in flight scaled with batch x seq, 1 GiB workspace.
    The largest batch at seq 8 and the longest context at batch 1 are the hand-computed floors."""
    a = analysis_of("llama-3-8b", 1, 8, "bf16", "l4")
    m = json.loads(json.dumps(a.to_dict()))["totals"]["memory_fit"]
    pd = m["per_device"]
    assert pd["kv_cache_bytes"] == 8 * 131072 and pd["workspace_bytes"] == 2 ** 30
    assert pd["gradients_bytes"] == pd["optimizer_bytes"] == 0
    assert pd["total_bytes"] == pytest.approx(sum(v for k, v in pd.items() if k != "total_bytes"))
    free = 24 * 2**30 - pd["weights_bytes"] - pd["workspace_bytes"]  # L4: 24 GiB of GDDR6 (binary, as stated)
    per_token = 131072 + pd["activations_bytes"] / 8
    # the longest context is memory's or the model's 8192 positions (max_position_embeddings), whichever is less
    assert int(free // per_token) > 8192
    assert m["max_batch"] == int(free // (8 * per_token)) and m["max_context"] == 8192
    assert m["capacity_bytes"] == 24 * 2**30 and m["fits"] and m["reason"] == ""



def test_quantized_weights_count_at_their_stored_size_everywhere(analysis_of):
    """int4 stores 0.5 B per weight plus a 2-byte scale per 128 (GPTQ / AWQ groups): the node rows, the totals and
    every kernel's traffic count the weights at that size, so the rows add up to the totals and no kernel moves
    fewer bytes than its weights occupy."""
    a = analysis_of("gpt2", 1, 32, "int4", "h100-sxm")
    ref = analysis_of("gpt2", 1, 32, "bf16", "h100-sxm")
    d = a.to_dict()
    scale = (0.5 + 2 / 128) / 2
    assert d["totals"]["param_bytes_read"] == pytest.approx(sum(n["param_bytes_read"] for n in d["nodes"]))
    assert d["totals"]["param_bytes_read"] == pytest.approx(ref.to_dict()["totals"]["param_bytes_read"] * scale)
    # held: every weight at int4 but GPT-2's token and position embeddings (50,257 x 768 tied to the head, 1,024 x
    # 768; its config), held at 2 bytes
    embeddings = (50257 + 1024) * 768
    assert d["totals"]["param_bytes"] == pytest.approx(ref.graph.param_bytes * scale + embeddings * (2 - 2 * scale))
    for k in a.kernel_results:
        weights = sum(a.results[i].cost.param_bytes_read for i in k.kernel.nodes)
        assert k.traffic_bytes >= weights * (1 - 1e-9), k.kernel.id


def test_fp8_decode_without_an_fp8_engine_is_weight_only_at_the_bf16_rate():
    """llama-3-8b decode at fp8 on an A100 SXM (Ampere: no fp8 tensor cores) runs as engines run it there, vLLM's
    FP8 Marlin W8A16: weights stored at 1 byte, dequantized to bf16 in the GEMM, bf16 compute at the A100 SXM's
    measured 271.2 TFLOP/s (Bekman's MAMF table), never the 624 TOPS int8 peak. A decode GEMM of K x N weights at
    batch 1 does 2 K N FLOPs and reads K N bytes of weights over the A100 SXM's 1.70 TB/s (BabelStream Triad)."""
    from opmap.analyze import analyze
    from opmap.hardware import get_hardware
    from opmap.phases.decode import decode_figures
    from opmap.workloads import build_zoo
    from opmap.workloads.phases import decode_workload

    w = decode_workload(build_zoo("llama-3-8b", 1, 16, "fp8"), 16)
    a = analyze(w, get_hardware("a100-sxm-80gb"), "fp8")
    s = a.to_dict()["assumptions"]
    assert a.precision.matrix == "bf16" and s["matrix_rate_flops_per_s"]["value"] == 271.2e12
    assert "weight-only" in s["weights_dtype"] and "no fp8 matrix engine" in s["precision_note"]
    # 1-byte weights, the ones the step reads: every parameter but the 128256 x 4096 embedding table, of which
    # the batch's one token gathers one row
    assert decode_figures(a, 16).floor.weights_bytes == pytest.approx((a.graph.params - 128256 * 4096 + 4096) * 1.0,
                                                                   rel=1e-6)
    gemm = next(r for r in a.results if r.node.op == "aten.mm.default" and r.cost.param_bytes_read)
    kn = gemm.cost.matrix_flops / 2  # weights of the GEMM (batch 1: M = 1)
    assert gemm.pred.matrix_s == pytest.approx(2 * kn / 271.2e12)
    assert gemm.cost.param_bytes_read == pytest.approx(kn * 1.0)
    assert gemm.pred.memory_s >= kn / 1.70e12


# analysis.json's assumptions block, in the order its keys have always been written (schema 2): the pipeline's,
# then what the pipeline, tuning, the runtime and the phase add, each only where set
ASSUMPTION_KEYS = [
    "workload", "hardware", "hardware_display_name", "dtype", "matrix_dtype", "precision_note", "weights_dtype",
    "activations_dtype", "accumulate_dtype", "precision_policy", "precision_evidence", "batch", "seq", "position_limit",
    "capture_device", "mode", "fusion_policy", "tiling", "matrix_peak_flops_per_s", "matrix_rate_flops_per_s",
    "vector_peak_flops_per_s", "memory_bandwidth_bytes_per_s", "memory_rate_bytes_per_s", "datasheet_only",
    "launch_overhead_s", "transcendental_slots", "time_model", "attention_kernel", "layer_type_overrides",
    "workload_notes", "capture_notes", "torch_version", "opmap_version", "python_version"]


def test_assumptions_keys_in_order(analysis_of):
    from dataclasses import replace

    from opmap.hardware import get_hardware
    from opmap.phases.runtime import get_runtime, with_runtime
    from opmap.workloads.phases import PhaseSpec

    a = analysis_of("gpt2", 1, 32)
    d = a.to_dict()["assumptions"]
    assert list(d) == ASSUMPTION_KEYS
    assert list(d["matrix_peak_flops_per_s"]) == ["value", "kind", "source"]
    assert list(d["matrix_rate_flops_per_s"])[:6] == ["value", "kind", "basis", "source", "of_peak", "power_state"]
    assert list(d["memory_rate_bytes_per_s"]) == ["value", "basis"]
    assert d["position_limit"] == {"max_positions": 1024, "rope": False}  # GPT-2's 1,024 learned positions
    rt = get_runtime(get_hardware("h100-sxm"), "engine")
    b = with_runtime(replace(a, assumptions=replace(a.assumptions, tuned="t", dtype_requested="fp4",
                                                      dtype_resolution="r", fp8_inference="f")), rt)
    b = replace(b, assumptions=replace(b.assumptions, phase=PhaseSpec("decode", kv_len=8)))
    d = b.to_dict()["assumptions"]
    assert list(d) == [*ASSUMPTION_KEYS, "fp8_inference", "dtype_requested", "dtype_resolution", "tuned", "runtime",
                       "runtime_line", "phase"]
    assert d["runtime"]["name"] == "engine" and d["phase"]["name"] == "decode" and b.runtime_per_step_s > 0
