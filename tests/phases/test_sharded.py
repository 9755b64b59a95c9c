"""A decode step under a layout (opmap.phases.sharded): the KV cache each device holds and the weights + KV read
floor of the time per output token, on a zoo model and a Hugging Face config, against the formulas:

- KV per device = 2 x layers / pp x KV heads / min(tp, KV heads) x head dim x bytes x batch x KV length (vLLM, Kwon
  et al. 2023, sec. 3; a KV head is replicated on tp / KV heads ranks when tp exceeds them, as Megatron-LM and vLLM
  do);
- floor = (weight bytes + KV bytes one device of each stage reads, summed over the stages a token passes) / the
  device's achievable memory rate: the matrices / tp (the K and V projections / min(tp, KV heads)), the norms and
  the rotary frequencies whole, the embedding rows the batch gathers / tp (vocabulary-parallel), the KV cache's
  share above."""

from __future__ import annotations

import json

import pytest

from opmap.hardware import get_hardware
from opmap.mapping.sharding import Parallelism
from opmap.phases.step import analyze_phase, capture_phase
from opmap.record import record
from opmap.workloads.phases import PhaseSpec, check_phase, phase_workload

H200 = get_hardware("h200")
BATCH, KV_LEN = 4, 1024
# layers, hidden, heads, KV heads, head dim, FFN, vocabulary: llama-3-8b as published (Meta's config.json), and a
# small Llama written as a Hugging Face config.json
LLAMA3_8B = (32, 4096, 32, 8, 128, 14336, 128256)
SMALL = (4, 256, 8, 2, 32, 896, 512)
SMALL_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": 256,
                "intermediate_size": 896, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
                "max_position_embeddings": 4096, "tie_word_embeddings": False}


def _decode(target: str):
    spec = check_phase(PhaseSpec("decode", KV_LEN), target, BATCH)
    w = phase_workload(target, spec, BATCH, None, "bf16")
    return analyze_phase(capture_phase(w, spec), w, H200, "bf16", spec).analysis


@pytest.fixture(scope="module")
def decodes(tmp_path_factory):
    cfg = tmp_path_factory.mktemp("hf") / "config.json"
    cfg.write_text(json.dumps(SMALL_CONFIG))
    return {"llama-3-8b": (_decode("llama-3-8b"), LLAMA3_8B), "config.json": (_decode(str(cfg)), SMALL)}


def _kv(geo, tp: int, pp: int = 1) -> float:
    layers, _, _, kvh, hd, _, _ = geo
    return 2 * layers / pp * kvh / min(tp, kvh) * hd * 2 * BATCH * KV_LEN


def _weights(geo, tp: int) -> float:
    layers, h, heads, kvh, hd, f, vocab = geo
    split = layers * (2 * h * heads * hd + 3 * h * f) + vocab * h  # q, o, gate, up, down; the LM head
    kv_proj = layers * 2 * h * kvh * hd
    whole = (2 * layers + 1) * h + hd // 2  # the norms; the rotary frequencies (a buffer of head dim / 2)
    return 2 * (split / tp + kv_proj / min(tp, kvh) + whole + BATCH * h / tp)


@pytest.mark.parametrize("model", ["llama-3-8b", "config.json"])
@pytest.mark.parametrize("tp,pp", [(2, 1), (8, 1), (4, 2)])
def test_decode_kv_cache_and_floor_per_device_are_the_formulas(decodes, model, tp, pp):
    """llama-3-70b at 8192 x 32 on 8 H200s printed 17.43 GiB a device with no KV cache (10 GiB of it a device), and
    a floor of the whole model's reads (54.2 ms) above the 23.7 ms the device takes, before the fix."""
    from opmap.phases.sharded import shard_analysis

    a, geo = decodes[model]
    p = Parallelism(tp=tp, pp=pp, microbatch=BATCH, global_batch=BATCH)
    out = shard_analysis(a, p)
    assert out.fit.kv_cache_bytes == pytest.approx(_kv(geo, tp, pp), rel=1e-12)
    f = record(out.phase_figures)
    assert f["kv_cache_read_bytes"] == pytest.approx(_kv(geo, tp), rel=1e-12)  # every stage's share, in turn
    assert f["weights_bytes"] == pytest.approx(_weights(geo, tp), rel=1e-12)
    floor = (_weights(geo, tp) + _kv(geo, tp)) / H200.memory_rate_bytes_per_s
    assert f["lower_bound_s"] == pytest.approx(floor, rel=1e-12)
    assert f["lower_bound_s"] < f["tpot_s"]
    assert f"the per-device weights + KV read floor {floor * 1e3:.4g} ms" in f["text"]


