"""Pricing a serving replica's steps (opmap.serve.model_cost): layer extrapolation, layouts, memory, KV format,
decode floors, context limits."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from opmap.errors import OpmapError
from opmap.hardware import get_hardware
from opmap.mapping.memory import ServingMemory, kv_bytes_per_token_per_device
from opmap.ops import active_experts, expected_experts
from opmap.phases.runtime import get_runtime
from opmap.serve.cost import DecodeFloor, TableCost
from opmap.serve.model_cost import Resolved, model_table_cost
from opmap.serve.pricer import Pricer


def _pricer(model: str, tp: int = 1, pp: int = 1, runtime: str = "engine") -> Pricer:
    hw0 = get_hardware("h100-sxm")
    rt = get_runtime(hw0, runtime)
    return Pricer(Resolved.build(model, "bf16"), rt.apply(hw0), "bf16", tp, pp, rt)


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 2)])
def test_extrapolated_point_equals_the_full_capture_on_llama_3_8b(tp, pp):
    """t(32) from a 2-layer capture equals the 32-layer capture's time (a homogeneous stack: each layer adds the
    same kernels and all-reduces), to 1e-9 relative (float summation order only); under pp the slowest stage
    equals opmap.mapping.sharding's too, to 1e-3: the engine fusion folds a layer's closing residual add into the
    next norm, so at the stage boundary that one add's time lands in the other stage (measured: 2e-5 of a decode
    stage, 3e-4 of a prefill stage; 1e-9 under the eager runtime, which fuses nothing across layers)."""
    ext, full = _pricer("llama-3-8b", tp, pp), _pricer("llama-3-8b", tp, pp)
    full.extrapolate = False
    for make in (lambda p: p.decode(16, 1024), lambda p: p.prefill(256)):
        e, f = make(ext), make(full)
        assert ext.extrapolate
        assert e.latency_s == pytest.approx(f.latency_s, rel=1e-9)
        assert e.stage_s == pytest.approx(f.stage_s, rel=1e-3)
        assert e.dense_bytes == pytest.approx(f.dense_bytes, rel=1e-9)


def test_kv_per_device_splits_over_tp_and_replicates_past_the_kv_heads():
    """llama-3-70b: 80 layers x 2 x 8 KV heads x 128 head dim x 2 bytes = 327,680 B per token; tp 8 holds one KV
    head per device (total / 8), tp 16 replicates each head on 2 devices (still total / 8); pp 4: 20 layers."""
    total = 80 * 2 * 8 * 128 * 2
    assert kv_bytes_per_token_per_device(total, 80, 8, tp=8) == total / 8
    assert kv_bytes_per_token_per_device(total, 80, 8, tp=16) == total / 8
    assert kv_bytes_per_token_per_device(total, 80, 8, tp=2, pp=4) == total / 2 / 4
    assert kv_bytes_per_token_per_device(total, 80, 8, pp=3) == total * 27 / 80  # ceil(80 / 3) layers


@cache
def _cost(model: str, tp: int = 1, pp: int = 1, **kw) -> TableCost:
    return model_table_cost(model, "h100-sxm", "bf16", tp, pp=pp, **kw)


def test_llama_3_70b_tp8_kv_and_memory_per_device():
    c = _cost("llama-3-70b", 8)
    assert c.kv_bytes_per_token == 80 * 2 * 8 * 128 * 2 / 8
    m = c.memory
    hw = get_hardware("h100-sxm")
    assert m["capacity_bytes"] == hw.memory_bytes  # as the catalog states it
    # the model card's 70,553,706,496 parameters at 2 bytes, over 8 devices
    assert m["weights_bytes"] == pytest.approx(70_553_706_496 * 2 / 8, rel=1e-12)
    assert m["usable_bytes"] == pytest.approx(m["capacity_bytes"] * 0.9 - m["weights_bytes"] - m["reserve_bytes"])
    assert c.kv_capacity_tokens == int(m["usable_bytes"] // c.kv_bytes_per_token)
    assert c.layout == {"tp": 8, "pp": 1} and c.to_dict()["runtime"]["name"] == "engine"


def test_fp8_kv_doubles_the_tokens_that_fit():
    p = _pricer("llama-3-8b")
    p.prefill(128)
    bf, f8 = p.memory("bf16", 0.9), p.memory("fp8", 0.9)
    assert bf.kv_bytes_per_token == 32 * 2 * 8 * 128 * 2 and f8.kv_bytes_per_token == 32 * 2 * 8 * 128 * 1
    assert f8.kv_capacity_tokens in (2 * bf.kv_capacity_tokens, 2 * bf.kv_capacity_tokens + 1)


def test_fp8_kv_halves_the_decode_kv_read():
    bf, f8 = _cost("gpt2"), _cost("gpt2", kv_dtype="fp8")
    read = bf.decode_s(16, 1 << 20) - bf.decode_s(16, 0)
    assert f8.decode_s(16, 1 << 20) - f8.decode_s(16, 0) == pytest.approx(read / 2, rel=1e-9)
    assert f8.decode_s(16, 0) == pytest.approx(bf.decode_s(16, 0), rel=1e-12)


def test_usable_memory_and_utilization():
    from opmap.mapping.memory import Assumed

    m = ServingMemory(80 * 2**30, 0.5, 10 * 2**30, {"w": Assumed(2**30, "assumed", "x")}, 2**20)
    assert m.usable_bytes == 40 * 2**30 - 11 * 2**30
    assert m.kv_capacity_tokens == 29 * 2**10


def test_expected_experts_top2_of_8():
    assert expected_experts(8, 2, 1) == pytest.approx(2.0)
    assert expected_experts(8, 2, 64) == pytest.approx(8 * (1 - 0.75 ** 64), rel=1e-15)
    assert active_experts(8, 2, 1) == 2 and active_experts(8, 2, 2) == math.ceil(8 * (1 - 0.75 ** 2)) == 4
    assert active_experts(8, 2, 64) == 8


@pytest.mark.parametrize("batch", [1, 2, 64])
def test_zoo_mixtral_decode_reads_the_experts_the_formula_gives(batch):
    """The meta capture runs ceil(E (1 - (1 - k/E)^b)) experts per layer (top-2 of 8): their weights are read."""
    from opmap.phases.step import capture_phase
    from opmap.workloads.phases import PhaseSpec

    r = Resolved.build("mixtral-8x7b", "bf16")
    r.set_layers(1)
    g = capture_phase(r.decode(batch, 64), PhaseSpec("decode", kv_len=64))
    ran = {n.module.split(".experts.")[1].split(".")[0] for n in g.nodes if ".experts." in n.module}
    assert len(ran) == math.ceil(expected_experts(8, 2, batch) - 1e-9)


@pytest.mark.parametrize("model,tp,pp", [("llama-3-8b", 1, 1), ("llama-3-70b", 4, 1), ("mixtral-8x7b", 2, 1),
                                         ("llama-3-70b", 16, 1), ("llama-3-70b", 2, 2)])
def test_tpot_never_below_its_floor(model, tp, pp):
    """The priced decode step (interpolated between its points) against the weight + KV bytes one device reads
    over its achievable memory rate, over batches and KV lengths (MoE: the experts the batch activates)."""
    c = _cost(model, tp, pp)
    for b in (1, 2, 3, 5, 8, 12, 16, 33, 64, 100, 256):
        for per_seq in (0, 128, 1000, 4000):
            assert c.decode_s(b, b * per_seq) >= c.decode_floor_s(b, b * per_seq) > 0, (b, per_seq)


def test_moe_floor_reads_the_active_experts_once():
    f = DecodeFloor(dense_bytes=1e9, kv_bytes_per_token=0.0, rate_bytes_per_s=1e12, expert_bytes=1e9, experts=8,
                    top_k=2)
    assert f.s(1, 0) == pytest.approx((1e9 + 2 * 1e9) / 1e12)
    assert f.s(64, 0) == pytest.approx((1e9 + 8 * (1 - 0.75 ** 64) * 1e9) / 1e12)


def test_pipeline_step_is_the_longer_of_latency_and_microbatches_on_the_slowest_stage():
    """pp 2: a step of 4 sequences runs 2 microbatches of 2; lat(2) = 10 ms through both stages, stage(2) = 6 ms:
    max(10, 2 x 6) = 12 ms. One sequence: one microbatch, its latency."""
    c = TableCost([100], [1.0], [1, 2], [0, 1000], [[0.008, 0.008], [0.010, 0.010]], pp=2,
                  stage_prefill_time_s=[0.5], stage_decode_time_s=[[0.004, 0.004], [0.006, 0.006]])
    assert c.decode_s(4, 0) == pytest.approx(0.012)
    assert c.decode_s(1, 0) == pytest.approx(0.008)
    assert c.prefill_s(100, 1) == pytest.approx(1.0)


def test_pp_layout_prices_stages():
    c = _cost("llama-3-8b", 1, 2)
    assert c.pp == 2 and c.stage_decode_time_s is not None
    assert c.kv_bytes_per_token == 32 * 2 * 8 * 128 * 2 / 2
    with pytest.raises(OpmapError, match="--pp 13 exceeds the 12 layers"):
        model_table_cost("gpt2", "h100-sxm", pp=13)


def test_context_past_the_model_limit_is_refused_unless_allowed():
    """llama-2-7b (rotary, 4096 positions): refused past 4096 unless allowed; gpt2's learned positions: refused."""
    with pytest.raises(OpmapError, match="at most 4096 positions.*--allow-long-context"):
        model_table_cost("llama-2-7b", "h100-sxm", max_context=8192)
    assert _cost("llama-2-7b", max_context=8192, allow_long_context=True).kv_capacity_tokens > 0
    with pytest.raises(OpmapError, match="at most 1024 positions.*learned positions"):
        model_table_cost("gpt2", "h100-sxm", max_context=1500, allow_long_context=True)


