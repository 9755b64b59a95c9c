"""Memory fit: measured saved activations against Korthikanti et al. 2022, the KV cache against vLLM's figure,
model state against the ZeRO paper, and the fit / largest batch / longest context against hand computations.

Goldens are closed forms from the papers, written out beside each test."""

from __future__ import annotations

import pytest
from megatron_stack import megatron_stack

from opmap.capture import capture
from opmap.errors import OpmapError
from opmap.mapping.activations import saved_activation_bytes
from opmap.mapping.memory import (
    Assumed,
    activation_model,
    fit_inference,
    fit_training,
    kv_cache_bytes,
    kv_geometry,
    training_state_bytes,
)
from opmap.record import record
from opmap.workloads import build_zoo


def test_activation_model_scales_batch_and_sequence_like_the_measurement():
    b, s, h, a = 1, 32, 64, 2
    model = activation_model(lambda bb, ss: saved_activation_bytes(*megatron_stack(bb, ss, h, a)).total_bytes, b, s)
    for bb, ss in ((3, 32), (2, 96)):
        assert model(bb, ss) == pytest.approx(saved_activation_bytes(*megatron_stack(bb, ss, h, a)).total_bytes)


# -- KV cache --------------------------------------------------------------------------------------------

def test_kv_cache_per_token_goldens():
    # Llama 3 8B, bf16: 2 x 32 layers x 8 KV heads x 128 x 2 B = 131,072 B per token (GQA)
    assert kv_cache_bytes(32, 8, 128, 1, 2) == 131072
    # OPT-13B, fp16: 2 x 5120 x 40 x 2 B = 800 KB per token (vLLM, Kwon et al. 2023, sec. 3); 2048 tokens 1.6 GB
    assert kv_cache_bytes(40, 40, 128, 1, 2) == 800 * 1024
    assert kv_cache_bytes(40, 40, 128, 2048, 2) == pytest.approx(1.6e9, rel=0.05)
    # a sliding window keeps at most the window's tokens
    assert kv_cache_bytes(32, 8, 128, 32768, 2, batch=2, window=4096) == 2 * 4096 * 131072


def test_kv_geometry_read_off_the_graph():
    g = capture(*(lambda w: (w.module, w.inputs))(build_zoo("llama-3-8b", 1, 8, "bf16")))
    geo = kv_geometry(g)
    assert (geo.layers, geo.heads[0], geo.head_dim, geo.bytes_per_token) == (32, 8, 128, 131072)
    g2 = capture(*(lambda w: (w.module, w.inputs))(build_zoo("gpt2", 1, 8, "fp16")))
    assert kv_geometry(g2).bytes_per_token == 2 * 12 * 12 * 64 * 2  # no GQA: every head cached
    g3 = capture(*(lambda w: (w.module, w.inputs))(build_zoo("bert-base", 1, 8, "fp16")))
    assert kv_geometry(g3).bytes_per_token == 0  # an encoder keeps no cache


# -- model state (ZeRO paper, Rajbhandari et al. 2020, Fig. 1: K = 12, N = 8) ------------------------------

@pytest.mark.parametrize("zero,golden", [
    (0, (2 + 2 + 12)),            # baseline: (2 + 2 + K) psi
    (1, 2 + 2 + 12 / 8),          # P_os: 2 psi + 2 psi + K psi / N
    (2, 2 + (2 + 12) / 8),        # P_os+g: 2 psi + (2 + K) psi / N
    (3, (2 + 2 + 12) / 8),        # P_os+g+p: (2 + 2 + K) psi / N
])
def test_model_state_by_zero_stage(zero, golden):
    psi = 7.5e9  # the paper's example: 7.5B parameters, 120 GB at stage 0, 1.9 GB at stage 3 over 64
    st = training_state_bytes(psi, zero=zero, dp=8, fmt="bf16")
    assert st.total_bytes == pytest.approx(golden * psi)
    assert training_state_bytes(psi, 0).total_bytes == 120e9
    assert training_state_bytes(psi, 3, 64).total_bytes == pytest.approx(1.875e9)


def test_model_state_with_fp32_main_gradients_and_refusals():
    # Megatron-LM distrib_optimizer.md: bf16 params with fp32 grads, 18 B per parameter undistributed
    assert training_state_bytes(1e9, 0, grad_bytes=4).total_bytes == 18e9
    with pytest.raises(OpmapError, match="accepted: 0, 1, 2, 3"):
        training_state_bytes(1e9, zero=4)
    with pytest.raises(OpmapError, match="at least 1"):
        training_state_bytes(1e9, dp=0)


# -- the fit ------------------------------------------------------------------------------------------------

