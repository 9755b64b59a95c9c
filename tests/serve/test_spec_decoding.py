"""Speculative decoding (opmap.serve.spec, spec_cost): the accepted tokens against Leviathan et al.'s formula, the
verify step as a decode step of K + 1 tokens (closed-form FLOPs), the step's price as K draft passes plus a
verify, TPOT by hand on fixed step costs, and the counting scheduler held equal to the reference on synthetic
costs, a Hugging Face llama config (EAGLE-3), a zoo model with a draft model and a small DeepSeek-V3 (MTP)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_family_configs import DEEPSEEK_R1, shallow
from opmap.errors import OpmapError
from opmap.record import record
from opmap.serve import TableCost, make_requests, simulate, summarize
from opmap.serve.policies import Chunked, Continuous
from opmap.serve.reference import reference_continuous
from opmap.serve.spec import SpecDecode, alpha_for, expected_tokens, parse_spec, step_tokens
from opmap.serve.spec_cost import SpecCost, spec_table_cost

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "examples" / "tiny-llama.json")


# -- accepted tokens ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("alpha,k,tokens", [
    (0.7, 3, 1 + 0.7 + 0.7**2 + 0.7**3),  # the geometric series 1 + a + ... + a^K, (1 - a^(K+1)) / (1 - a)
    (0.85, 1, 1.85),  # DeepSeek-V3's MTP at its low end: 1.85 tokens a step (its report: 1.8x TPS)
    (0.0, 4, 1.0),  # nothing accepted: the target's own token only
    (0.5, 2, 1.75),
])
def test_expected_tokens_is_leviathan_eq1(alpha, k, tokens):
    """E[tokens per step] = (1 - alpha^(K+1)) / (1 - alpha) (Leviathan, Kalman, Matias 2023, eq. 1); alpha_for
    inverts it (--spec-accepted)."""
    assert expected_tokens(alpha, k) == pytest.approx(tokens, rel=1e-12)
    if alpha > 0:
        assert alpha_for(tokens, k) == pytest.approx(alpha, abs=1e-9)


def test_drawn_steps_have_the_formula_mean_and_add_up_to_each_request():
    """Tokens per step min(G, K + 1), G geometric: each request's draws add up to its output - 1, each in
    [1, K + 1]; over 200 requests of 5,001 tokens the mean per step is E within 1% (the last step of each request cut:
    a bias under 1 / 1,975 steps); P(1 token) = 1 - alpha = 0.3; the same seed draws the same steps."""
    s = parse_spec("eagle:3", 0.7, seed=5)
    out = [5001] * 200 + [1, 2, 7]
    steps = step_tokens(s, out)
    for n, st in zip(out, steps):
        assert int(st.sum()) == n - 1 and (len(st) == 0 or (st.min() >= 1 and st.max() <= 4))
    allsteps = np.concatenate(steps[:200])
    assert 200 * 5000 / len(allsteps) == pytest.approx(expected_tokens(0.7, 3), rel=0.01)
    assert float(np.mean(allsteps == 1)) == pytest.approx(0.3, abs=0.01)
    assert all(np.array_equal(a, b) for a, b in zip(steps, step_tokens(s, out)))


def test_defaults_name_their_sources():
    """--spec mtp:1 without an acceptance takes DeepSeek-V3's 85% (arXiv 2412.19437 section 5.4.3); K > 1 the
    chained length 3.20 at K = 7 (nebius/MTP-DeepSeek-V3-0324's card), alpha solved from it."""
    one = parse_spec("mtp:1")
    assert one.alpha == 0.85 and "2412.19437" in one.basis
    deep = parse_spec("mtp:3")
    assert expected_tokens(deep.alpha, 7) == pytest.approx(3.20, rel=1e-6) and "MTP-DeepSeek-V3-0324" in deep.basis
    assert parse_spec("eagle:2", accepted=2.0).alpha == pytest.approx(alpha_for(2.0, 2))
    hf = parse_spec("draft:hf:meta-llama/Llama-3.2-1B:4", 0.6)  # a draft's own name may hold colons
    assert (hf.draft, hf.k, hf.spec()) == ("hf:meta-llama/Llama-3.2-1B", 4, "draft:hf:meta-llama/Llama-3.2-1B:4")


@pytest.mark.parametrize("text,accept,accepted,needle", [
    ("mtp:0", None, None, "K must be an integer from 1 to 16"),
    ("eagle:x", 0.5, None, "K must be an integer"),
    ("medusa:2", 0.5, None, "unknown --spec kind 'medusa'"),
    ("draft:3", 0.5, None, "bad --spec 'draft:3'"),
    ("draft: :3", 0.5, None, "bad --spec 'draft: :3'"),
    ("eagle:3:1", 0.5, None, "bad --spec 'eagle:3:1'"),
    ("eagle:3", 1.0, None, "--spec-accept must be a number from 0 to below 1"),
    ("eagle:3", -0.1, None, "--spec-accept must be a number from 0 to below 1"),
    ("eagle:3", None, 4.0, "--spec-accepted must be a number from 1 to below K + 1 = 4"),
    ("eagle:3", 0.5, 2.0, "give one"),
    ("eagle:3", None, None, "no published default"),
])
def test_bad_spec_is_refused_in_one_line(text, accept, accepted, needle):
    with pytest.raises(OpmapError, match=None) as e:
        parse_spec(text, accept, accepted)
    assert needle in str(e.value) and "\n" not in str(e.value)


# -- the verify step: a decode step of K + 1 tokens ---------------------------------------------------------------

def test_verify_is_a_decode_step_of_k_plus_1_tokens_per_sequence():
    """A zoo Llama (dim 128, 4 heads, 2 KV heads, head dim 32, FFN 256, vocab 1000, 2 layers) decoding b = 3
    sequences of q = K + 1 = 4 new tokens against L = 64 cached: matrix FLOPs per layer 2 bq (d (d + 2 kv hd) + d^2 +
    3 d f) (QKV, O, gate / up / down at M = b q) + 4 b h q L hd (QK^T and PV), plus the head 2 bq d V; the weights
    read as at q = 1 (each once), but for the embedding rows gathered: b (q - 1) more of d bf16 values."""
    from opmap.costs import cost_graph
    from opmap.phases.step import capture_phase
    from opmap.workloads.llama import Llama, LlamaConfig
    from opmap.workloads.phases import PhaseSpec, decode_workload
    from opmap.workloads.zoo import Workload

    c = LlamaConfig(vocab_size=1000, dim=128, n_layer=2, n_head=4, n_kv_head=2, ffn_dim=256, max_seq=512)
    with torch.device("meta"):
        m = Llama(c).to(torch.bfloat16)
    b, L, d, h, kv, hd, f, V = 3, 64, 128, 4, 2, 32, 256, 1000

    def flops(q):
        w = decode_workload(Workload("small", m, None, b, 1), L, queries=q)
        costs = cost_graph(capture_phase(w, PhaseSpec("decode", kv_len=L)))
        return sum(x.matrix_flops for x in costs), sum(x.param_bytes_read for x in costs)

    (f1, w1), (f4, w4) = flops(1), flops(4)
    q = 4
    layer = 2 * b * q * (d * (d + 2 * kv * hd) + d * d + 3 * d * f) + 4 * b * h * q * L * hd
    assert f4 == pytest.approx(2 * layer + 2 * b * q * d * V, rel=1e-12)
    assert f4 == pytest.approx(4 * f1, rel=1e-12)
    assert w4 == pytest.approx(w1 + b * (q - 1) * d * 2, rel=1e-12)


# -- the step's price and TPOT by hand ----------------------------------------------------------------------------

def _flat(decode_s: float, prefill_per_token_s: float, kv_slope_s: float = 0.0) -> TableCost:
    """Decode ``decode_s`` a step (+ ``kv_slope_s`` per KV token held), prefill ``prefill_per_token_s`` a token."""
    return TableCost([1000], [1000 * prefill_per_token_s], [1], [0, 1000],
                     [[decode_s, decode_s + 1000 * kv_slope_s]])


def _spec_cost(alpha: float, k: int, seed: int = 0, cap: int | None = None, slope: float = 0.0) -> SpecCost:
    """Target decode 10 ms, verify 10 ms, a draft pass 1 ms; prefill 1 ms a token (target), 0.1 ms (draft)."""
    s = SpecDecode("eagle", k, alpha, "test", seed=seed)
    return SpecCost(_flat(0.010, 1e-3, slope), _flat(0.010, 1e-3, slope), _flat(0.001, 1e-4, slope / 10), s, cap)


def test_a_step_is_k_draft_passes_and_one_verify():
    c = _spec_cost(0.7, 3)
    assert c.decode_s(1, 100) == pytest.approx(3 * 0.001 + 0.010)
    assert c.prefill_s(10, 1) == pytest.approx(10 * 1e-3 + 10 * 1e-4)


def test_tpot_by_hand_with_nothing_accepted():
    """alpha 0: one token a step. A request of 10 prompt and 5 output tokens at 0: prefill 10 x 1 ms + 10 x 0.1 ms
    = 11 ms (the first token), then 4 steps of 3 x 1 + 10 = 13 ms: finish 63 ms, TPOT 13 ms, every gap 13 ms."""
    from opmap.serve.arrivals import Requests

    reqs = Requests(np.array([0.0]), np.array([10]), np.array([5]), "given")
    c = _spec_cost(0.0, 3)
    ref = reference_continuous(reqs, Continuous(), c)
    assert ref.first == pytest.approx([0.011]) and ref.finish == pytest.approx([0.063])
    assert ref.gaps == pytest.approx([0.013] * 4)
    res = simulate(reqs, Continuous(), c)
    assert record(summarize(res))["latency"]["tpot"]["p50_s"] == pytest.approx(0.013)


def test_tpot_ratio_against_the_plain_decode():
    """One request of 20,001 output tokens: a step of 13 ms emits 2.533 tokens on average (alpha 0.7, K 3), so TPOT
    = 13 / 2.533 = 5.13 ms against the plain 10 ms: a ratio 0.513 (steps drawn: sd 0.6% of their count)."""
    from opmap.serve.arrivals import Requests

    reqs = Requests(np.array([0.0]), np.array([10]), np.array([20001]), "given")
    spec = record(summarize(simulate(reqs, Continuous(), _spec_cost(0.7, 3))))["latency"]["tpot"]["p50_s"]
    plain = record(summarize(simulate(reqs, Continuous(), _flat(0.010, 1e-3))))["latency"]["tpot"]["p50_s"]
    assert plain == pytest.approx(0.010)
    assert spec / plain == pytest.approx(0.013 / expected_tokens(0.7, 3) / 0.010, rel=0.02)


# -- the counting scheduler held equal to the reference -----------------------------------------------------------

def _same_as_reference(reqs, pol, cost):
    """The same start, first-token and finish times and inter-token gaps (count and sum) as the reference."""
    res = simulate(reqs, pol, cost)
    ref = reference_continuous(reqs, pol, cost)
    np.testing.assert_allclose(res.start_s, ref.start)
    np.testing.assert_allclose(res.first_s, ref.first)
    np.testing.assert_allclose(res.finish_s, ref.finish)
    assert res.itl_weight.sum() == len(ref.gaps) == int((reqs.output_len - 1).sum())
    assert float((res.itl_gap_s * res.itl_weight).sum()) == pytest.approx(sum(ref.gaps))
    return res


@pytest.mark.parametrize("seed,cap,pol,alpha,k", [(1, None, Continuous(8192), 0.7, 3),
                                                  (2, 3000, Continuous(512, max_seqs=8), 0.85, 1),
                                                  (3, 1200, Continuous(300, max_seqs=64), 0.5, 5)])
def test_the_counting_scheduler_is_the_reference_with_speculation(seed, cap, pol, alpha, k):
    """Random traces, a KV slope (each step's price follows the KV the accepted tokens add) and a cache that holds
    back admissions; TPOT percentiles spread (p99 above p50) where requests draw different steps."""
    reqs = make_requests("poisson:30", "uniform:1,300", "uniform:2,200", 250, seed=seed)
    res = _same_as_reference(reqs, pol, _spec_cost(alpha, k, seed, cap, slope=1e-6))
    tpot = record(summarize(res))["latency"]["tpot"]
    assert tpot["p99_s"] > tpot["p50_s"]


def test_chunked_prefill_carries_the_verify_tokens():
    """A chunked step of prompt chunks and speculative decodes: the target reads its weights once for the chunk
    and the decodes' K + 1 tokens each; every request's tokens are out."""
    reqs = make_requests("poisson:30", "uniform:1,300", "uniform:2,200", 100, seed=4)
    c = _spec_cost(0.7, 3)
    assert c.mixed_s(100, 1, 5, 500) == pytest.approx(
        c.target.prefill_s(100 + 5 * 4, 6) + 3 * c.draft.decode_s(5, 500) + c.draft.prefill_s(100, 1))
    res = simulate(reqs, Chunked(256), c)
    assert res.itl_weight.sum() == int((reqs.output_len - 1).sum())


def _small_deepseek(tmp_path: Path) -> str:
    """DeepSeek-R1's config (tests/hf_family_configs.py) narrowed: 3 layers (one dense, two MoE), hidden 256, MLA
    with kv_lora_rank 64, 8 routed experts of which 2 run."""
    d = {**shallow(DEEPSEEK_R1, 3), "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 4,
         "kv_lora_rank": 64, "q_lora_rank": 96, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
         "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
         "moe_intermediate_size": 128, "intermediate_size": 512, "vocab_size": 1024, "max_position_embeddings": 4096}
    d.pop("quantization_config")
    p = tmp_path / "config.json"
    p.write_text(json.dumps(d))
    return str(p)


@pytest.mark.parametrize("case", ["hf-llama-eagle", "zoo-gpt2-draft-llama", "hf-deepseek-v3-mtp"])
def test_the_counting_scheduler_is_the_reference_on_priced_models(tmp_path, case):
    """Priced by opmap's phase analyses on an H100: a step is K draft passes of the draft (a one-layer target for
    EAGLE and MTP, a model of its own for draft) and one verify pass of the target over K + 1 tokens."""
    from dataclasses import replace

    model, spec = {"hf-llama-eagle": (TINY, parse_spec("eagle:3", 0.7)),
                   "zoo-gpt2-draft-llama": ("gpt2", parse_spec(f"draft:{TINY}:2", 0.6)),
                   "hf-deepseek-v3-mtp": (None, parse_spec("mtp:2"))}[case]
    model = model or _small_deepseek(tmp_path)
    cost = spec_table_cost(model, "h100-sxm", "bf16", 1, spec)
    for b, kv in ((1, 300), (1024, 1024 * 900)):
        assert cost.decode_s(b, kv) == pytest.approx(spec.k * cost.draft.decode_s(b, kv) + cost.verify.decode_s(b, kv))
        # K + 1 tokens a sequence: the same weights and KV read, more FLOPs; never cheaper than one token (a GEMM of
        # M = 4 may tile better than a GEMV of M = 1: within 1%)
        assert cost.verify.decode_s(b, kv) >= 0.99 * cost.target.decode_s(b, kv)
    if "deepseek" not in case:  # one sequence of a dense model: about as dear (the weights' read bounds both); a
        # MoE's K + 1 tokens route to more experts (8 (1 - (1 - 2/8)^3) = 4.6 of 8 for 3 tokens, 2 for one)
        assert cost.verify.decode_s(1, 300) == pytest.approx(cost.target.decode_s(1, 300), rel=0.05)
    assert cost.kv_capacity_tokens < cost.target.kv_capacity_tokens  # the draft's weights and KV take their share
    cost = replace(cost, kv_capacity_tokens=4000)
    reqs = make_requests("poisson:200", "uniform:16,400", "uniform:2,300", 120, seed=7)
    _same_as_reference(reqs, Continuous(2048, max_seqs=32), cost)