@pytest.mark.parametrize("model,needle", [("bert-base", "an encoder"), ("resnet50", "a vision model")])
def test_non_decoders_are_refused_in_one_line(model, needle):
    with pytest.raises(OpmapError, match=needle) as e:
        model_table_cost(model, "h100-sxm")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kw,needle", [({"kv_dtype": "fp4"}, "--kv-dtype"), ({"runtime": "jit"}, "runtime"),
                                       ({"gpu_memory_utilization": 0.0}, "--gpu-memory-utilization"),
                                       ({"gpu_memory_utilization": 1.5}, "--gpu-memory-utilization")])
def test_bad_pricing_options_are_refused(kw, needle):
    with pytest.raises(OpmapError, match=needle):
        model_table_cost("gpt2", "h100-sxm", **kw)


def test_runtime_per_step_is_added_once_per_step():
    """eager vs graphs on gpt2: the same step's time differs by the per-kernel overheads and graphs' per-step
    launch; graphs' decode step is never below its own per-step time."""
    g = _cost("gpt2", runtime="graphs")
    rt = get_runtime(get_hardware("h100-sxm"), "graphs")
    assert g.runtime["name"] == "graphs" and g.decode_s(1, 0) > rt.per_step_s
    assert _cost("gpt2", runtime="eager").decode_s(1, 0) > g.decode_s(1, 0)


