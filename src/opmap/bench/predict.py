"""A measured load run joined to opmap's prediction of the same workload (``opmap bench --predict``).

The workload is taken from the run's records, not from its spec: each request's send time and the token counts
the server reported (``usage``; the asked counts where it sent none). It runs through opmap's serving simulator
(opmap.serve.sim.simulate) with steps priced by opmap's cost model (opmap.serve.model_cost.model_table_cost) for
the hardware the server runs on, under the batching policy the server runs:

- transformers serve ``--continuous-batching`` (transformers 5.25, generation/continuous_batching/scheduler.py,
  FIFOScheduler): every step carries all running decodes first, then fills the rest of ``max_batch_tokens``
  with prompt chunks, new requests admitted in arrival order while KV blocks last; that is the simulator's
  ``engine`` policy with max_num_seqs = min(1024, max_batch_tokens) (transformers' FALLBACK_DEFAULTS
  max_requests_per_batch), max_num_batched_tokens = max_batch_tokens, KV blocks of PAGE_TOKENS, chunked prefill.
- open loop: the simulator's arrivals are the send times; closed loop (``--concurrency C``): a request is sent
  when the one whose client slot it took ended (plus the client's own measured turnaround), so the simulated
  sends follow the simulated ends: one simulation whose closed-loop client (opmap.serve.closed_loop) sends each
  slot's next request as its predecessor ends.
- server overhead (optional, ``ServerOverhead``): what the model's kernels do not account for, measured on the
  server by a probe before the run (sequential requests, then one batch of concurrent ones): ``step_s`` per
  engine step (the batching loop's Python, eager dispatch) plus ``per_seq_s`` per sequence in a decode step
  (each token's hand-off, detokenizing and SSE event: transformers serve runs its batching thread and its web
  event loop in one process, under one GIL, so that work lengthens the step) added to every priced step, and
  ``request_s`` per request (HTTP, tokenizing, the queue into the engine) added to its arrival. The prediction
  is printed with and without it, so the model's own error and the server's overhead stay apart.

The predicted figures are named and computed as the measured ones (opmap.bench.metrics): TTFT = first token -
send, e2e = last token - send, TPOT = (e2e - TTFT) / (output tokens - 1), ITL = the gaps between a request's
tokens (measured: between its token events), output tokens/s = output tokens / (last end - first send);
warm-up requests are simulated (they load the server) but kept out of the figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from opmap.errors import OpmapError
from opmap.record import key, record

if TYPE_CHECKING:
    from opmap.bench.metrics import BenchFigures, BenchLatency, BenchRates

SCHEMA_VERSION = 1
PCTS = (50, 90, 99)
METRICS = ("ttft", "tpot", "itl", "e2e")
MAX_REQUESTS_PER_BATCH = 1024  # transformers' continuous batching FALLBACK_DEFAULTS["max_requests_per_batch"]
LOAD_GAP_S = 0.01  # the load probe's 1-token requests, 10 ms apart: all inside the batch's decode (>= 32 steps)


@dataclass(frozen=True)
class ServerOverhead:
    """Measured server time outside the model's kernels (s): ``step_s`` per engine step, ``per_seq_s`` per
    sequence of a decode step, ``request_s`` per request; ``basis`` says how each was measured. Its record is
    bench_predict.json's ``overhead``: the per-step, per-sequence and per-request times first (``RECORD``)."""

    RECORD: ClassVar[tuple[str, ...]] = ("step_s", "per_seq_s", "request_s", "request_load_s", "load_batch",
                                         "per_stream_s", "basis")
    step_s: float
    request_s: float
    basis: dict[str, Any]
    per_seq_s: float = 0.0
    request_load_s: float | None = None  # request_s with ``load_batch`` other sequences decoding
    load_batch: int = 1
    per_stream_s: float = 0.0  # a fitted stack's time a request waits per other stream in flight (no cap)

    def lag_s(self, running: float) -> float:
        """A request's own overhead (s) with ``running`` other sequences decoding: request_s, growing linearly to
        request_load_s at load_batch (held there past it) where the load probe measured that, and by per_stream_s
        a stream where a stack profile fitted it."""
        base = self.request_s + self.per_stream_s * max(0.0, running)
        if self.request_load_s is None or self.load_batch <= 0:
            return base
        f = min(1.0, max(0.0, running / self.load_batch))
        return base + f * (self.request_load_s - self.request_s)


