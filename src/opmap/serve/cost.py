"""What a step of the server costs. The simulator asks a ``StepCost`` for the time of each step it forms:

- ``prefill_s(tokens, seqs)``: one forward pass over ``tokens`` prompt tokens from ``seqs`` sequences (s);
- ``decode_s(seqs, kv_tokens)``: one decode iteration, one new token for each of ``seqs`` sequences that
  together hold ``kv_tokens`` tokens of KV cache (s);
- ``kv_capacity_tokens``: how many tokens of KV cache fit beside the weights (None: unlimited).

``TableCost`` interpolates a few priced points (built from opmap's phase analyses in model_cost.py, or by
hand in tests). ``ServiceTime`` replaces the cost model by a per-request service time (``fixed:MS`` or
``exp:MS``, the mean), so the simulator can be checked against queueing theory.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from opmap.errors import OpmapError
from opmap.record import key, record
from opmap.validate import positive_in

SERVICE_ACCEPTED = "fixed:MS, exp:MS (MS the mean service time in milliseconds, > 0, at most a day)"


@runtime_checkable
class StepCost(Protocol):
    kv_capacity_tokens: int | None

    def prefill_s(self, tokens: int, seqs: int) -> float: ...

    def decode_s(self, seqs: int, kv_tokens: int) -> float: ...


def mixed_s(cost: StepCost, prefill_tokens: int, prefill_seqs: int, decode_seqs: int, kv_tokens: int,
            prefix: Sequence[tuple[int, int]] = ()) -> float:
    """One iteration carrying prompt chunks and decodes together (chunked prefill): the weights are read once
    for all ``prefill_tokens + decode_seqs`` tokens, and the decodes cost what their own step does beyond those
    tokens' pass: their attention over n sequences (a decode-attention kernel's time at n sequences holding almost
    no KV is not 0: NVIDIA's measured B200 table, 64 heads of 64 over 8 KV heads, 2048 sequences, takes 148 us a
    layer at 2 tokens each) and their logits (every decode token samples one; a prompt's pass computes its last
    token's only). So the step is the decodes' step t_d(n, K) plus the prompt tokens' marginal pass,
    P(p + n) - P(n) (P: ``prefill_s``, one pass of that many tokens), and at least one pass of all its tokens plus
    the decodes' KV read, P(p + n) + t_d(n, K) - t_d(n, 0): the first exceeds the second by t_d(n, 0) - P(n), the
    decodes' attention at no KV and their logits beyond a prompt's last token. (Until 2026-12-08 the step was the
    second alone: a gpt-oss-20b B200 step of 2048 decodes at 1500 tokens and 2048 prompt tokens 21.7 ms, where
    NVIDIA's aiconfigurator-core 0.12.0 prices 28.1 ms from the same measured tables; 26.2 ms now.)

    ``prefix``: (tokens already prefilled, tokens in this step) of each chunk that continues a prompt. Such a
    chunk's queries also attend to the prompt's earlier chunks, which ``prefill_s`` of the chunk alone does not
    count: with a prompt priced as P(n) = c + a n + b n^2 / 2 (weights, then causal attention), the chunk
    (d, t) costs P(t) + b d t, and b d t = P(d + t) - P(d) - P(t) + P(0), added here (0 for a P linear in
    n). Without it a long prompt cut into chunks cost less than the same prompt in one step (a 10,000-token
    prompt in chunks of 4096 priced as three short prompts); with it a lone prompt's chunks add up to the
    whole prompt's P(n) plus one c per extra step. A cost with a ``mixed_s`` of its own (speculative decoding:
    opmap.serve.spec_cost) prices the step itself."""
    own = getattr(cost, "mixed_s", None)
    if own is not None:
        return own(prefill_tokens, prefill_seqs, decode_seqs, kv_tokens, prefix)
    if decode_seqs == 0:
        t = cost.prefill_s(prefill_tokens, prefill_seqs)
    elif prefill_tokens == 0:
        return cost.decode_s(decode_seqs, kv_tokens)
    else:
        whole = cost.prefill_s(prefill_tokens + decode_seqs, prefill_seqs + decode_seqs)
        dec = cost.decode_s(decode_seqs, kv_tokens)
        t = max(whole + max(0.0, dec - cost.decode_s(decode_seqs, 0)),
                dec + max(0.0, whole - cost.prefill_s(decode_seqs, decode_seqs)))
    return prefix_s(cost, prefix, t)


def prefix_s(cost: StepCost, prefix: Sequence[tuple[int, int]], t: float = 0.0) -> float:
    """``t`` plus the attention of each chunk (d tokens already prefilled, n in this step) to its prompt's earlier
    chunks: P(d + n) - P(d) - P(n) + P(0) (``mixed_s``), added one by one."""
    if prefix:
        p0 = cost.prefill_s(0, 1)
        for d, n in prefix:
            if d > 0:
                t += max(0.0, cost.prefill_s(d + n, 1) - cost.prefill_s(d, 1) - cost.prefill_s(n, 1) + p0)
    return t


def _seg(xs: Sequence[float], x: float) -> tuple[int, float]:
    """Index i and weight w with x = xs[i] + w (xs[i+1] - xs[i]); linear extrapolation past either end."""
    n = len(xs)
    if n == 1:
        return 0, 0.0
    i = min(max(bisect_right(xs, x) - 1, 0), n - 2)
    return i, (x - xs[i]) / (xs[i + 1] - xs[i])


@dataclass
class TableCost:
    """Step times interpolated from priced points. ``prefill_tokens``/``prefill_time_s``: prefill time over
    total prompt tokens in the step (piecewise linear, extrapolated linearly; a prompt of one token or more no
    cheaper than a decode step of one sequence holding no KV, ``_least``). ``decode_batch`` x ``decode_kv``: a
    grid of decode times ``decode_time_s[i][j]`` for batch ``decode_batch[i]`` holding ``decode_kv[j]`` KV tokens in all
    (bilinear, extrapolated linearly). Times never go below 0."""

    prefill_tokens: Sequence[float]
    prefill_time_s: Sequence[float]
    decode_batch: Sequence[float]
    decode_kv: Sequence[float]
    decode_time_s: Sequence[Sequence[float]]
    kv_capacity_tokens: int | None = None
    source: str = "table"
    kv_bytes_per_token: float | None = None  # per device: what a token's KV cache costs to hold and to move
    runtime: dict | None = None  # the record (opmap.record) of the Runtime the steps were priced under
    memory: dict | None = None  # per device: capacity, utilization, weights, reserve, usable, KV (model_cost)
    layout: dict | None = None  # {"tp", "pp"}: the devices of one replica
    kv_dtype: str | None = None
    # pp > 1: the slowest pipeline stage's time per microbatch (its send included), on the same grids; a step of
    # n sequences runs as m = min(pp, n) microbatches (``_piped``)
    pp: int = 1
    stage_prefill_time_s: Sequence[float] | None = None
    stage_decode_time_s: Sequence[Sequence[float]] | None = None
    floor: DecodeFloor | None = None
    # where the model's MoE layers were priced off the device's measured MoE grid (opmap.mapping.moe_measured)
    moe_grid: str | None = None
    # DP attention: the replica's steps are this many attention ranks' in lockstep, each priced by this table at its
    # own batch (opmap.serve.lockstep), under pp each rank's step its own microbatches through its stages (``_piped``);
    # 1: the replica runs one batch
    attention_ranks: int = 1

    def __post_init__(self) -> None:
        self.prefill_tokens = [float(x) for x in self.prefill_tokens]
        self.prefill_time_s = [float(x) for x in self.prefill_time_s]
        self.decode_batch = [float(x) for x in self.decode_batch]
        self.decode_kv = [float(x) for x in self.decode_kv]
        self.decode_time_s = [[float(x) for x in row] for row in self.decode_time_s]
        ok = (len(self.prefill_tokens) == len(self.prefill_time_s) >= 1
              and len(self.decode_time_s) == len(self.decode_batch) >= 1
              and all(len(r) == len(self.decode_kv) >= 1 for r in self.decode_time_s)
              and all(np.all(np.diff(v) > 0) for v in (self.prefill_tokens, self.decode_batch, self.decode_kv)))
        if not ok:
            raise OpmapError("TableCost needs increasing prefill_tokens, decode_batch and decode_kv and a "
                             "decode_time_s grid of len(decode_batch) rows by len(decode_kv) columns")
        if self.stage_prefill_time_s is not None:
            self.stage_prefill_time_s = [float(x) for x in self.stage_prefill_time_s]
        if self.stage_decode_time_s is not None:
            self.stage_decode_time_s = [[float(x) for x in row] for row in self.stage_decode_time_s]
        if not (isinstance(self.pp, int) and self.pp >= 1) or (self.pp > 1 and not (
                self.stage_prefill_time_s is not None and len(self.stage_prefill_time_s) == len(self.prefill_tokens)
                and self.stage_decode_time_s is not None and len(self.stage_decode_time_s) == len(self.decode_batch)
                and all(len(r) == len(self.decode_kv) for r in self.stage_decode_time_s))):
            raise OpmapError("TableCost with pp > 1 needs stage_prefill_time_s and stage_decode_time_s on the "
                             "prefill and decode grids")
        if not (isinstance(self.attention_ranks, int) and self.attention_ranks >= 1):
            raise OpmapError(f"TableCost's attention_ranks must be a positive integer, got {self.attention_ranks!r}")

    def _prefill(self, ys: Sequence[float], tokens: float) -> float:
        xs = self.prefill_tokens
        i, w = _seg(xs, tokens)
        if len(xs) == 1:
            return ys[0] * tokens / xs[0]
        return max(0.0, ys[i] + w * (ys[i + 1] - ys[i]))

    def _piped(self, one, stage, n: int) -> float:
        """A step of ``n`` sequences under pp stages: m = min(pp, n) microbatches of n / m sequences each; the
        next token of a sequence waits for its microbatch to pass every stage (``one``: the latency) and for the
        m microbatches to pass the slowest stage (``stage``), whichever is longer (steady state, the pipeline
        kept full by the engine's pp batches in flight)."""
        m = max(1, min(self.pp, int(n)))
        return max(one(m), m * stage(m))

    def prefill_s(self, tokens: int, seqs: int = 1) -> float:
        if self.pp > 1 and self.stage_prefill_time_s is not None:
            return self._piped(lambda m: self._least(self._prefill(self.prefill_time_s, tokens / m), tokens,
                                                     self.decode_time_s),
                               lambda m: self._least(self._prefill(self.stage_prefill_time_s, tokens / m), tokens,
                                                     self.stage_decode_time_s), seqs)
        return self._least(self._prefill(self.prefill_time_s, tokens), tokens, self.decode_time_s)

    def _least(self, t: float, tokens: float, grid: Sequence[Sequence[float]]) -> float:
        """A prefill of ``tokens`` >= 1 priced ``t`` by the line through the smallest priced prompts, no cheaper
        than a decode step of one sequence holding no KV on the same ``grid``: both read every weight once, and
        the line extrapolated below its first point can fall under that (llama-3-70b on MI300X at pp 2: 9.7 ms
        for one token, where one decoded token takes 37.6 ms and its weights' read alone 35.2 ms)."""
        return max(t, self._decode(grid, 1, 0)) if tokens >= 1 else t

    def decode_s(self, seqs: int, kv_tokens: int) -> float:
        # the simulator's hot path (a call per engine step): _piped written out, without its closures
        if self.pp > 1 and self.stage_decode_time_s is not None:
            m = max(1, min(self.pp, int(seqs)))
            s, k = seqs / m, kv_tokens / m
            return max(self._decode(self.decode_time_s, s, k), m * self._decode(self.stage_decode_time_s, s, k))
        return self._decode(self.decode_time_s, seqs, kv_tokens)

    def decode_floor_s(self, seqs: int, kv_tokens: int) -> float:
        """The least a decode step of ``seqs`` sequences holding ``kv_tokens`` KV tokens can take: the weights and
        KV bytes one device reads over its achievable memory rate (``DecodeFloor``); 0 without a floor."""
        return self.floor.s(seqs, kv_tokens) if self.floor is not None else 0.0

    def _decode(self, g: Sequence[Sequence[float]], seqs: float, kv_tokens: float) -> float:
        # _seg on both grids, inlined (the simulator prices every engine step here)
        xs, ks = self.decode_batch, self.decode_kv
        nb, nk = len(xs), len(ks)
        if nb > 1:
            i = min(max(bisect_right(xs, seqs) - 1, 0), nb - 2)
            i1, u = i + 1, (seqs - xs[i]) / (xs[i + 1] - xs[i])
        else:
            i = i1 = 0
            u = 0.0
        if nk > 1:
            j = min(max(bisect_right(ks, kv_tokens) - 1, 0), nk - 2)
            j1, v = j + 1, (kv_tokens - ks[j]) / (ks[j + 1] - ks[j])
        else:
            j = j1 = 0
            v = 0.0
        r, r1 = g[i], g[i1]
        a = r[j] + v * (r[j1] - r[j])
        b = r1[j] + v * (r1[j1] - r1[j])
        return max(0.0, a + u * (b - a))

    def to_dict(self) -> dict:
        d = {"kind": "table", "source": self.source, "kv_capacity_tokens": self.kv_capacity_tokens,
             "kv_bytes_per_token": self.kv_bytes_per_token, "kv_dtype": self.kv_dtype, "runtime": self.runtime,
             "memory": self.memory, "layout": self.layout or {"tp": 1, "pp": self.pp,
                                                             **({"attention_ranks": self.attention_ranks}
                                                                if self.attention_ranks > 1 else {})},
             "prefill": {"tokens": self.prefill_tokens, "time_s": self.prefill_time_s},
             "decode": {"batch": self.decode_batch, "kv_tokens": self.decode_kv, "time_s": self.decode_time_s}}
        if self.stage_prefill_time_s is not None:
            d["prefill"]["stage_time_s"] = list(self.stage_prefill_time_s)
        if self.stage_decode_time_s is not None:
            d["decode"]["stage_time_s"] = [list(r) for r in self.stage_decode_time_s]
        if self.floor is not None:
            d["decode_floor"] = record(self.floor)
        return d


@dataclass(frozen=True)
class DecodeFloor:
    """What one device of a replica must read per decode step, per microbatch: ``dense_bytes`` of weights that
    every step reads (its share under tp and pp: embedding rows gathered, not the table), ``expert_bytes`` per
    active expert (all its MoE layers' copy of that expert, its share under tp and pp), the experts a batch
    activates (``opmap.ops.expected_experts``: E (1 - (1 - k/E)^b), uniform routing), and ``kv_bytes_per_token``
    of KV cache; over ``rate_bytes_per_s`` (the device's achievable memory rate). With DP attention over ``ranks``
    (> 1) each device holds E / ranks whole experts and the ranks' tokens together activate
    E (1 - (1 - k/E)^(ranks b)), its share 1 / ranks of them (every rank at b sequences). Under pp a step runs
    m = min(pp, seqs) microbatches, each reading the device's weights again. Its record is serve.json's
    ``cost.decode_floor``: the bytes, the rate and the formula they stand in (``basis``)."""

    RECORD: ClassVar[tuple[str, ...]] = ("dense_bytes", "expert_bytes", "experts", "top_k", "kv_bytes_per_token", "pp",
                                         "rate_bytes_per_s", "rate_basis", "basis", "ranks")
    basis: ClassVar[str] = ("weights one device reads per step (active experts: E (1 - (1 - k/E)^b) under uniform "
                            "top-k routing) + its KV read, over its achievable memory rate")
    dense_bytes: float
    kv_bytes_per_token: float
    rate_bytes_per_s: float
    expert_bytes: float = 0.0
    experts: int = 0
    top_k: int = 0
    pp: int = 1
    rate_basis: str = ""
    ranks: int = field(default=1, metadata=key(omit="default"))  # DP attention's ranks (1: none)

    def weight_bytes(self, seqs: float) -> float:
        """Weight bytes one device reads for one microbatch of ``seqs`` sequences (one token each)."""
        from opmap.ops import expected_experts

        r = self.ranks
        return self.dense_bytes + self.expert_bytes * expected_experts(self.experts, self.top_k, r * seqs) / r

    def s(self, seqs: int, kv_tokens: int) -> float:
        m = max(1, min(self.pp, int(seqs)))
        return (m * self.weight_bytes(seqs / m) + kv_tokens * self.kv_bytes_per_token) / self.rate_bytes_per_s



@dataclass(frozen=True)
class ServiceTime:
    """A per-request service time: ``fixed`` (every request takes mean_s) or ``exp`` (exponential, mean
    mean_s). A batch of requests takes as long as its longest member."""

    kind: str
    mean_s: float
    kv_capacity_tokens: int | None = None

    def spec(self) -> str:
        return f"{self.kind}:{self.mean_s * 1e3:g}"

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        if self.kind == "fixed":
            return np.full(n, self.mean_s)
        return rng.exponential(self.mean_s, n)

    def to_dict(self) -> dict:
        return {"kind": "service_time", "spec": self.spec(), "distribution": self.kind, "mean_s": self.mean_s}


def parse_service_time(spec: str) -> ServiceTime:
    """``fixed:MS`` or ``exp:MS``: MS a number > 0, at most the plausibility ceiling of a time in ms (one day:
    opmap.validate.CEILINGS; fixed:1e308 printed a p99 TTFT of inf)."""
    kind, _, body = spec.strip().partition(":")
    try:
        ms = float(body)
    except ValueError:
        ms = None
    if kind not in ("fixed", "exp") or ms is None:
        raise OpmapError(f"bad service time {spec!r}: accepted: {SERVICE_ACCEPTED}")
    try:
        ms = positive_in("ms").check(ms, f"service time {spec!r}: MS")
    except OpmapError as e:
        raise OpmapError(f"{e}; accepted: {SERVICE_ACCEPTED}") from None
    return ServiceTime(kind, ms / 1e3)