def test_hf_config_is_priced(tmp_path):
    """A Hugging Face config (analyze's resolver) is priced like a zoo model: extrapolated from 2 layers."""
    import json

    cfg = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512,
           "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    c = model_table_cost(str(p), "h100-sxm")
    assert "extrapolated" in c.source
    assert c.kv_bytes_per_token == 6 * 2 * 2 * 64 * 2


def test_hf_config_decode_step_prices_as_the_zoo_model(tmp_path):
    """llama-3-8b as its Hugging Face config: serve's engine step writes one token's K and V, as the zoo model's
    does, so batch 64 at 8192 tokens prices the same (before: transformers' DynamicCache append, a copy of the
    whole cache per layer per step, priced inside the QKV kernel: 2.1x the zoo model's step)."""
    import json

    cfg = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
           "max_position_embeddings": 8192, "rope_theta": 500000.0, "tie_word_embeddings": False}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    hf, zoo = _pricer(str(p)).decode(64, 8192), _pricer("llama-3-8b").decode(64, 8192)
    assert hf.latency_s == pytest.approx(zoo.latency_s, rel=0.01)


def test_model_file_is_priced(tmp_path):
    """A model file whose factory returns a zoo-style decoder: priced through analyze's resolver, 4 layers
    extrapolated from 2; KV per token 4 layers x 2 x 2 KV heads x 32 head dim x 2 bytes."""
    f = tmp_path / "m.py"
    f.write_text("import torch\n"
                 "from opmap.workloads.llama import Llama, LlamaConfig\n"
                 "def make():\n"
                 "    c = LlamaConfig(vocab_size=512, dim=128, n_layer=4, n_head=4, n_kv_head=2, ffn_dim=256,"
                 " max_seq=4096)\n"
                 "    return Llama(c), torch.zeros(1, 16, dtype=torch.long)\n")
    c = model_table_cost(f"{f}:make", "h100-sxm")
    assert "extrapolated" in c.source and c.kv_bytes_per_token == 4 * 2 * 2 * 32 * 2