@dataclass(frozen=True)
class Workload:
    """The run as the simulator takes it, in send order: send time (s), token counts, warm-up flags, and in a
    closed loop each request's predecessor in its client slot (-1: the slot's first) and the client's turnaround
    (s from that predecessor's end to this send)."""

    sent_s: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    warmup: np.ndarray
    pred: np.ndarray
    turnaround_s: np.ndarray
    closed: bool
    concurrency: int | None = None


def engine_policy(max_batch_tokens: int, page_tokens: int):
    """The simulator's policy for transformers' FIFO continuous batching (module docstring)."""
    from opmap.serve.policies import Engine

    return Engine(max_num_seqs=min(MAX_REQUESTS_PER_BATCH, max_batch_tokens), max_num_batched_tokens=max_batch_tokens,
                  kv_block=page_tokens)


def workload(records, mode: str, concurrency: int | None) -> Workload:
    """The requests that got an answer, in send order, with their reported token counts (module docstring)."""
    ok = sorted((r for r in records if r.status == "ok"), key=lambda r: r.sent_s)
    if not ok:
        raise OpmapError("--predict needs at least one answered request: the run has none")
    sent = np.array([r.sent_s for r in ok])
    ends = np.array([r.end_s for r in ok])
    inp = np.array([r.usage_prompt_tokens or r.input_tokens_asked for r in ok], dtype=np.int64)
    out = np.array([r.usage_completion_tokens or r.output_tokens_asked for r in ok], dtype=np.int64)
    warm = np.array([bool(r.warmup) for r in ok])
    pred = np.full(len(ok), -1, dtype=np.int64)
    turn = np.zeros(len(ok))
    closed = mode == "closed" and bool(concurrency)
    if closed:
        busy: list[int] = []  # requests holding a client slot
        for k in range(len(ok)):
            if len(busy) >= concurrency:  # the slot freed first is the one this send took
                j = min(busy, key=lambda i: ends[i])
                busy.remove(j)
                pred[k], turn[k] = j, max(0.0, sent[k] - ends[j])
            busy.append(k)
    return Workload(sent, np.maximum(inp, 1), np.maximum(out, 1), warm, pred, turn, closed,
                    concurrency if closed else None)


def with_step_overhead(cost, step_s: float, per_seq_s: float = 0.0):
    """``cost`` (a TableCost) with ``step_s`` added to every priced prefill and decode step, and ``per_seq_s``
    per sequence to every decode step (exact under the table's linear interpolation in the batch)."""
    if step_s <= 0 and per_seq_s <= 0:
        return cost
    return replace(cost, prefill_time_s=[t + step_s for t in cost.prefill_time_s],
                   decode_time_s=[[t + step_s + per_seq_s * b for t in row]
                                  for b, row in zip(cost.decode_batch, cost.decode_time_s)], floor=None,
                   source=f"{cost.source} + measured server overhead ({step_s * 1e3:.3g} ms a step, "
                          f"{per_seq_s * 1e3:.3g} ms a decoding sequence)")


def with_stack(cost, p) -> tuple[Any, ServerOverhead]:
    """(``cost`` under a stack's parameters ``p``, the overhead the simulation adds per request): ``p`` has
    step_s, per_seq_s, request_s, decode_scale and prefill_scale (opmap.calibrate.stack_profile.StackProfile, or
    opmap.bench.stack_fit.Params while fitting). Prefill and decode step times scaled, then the host time per step
    and per decoding sequence added (``with_step_overhead``)."""
    scaled = replace(cost, prefill_time_s=[t * p.prefill_scale for t in cost.prefill_time_s],
                     decode_time_s=[[t * p.decode_scale for t in row] for row in cost.decode_time_s], floor=None)
    if cost.stage_prefill_time_s is not None:
        scaled = replace(scaled, stage_prefill_time_s=[t * p.prefill_scale for t in cost.stage_prefill_time_s])
    if cost.stage_decode_time_s is not None:
        scaled = replace(scaled, stage_decode_time_s=[[t * p.decode_scale for t in row]
                                                      for row in cost.stage_decode_time_s])
    return (with_step_overhead(scaled, p.step_s, p.per_seq_s),
            ServerOverhead(p.step_s, p.request_s, {"stack profile": "fitted"}, p.per_seq_s,
                           per_stream_s=p.per_stream_s))


