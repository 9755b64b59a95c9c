"""What the capacity search may skip without changing its answer: a refinement round run one rate at a time stops
at its first invalid rate; a configuration where a request served alone already breaks the SLO is not searched."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from opmap.record import record
from opmap.serve.alone import alone_breaks_slo
from opmap.serve.arrivals import Arrival, parse_length
from opmap.serve.capacity import RateProbe, find_capacity, steady_capacity
from opmap.serve.cost import TableCost
from opmap.serve.metrics import Slo, Validity
from opmap.serve.policies import parse_policy


@dataclass(frozen=True)
class Ran:
    """What a probe's run reports to the search (a ServeReport's validity and steady state)."""

    validity: Validity
    steady_state: Any = None


def _rule(valid):
    def run(rate: float) -> Ran:
        ok = valid(rate)
        return Ran(Validity(ok, "VALID" if ok else "INVALID", f"{rate:g}", "the rule given"))
    return run


@pytest.mark.parametrize("valid", [
    lambda r: r <= 3.0,  # an edge at 3 requests/s
    lambda r: r <= 3.0 or 3.3 <= r <= 3.5,  # not monotone: valid again above the first invalid rate
    lambda r: r <= 0.2 or 1.0 <= r <= 2.9,  # not monotone below the edge either
])
def test_a_round_stopped_at_its_first_invalid_rate_gives_the_answer_of_the_whole_round(valid):
    def together(fn, rates):  # an engine's map: every probe of a round run
        return [fn(r) for r in rates]

    for ceiling in (None, 50.0):
        whole = find_capacity(_rule(valid), 1.0, map_fn=together, ceiling=ceiling)
        one_by_one = find_capacity(_rule(valid), 1.0, ceiling=ceiling)
        for k in ("rate_per_s", "bracket", "converged", "limited_by", "summary"):
            assert getattr(one_by_one, k) == getattr(whole, k)
        # the record too: the runs a whole round made above its first invalid rate decide nothing and are left out,
        # so serve.json is the same on every engine (tests/explore/test_engine.py: a pool against inline)
        assert one_by_one.runs == whole.runs


def _flat(prefill_s: float, step_s: float, kv_capacity: int = 100_000) -> TableCost:
    """Every prefill of up to 4096 tokens takes ``prefill_s``, every decode step ``step_s`` (monotone: flat)."""
    return TableCost([1, 4096], [prefill_s, prefill_s], [1, 256], [0, 1e6], [[step_s, step_s], [step_s, step_s]],
                     kv_capacity_tokens=kv_capacity)


def _probe(cost, slo, policy="engine", output_len="128"):
    return RateProbe(Arrival("poisson", 1.0), parse_length("512"), parse_length(output_len), 200,
                     parse_policy(policy), cost, 1, "round_robin", 0, slo)


def test_the_alone_bound_is_prefill_plus_one_step_per_later_token():
    """A request of 512 + 128 tokens alone: its prompt in one step (50 ms: its first token), then 127 decode steps
    of 20 ms: e2e = 50 + 127 x 20 = 2590 ms, TPOT = 127 x 20 / 127 = 20 ms."""
    cost = _flat(0.050, 0.020)
    why = alone_breaks_slo(_probe(cost, Slo(None, None, 2.589)))
    assert why is not None and "2590 ms end to end, over the 2589 ms limit" in why
    assert alone_breaks_slo(_probe(cost, Slo(None, None, 2.591))) is None
    assert "50 ms TTFT" in alone_breaks_slo(_probe(cost, Slo(0.049, None)))
    assert "20 ms TPOT" in alone_breaks_slo(_probe(cost, Slo(None, 0.0199)))
    assert alone_breaks_slo(_probe(cost, Slo(0.051, 0.0201))) is None
    # a policy that waits for a batch serves a lone request slower than a full one: not judged alone
    assert alone_breaks_slo(_probe(cost, Slo(None, None, 2.589), policy="dynamic:8,100")) is None
    # a table where a batch of 16 steps at half the time of one: the bound is half the time alone (1295 ms)
    odd = TableCost([1, 4096], [0.05, 0.05], [1, 16, 256], [0, 1e6], [[0.02, 0.02], [0.01, 0.01], [0.03, 0.03]])
    assert alone_breaks_slo(_probe(odd, Slo(None, None, 2.589))) is None
    assert "at least 0.5 of that" in alone_breaks_slo(_probe(odd, Slo(None, None, 1.29)))
    # a table extrapolated past its last batch downward (the last rows falling) shows no share at all
    down = TableCost([1, 4096], [0.05, 0.05], [1, 16, 256], [0, 1e6],
                     [[0.02, 0.02], [0.03, 0.03], [0.025, 0.025]])
    assert alone_breaks_slo(_probe(down, Slo(None, None, 0.1))) is None


def test_the_bound_asks_the_table_to_grow_only_where_the_request_runs():
    """A decode table where 16 sequences holding 131,072 KV tokens in all step faster (80 ms) than one sequence
    holding them (100 ms), as NVIDIA's measured decode attention on the H100 does at long KV (256 sequences
    slower again, so the table rises past its last batch). A request of 512 +
    128 tokens holds 512-640 tokens, where 16 sequences take 25.2 ms a step against one's 20.3 ms: no loaded step it
    meets is cheaper than its step alone, and the bound stands whole. A request whose own KV reaches 100,000 tokens
    meets cheaper steps (linear between the 16,384 and 131,072 columns: one sequence 30 + 70 (k - 16384) / 114688
    ms, 16 of them 32 + 48 (k - 16384) / 114688 ms), so the bound is its time alone scaled by the least ratio
    of the two over its KV range, at its end (100,128 tokens): claimed where that share still breaks the limit."""
    rows = [[0.020, 0.030, 0.100], [0.025, 0.032, 0.080], [0.040, 0.050, 0.150]]  # 1, 16 and 256 sequences
    cost = TableCost([1, 4096], [0.05, 0.05], [1, 16, 256], [0, 16384, 131072], rows, kv_capacity_tokens=1_000_000)
    # one sequence at k tokens: 20 ms + 10 ms x k / 16384; alone: 50 ms for the prompt, then 127 steps at 512..638
    alone = 0.05 + sum(0.020 + 0.010 * (512 + j) / 16384 for j in range(127))
    why = alone_breaks_slo(_probe(cost, Slo(None, None, 2.0)))
    assert why is not None and f"{alone * 1e3:.4g} ms end to end" in why and "at least as long" in why, (why, alone)

    def one(k):
        return 0.030 + 0.070 * (k - 16384) / 114688

    def many(k):
        return 0.032 + 0.048 * (k - 16384) / 114688

    r = min(many(k) / one(k) for k in (100_000, 100_128))
    long_alone = 0.05 + sum(one(100_000 + j) for j in range(127))

    def long(table, p99_s):
        # a token budget over the prompt: it is prefilled in one step (50 ms), as the short request's is
        return RateProbe(Arrival("poisson", 1.0), parse_length("100000"), parse_length("128"), 200,
                         parse_policy("engine:256,131072,16"), table, 1, "round_robin", 0, Slo(None, None, p99_s))

    why = alone_breaks_slo(long(cost, 0.99 * r * long_alone))
    assert why is not None and f"{long_alone * 1e3:.4g} ms end to end" in why and f"at least {r:.4g} of that" in why
    assert alone_breaks_slo(long(cost, 1.01 * r * long_alone)) is None  # alone breaks it; r of alone does not
    # the same long request on a table whose batches never step faster: the bound stands whole
    up = TableCost([1, 4096], [0.05, 0.05], [1, 16, 256], [0, 16384, 131072],
                   [rows[0], [0.025, 0.032, 0.110], rows[2]], kv_capacity_tokens=1_000_000)
    assert "at least as long" in alone_breaks_slo(long(up, 1.01 * r * long_alone))


def test_a_configuration_too_slow_alone_is_answered_without_a_search_and_the_same():
    """2590 ms alone against a 2 s p99: the whole search (32 rates down to 2^-31 of saturation) finds no rate
    either; pruned, it runs none."""
    probe = _probe(_flat(0.050, 0.020), Slo(None, None, 2.0), output_len="128")
    pruned = steady_capacity(probe)
    full = steady_capacity(probe, prune=False)
    assert pruned.rate_per_s is None and full.rate_per_s is None
    assert pruned.search.runs == () and len(full.search.runs) == 32
    assert "2590 ms end to end" in pruned.reason
    assert pruned.saturation_per_s == full.saturation_per_s
    assert record(pruned)["runs"] == [] and record(pruned)["rate_per_s"] is None


def test_the_descent_stops_at_its_first_run_served_alone_with_the_same_record():
    """A request alone takes 2590 ms against a 2 s p99, so every rate is invalid. Probing from the saturation rate
    down, once a run serves every request alone (each done before the next arrives), every lower rate serves them
    alike (the same gaps, longer): the descent records those rates with that run's verdict instead of running
    them, and the record is the one running all 32 gives (the same rates, the same verdicts)."""
    probe = _probe(_flat(0.050, 0.020), Slo(None, None, 2.0))
    calls = []

    def counted(fn, rates):
        calls.extend(rates)
        return [fn(r) for r in rates]

    sat = float(probe.saturation().throughput.requests_per_s)
    full = find_capacity(probe, sat, map_fn=counted, ceiling=sat, skip_alone=False)
    n_full = len(calls)
    calls.clear()
    short = find_capacity(probe, sat, map_fn=counted, ceiling=sat, skip_alone=True)
    assert len(full.runs) == n_full == 32
    assert [(r.rate_per_s, r.valid) for r in short.runs] == [(r.rate_per_s, r.valid) for r in full.runs]
    # the reasons alike, but for the last digit the runs at the lowest rates print: their arrivals lie ~1e10 s out,
    # where a float's spacing is ~1e-6 s, so finish - arrival comes out 2590.1 ms there, 2590.0 alone
    k = len(calls)  # the runs the short descent ran: the same; below them, alone alike
    assert short.runs[:k] == full.runs[:k]
    ms = [float(r.reason.split()[2]) for r in short.runs[k - 1:] + full.runs[k - 1:]]
    assert all(abs(m - 2590.0) <= 0.1 for m in ms)
    assert (short.rate_per_s, short.bracket, short.limited_by) == (full.rate_per_s, full.bracket, full.limited_by)
    assert k < n_full
    assert probe(calls[-1]).steady_state.alone and not probe(sat).steady_state.alone


def test_under_pp_the_bound_is_the_request_s_steps_at_the_cheapest_step():
    """pp 2: a decode microbatch of one sequence with no KV takes 20 ms through both stages, a one-token prefill
    50 ms: no step is cheaper than 20 ms, and 512 + 128 tokens take at least 128 steps: 2560 ms end to end."""
    cost = TableCost([1, 4096], [0.05, 0.05], [1, 256], [0, 1e6], [[0.02, 0.02], [0.02, 0.02]],
                     kv_capacity_tokens=100_000, pp=2, stage_prefill_time_s=[0.03, 0.03],
                     stage_decode_time_s=[[0.012, 0.012], [0.012, 0.012]])
    why = alone_breaks_slo(_probe(cost, Slo(None, None, 2.559)))
    assert why is not None and "2560 ms end to end" in why and "128 steps of at least 20 ms" in why
    assert alone_breaks_slo(_probe(cost, Slo(None, None, 2.561))) is None


def test_a_prefill_below_the_priced_prompts_is_no_cheaper_than_one_decode_step():
    """The prefill line through 128 tokens (39 ms) and 512 (128 ms) extrapolates to 39 - 127 x 89 / 384 = 9.6 ms
    for one token, under the 37.6 ms of a decode step of one sequence at no KV: both read every weight once, so
    the prompt is priced at least that step (and its pp stage at least the decode's stage); the descent's bound
    under pp then holds 128 steps of 37.6 ms = 4813 ms, over a 2 s SLO."""
    cost = TableCost([128, 512], [0.039, 0.128], [1, 256], [0, 1e6], [[0.0376, 0.04], [0.05, 0.06]],
                     kv_capacity_tokens=100_000, pp=2, stage_prefill_time_s=[0.02, 0.065],
                     stage_decode_time_s=[[0.0188, 0.02], [0.025, 0.03]])
    line = 0.039 - 127 * (0.128 - 0.039) / 384
    assert line == pytest.approx(0.009565, rel=1e-3)
    assert cost._prefill(cost.prefill_time_s, 1) == pytest.approx(line)
    assert cost.prefill_s(1, 1) == pytest.approx(0.0376)  # max(one 37.6 ms, 1 x stage max(line, 18.8 ms))
    assert cost.prefill_s(512, 1) == pytest.approx(0.128)  # on the line: untouched
    assert cost.prefill_s(0, 1) == pytest.approx(0.039 - 128 * (0.128 - 0.039) / 384)  # no tokens: the line's
    why = alone_breaks_slo(_probe(cost, Slo(None, None, 2.0)))
    assert why is not None and f"{128 * 37.6:.4g} ms end to end" in why


@pytest.mark.parametrize("model", ["llama-3-70b", "hf-70b"])
def test_llama_3_70b_on_mi300x_at_pp_2_is_answered_without_a_search(model, tmp_path):
    """llama-3-70b (zoo, and its Hugging Face config) at tp 1 pp 2 on MI300X, 512 + 128 tokens: each decoded
    token passes both stages, each reading its half of the weights: 2 x 69.5 GB / 3.948 TB/s (the catalog's
    BabelStream Triad) = 35.2 ms a token at least, 128 tokens 4.5 s, over a 2 s SLO: no rate is searched. Before,
    the one-token prefill extrapolated to 9.7 ms set the bound (128 x 9.7 = 1.24 s) under the SLO, and the
    descent ran ~16 runs of 1,000 requests (the fit cell's CPU time 38.5 s, now 5.4 s)."""
    import json

    from opmap.explore.layouts import price_layout

    if model == "hf-70b":  # meta-llama/Meta-Llama-3-70B's config.json (dims as published)
        cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
               "intermediate_size": 28672, "num_attention_heads": 64, "num_key_value_heads": 8,
               "num_hidden_layers": 80, "vocab_size": 128256, "max_position_embeddings": 8192,
               "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
               "torch_dtype": "bfloat16"}
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        model = str(tmp_path / "config.json")
    cost = price_layout(model, "mi300x", "bf16", 1, 2, "engine", max_context=640)
    weights_s = cost.floor.pp * cost.floor.dense_bytes / cost.floor.rate_bytes_per_s
    assert cost.floor.rate_bytes_per_s == 3.948e12 and weights_s == pytest.approx(0.0352, rel=0.02)
    assert cost.prefill_s(1, 1) >= weights_s and cost.prefill_s(1, 1) >= cost.decode_s(1, 0)
    why = alone_breaks_slo(_probe(cost, Slo(None, None, 2.0)))
    assert why is not None and "128 steps of at least" in why
    assert 128 * weights_s <= float(why.split(" takes ")[1].split(" ms")[0]) / 1e3