def test_a_module_without_a_kv_cache_is_refused(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import torch\n"
                 "def make():\n"
                 "    return torch.nn.Sequential(torch.nn.Linear(8, 8)), torch.zeros(1, 8)\n")
    with pytest.raises(OpmapError, match="needs a decoder") as e:
        model_table_cost(f"{f}:make", "h100-sxm")
    assert "\n" not in str(e.value)


def test_an_encoder_config_is_refused_as_not_a_decoder(tmp_path):
    import json

    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "bert", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2,
                             "num_attention_heads": 2, "intermediate_size": 128, "max_position_embeddings": 128}))
    with pytest.raises(OpmapError, match="no causal attention"):
        model_table_cost(str(p), "h100-sxm")


def test_a_second_pricing_builds_and_captures_nothing(tmp_path, monkeypatch):
    """With the capture cache on, the zoo model's summary and its 2-layer graphs are kept: a second pricing builds
    no module and prices the same table."""
    monkeypatch.setenv("OPMAP_GRAPH_CACHE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = model_table_cost("gpt2", "h100-sxm", tp=2)
    r = Resolved.build("gpt2", "bf16")
    assert r._built is None and r.layers == 12 and r.max_positions == 1024
    p = Pricer(r, get_hardware("h100-sxm"), "bf16", 2, 1, get_runtime(get_hardware("h100-sxm"), "engine"))
    p.prefill(128)
    assert r._built is None  # the graph came from the cache
    second = model_table_cost("gpt2", "h100-sxm", tp=2)
    assert second.to_dict() == first.to_dict()


def test_large_decode_batches_are_priced_compute_bound():
    """Engines run decode batches past the ridge. Llama-3-8B at fp8 on an H100: a decode step of b sequences does at
    least 2 x 7.50e9 x b FLOP (its matmul weights: 8.03e9 parameters less the 128256 x 4096 = 0.525e9 of the input
    embedding, a gather), over the achievable fp8 rate 1.4026e15 FLOP/s (catalog, measured): 2 x 7.50e9 x 1024 /
    1.4026e15 = 11.0 ms at 1024 and 43.8 ms at 4096. Priced points now reach 1024 and, past them, the line is
    compute-bound: the table at 4096 is at least that bound, from a point priced there. Drawn only through batches
    <= 64 (weight-read-bound, nearly flat) and extrapolated, the step at 4096 came out below it (about 21 ms, before
    decode attention's per-sequence cost came from the H100's measured grid: that cost now steepens the 16-64 line,
    so the extrapolation no longer shows the gap; the priced 4096 point is what holds the bound)."""
    c = model_table_cost("llama-3-8b", "h100-sxm", "fp8")
    assert max(c.decode_batch) >= 4096
    for b in (1024, 4096):
        assert c.decode_s(b, 0) >= 2 * 7.50e9 * b / 1.4026e15


def test_a_power_limited_card_is_priced_at_its_sustained_rate_and_still_extrapolated():
    """A serving run keeps the device busy for minutes, so an L4 (power-limited; catalog: boost bf16 70.89 TFLOP/s
    on a 2048^3 loop, sustained 56.90 on 10240^3 loops past its 30 ms power window) runs every step at 56.90, the
    long and the short alike: the rate does not depend on the step's length, so the 2-layer extrapolation holds. A
    compute-bound prefill of 1024 tokens of gpt2 does at least 2 x 85.0e6 x 1024 FLOP in its block matmuls (12 layers
    x 7.08e6 parameters: 4 x 768^2 attention + 8 x 768^2 MLP) at that rate."""
    hw0 = get_hardware("l4")
    rt = get_runtime(hw0, "engine")
    p = Pricer(Resolved.build("gpt2", "bf16"), rt.apply(hw0), "bf16", 1, 1, rt)
    assert p.extrapolate
    t = p.prefill(1024).latency_s
    assert "sustained" in p.rate_basis and "power-limited" in p.rate_basis
    assert t >= 2 * 12 * 12 * 768 ** 2 * 1024 / 56.90e12
    full = Pricer(Resolved.build("gpt2", "bf16"), rt.apply(hw0), "bf16", 1, 1, rt)
    full.extrapolate = False
    assert full.prefill(1024).latency_s == pytest.approx(t, rel=1e-9)
    c = model_table_cost("gpt2", "l4", "bf16")
    assert "sustained" in c.source and "extrapolated" in c.source


# -- uneven stacks: priced per layer period (opmap.serve.layer_period) -----------------------------------------------

def _narrow(family: str, layers: int) -> dict:
    """A published config (tests/hf_family_configs.py) cut to ``layers`` layers and narrowed (hidden 256, 4 heads,
    few experts) so a whole capture stays quick; its layer pattern kept: DeepSeek-V3 one dense layer then MoE (p 1,
    q 1), gpt-oss sliding and full layers in turn (p 0, q 2), Llama 4 Maverick a NoPE layer every 4th and MoE every
    2nd (p 0, q 4; 13 layers leave a tail of 1)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from hf_family_configs import DEEPSEEK_R1, GPT_OSS_20B, LLAMA4_MAVERICK, shallow

    small = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
             "intermediate_size": 512, "vocab_size": 1024, "max_position_embeddings": 4096, "pad_token_id": 0}
    if family == "deepseek_v3":
        d = {**shallow(DEEPSEEK_R1, layers), **small, "num_key_value_heads": 4, "kv_lora_rank": 64, "q_lora_rank": 96,
             "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": 8,
             "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "moe_intermediate_size": 128}
        d.pop("quantization_config"), d.pop("head_dim")  # MLA's head widths are its own
    elif family == "gpt_oss":
        d = {**shallow(GPT_OSS_20B, layers), **small, "num_local_experts": 8, "intermediate_size": 256}
    else:
        d = {**shallow(LLAMA4_MAVERICK, layers), **small, "intermediate_size_mlp": 512, "num_local_experts": 4,
             "bos_token_id": 1, "eos_token_id": 2}
    return d


def _close(a, b, rel: float, path: str = "") -> None:
    """``a`` equals ``b`` (a serve.json cost record): integers exactly, floats to ``rel``."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _close(a[k], b[k], rel, f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, rel, f"{path}[{i}]")
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=rel, abs=1e-300), path
    else:
        assert a == b, path