def _simulate_open(arr_s: np.ndarray, w: Workload, policy, cost, seed: int):
    """Simulate requests arriving at ``arr_s`` (send order); per-request (first, finish) in send order and the
    pooled inter-token gaps."""
    from opmap.serve.arrivals import Requests
    from opmap.serve.sim import simulate

    order = np.argsort(arr_s, kind="stable")
    reqs = Requests(arr_s[order], w.input_len[order], w.output_len[order], "bench records")
    res = simulate(reqs, policy, cost, 1, "round_robin", seed)
    first, finish = np.empty(len(arr_s)), np.empty(len(arr_s))
    first[order], finish[order] = res.first_s, res.finish_s
    return first, finish, res


def _simulate_closed(w: Workload, policy, cost, lag_s: float, seed: int):
    """The closed loop simulated directly (opmap.serve.closed_loop): each client slot's requests in send order,
    a request sent its turnaround after its predecessor's simulated end and arriving ``lag_s`` later; the
    simulated sends and the result (times in send order)."""
    from opmap.serve.arrivals import Requests
    from opmap.serve.sim import ClosedLoop, simulate

    loop = ClosedLoop(int((w.pred < 0).sum()), tuple(w.turnaround_s.tolist()), tuple(w.pred.tolist()),
                      tuple(w.sent_s.tolist()), lag_s)
    res = simulate(Requests(w.sent_s, w.input_len, w.output_len, "bench records"), policy, cost, 1, "round_robin",
                   seed, closed=loop)
    sent = w.sent_s.copy()
    has = w.pred >= 0
    sent[has] = res.finish_s[w.pred[has]] + w.turnaround_s[has]  # as the client sent them (ClosedLoop)
    return sent, res


def simulate_workload(w: Workload, policy, cost, overhead: ServerOverhead | None = None, seed: int = 0):
    """(sent s, first token s, last token s, SimResult) per request in send order, sends as the run made them (open
    loop) or as the simulated ends let them (closed loop, one simulation); the overhead's per-request time delays
    each arrival at the engine (the request's HTTP and tokenizing): in a closed loop of C clients with C - 1 others
    decoding (``ServerOverhead.lag_s``), in an open loop with none (the probe's sequential figure)."""
    running = (w.concurrency - 1) if w.closed and w.concurrency else 0
    lag = overhead.lag_s(running) if overhead is not None else 0.0
    if not w.closed:
        first, finish, res = _simulate_open(w.sent_s + lag, w, policy, cost, seed)
        return w.sent_s.copy(), first, finish, res
    sent, res = _simulate_closed(w, policy, cost, lag, seed)
    return sent, res.first_s, res.finish_s, res


@dataclass(frozen=True)
class Latency:
    """One latency's statistics (s): mean, p50, p90, p99 (None where no request has it: a TPOT of 1-token
    answers)."""

    mean_s: float | None
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None


def _stats(x: np.ndarray, w: np.ndarray | None = None) -> Latency:
    from opmap.serve.metrics import stats

    s = stats(np.asarray(x, dtype=float), w)
    return Latency(s["mean_s"], *(s[f"p{p}_s"] for p in PCTS))


@dataclass(frozen=True)
class Latencies:
    """A run's latencies: time to first token, time per output token, inter-token gaps, end to end."""

    ttft: Latency
    tpot: Latency
    itl: Latency
    e2e: Latency


@dataclass(frozen=True)
class Throughput:
    """Requests and output tokens per second over a run's span."""

    requests_per_s: float
    output_tokens_per_s: float


@dataclass(frozen=True)
class Figures:
    """A run's latencies (TTFT, TPOT, ITL, e2e) and throughput over its span (first send to last token, s), one
    formula for the measured and the predicted side (module docstring)."""

    latency: Latencies
    throughput: Throughput
    requests: int
    output_tokens: int
    span_s: float