def test_kv_heads_fewer_than_tp_are_replicated(decodes):
    """tp 16 over llama-3-8b's 8 KV heads: each KV head (its cache and its K / V projections) on 2 ranks."""
    from opmap.phases.sharded import shard_analysis

    a, geo = decodes["llama-3-8b"]
    out = shard_analysis(a, Parallelism(tp=16, microbatch=BATCH, global_batch=BATCH))
    assert out.fit.kv_cache_bytes == pytest.approx(_kv(geo, 8), rel=1e-12)
    assert out.phase_figures.floor.weights_bytes == pytest.approx(_weights(geo, 16), rel=1e-12)


def test_a_kv_cache_that_outgrows_the_device_does_not_fit():
    """128 sequences of 8192 tokens of llama-3-8b: 2 x 32 x 8 x 128 x 2 x 128 x 8192 = 128 GiB of KV a replica. Over
    tp 2, 64 GiB a device beside 7.5 GiB of weights: it fits an H200's 141 GiB; data parallelism gives each replica
    its own 128 sequences: 128 GiB a device beside 15 GiB of weights does not fit (llama-3-70b at 128 x 8192 on tp 2,
    160 GiB of KV a device, "fit" before the fix)."""
    from opmap.phases.sharded import shard_analysis

    spec = check_phase(PhaseSpec("decode", 8192), "llama-3-8b", 128)
    w = phase_workload("llama-3-8b", spec, 128, None, "bf16")
    a = analyze_phase(capture_phase(w, spec), w, H200, "bf16", spec).analysis
    fit = shard_analysis(a, Parallelism(tp=2, microbatch=128, global_batch=128)).fit
    assert fit.kv_cache_bytes == 64 * 2**30 and fit.fits
    fit = shard_analysis(a, Parallelism(dp=2, microbatch=128, global_batch=256)).fit
    assert fit.kv_cache_bytes == 128 * 2**30 and not fit.fits and "kv cache" in fit.reason


@pytest.mark.parametrize("tp", [2, 8])
def test_hf_config_decode_under_a_layout_through_analyze(tmp_path, capsys, tp):
    """`opmap analyze config.json --phase decode --tp N`: analysis.json's memory fit holds the KV cache a device
    keeps and the phase's floor is one device's reads (they were 0 and the whole model's before the fix)."""
    from opmap.cli import main

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(SMALL_CONFIG))
    rc = main([str(a) for a in ("analyze", cfg, "--phase", "decode", "--kv-len", KV_LEN, "--batch", BATCH,
                                "--tp", tp, "--hardware", "h200", "--no-store", "--rows", 1, "--out", tmp_path / "o")])
    assert rc == 0, capsys.readouterr().err
    d = json.loads((tmp_path / "o" / "analysis.json").read_text())
    assert d["totals"]["memory_fit"]["per_device"]["kv_cache_bytes"] == pytest.approx(_kv(SMALL, tp), rel=1e-12)
    floor = (_weights(SMALL, tp) + _kv(SMALL, tp)) / H200.memory_rate_bytes_per_s
    assert d["phase"]["lower_bound_s"] == pytest.approx(floor, rel=1e-12) and floor < d["phase"]["tpot_s"]