@pytest.mark.parametrize("family,layers,kw,pq", [
    ("deepseek_v3", 6, {"tp": 2, "ep": 2, "dp_attention": True}, (1, 1)),
    ("gpt_oss", 8, {"pp": 2}, (0, 2)),
    ("llama4_maverick", 13, {"tp": 2}, (0, 4))])
def test_an_uneven_stack_priced_per_period_equals_its_whole_capture(tmp_path, monkeypatch, family, layers, kw, pq):
    """The table from the short and long captures (p + q + r and p + 2q + r layers) equals the one from capturing the
    whole model: every prefill time, decode row, KV bytes per token and capacity, weights, reserve and decode floor,
    to 1e-9 relative (the same kernels summed in another order: float rounding only; the captures are a meta trace,
    deterministic). Under pp 2 the slowest stage to 1e-3: the engine fusion folds a layer's closing residual add into
    the next layer's norm, so at the stage boundary that add lands on the other side (as for a homogeneous stack,
    test_extrapolated_point_equals_the_full_capture_on_llama_3_8b). DeepSeek-V3 under DP attention puts each MoE
    layer's dispatch and combine all-to-all on that layer, none on the dense one; gpt-oss's sliding and full layers
    alternate; Maverick's 13 layers end in a tail of one (a rope dense layer, as the period's first)."""
    p = tmp_path / "config.json"
    p.write_text(json.dumps(_narrow(family, layers)))
    m = Resolved.build(str(p), "bf16")
    st, why = m.stack()
    assert (m.prefix, m.period) == pq and st is not None and st.long < layers, why
    periodic = model_table_cost(str(p), "h100-sxm", "bf16", **kw)
    assert f"from {st.long}-layer captures" in periodic.source
    monkeypatch.setattr(Resolved, "stack", lambda self: (None, "test: the whole model"))
    whole = model_table_cost(str(p), "h100-sxm", "bf16", **kw)
    assert "captured whole (test: the whole model)" in whole.source
    a, b = periodic.to_dict(), whole.to_dict()
    a.pop("source"), b.pop("source")
    stage = (a["prefill"].pop("stage_time_s", None), b["prefill"].pop("stage_time_s", None),
             a["decode"].pop("stage_time_s", None), b["decode"].pop("stage_time_s", None))
    _close(a, b, 1e-9)
    _close(stage[0], stage[1], 1e-3)
    _close(stage[2], stage[3], 1e-3)
    assert periodic.kv_capacity_tokens == whole.kv_capacity_tokens > 0