def figures(sent_s, first_s, finish_s, output_len, itl_gap_s, itl_weight=None) -> Figures:
    """Latency (s) at mean / p50 / p90 / p99 and throughput, one formula for the measured and the predicted side
    (module docstring)."""
    sent_s, first_s, finish_s = (np.asarray(a, dtype=float) for a in (sent_s, first_s, finish_s))
    out = np.asarray(output_len, dtype=float)
    ttft, e2e = first_s - sent_s, finish_s - sent_s
    multi = out > 1
    tpot = (e2e - ttft)[multi] / (out[multi] - 1)
    span = float(finish_s.max() - sent_s.min()) if len(sent_s) else 0.0
    rate = (lambda k: k / span) if span > 0 else (lambda k: 0.0)
    return Figures(Latencies(_stats(ttft), _stats(tpot), _stats(np.asarray(itl_gap_s), itl_weight), _stats(e2e)),
                   Throughput(rate(len(sent_s)), rate(float(out.sum()))), int(len(sent_s)), int(out.sum()), span)


def predicted_figures(w: Workload, sent, first, finish, res) -> Figures:
    keep = ~w.warmup
    if not keep.any():
        raise OpmapError("--predict needs at least one request past the warm-up")
    return figures(sent[keep], first[keep], finish[keep], w.output_len[keep], res.itl_gap_s, res.itl_weight)


