"""A serving stack's parameters fitted to measured runs (``opmap calibrate --from-bench``): the step cost of the
model (opmap.serve.model_cost) scaled and offset by the few parameters of opmap.calibrate.stack_profile until the
simulated runs (opmap.bench.predict.simulate_workload, the workload each run actually sent) match the measured
ones.

The parameters: opmap.calibrate.stack_profile's (a step, a decoding sequence, a request, a stream in flight at the
request's send, the decode and prefill scales). The fit minimises, over every run, the squared log ratio predicted /
measured of three figures: TTFT p50, TPOT p50 and output tokens/s (the same formula on both sides:
opmap.bench.predict.figures), plus a small pull of the scales toward 1 (``PRIOR``) so that parameters the runs
cannot tell apart stay at the model's values rather than drifting. Nelder-Mead (Nelder and Mead 1965, the standard
coefficients: reflection 1, expansion 2, contraction 0.5, shrink 0.5) over log scales and times in ms; times held at
>= 0 by their absolute value; at most two passes of at most ``MAX_EVALS`` simulations of the run set
(the second restarted from the first's best on a smaller simplex).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from opmap.bench.predict import (
    Workload,
    figures,
    predicted_figures,
    simulate_workload,
    with_stack,
    workload,
)
from opmap.calibrate.stack_profile import BOUNDS, FitRun, Residual, StackProfile
from opmap.errors import OpmapError

FIGURES = ("ttft_mean", "tpot_mean", "ttft_p50", "tpot_p50", "output_tokens_per_s")
PRIOR = 1e-3  # weight of (log scale)^2 in the objective: a tie-breaker, far below one figure's 5% error (2.4e-3)
MAX_EVALS = 300  # per Nelder-Mead pass; the fit runs two (a restart from the first's best: a fresh simplex)
TOL = 1e-6


@dataclass(frozen=True)
class Params:
    step_s: float = 0.0
    per_seq_s: float = 0.0
    request_s: float = 0.0
    decode_scale: float = 1.0
    prefill_scale: float = 1.0
    per_stream_s: float = 0.0

    def clipped(self) -> Params:
        return Params(*(min(max(getattr(self, k), BOUNDS[k][0]), BOUNDS[k][1]) for k in BOUNDS))


def apply(cost, p: Params):
    """(the step cost under ``p``, the per-request overhead): opmap.bench.predict.with_stack."""
    return with_stack(cost, p)


def measured_figures(records, output_len: np.ndarray | None = None):
    """A run's figures from its records by the formula the predicted side uses (opmap.bench.predict.figures):
    the answered, non-warm-up requests; the last token's arrival as the finish."""
    ok = sorted((r for r in records if r.status == "ok" and not r.warmup), key=lambda r: r.sent_s)
    if not ok:
        raise OpmapError("a run to fit needs answered requests past the warm-up: this one has none")
    sent = np.array([r.sent_s for r in ok])
    first = np.array([r.first_token_s if r.first_token_s is not None else r.end_s for r in ok])
    finish = np.array([r.token_times_s[-1] if r.token_times_s else r.end_s for r in ok])
    out = np.array([max(1, r.usage_completion_tokens or r.output_tokens_asked) for r in ok])
    gaps = [b - a for r in ok for a, b in zip(r.token_times_s, r.token_times_s[1:])]
    return figures(sent, first, finish, out, np.array(gaps or [0.0]))


def _values(f) -> dict[str, float | None]:
    lat = f.latency
    return {"ttft_mean": lat.ttft.mean_s, "tpot_mean": lat.tpot.mean_s, "ttft_p50": lat.ttft.p50_s,
            "tpot_p50": lat.tpot.p50_s, "output_tokens_per_s": f.throughput.output_tokens_per_s}


@dataclass(frozen=True)
class Run:
    """A measured run as the fit takes it: a name, its workload (opmap.bench.predict.Workload), its measured
    figures and how it was loaded."""

    name: str
    workload: Workload
    measured: dict[str, float | None]
    mode: str
    concurrency: int | None
    rate_per_s: float | None

    @classmethod
    def of(cls, name: str, result) -> Run:
        w = workload(result.records, result.mode, result.concurrency)
        m = _values(measured_figures(result.records))
        rate = None
        if result.mode == "open" and len(w.sent_s) > 1:
            rate = float((len(w.sent_s) - 1) / max(1e-9, w.sent_s.max() - w.sent_s.min()))
        return cls(name, w, m, result.mode, result.concurrency, rate)


def predict(run: Run, cost, policy, p: Params, seed: int = 0) -> dict[str, float | None]:
    c, ov = apply(cost, p)
    sent, first, finish, res = simulate_workload(run.workload, policy, c, ov, seed)
    return _values(predicted_figures(run.workload, sent, first, finish, res))


def _ratio(pred: float | None, meas: float | None) -> float | None:
    if pred is None or meas is None or pred <= 0 or meas <= 0:
        return None
    return pred / meas


def _from_x(x: Sequence[float], per_stream_s: float = 0.0) -> Params:
    """The parameters of a point of the search: log scales, then times in ms; the time a stream in flight adds
    the sixth coordinate where the runs can tell it (``streams``), else held at ``per_stream_s``."""
    streams = abs(x[5]) / 1e3 if len(x) > 5 else per_stream_s
    return Params(abs(x[2]) / 1e3, abs(x[3]) / 1e3, abs(x[4]) / 1e3, math.exp(x[0]), math.exp(x[1]),
                  streams).clipped()


