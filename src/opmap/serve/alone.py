"""A bound on a serving configuration's capacity before any search: the shortest request served alone.

Under iteration-level batching (policies engine, continuous, chunked: no batch is waited for) and a step cost that
grows with its work, a request is served fastest alone on an idle replica: at any arrival rate each of its steps
carries at least its own work and queueing only adds. "Grows with its work" is asked of the step table where the
request runs (``_bound_ratio``): prefill times up in tokens, every decode row up in KV tokens, and every batch's
decode step at least one sequence's at the KV tokens the request itself holds (its prompt to its prompt plus its
answer), or, where a batch steps faster, each time alone scaled by the least such ratio. A measured decode-attention
table can be cheaper for 16 sequences of 1k tokens than for one of 16k (the H100's is); that is no step a short
request meets, so the bound stands whole where the request's own KV is short.
So where the shortest request the lengths can draw, alone, already takes longer than an SLO limit, every request
of every run does, and no rate meets the SLO: the capacity search (``opmap.serve.capacity.steady_capacity``)
answers so without probing rates down to 2^-31 of saturation.
"""

from __future__ import annotations

import numpy as np


def _lowest(length) -> int:
    """The fewest tokens ``length`` (an arrivals.Length) can draw: its fixed value or a uniform's low end, else 1."""
    return int(length.a) if length.kind in ("fixed", "uniform") else 1


def _monotone(cost) -> bool:
    """A TableCost whose every step time grows (or stays) with the tokens, the sequences and the KV tokens: a
    step that carries more work never runs faster than the same step with less."""
    from opmap.serve.cost import TableCost

    if not isinstance(cost, TableCost):
        return False
    up = (lambda v: all(b >= a for a, b in zip(v, v[1:])))  # noqa: E731
    grids = [cost.decode_time_s] + ([cost.stage_decode_time_s] if cost.stage_decode_time_s is not None else [])
    flats = [cost.prefill_time_s] + ([cost.stage_prefill_time_s] if cost.stage_prefill_time_s is not None else [])
    return (all(up(v) for v in flats) and all(up(r) for g in grids for r in g)
            and all(up(c) for g in grids for c in zip(*g)))


def _bound_ratio(cost, prompt: int, answer: int) -> float | None:
    """The least share of its alone step that any step a request of ``prompt`` + ``answer`` tokens meets under load
    can take (1.0: none is cheaper), or None where no such share is shown. Under pp: 1.0 where the table is
    ``_monotone`` (the bound then reads its cheapest step). Else it needs prefill times up in tokens and every decode
    row up in KV tokens (a step holding more KV is no faster), and reads, at every KV total k the request itself can
    hold (its prompt to prompt + answer), each batch's step over one sequence's, t(n, k) / t(1, k), the table
    extrapolated past its last batch no lower (its last rows rising). A loaded step of n sequences holding K >= k
    tokens, the request's k among them, takes t(n, K) >= t(n, k) >= r t(1, k): at least r of its step alone. The
    table is linear between its KV columns and between its batches, so the ratio is read at the range's ends, at
    each column inside it and at each batch priced (a measured table's noise: B200's llama-3-8b decode at 64
    sequences is 5% under one's; A100's at 16 is 0.1% under)."""
    from opmap.serve.cost import TableCost

    if not isinstance(cost, TableCost):
        return None
    if cost.pp > 1:
        return 1.0 if _monotone(cost) else None
    up = (lambda v: all(b >= a for a, b in zip(v, v[1:])))  # noqa: E731
    g, lo, hi = cost.decode_time_s, float(prompt), float(prompt + answer)
    if not (up(cost.prefill_time_s) and all(up(r) for r in g)):
        return None
    ratio = 1.0
    rows = [b for b in cost.decode_batch if b >= 1]
    for k in [lo, hi] + [k for k in cost.decode_kv if lo < k < hi]:
        one = cost._decode(g, 1, k)
        at = [cost._decode(g, b, k) for b in rows]
        if len(at) > 1 and at[-1] < at[-2]:
            return None
        if one > 0:
            ratio = min(ratio, min(at) / one)
    return ratio if ratio > 0 else None


def alone_breaks_slo(probe) -> str | None:
    """Why no arrival rate can meet the SLO of ``probe`` (an opmap.serve.capacity.RateProbe), or None where that
    is not shown: the shortest request the lengths can draw (``_lowest``), simulated alone on an idle replica,
    already breaks a limit (the module docstring). Only judged where its premises hold: an iteration-level
    policy, a step table that grows with the work on the request's path (``_bound_ratio``; where a batch steps
    faster than one sequence, each time alone is scaled by the least such ratio r: every step under load takes at
    least r of the request's step alone), no disaggregation; None otherwise. Under pp a step of several sequences
    runs as microbatches, each with part of the KV, not provably slower than one alone: there the bound is the
    request's o steps at the cheapest step each (``_floor``)."""
    from opmap.serve.arrivals import Requests
    from opmap.serve.policies import Chunked, Continuous, Engine

    slo = probe.slo
    if (slo is None or probe.disaggregate is not None
            or not isinstance(probe.policy, (Engine, Continuous, Chunked))
            or (r := _bound_ratio(probe.cost, _lowest(probe.input_len), _lowest(probe.output_len))) is None):
        return None
    i, o = _lowest(probe.input_len), _lowest(probe.output_len)
    if probe.cost.pp > 1:  # every step at least the cheapest one; a request takes o steps, the first its prompt's
        ttft, e2e = _floor(probe.cost), o * _floor(probe.cost)
        how = f"at least {o} steps of at least {ttft * 1e3:.4g} ms each (the cheapest step under pp {probe.cost.pp})"
    else:
        one = probe._simulate(Requests(np.zeros(1), np.array([i]), np.array([o]), "alone"))
        ttft = float(one.first_s[0] - one.arrival_s[0])
        e2e = float(one.finish_s[0] - one.arrival_s[0])
        how = "served alone on an idle replica"
    tpot = (e2e - ttft) / (o - 1) if o > 1 else None  # a single-token output has no TPOT: not judged on it
    least = "as long" if r >= 1 else (f"{r:.4g} of that (the step table's least ratio of a batch's step to one "
                                      "sequence's where this request runs)")
    for limit, got, what in ((slo.p99_s, e2e, "end to end"), (slo.ttft_s, ttft, "TTFT"), (slo.tpot_s, tpot, "TPOT")):
        if limit is not None and got is not None and r * got > limit:
            return (f"no rate meets the SLO: a request of {i} + {o} tokens {how} takes {got * 1e3:.4g} ms {what}, "
                    f"over the {limit * 1e3:g} ms limit (at any rate every request takes at least {least})")
    return None


def _floor(cost) -> float:
    """The cheapest step a pipelined TableCost prices (s): a step of n sequences runs as m = min(pp, n)
    microbatches of at least one sequence (and one token) each, and takes at least one microbatch's latency
    through every stage, which grows with its sequences, tokens and KV (``_monotone``): so at least the decode
    latency of one sequence holding no KV, or the prefill latency of one token (priced no cheaper than that decode:
    ``TableCost._least``), whichever is less."""
    one = cost._decode(cost.decode_time_s, 1, 0)
    return max(0.0, min(one, cost._least(cost._prefill(cost.prefill_time_s, 1), 1, cost.decode_time_s)))
