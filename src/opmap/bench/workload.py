"""The requests a load run sends: send times and lengths drawn exactly as ``opmap serve`` draws them
(opmap.serve.arrivals: the same specs, the same seed, the same trace format), and prompts.

Arrivals: serve's ``poisson:RATE``, ``gamma:RATE,CV``, ``offline`` (all at t = 0) and ``trace:FILE``, plus
``constant:RATE`` (a send every 1/RATE s, the first one gap in, as serve's processes start). With the same seed
and lengths, poisson / gamma / offline / trace schedules are serve's ``make_requests`` values, so a bench run and
the simulation of it (``--predict``) see the same arrival times and lengths.

Prompts: without a tokenizer, words drawn from a fixed list of common English words, one word per asked token.
Each of these words is one token with its leading space in GPT-2-style BPE vocabularies (GPT-2, Llama 3,
Qwen 2), so a prompt of N words is about N tokens (plus the template's or BOS tokens); the server's ``usage``
says the real count and the run reports the difference. Words are drawn per request from the seed, so prompts
differ from their first word and a prefix cache cannot serve one request from another's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np

from opmap.bench.records import RequestSpec
from opmap.errors import OpmapError
from opmap.serve.arrivals import (
    MAX_REQUESTS,
    Arrival,
    Length,
    arrival_times,
    draw_lengths,
    make_requests,
    parse_arrival,
)
from opmap.validate import positive_in

ARRIVALS_ACCEPTED = "poisson:RATE, constant:RATE, gamma:RATE,CV, offline, trace:FILE"
WORDS = tuple(dict.fromkeys((
    "the of and to in is was for on that with as by at from his it an are were which this be or has her had "
    "first one their its new after who they have two also been more but other one time when would all over "
    "year years there into can only about some most made may these city school world some under part three "
    "state such many during called while where then later team name game since them before did well can main "
    "people war high both being between house film music water book power day line second known each life "
    "early same long family use used work near four number great through place small south north west east "
    "end way back found group area local home around order case field five hand left right light best past "
    "head side open road lead land last point room play show body team form river sea war car war age half"
).split()))
PromptFn = Callable[[int, int, np.random.Generator], str]


def word_prompt(index: int, tokens: int, rng: np.random.Generator) -> str:
    """A prompt of ``tokens`` words drawn from WORDS (about one token each; see the module docstring)."""
    pick = rng.integers(0, len(WORDS), tokens)
    return " ".join(WORDS[i] for i in pick)


class Constant(Arrival):
    """serve's Arrival with kind "constant": a send every 1/rate_per_s s."""

    def spec(self) -> str:
        return f"constant:{self.rate_per_s:g}"


def parse_load_arrival(spec: str) -> Arrival:
    """serve's arrival specs (``parse_arrival``) and ``constant:RATE`` (RATE a number > 0, requests/s)."""
    s = spec.strip()
    kind, _, body = s.partition(":")
    if kind == "constant":
        try:
            rate = float(body)
        except ValueError:
            rate = float("nan")
        try:  # serve's rule for a rate: > 0, at most the plausibility ceiling (opmap.validate.CEILINGS)
            rate = positive_in("requests/s").check(rate, f"arrival {spec!r}: RATE")
        except OpmapError as e:
            raise OpmapError(f"{e}; accepted: {ARRIVALS_ACCEPTED}") from None
        return Constant("constant", rate)
    try:
        return parse_arrival(s)
    except OpmapError as e:
        raise OpmapError(str(e).replace("poisson:RATE, gamma", "poisson:RATE, constant:RATE, gamma")) from None


def schedule(arrival: Arrival, input_len: Length, output_len: Length, n: int | None, duration_s: float | None,
             seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(send times s, input lengths, output lengths) of an open-loop run: ``n`` requests, or every arrival within
    ``duration_s`` (a trace: its rows, at most ``n``, within the duration)."""
    if arrival.kind == "constant":
        m = n if n is not None else int(math.floor(duration_s * arrival.rate_per_s))
        m = max(1, min(m, MAX_REQUESTS))
        rng = np.random.default_rng(seed)
        t = np.arange(1, m + 1, dtype=np.float64) / arrival.rate_per_s
        return t, draw_lengths(input_len, m, rng), draw_lengths(output_len, m, rng)
    if n is None and arrival.kind in ("poisson", "gamma"):
        m = _enough(arrival, duration_s, seed)
    else:
        m = n
    if m is None and arrival.kind == "offline":
        raise OpmapError("--arrival offline sends every request at t = 0: give --requests N, not --duration")
    reqs = make_requests(arrival, input_len, output_len, m, seed)
    t, i, o = reqs.arrival_s, reqs.input_len, reqs.output_len
    if duration_s is not None:
        keep = t <= duration_s
        t, i, o = t[keep], i[keep], o[keep]
    if len(t) == 0:
        raise OpmapError(f"no request of {arrival.spec()} arrives within --duration {duration_s:g} s")
    return t, i, o


def _enough(arrival: Arrival, duration_s: float, seed: int) -> int:
    """A request count whose draw (with ``seed``) runs past ``duration_s``: doubled until it does."""
    m = max(16, int(arrival.rate_per_s * duration_s * 1.2) + 16)
    while m < MAX_REQUESTS:
        t = arrival_times(arrival, m, np.random.default_rng(seed))
        if t[-1] > duration_s:
            return m
        m *= 2
    return MAX_REQUESTS


def open_specs(times: np.ndarray, input_len: np.ndarray, output_len: np.ndarray, warmup: int, seed: int,
               prompt: PromptFn = word_prompt) -> Iterator[RequestSpec]:
    """The open-loop specs, lazily (a prompt is built when its request is due): the first ``warmup`` marked."""
    rng = np.random.default_rng([seed, 1])  # prompts: a stream apart from the arrivals' and lengths'
    for k in range(len(times)):
        n_in, n_out = int(input_len[k]), int(output_len[k])
        yield RequestSpec(k, float(times[k]), prompt(k, n_in, rng), n_in, n_out, k < warmup)


def closed_specs(input_len: Length, output_len: Length, n: int | None, warmup: int, seed: int,
                 prompt: PromptFn = word_prompt) -> Iterator[RequestSpec]:
    """Closed-loop specs (no send time), lazily: ``n`` of them, or without end (a --duration run) up to
    MAX_REQUESTS. Lengths are drawn as serve draws them (one generator, inputs then outputs, here in blocks)."""
    total = MAX_REQUESTS if n is None else n
    rng = np.random.default_rng(seed)
    prng = np.random.default_rng([seed, 1])
    k = 0
    while k < total:
        block = min(4096, total - k) if n is None else total
        ins, outs = draw_lengths(input_len, block, rng), draw_lengths(output_len, block, rng)
        for j in range(block):
            n_in, n_out = int(ins[j]), int(outs[j])
            yield RequestSpec(k, None, prompt(k, n_in, prng), n_in, n_out, k < warmup)
            k += 1