def test_inference_fit_max_batch_and_context_by_hand():
    """Capacity 10 GB, weights 4 GB, workspace 1 GB: 5 GB for the KV cache at 1 MB per token.
    At context 1000: 5 sequences fit (1 GB each), so batch 5 fits and batch 6 does not; at batch 2: 2500 tokens."""
    ws = Assumed(1e9, "assumed", "test")
    ok = fit_inference(4e9, 1e6, 10e9, batch=5, context=1000, workspace=ws)
    assert ok.fits and ok.reason == "" and ok.max_batch == 5 and ok.max_context == 1000
    assert ok.per_device["total_bytes"] == 10e9 and ok.per_device["kv_cache_bytes"] == 5e9
    bad = fit_inference(4e9, 1e6, 10e9, batch=6, context=1000, workspace=ws)
    assert not bad.fits and bad.max_batch == 5 and bad.max_context == 833
    # shown in binary units, as vendors state device memory: 11e9 B = 10.24 GiB, 10e9 B = 9.313 GiB
    assert bad.reason.startswith("needs 10.24 GiB per device, the device has 9.313 GiB (1.10x)")
    assert "kv cache" in bad.reason and bad.text.startswith("does not fit")
    d = record(bad)
    assert set(d["per_device"]) == {"weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
                                    "kv_cache_bytes", "workspace_bytes", "total_bytes"}
    assert d["capacity_bytes"] == 10e9 and d["fits"] is False
    # a 500-token window caps the cache: any context fits at batch 6 (3 GB of cache)
    assert fit_inference(4e9, 1e6, 10e9, 6, 1000, workspace=ws, window=500, max_context=10**6).max_context == 10**6
    # weights alone too large: nothing fits, as a result with a reason
    none = fit_inference(12e9, 1e6, 10e9, 1, 1, workspace=ws)
    assert not none.fits and none.max_batch == 0 and none.max_context == 0 and "weights" in none.reason


def test_training_fit_on_a_small_model_by_hand():
    """The 3-layer Megatron stack (h 128, a 4) in bf16 AdamW, ZeRO 0: 16 B per parameter; activations measured
    (3 layers x (s b h (34 + 5 a s / h) + 16 s b)). The largest batch is the hand-computed floor."""
    h, a, s = 128, 4, 64
    m, _ = megatron_stack(1, s, h, a)
    params = sum(p.numel() for p in m.parameters())
    assert params == 3 * (12 * h * h + 13 * h)
    st = training_state_bytes(params, 0)
    ws = Assumed(0.0, "assumed", "test")

    def act(b, ss):
        return saved_activation_bytes(*megatron_stack(b, ss, h, a)).total_bytes

    per_seq = 3 * (s * h * (34 + 5 * a * s / h) + 16 * s)
    cap = 16 * params + 7.5 * per_seq
    f = fit_training(st, cap, 4, s, act, workspace=ws, max_batch=64, max_context=512)
    assert f.fits and f.max_batch == 7 and f.activations_bytes == 4 * per_seq
    assert f.per_device["optimizer_bytes"] == 12 * params and f.kv_cache_bytes == 0
    bigger = fit_training(st, cap, 8, s, act, workspace=ws, max_batch=64, max_context=512)
    assert not bigger.fits and "activations" in bigger.reason and bigger.max_batch == 7
    # the longest sequence that fits at batch b is the largest s with b * 3 * (34 s h + 5 a s^2 + 16 s) <=
    # 7.5 per_seq; a larger batch fits a shorter one
    def longest(b):
        return max(ss for ss in range(1, 513) if b * 3 * (34 * ss * h + 5 * a * ss * ss + 16 * ss) <= 7.5 * per_seq)
    assert (f.max_context, bigger.max_context) == (longest(4), longest(8)) == (104, 60)


def test_a_serving_memory_records_the_derived_bytes_beside_its_inputs():
    """serve.json's cost.memory: usable = capacity x utilization - weights - reserve, KV tokens = floor(usable / KV
    bytes per token), the KV cache those whole tokens take; the reserve's entries as their fields."""
    from opmap.mapping.memory import ServingMemory

    cap = 80 * 2 ** 30  # an H100's 80 GiB as the catalog states it
    m = ServingMemory(cap, 0.9, 16e9, {"workspace": Assumed(1e9, "assumed", "test")}, 131072.0)
    d = record(m)
    assert list(d) == ["capacity_bytes", "utilization", "usable_bytes", "weights_bytes", "reserve_bytes", "kv_bytes",
                       "kv_bytes_per_token", "kv_capacity_tokens", "reserve", "units"]
    usable = cap * 0.9 - 16e9 - 1e9
    assert d["usable_bytes"] == usable and d["kv_capacity_tokens"] == int(usable // 131072.0)
    assert d["kv_bytes"] == int(usable // 131072.0) * 131072.0
    assert d["reserve"] == {"workspace": {"value": 1e9, "kind": "assumed", "source": "test"}}
    assert d["units"].startswith("bytes per device")
