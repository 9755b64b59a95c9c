"""A serving stack's profile: the few parameters a serving prediction is most sensitive to, fitted to measured
bench runs of one stack on one device (``opmap calibrate --from-bench``, opmap.bench.stack_fit), and taken by
``serve``, ``fit`` and ``bench --predict`` (``--stack PROFILE``).

Parameters (each a fitted value, kind ``fit``, with the runs it was fitted on):

- ``step_s``: host time per engine step outside the model's kernels (the scheduler, the batch's Python, eager
  dispatch), added to every priced step;
- ``per_seq_s``: host time per sequence of a decode step (each token's hand-off, detokenizing, its event);
- ``request_s``: per request, before its first step (HTTP, tokenizing, the queue into the engine);
- ``per_stream_s``: what each other stream in flight adds to a request's way into the engine (a closed loop of C
  clients: C - 1 others; the front end's event loop serves their token events before the new request: measured on
  transformers serve, ~1.1 ms a stream, benchmarks/README.md "bench_stack_calibration.py"); 0 in a profile written
  before it existed;
- ``decode_scale``: measured over priced decode step time (1 / the fraction of the model's decode rate the stack
  achieves: a decode step is memory-bound, so this is the achievable decode bandwidth's shortfall);
- ``prefill_scale``: measured over priced prefill time (the prefill efficiency's shortfall);
- ``kv_blocks``: the KV pool in blocks where the runs say it (a launched server's settings, vLLM's
  ``num_gpu_blocks`` scraped from /metrics), else None (the model's memory fit decides it).

A profile can also be anchored to one published or measured Offline run of the stack (every request queued at
once: the stack's throughput at saturation; run mode ``offline``): a uniform decode and prefill scale, the
predicted over the measured throughput, that sets the capacity an open-loop prediction's utilization is taken
against (benchmarks/serving_tails.py: MLPerf Server tails from the same system's Offline run).

The profile keeps the range it was fitted on (closed-loop concurrencies, open-loop rates) and the residuals
(predicted / measured per run and figure) before and after the fit; a prediction outside the range says so.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from opmap.errors import OpmapError
from opmap.safeio import read_json_object

SCHEMA_VERSION = 1
KIND = "stack-profile"
MAX_BYTES = 4 << 20
MODES = ("open", "closed", "offline")  # a fitted run's load (FitRun.mode)
PARAMS = ("step_s", "per_seq_s", "request_s", "decode_scale", "prefill_scale")
LATER_PARAMS = ("per_stream_s",)  # read as 0 where a profile predates them
# what a fitted value may be: times in [0, 10 s], scales in [0.05, 20] (a stack 20x slower or faster than the
# model's kernels is a wrong model or a wrong device, not a stack to profile)
BOUNDS = {"step_s": (0.0, 10.0), "per_seq_s": (0.0, 10.0), "request_s": (0.0, 10.0), "decode_scale": (0.05, 20.0),
          "prefill_scale": (0.05, 20.0), "per_stream_s": (0.0, 10.0)}


@dataclass(frozen=True)
class Residual:
    """Predicted / measured for one run's figure, before the fit (the model with the stack's defaults) and
    after it."""

    run: str
    figure: str  # ttft_p50 | tpot_p50 | output_tokens_per_s
    before: float | None
    after: float | None


@dataclass(frozen=True)
class FitRun:
    """A run the profile was fitted on: its folder's name, the load (closed loop at ``concurrency`` or open loop
    at ``rate_per_s``) and its measured requests."""

    name: str
    mode: str  # closed | open | offline (every request queued at once: the run measured saturation)
    concurrency: int | None
    rate_per_s: float | None
    requests: int


@dataclass(frozen=True)
class StackProfile:
    device: str
    model: str
    dtype: str
    runtime: str
    step_s: float
    per_seq_s: float
    request_s: float
    decode_scale: float
    prefill_scale: float
    kv_blocks: int | None
    page_tokens: int | None
    max_batch_tokens: int | None
    runs: tuple[FitRun, ...]
    residuals: tuple[Residual, ...] = ()
    source: str = ""
    per_stream_s: float = 0.0

    def __post_init__(self) -> None:
        for k in (*PARAMS, *LATER_PARAMS):
            lo, hi = BOUNDS[k]
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and lo <= v <= hi):
                raise OpmapError(f"stack profile: {k} {v!r} is not a number in [{lo:g}, {hi:g}]")
        if not self.runs:
            raise OpmapError("stack profile: fitted on no run")

    @property
    def concurrency_range(self) -> tuple[int, int] | None:
        cs = [r.concurrency for r in self.runs if r.mode == "closed" and r.concurrency]
        return (min(cs), max(cs)) if cs else None

    @property
    def rate_range(self) -> tuple[float, float] | None:
        rs = [r.rate_per_s for r in self.runs if r.mode == "open" and r.rate_per_s]
        return (min(rs), max(rs)) if rs else None

    def outside(self, concurrency: int | None = None, rate_per_s: float | None = None) -> str:
        """Why a load lies outside the fitted range ("" inside it): a prediction there extrapolates."""
        c, r = self.concurrency_range, self.rate_range
        if c is None and r is None and any(run.mode == "offline" for run in self.runs):
            return ""  # anchored to a saturated run: every load up to its throughput lies below it
        if concurrency is not None:
            if c is None:
                return f"concurrency {concurrency}: the profile was fitted on open-loop runs only"
            if not c[0] <= concurrency <= c[1]:
                return f"concurrency {concurrency} is outside the fitted {c[0]}-{c[1]}: extrapolated"
        if rate_per_s is not None:
            if r is None:
                return f"rate {rate_per_s:g}/s: the profile was fitted on closed-loop runs only"
            if not r[0] <= rate_per_s <= r[1]:
                return f"rate {rate_per_s:g}/s is outside the fitted {r[0]:g}-{r[1]:g}/s: extrapolated"
        return ""

    def line(self) -> str:
        return (f"stack profile ({self.source or 'fitted'}): {self.step_s * 1e3:.3g} ms a step, "
                f"{self.per_seq_s * 1e3:.3g} ms a decoding sequence, {self.request_s * 1e3:.3g} ms a request"
                + (f" + {self.per_stream_s * 1e3:.3g} ms a stream in flight" if self.per_stream_s else "") + ", "
                f"decode x{self.decode_scale:.3g}, prefill x{self.prefill_scale:.3g}"
                + (f", KV {self.kv_blocks} blocks" if self.kv_blocks else "")
                + f"; fitted on {len(self.runs)} runs")

    def to_dict(self) -> dict[str, object]:
        return {"schema_version": SCHEMA_VERSION, "kind": KIND, "device": self.device, "model": self.model,
                "dtype": self.dtype, "runtime": self.runtime, "source": self.source,
                "parameters": {k: {"value": getattr(self, k), "kind": "fit"} for k in (*PARAMS, *LATER_PARAMS)},
                "kv_blocks": self.kv_blocks, "page_tokens": self.page_tokens,
                "max_batch_tokens": self.max_batch_tokens,
                "runs": [{"name": r.name, "mode": r.mode, "concurrency": r.concurrency, "rate_per_s": r.rate_per_s,
                          "requests": r.requests} for r in self.runs],
                "residuals": [{"run": r.run, "figure": r.figure, "before": r.before, "after": r.after}
                              for r in self.residuals]}


def _num(d: dict, k: str, where: str) -> float:
    v = d.get(k)
    if isinstance(v, dict):
        v = v.get("value")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise OpmapError(f"{where}: {k} must be a number, got {v!r}")
    return float(v)


def _opt_int(v: object, k: str, where: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise OpmapError(f"{where}: {k} must be a whole number >= 1 or null, got {v!r}")
    return v


def read_stack_profile(path: str | Path) -> StackProfile:
    """The profile at ``path`` (JSON, bounded, parsed and checked); one OpmapError line when it is not one."""
    where = str(path)
    d = read_json_object(path, MAX_BYTES, "stack profile", f"{where} holds no JSON object: not a stack profile")
    if d.get("kind") != KIND or d.get("schema_version") != SCHEMA_VERSION:
        raise OpmapError(f"{where}: not a stack profile (kind {d.get('kind')!r}, schema_version "
                         f"{d.get('schema_version')!r}; `opmap calibrate --from-bench` writes kind {KIND!r}, "
                         f"schema_version {SCHEMA_VERSION})")
    params = d.get("parameters")
    if not isinstance(params, dict):
        raise OpmapError(f"{where}: parameters must be an object holding {', '.join(PARAMS)}")
    runs_raw = d.get("runs")
    if not isinstance(runs_raw, list) or not 1 <= len(runs_raw) <= 1000:
        raise OpmapError(f"{where}: runs must be a list of 1 to 1000 runs")
    runs = []
    for r in runs_raw:
        if not isinstance(r, dict) or r.get("mode") not in MODES:
            raise OpmapError(f"{where}: a run must be an object with mode {', '.join(MODES)}")
        rate = r.get("rate_per_s")
        runs.append(FitRun(str(r.get("name", ""))[:200], r["mode"], _opt_int(r.get("concurrency"), "concurrency",
                                                                                where),
                           float(rate) if isinstance(rate, (int, float)) and math.isfinite(rate) else None,
                           int(r.get("requests") or 0)))
    texts = {k: str(d.get(k, ""))[:500] for k in ("device", "model", "dtype", "runtime", "source")}
    res_raw = d.get("residuals") if isinstance(d.get("residuals"), list) else []
    ratio = lambda v: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) \
        else None
    residuals = tuple(Residual(str(r.get("run", ""))[:200], str(r.get("figure", ""))[:40], ratio(r.get("before")),
                               ratio(r.get("after"))) for r in res_raw[:10_000] if isinstance(r, dict))
    return StackProfile(texts["device"], texts["model"], texts["dtype"], texts["runtime"],
                        *(_num(params, k, where) for k in PARAMS),
                        _opt_int(d.get("kv_blocks"), "kv_blocks", where),
                        _opt_int(d.get("page_tokens"), "page_tokens", where),
                        _opt_int(d.get("max_batch_tokens"), "max_batch_tokens", where), tuple(runs), residuals,
                        source=texts["source"],
                        **{k: _num(params, k, where) if k in params else 0.0 for k in LATER_PARAMS})


def write_stack_profile(profile: StackProfile, path: str | Path) -> Path:
    """Write ``profile`` as JSON, atomically: a new temporary file (mkstemp: a fresh name, never a link's target)
    moved over ``path`` (a link there is replaced, not followed); read back through the reader's checks first."""
    path = Path(path)
    text = json.dumps(profile.to_dict(), indent=1, allow_nan=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        read_stack_profile(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