def streams_tell(runs: Sequence[Run]) -> bool:
    """Whether the runs can tell the time a stream in flight adds: a closed loop of more than one client (an open
    loop's arrivals are taken with none in flight: opmap.bench.predict.simulate_workload)."""
    return any(r.workload.closed and (r.workload.concurrency or 0) > 1 for r in runs)


def objective(runs: Sequence[Run], cost, policy, per_stream_s: float = 0.0) -> Callable[[Sequence[float]], float]:
    def f(x: Sequence[float]) -> float:
        p = _from_x(x, per_stream_s)
        total = PRIOR * (math.log(p.decode_scale) ** 2 + math.log(p.prefill_scale) ** 2)
        for r in runs:
            pred = predict(r, cost, policy, p)
            for k in FIGURES:
                q = _ratio(pred[k], r.measured[k])
                if q is not None:
                    total += math.log(q) ** 2
        return total
    return f


def nelder_mead(f: Callable[[Sequence[float]], float], x0: Sequence[float], steps: Sequence[float],
                max_evals: int = MAX_EVALS, tol: float = TOL) -> tuple[np.ndarray, float, int]:
    """The minimum of ``f`` from ``x0`` (simplex of x0 and x0 + steps[i] e_i): (x, f(x), evaluations)."""
    n = len(x0)
    pts = [np.asarray(x0, dtype=float)]
    for i in range(n):
        e = np.array(x0, dtype=float)
        e[i] += steps[i]
        pts.append(e)
    vals = [f(p) for p in pts]
    evals = n + 1
    while evals < max_evals:
        order = np.argsort(vals)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        if vals[-1] - vals[0] <= tol:
            break
        centroid = np.mean(pts[:-1], axis=0)
        xr = centroid + (centroid - pts[-1])
        fr = f(xr)
        evals += 1
        if vals[0] <= fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
            continue
        if fr < vals[0]:
            xe = centroid + 2.0 * (centroid - pts[-1])
            fe = f(xe)
            evals += 1
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
            continue
        xc = centroid + 0.5 * (pts[-1] - centroid)
        fc = f(xc)
        evals += 1
        if fc < vals[-1]:
            pts[-1], vals[-1] = xc, fc
            continue
        for i in range(1, n + 1):  # shrink toward the best
            pts[i] = pts[0] + 0.5 * (pts[i] - pts[0])
            vals[i] = f(pts[i])
            evals += 1
    best = int(np.argmin(vals))
    return pts[best], float(vals[best]), evals


def fit(runs: Sequence[Run], cost, policy, start: Params = Params(), progress=None) -> tuple[Params, int]:
    """The parameters that best fit ``runs`` (module docstring) and the simulations of the run set it took."""
    if not runs:
        raise OpmapError("--from-bench needs at least one run to fit")
    f = objective(runs, cost, policy, start.per_stream_s)
    if progress is not None:
        inner = f

        def f(x):  # noqa: F811 (the objective, reporting each evaluation)
            progress()
            return inner(x)
    x0 = [math.log(start.decode_scale), math.log(start.prefill_scale), start.step_s * 1e3, start.per_seq_s * 1e3,
          start.request_s * 1e3]
    steps = [0.4, 0.4, 2.0, 0.5, 5.0]
    if streams_tell(runs):
        x0, steps = [*x0, start.per_stream_s * 1e3], [*steps, 1.0]
    x, _, evals = nelder_mead(f, x0, steps)
    x, _, more = nelder_mead(f, x, [s / 4 for s in steps])  # a restart: a collapsed simplex stalls Nelder-Mead
    return _from_x(x, start.per_stream_s), evals + more


def residuals(runs: Sequence[Run], cost, policy, before: Params, after: Params) -> tuple[Residual, ...]:
    out = []
    for r in runs:
        pb, pa = predict(r, cost, policy, before), predict(r, cost, policy, after)
        out += [Residual(r.name, k, _ratio(pb[k], r.measured[k]), _ratio(pa[k], r.measured[k])) for k in FIGURES]
    return tuple(out)


def profile(runs: Sequence[Run], cost, policy, p: Params, *, device: str, model: str, dtype: str, runtime: str,
            kv_blocks: int | None, page_tokens: int | None, max_batch_tokens: int | None,
            before: Params = Params()) -> StackProfile:
    fitted = tuple(FitRun(r.name, r.mode, r.concurrency, r.rate_per_s, int((~r.workload.warmup).sum()))
                   for r in runs)
    return StackProfile(device, model, dtype, runtime, p.step_s, p.per_seq_s, p.request_s, p.decode_scale,
                        p.prefill_scale, kv_blocks, page_tokens, max_batch_tokens, fitted,
                        residuals(runs, cost, policy, before, p), source="opmap calibrate --from-bench",
                        per_stream_s=p.per_stream_s)


def params_of(profile: StackProfile) -> Params:
    return Params(profile.step_s, profile.per_seq_s, profile.request_s, profile.decode_scale, profile.prefill_scale,
                  profile.per_stream_s)