def test_a_quantized_uneven_stack_holds_its_bf16_modules_once_a_layer(tmp_path, monkeypatch):
    """gpt-oss at MXFP4 keeps its attention, router, embedding and LM head in bf16 (quantization_config's
    modules_to_not_convert): serve's weights per device, priced from the 2- and 4-layer captures of an 8-layer stack,
    count each layer's bf16 attention once a layer, as the whole capture does and as analyze's memory line of the whole
    model holds them (opmap.analyze.Analysis.weights_held_bytes, an independent path: one capture, no blocks)."""
    from opmap.api import Model, Shape

    p = tmp_path / "config.json"
    p.write_text(json.dumps(_narrow("gpt_oss", 8)))
    periodic = model_table_cost(str(p), "b200", "mxfp4")
    held = Model(str(p), "mxfp4").prefill(Shape(1, 16), get_hardware("b200"), "eager")
    assert held.weights_held_bytes > held.graph.param_bytes * held.precision.weight_scale * 1.01  # bf16 parts
    assert periodic.memory["weights_bytes"] == pytest.approx(held.weights_held_bytes, rel=1e-9)
    monkeypatch.setattr(Resolved, "stack", lambda self: (None, "test: the whole model"))
    whole = model_table_cost(str(p), "b200", "mxfp4")
    assert whole.memory["weights_bytes"] == pytest.approx(held.weights_held_bytes, rel=1e-9)


# -- prefill points up to the run's longest prompt (prefill_lengths) ------------------------------------------------

@pytest.mark.parametrize("limit,longest,want", [
    (131072, 32768, [128, 512, 2048, 8192, 32768]),  # gpt-oss, 32768/1024: x4 from 2048 while <= half, then the top
    (131072, 8192, [128, 512, 2048, 8192]),  # 8192/1024
    (131072, 33792, [128, 512, 2048, 8192, 33792]),  # 32768 is over half of 33792: the top point alone
    (131072, 2000, [128, 512, 2048]),  # 1000/1000: the grid, unchanged
    (131072, None, [128, 512, 2048]),
    (4096, 32768, [128, 512, 2048, 4096]),  # capped at the model's positions
    (None, 9000, [128, 512, 2048, 9000]),  # no position limit: the run's prompt
])
def test_prefill_points_reach_the_longest_prompt(limit, longest, want):
    from opmap.serve.model_cost import prefill_lengths

    assert prefill_lengths(limit, longest) == want