def join(measured: dict[str, Any], predicted: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of (metric, statistic, measured, predicted, predicted / measured): latencies at p50 / p90 / p99 and
    mean (s), then output tokens/s and requests/s."""
    rows = []
    for m in METRICS:
        for k in (*(f"p{p}_s" for p in PCTS), "mean_s"):
            a, b = measured["latency"][m][k], predicted["latency"][m][k]
            rows.append({"metric": m, "stat": k.removesuffix("_s"), "unit": "s", "measured": a, "predicted": b,
                         "ratio": _ratio(b, a)})
    for k in ("output_tokens_per_s", "requests_per_s"):
        a, b = measured["throughput"][k], predicted["throughput"][k]
        rows.append({"metric": k.removesuffix("_per_s"), "stat": "per_s", "unit": "1/s", "measured": a,
                     "predicted": b, "ratio": _ratio(b, a)})
    return rows


def _ratio(p: float | None, m: float | None) -> float | None:
    if p is None or m is None or not m or not math.isfinite(p / m):
        return None
    return p / m


@dataclass(frozen=True)
class Prediction:
    """One variant of the prediction (the model alone, or with the server's overhead): its figures, the join
    with the measured ones (``join``'s rows) and the simulated steps."""

    name: str
    figures: Figures
    rows: tuple[dict[str, Any], ...]
    steps: int


@dataclass(frozen=True)
class Measured:
    """The measured side: the run's latency and throughput, as bench.json has them (opmap.bench.metrics)."""

    latency: BenchLatency
    throughput: BenchRates


@dataclass(frozen=True)
class SimulatedLoad:
    """The workload simulated: its requests (warm-up ones among them), the loop, and whether a closed loop's sends
    were simulated (they follow the simulated ends) or taken as measured (written as ``closed_loop_sends``)."""

    RECORD: ClassVar[tuple[str, ...]] = ("requests", "warmup", "mode", "concurrency", "closed_loop_sends")
    requests: int
    warmup: int
    mode: str
    concurrency: int | None
    closed: bool

    @property
    def closed_loop_sends(self) -> str:
        return "simulated" if self.closed else "as measured"


@dataclass(frozen=True)
class BenchPrediction:
    """A measured run joined to its simulation (bench_predict.json, its record): the measured figures, the
    workload simulated, the policy and step cost, the variants (keyed by name), the overhead where measured, the
    stack profile where applied and the command's assumptions (each written only where set)."""

    RECORD: ClassVar[tuple[str, ...]] = ("schema_version", "measured", "workload", "policy", "cost", "predictions",
                                         "overhead", "stack", "assumptions")
    schema_version: ClassVar[int] = SCHEMA_VERSION
    measured: Measured
    workload: SimulatedLoad
    policy: Any
    cost: Any
    predictions: tuple[Prediction, ...] = field(metadata=key(mapping="name"))
    overhead: ServerOverhead | None = field(default=None, metadata=key(omit="none"))
    assumptions: dict[str, Any] | None = field(default=None, metadata=key(omit="none"))
    # opmap.calibrate.stack_profile.StackProfile: the "model+stack" variant's
    stack: Any = field(default=None, metadata=key(omit="none"))

    def last(self) -> Prediction:
        """The variant a run records: with the overhead where measured, else the model alone."""
        return self.predictions[-1]


def predict_run(result, cost, policy, *, overhead: ServerOverhead | None = None,
                measured: BenchFigures | None = None, seed: int = 0, stack=None) -> BenchPrediction:
    """The join of a BenchResult with its simulation on ``cost`` under ``policy``: the model alone, and with the
    server's measured overhead where given, or with a stack profile's fitted parameters (``stack``:
    opmap.calibrate.stack_profile.StackProfile, opmap.bench.stack_fit.apply). ``measured``: the run's figures
    (default: opmap.bench.metrics.summarize of its records, as ``opmap bench`` prints and records them)."""
    if measured is None:
        from opmap.bench.metrics import summarize

        measured = summarize(result.records)
    w = workload(result.records, result.mode, result.concurrency)
    m = Measured(measured.latency, measured.throughput)
    m_rec = record(m)
    variants = [("model", cost, None)]
    if overhead is not None:
        variants.append(("model+overhead", with_step_overhead(cost, overhead.step_s, overhead.per_seq_s),
                         overhead))
    if stack is not None:
        if stack.kv_blocks and stack.page_tokens:
            cost = replace(cost, kv_capacity_tokens=stack.kv_blocks * stack.page_tokens)
        variants.append(("model+stack", *with_stack(cost, stack)))
    preds = []
    for name, c, ov in variants:
        sent, first, finish, res = simulate_workload(w, policy, c, ov, seed)
        pred = predicted_figures(w, sent, first, finish, res)
        preds.append(Prediction(name, pred, tuple(join(m_rec, record(pred))), res.steps))
    load = SimulatedLoad(int(len(w.sent_s)), int(w.warmup.sum()), result.mode, result.concurrency, w.closed)
    return BenchPrediction(m, load, policy, cost, tuple(preds), overhead, stack=stack)


def probe_records(base_url: str, model: str, prompt: str, n_in: int, *, reps: int = 10, long_out: int = 32,
                  batch: int = 1, api: str = "completions", ignore_eos: bool = False,
                  timeout_s: float = 60.0) -> tuple[tuple, tuple]:
    """Probe the server with the bench's own client: (``reps`` sequential 1-token and ``long_out``-token answers
    on ``prompt`` of ``n_in`` tokens; where ``batch`` > 1, ``batch`` long answers sent together with ``reps``
    1-token requests sent among them, LOAD_GAP_S apart). The records, for ``overhead_from_probe``."""
    from opmap.bench.client import run_load

    seq = run_load(base_url, model, probe_specs(prompt, n_in, reps, long_out), api=api, concurrency=1,
                   timeout_s=timeout_s, ignore_eos=ignore_eos).records
    together = ()
    if batch > 1:
        from opmap.bench.records import RequestSpec

        specs = [RequestSpec(i, 0.0, prompt, n_in, long_out) for i in range(batch)]
        specs += [RequestSpec(batch + k, LOAD_GAP_S * (k + 1), prompt, n_in, 1) for k in range(reps)]
        together = run_load(base_url, model, specs, api=api, timeout_s=timeout_s, ignore_eos=ignore_eos).records
    return tuple(seq), tuple(together)


def measure_overhead(base_url: str, model: str, cost, prompt: str, n_in: int, *, long_out: int = 32, **kw
                     ) -> ServerOverhead:
    """One probe (``probe_records``) and the overhead it gives (``overhead_from_probe``)."""
    seq, together = probe_records(base_url, model, prompt, n_in, long_out=long_out, **kw)
    return overhead_from_probe(seq, cost, n_in, long_out, together, kw.get("batch", 1))


def probe_specs(prompt_1: str, n_in: int, reps: int, long_out: int):
    """The probe's requests (opmap.bench.records.RequestSpec), sequential: ``reps`` answers of 1 token, then
    ``reps`` of ``long_out`` tokens, all on an ``n_in``-token prompt."""
    from opmap.bench.records import RequestSpec

    specs = [RequestSpec(i, None, prompt_1, n_in, 1) for i in range(reps)]
    specs += [RequestSpec(reps + i, None, prompt_1, n_in, long_out) for i in range(reps)]
    return specs


def _e2e(records, out: int) -> list[float]:
    """Times (s) from the send to the last token's arrival of the answered requests that asked ``out`` tokens
    and got them (the stream's end where no event carried text). Not to the stream's end: the events after the
    last token (finish, usage, [DONE]) are no part of a token's time, and a proxy can hold them back (a line
    per packet behind Nagle's algorithm waits for the client's delayed ACK), which would count tens of ms into
    request_s and so into every predicted TTFT."""
    return [(r.token_times_s[-1] if r.token_times_s else r.end_s) - r.sent_s for r in records
            if r.status == "ok" and r.output_tokens_asked == out and (r.usage_completion_tokens or out) == out]


def overhead_from_probe(records, cost, n_in: int, long_out: int, together=(), batch: int | None = None
                        ) -> ServerOverhead:
    """Server overhead from the probe's records (``measure_overhead``), against the model's own step times. The
    probe is timed by end-to-end times (send to the last token's arrival, ``_e2e``), which a starved web process
    cannot blur (it may deliver many tokens in one event; the last token still arrives after it was made):

    - per token at batch 1 = (median e2e of the long answers - median e2e of the 1-token answers) / (n - 1);
      step_s = that less the priced decode step of one sequence;
    - per token at batch b (``together``: b = ``batch`` long answers sent at once, in each of the pooled
      probes) = (their median e2e - median 1-token
      e2e) / (n - 1); per_seq_s = (that - the priced decode step of b sequences - step_s) / (b - 1);
    - request_s = the median e2e of the 1-token answers (one prefill step) less the priced prefill and step_s;
    - request_load_s (1-token requests sent while the b answers decode) = their median e2e less the priced
      mixed step (their prompt beside b decodes) and its overheads.

    Each floored at 0."""
    one, long = _e2e(records, 1), _e2e(records, long_out)
    if not one or not long or long_out < 2:
        raise OpmapError("the overhead probe got no answer from the server: --predict cannot measure its overhead")
    e1 = float(np.median(one))
    kv = n_in + long_out // 2
    decode_model = cost.decode_s(1, kv)
    prefill_model = cost.prefill_s(n_in, 1)
    per_tok = (float(np.median(long)) - e1) / (long_out - 1)
    step = max(0.0, per_tok - decode_model)
    request = max(0.0, e1 - prefill_model - step)
    basis = {"probe": f"{len(one)} requests of {n_in} prompt tokens -> 1 token, {len(long)} -> {long_out} tokens, "
                      "sequential",
             "measured_e2e_1_token_s": e1, "measured_s_per_token": per_tok,
             "model_prefill_s": prefill_model, "model_decode_step_s": decode_model,
             "spread_e2e_1_token_s": [float(min(one)), float(max(one))],
             "spread_e2e_long_s": [float(min(long)), float(max(long))]}
    per_seq, load_req = 0.0, None
    batch_e2e = _e2e(together, long_out)
    b = batch or len(batch_e2e)  # probes pooled: each sent ``batch`` together
    if b > 1 and batch_e2e:
        tok_b = (float(np.median(batch_e2e)) - e1) / (long_out - 1)
        model_b = cost.decode_s(b, b * kv)
        per_seq = max(0.0, (tok_b - model_b - step) / (b - 1))
        basis.update({"batch_probe": f"{b} requests -> {long_out} tokens sent together",
                      "measured_s_per_token_batch": tok_b, "model_decode_step_batch_s": model_b})
        under = _e2e(together, 1)
        if under:  # a 1-token request joins a step of b decodes: that mixed step, priced, and its overheads
            mixed = cost.prefill_s(n_in + b, 1 + b) + step + per_seq * b
            load_req = max(0.0, float(np.median(under)) - mixed)
            basis.update({"load_probe": f"{len(under)} requests -> 1 token sent among them",
                          "measured_e2e_1_token_load_s": float(np.median(under)), "model_mixed_step_s": mixed})
    return ServerOverhead(step, request, basis, per_seq, load_req, b if load_req is not None else 1)
