"""A quantized checkpoint priced as it ships (opmap.analyze.checkpoint_unquantized, opmap.mapping.fp8.
inference_bf16_nodes, opmap.workloads.hf_geometry.checkpoint_quantization): gpt-oss's config.json says its experts
are MXFP4 and its attention, router, embedding and LM head are not (quantization_config.modules_to_not_convert), so
an mxfp4 analysis reads the attention projections' weights at 2 bytes and the experts' at MXFP4's 17/32 (4-bit
values and an 8-bit scale per 32: OCP Microscaling v1.0); a zoo model without a checkpoint puts every Linear but the
LM head in the run's format."""

from __future__ import annotations

import json

import pytest

from opmap.errors import OpmapError
from opmap.mapping.fp8 import module_matches

pytest.importorskip("transformers")

from hf_family_configs import DEEPSEEK_R1, GPT_OSS_20B, shallow  # noqa: E402
from opmap.api import Model, Shape  # noqa: E402
from opmap.hardware import get_hardware  # noqa: E402
from opmap.workloads.hf_geometry import checkpoint_quantization  # noqa: E402

MXFP4_BYTES = 0.5 + 1 / 32  # E2M1 (4 bits) + one E8M0 scale byte per 32 elements


def test_the_checkpoint_formats_of_the_published_configs():
    assert checkpoint_quantization(GPT_OSS_20B) == ("mxfp4", ("model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                              "model.embed_tokens", "lm_head"))
    assert checkpoint_quantization(DEEPSEEK_R1) == ("fp8-block", ())  # weight_block_size [128, 128]
    assert checkpoint_quantization({"model_type": "llama"}) == ("", ())
    with pytest.raises(OpmapError, match="modules_to_not_convert must be a list"):
        checkpoint_quantization({"quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": "x"}})


def test_module_patterns_match_as_transformers_names_them():
    pats = ("model.layers.*.self_attn", "lm_head")
    assert module_matches("model.layers.3.self_attn.q_proj", pats) and module_matches("lm_head", pats)
    assert not module_matches("model.layers.3.mlp.experts", pats) and not module_matches("lm_head2", pats)


def _weights(a, fragment: str) -> list[tuple[float, float]]:
    """(weight bytes read, weight elements) of each weight GEMM whose module holds ``fragment``."""
    out = []
    for r in a.results:
        params = [t for t in r.node.inputs if t.param is not None]
        if r.node.packet in ("mm", "addmm", "bmm", "linear") and params and fragment in r.node.module:
            out.append((r.cost.param_bytes_read, sum(t.numel for t in params)))
    return out


@pytest.fixture(scope="module")
def gpt_oss_mxfp4(tmp_path_factory):
    path = tmp_path_factory.mktemp("g") / "config.json"
    path.write_text(json.dumps(shallow(GPT_OSS_20B, 2)))
    m = Model(str(path), "mxfp4")
    return m.prefill(Shape(1, 16), get_hardware("b200"), "eager")


def test_gpt_oss_attention_stays_bf16_and_its_experts_are_mxfp4(gpt_oss_mxfp4):
    a = gpt_oss_mxfp4
    attn = _weights(a, "self_attn")
    experts = _weights(a, "mlp.experts")
    assert attn and experts
    for read, n in attn:  # q / k / v / o weights (their biases too) at bf16
        assert read == pytest.approx(2 * n)
    for read, n in experts:
        assert read == pytest.approx(MXFP4_BYTES * n)
    assert "the checkpoint's unquantized modules (model.layers.*.self_attn" in a.assumptions.fp8_inference


def test_a_zoo_model_without_a_checkpoint_runs_its_attention_in_the_format():
    a = Model("mixtral-8x7b", "mxfp4").prefill(Shape(1, 16), get_hardware("b200"), "eager")
    attn = _weights(a, "attn")
    assert attn and all(read == pytest.approx(MXFP4_BYTES * n) for read, n in attn)


# -- the weights held (opmap.mapping.memory.held_weight_bytes) ------------------------------------------------

def _gpt_oss_params(c: dict) -> tuple[int, int]:
    """(all parameters, those the checkpoint keeps in bf16) of a gpt-oss config, counted from its published
    structure (transformers' GptOssModel: q / k / v / o with biases and per-head sinks; a router with bias; experts'
    gate_up_proj (E, H, 2I) and down_proj (E, I, H) with biases; two RMSNorms a layer and a final one; an untied LM
    head). Kept: the embedding, the LM head, q / k / v / o and the router (modules_to_not_convert; the sinks are no
    GEMM weight and stay in the format)."""
    h, v, e, i = c["hidden_size"], c["vocab_size"], c["num_local_experts"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    attn = (h * q + q) + 2 * (h * kv + kv) + (q * h + h)
    router = h * e + e
    experts = e * h * 2 * i + e * 2 * i + e * i * h + e * h
    layer = attn + c["num_attention_heads"] + router + experts + 2 * h
    total = 2 * v * h + c["num_hidden_layers"] * layer + h
    kept = 2 * v * h + c["num_hidden_layers"] * (attn + router)
    return total, kept


def test_gpt_oss_holds_its_unquantized_modules_in_bf16(gpt_oss_mxfp4):
    c = shallow(GPT_OSS_20B, 2)
    total, kept = _gpt_oss_params(c)
    assert gpt_oss_mxfp4.graph.params == total
    # every parameter at MXFP4's 17/32 byte, the kept ones at 2 bytes
    want = MXFP4_BYTES * total + (2 - MXFP4_BYTES) * kept
    assert gpt_oss_mxfp4.weights_held_bytes == pytest.approx(want, rel=1e-9)
    assert gpt_oss_mxfp4.totals_dict()["param_bytes"] == pytest.approx(want, rel=1e-9)
    assert gpt_oss_mxfp4.memory.weights_bytes == pytest.approx(want, rel=1e-9)
    assert "in bf16" in gpt_oss_mxfp4.memory_text


def test_a_zoo_llama_at_fp8_holds_its_embedding_and_head_in_bf16():
    # Llama 3 8B (Meta's config: vocab 128,256, hidden 4,096, 32 layers, MLP 14,336, 8 KV heads of 128): 8,030,261,248
    # parameters, the embedding and the untied LM head 128,256 x 4,096 each; fp8 stores 1 byte a weight, bf16 2
    v, h, layers, inter, kv = 128256, 4096, 32, 14336, 8 * 128
    total = 2 * v * h + layers * (2 * h * h + 2 * h * kv + 3 * h * inter + 2 * h) + h
    assert total == 8_030_261_248
    a = Model("llama-3-8b", "fp8").prefill(Shape(1, 16), get_hardware("h100-sxm"), "eager")
    assert a.weights_held_bytes == pytest.approx(total * 1 + 2 * v * h * (2 - 1), rel=1e-9)
    bf16 = Model("llama-3-8b", "bf16").prefill(Shape(1, 16), get_hardware("h100-sxm"), "eager")
    assert bf16.weights_held_bytes == pytest.approx(2 * total, rel=1e-9)  # nothing narrower than bf16: unchanged


# -- the attention core of a sub-byte run (opmap.precision.attention_core_precision) --------------------------------

def _sdpa(a) -> list:
    return [r for r in a.results if r.cost.problem is not None and r.cost.problem.family.attention]


@pytest.mark.parametrize("model", ["qwen3_moe", "mixtral-8x7b"])
def test_a_sub_byte_run_prices_its_attention_products_at_fp8_not_fp4(model, tmp_path):
    """TensorRT-LLM's context FMHA runs bf16 or e4m3, never fp4 (precision.ATTENTION_CORE_FLOOR): an nvfp4 run of
    Qwen3-30B-A3B (its published config cut to 2 layers) or a zoo Mixtral on a B200 prices QK^T and PV as the fp8 run
    does, at no more than the B200's 4.5 PFLOP/s dense FP8 (NVIDIA HGX B200 specifications), while its expert GEMMs
    keep the FP4 rate (faster than fp8's)."""
    from hf_family_configs import FAMILIES

    if model in FAMILIES:
        path = tmp_path / "config.json"
        path.write_text(json.dumps(shallow(FAMILIES[model], 2)))
        model = str(path)
    hw = get_hardware("b200")
    fp4, fp8 = (Model(model, d).prefill(Shape(1, 4096), hw, "eager") for d in ("nvfp4", "fp8"))
    a4, a8 = _sdpa(fp4), _sdpa(fp8)
    assert a4 and len(a4) == len(a8)
    for r4, r8 in zip(a4, a8):
        assert r4.pred.matrix_s == pytest.approx(r8.pred.matrix_s, rel=1e-9)
        assert r4.pred.matrix_s >= r4.cost.matrix_flops / 4.5e15
    ids = {r.node.id for r in a4}
    k4 = [k for k in fp4.kernel_results if k.kernel.anchor in ids]
    assert k4 and all(k.format.startswith("fp8") for k in k4), k4[0].format
    e4, e8 = _weights_time(fp4, "experts"), _weights_time(fp8, "experts")
    assert e4 < e8


def _weights_time(a, fragment: str) -> float:
    """The matrix time of the weight GEMMs whose module holds ``fragment``."""
    return sum(r.pred.matrix_s for r in a.results if fragment in r.node.module and r.cost.param_bytes_read)