@pytest.mark.parametrize("model", ["qwen3", "llama-3-8b"])
def test_a_chunked_long_prompt_pays_its_attention_to_earlier_chunks(model, tmp_path):
    """An 8192-token prompt in four chunks of 2048 (opmap.serve.cost.prefix_s) costs P(8192) + 3 P(0) (the chunks'
    P(d + n) - P(d) - P(n) + P(0) telescope), and more than four 2048-token prompts by at least the causal pairs
    across chunks, 8192^2 / 2 - 4 x 2048^2 / 2 = 25,165,824 per query head, at 4 x head dim FLOPs a pair (QK^T
    and PV) over the fastest causal forward the H100's attention kernel (cuDNN, the catalog's) is measured at, 539
    TFLOP/s (Shah et al. 2024, FlashAttention-3, Figure 5: cuDNN, causal, head dim 128, 16k): points priced only
    to 2048 extrapolated the table linearly and left most of that out (a constant per chunk: 15.2 ms of the 24.5
    ms bound on Llama 3 8B). Qwen3-8B's published config cut to 2 layers, and the zoo Llama 3 8B (32 layers of 32
    query heads of 128: Meta's config)."""
    from hf_family_configs import QWEN3_8B, shallow
    from opmap.serve.cost import prefix_s

    if model == "qwen3":
        path = tmp_path / "config.json"
        path.write_text(json.dumps(shallow(QWEN3_8B, 2)))
        model, layers = str(path), 2
    else:
        layers = 32
    c = model_table_cost(model, "h100-sxm", "bf16", longest_prompt=8192)
    assert c.prefill_tokens == [128, 512, 2048, 8192]
    chunks = [(d, 2048) for d in (0, 2048, 4096, 6144)]
    chunked = sum(c.prefill_s(n, 1) for _, n in chunks) + prefix_s(c, chunks)
    p0 = c.prefill_s(0, 1)
    assert chunked == pytest.approx(c.prefill_s(8192, 1) + 3 * p0, rel=1e-9)
    cross = (8192 ** 2 / 2 - 4 * 2048 ** 2 / 2) * 32 * 4 * 128 * layers / 539e12
    assert chunked - 4 * c.prefill_s(2048, 1) >= cross


@pytest.mark.parametrize("model", ["llama-3-8b", "qwen3"])
def test_a_prefill_point_prices_the_lm_head_over_the_last_token(model, tmp_path):
    """Engines compute the logits they sample, one row per prompt (vLLM v1 ``logits_indices = query_start_loc[1:] -
    1``; TensorRT-LLM's gather_context_logits off by default): a prefill point's LM head is one token's, 2 x hidden x
    vocab FLOPs (Llama 3 8B: 2 x 4096 x 128,256 = 1,050,673,152; Qwen3-8B: 2 x 4096 x 151,936), and the point's
    graph has 2 x (S - 1) x hidden x vocab FLOPs fewer than analyze's prefill of S tokens (every position's
    logits, as a model's plain forward computes them), the rest the same."""
    from hf_family_configs import QWEN3_8B, shallow
    from opmap.phases.step import analyze_phase, capture_phase
    from opmap.workloads.phases import PhaseSpec, phase_workload

    vocab, hidden = (128256, 4096) if model == "llama-3-8b" else (151936, 4096)
    if model == "qwen3":
        path = tmp_path / "config.json"
        path.write_text(json.dumps(shallow(QWEN3_8B, 2)))
        model = str(path)
    hw, spec, s = get_hardware("h100-sxm"), PhaseSpec("prefill"), 512
    m = Resolved.build(model, "bf16")
    m.set_layers(2)
    served = m.prefill(s)
    a = analyze_phase(capture_phase(served, spec), served, hw, "bf16", spec).analysis
    head = sum(r.cost.flops for r in a.results if r.node.module == "lm_head")
    assert head == 2 * hidden * vocab
    # the same two layers, every position's logits: the shallow config through analyze's loader; the zoo module
    # cut to two layers, called with its prompt alone
    plain = phase_workload(model, spec, 1, s, "bf16") if m.hf else replace(served, inputs=(served.inputs[0],))
    b = analyze_phase(capture_phase(plain, spec), plain, hw, "bf16", spec).analysis
    assert sum(r.cost.flops for r in b.results) - sum(r.cost.flops for r in a.results) == 2 * (s - 1) * hidden * vocab


# -- decode points to the run's longest context (decode_lengths) ------------------------------------------------------

@pytest.mark.parametrize("longest,want", [(None, (256, 1024)), (2000, (256, 1024)), (4096, (256, 1024)),
                                          (9216, (256, 9216)), (33792, (256, 33792))])
def test_decode_points_reach_the_longest_context(longest, want):
    from opmap.serve.model_cost import decode_lengths

    assert decode_lengths(longest) == want


def test_a_long_context_decode_is_priced_at_its_own_length_not_extrapolated(tmp_path):
    """Qwen3-8B (cut to 2 layers) on an H100 SXM, whose decode attention is NVIDIA's measured table (concave in the
    KV length): a run holding 16,384-token contexts prices each decode batch on the chord from 256 to 16,384 KV
    tokens a sequence, so the table's step at 16 sequences x 16,384 tokens is the point priced there (the chord is
    exact at its ends), where the line through 256 and 1024 carried 16x past its last point is dearer."""
    from hf_family_configs import QWEN3_8B, shallow

    path = tmp_path / "config.json"
    path.write_text(json.dumps(shallow(QWEN3_8B, 2)))
    long = model_table_cost(str(path), "h100-sxm", "bf16", max_context=16384)
    short = model_table_cost(str(path), "h100-sxm", "bf16", max_context=2048)
    p = _pricer(str(path))
    at = p.decode(16, 16384).latency_s  # the point with its runtime's per-step time, as the table holds it
    assert long.decode_s(16, 16 * 16384) == pytest.approx(at, rel=1e-6)
    assert short.decode_s(16, 16 * 16384) > long.decode_s(16, 16 * 16384)


def test_weights_with_no_room_are_refused_after_the_first_point():
    """Llama-3-70B at bf16 on one H100 (80 GiB): its 70,553,706,496 parameters x 2 B = 131.4 GiB of weights leave no
    KV cache at any runtime reserve, so the refusal comes after the first priced point, not after all of them."""
    said = []
    with pytest.raises(OpmapError, match=r"the weights need 131\.4 GiB per device, of 80\.0 GiB x 0\.9"):
        model_table_cost("llama-3-70b", "h100-sxm", "bf16", 1, progress=said.append)
    assert said == ["pricing prefill of 128 tokens"], said


def test_a_hugging_face_config_with_no_room_is_refused_after_the_first_point(tmp_path):
    """Qwen3-8B (its published config.json) at bf16: per layer q and o 4096 x 4096, k and v 4096 x 1024, the MLP
    3 x 4096 x 12,288, four norms (2 x 4096 + 2 x 128); 36 layers, untied embedding and LM head 151,936 x 4096 each,
    the final norm 4096: 8,190,735,360 parameters, 15.3 GiB at 2 B. On an L4 (24 GiB) at a utilization of 0.5 (12
    GiB) that leaves no KV cache."""
    from hf_family_configs import QWEN3_8B

    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 12288 + 2 * 4096 + 2 * 128
    params = 36 * layer + 2 * 151936 * 4096 + 4096
    assert params == 8_190_735_360
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3_8B))
    said = []
    with pytest.raises(OpmapError, match=rf"the weights need {params * 2 / 2**30:.1f} GiB per device, of 24\.0 GiB "
                                         r"x 0\.5"):
        model_table_cost(str(path), "l4", "bf16", 1, gpu_memory_utilization=0.5, progress=said.append)
    assert said == ["pricing prefill of 128 tokens"], said
