"""Latency-throughput sweeps over batch and sequence: predicted on a catalog device, or measured here.

``sweep`` prices every (batch, seq) point of a model for a phase (prefill: the whole prompt, latency = time to
first token; decode: one token per sequence against a KV cache of ``seq`` tokens, latency = time per output
token). Each sequence length is captured as a shape family over the batch (``opmap.explore.shapes``): four
small captures prove the graph's integers polynomial in the batch, and every requested batch is then written
from the fit and re-priced with no capture of its own; a model whose graph changes with the batch is captured
point by point, and the point says so (``method``).

Per point: latency, requests and tokens per second, the bound mix (share of predicted time by bound class),
MFU, the memory fit. Predicted points carry no percentiles (one prediction is not a distribution); with
``measure=True`` each point is built on the local CPU in ``dtype`` (a torch dtype: MEASURED_DTYPES) and timed over
repeats: p50 / p95 / p99 from those runs, beside the prediction for the same CPU (``hw``: a CPU profile, the host's
calibrated one from the command line) at the same dtype; every point names its hardware and dtype. The energy of
the timed repeats is read from the package's RAPL counter before and after them (``opmap.measure.energy``):
``energy_j`` over ``energy_window_s``, ``power_w`` = J / s, ``energy_per_token_j``, ``tokens_per_j``,
``power_method``. Where no counter can be read, the local profile's TDP (``opmap calibrate``'s local.toml, where a
``tdp_w`` was added to it) models the draw of the busy loop, said so; without one every energy figure is null with
the reason. Predicted points carry the same keys, null.

The Pareto front: points no other point beats on both latency (lower) and tokens per second (higher). The knee,
per sequence length along the batch: the point farthest above the chord from the smallest to the largest batch
in normalised (latency, tokens per second) space (Satopaa et al. 2011, "Kneedle"), the batch past which more
batch buys little throughput for its latency.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from opmap.analyze import analyze_graph
from opmap.capture import capture
from opmap.errors import Interrupted, OpmapError
from opmap.explore.shapes import FIT_POINTS, NotAFamily, ShapeFamily
from opmap.hardware.spec import HardwareSpec
from opmap.measure.energy import RAPL_ROOT
from opmap.measure.oom import check_fits, refusal_as_error, run_bytes
from opmap.phases.runtime import get_runtime
from opmap.precision import build_bytes
from opmap.record import key, record
from opmap.validate import INT_MAX

SCHEMA_VERSION = 1
PHASES = ("prefill", "decode")
FAMILY_VALUES = (1, 2, 3, 4)  # FIT_POINTS fit batches and one to check
MEASURED_DTYPES = ("fp32", "bf16", "fp16")  # torch dtypes a CPU runs (no TF32 on a CPU)


def parse_ints(text: str, what: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; one line naming the problem otherwise."""
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise OpmapError(f"--{what} takes comma-separated positive integers such as 1,2,4, got {text!r}") from None
    if not vals or any(not 1 <= v <= INT_MAX for v in vals):
        raise OpmapError(f"--{what} takes comma-separated integers from 1 to {INT_MAX} such as 1,2,4, got {text!r}")
    return sorted(set(vals))


def _bound_mix(a) -> dict[str, float]:
    tot: dict[str, float] = defaultdict(float)
    for k in a.kernel_results:
        tot[str(k.bound)] += k.predicted_s
    s = sum(tot.values()) or 1.0
    return {b: t / s for b, t in sorted(tot.items(), key=lambda x: -x[1])}


def _workload(target: str, phase: str, batch: int, seq: int, dtype: str, kv_write: str, device: str = "meta"):
    from opmap.workloads.phases import PhaseSpec, phase_workload

    spec = PhaseSpec(phase, kv_len=seq if phase == "decode" else None, kv_write=kv_write)
    return phase_workload(target, spec, batch, None if phase == "decode" else seq, dtype, device)


ENERGY_KEYS = ("energy_j", "energy_window_s", "power_w", "energy_per_token_j", "tokens_per_j")


@dataclass(frozen=True)
class Predicted:
    """A measured point's prediction, kept beside it: the same point priced on ``hardware`` in ``dtype``."""

    latency_s: float
    mfu: float | None
    bound_mix: dict[str, float]
    hardware: str
    dtype: str


@dataclass(frozen=True)
class SweepPoint:
    """One (batch, seq) point: its latency (prefill: time to first token; decode: time per output token), requests
    and tokens per second, share of predicted time by bound, MFU, the memory fit, and how it was got (``method``).
    Percentiles and energy only where measured (None otherwise); ``predicted`` beside a measured point only. Its
    record is sweep.json's point: every field in order, ``predicted`` only where set."""

    batch: int
    seq: int
    phase: str
    hardware: str
    dtype: str
    latency_s: float
    latency_p50_s: float | None
    latency_p95_s: float | None
    latency_p99_s: float | None
    throughput_per_s: float
    tokens_per_s: float
    bound_mix: dict[str, float]
    mfu: float | None
    fits: bool
    memory_bytes: float
    method: str
    energy_j: float | None = None
    energy_window_s: float | None = None
    power_w: float | None = None
    energy_per_token_j: float | None = None
    tokens_per_j: float | None = None
    power_method: str = "not measured: a predicted point (opmap fit models power under load)"
    predicted: Predicted | None = field(default=None, metadata=key(omit="none"))


@dataclass(frozen=True)
class SeqPoints:
    """One sequence length's points and the captures they took (``seq_points``)."""

    points: tuple[SweepPoint, ...]
    captures: int


@dataclass(frozen=True)
class BatchSeq:
    """One point's place in the grid: sweep.json's knee and Pareto entries."""

    batch: int
    seq: int


@dataclass(frozen=True)
class SweepLayout:
    """The layout every point was priced as: sweep.json's ``layout`` block."""

    RECORD: ClassVar[tuple[str, ...]] = ("tp", "pp", "devices")
    tp: int
    pp: int

    @property
    def devices(self) -> int:
        return self.tp * self.pp


@dataclass(frozen=True)
class SweepStop:
    """A sweep stopped by a signal: the signal's name, the sequence lengths finished and those not run."""

    signal: str
    seqs_done: tuple[int, ...]
    seqs_not_run: tuple[int, ...]


@dataclass(frozen=True)
class Sweep:
    """A sweep (``sweep``): its points, the knee per sequence length and the Pareto front, how fast it ran and on
    what, its assumptions; ``interrupted`` where a stop kept the lengths finished. Its record is sweep.json
    (``RECORD``: the layout as its block)."""

    RECORD: ClassVar[tuple[str, ...]] = (
        "schema_version", "model", "hardware", "measured_on", "phase", "dtype", "runtime", "layout", "points", "knee",
        "pareto", "points_per_s", "captures", "wall_s", "engine", "assumptions", "interrupted")
    schema_version: ClassVar[int] = SCHEMA_VERSION
    model: str
    hardware: str
    measured_on: str | None
    phase: str
    dtype: str
    runtime: dict[str, Any]  # the runtime the points were priced under, as sweep.json writes it (its record)
    tp: int
    pp: int
    points: tuple[SweepPoint, ...]
    knee: tuple[BatchSeq, ...]
    pareto: tuple[BatchSeq, ...]
    points_per_s: float
    captures: int
    wall_s: float
    engine: str
    assumptions: tuple[str, ...]
    interrupted: SweepStop | None = field(default=None, metadata=key(omit="none"))

    @property
    def layout(self) -> SweepLayout:
        return SweepLayout(self.tp, self.pp)


def sweep(target: str, hw: HardwareSpec, batches: Sequence[int], seqs: Sequence[int], phase: str = "prefill",
          dtype: str = "bf16", measure: bool = False, repeats: int = 10,
          progress: Callable[[str, int, int], None] | None = None, engine: str = "local",
          workers: int | None = None, rapl_root: Path = RAPL_ROOT, runtime: str | None = None, tp: int = 1,
          pp: int = 1) -> Sweep:
    """Every (batch, seq) point. Predicted: one task per sequence length (its batch family's captures and all
    its batch points, re-priced), run on ``engine`` (``opmap.explore.engine``: ``local`` process pool or
    ``ray``); the points come back in the same order with the same values either way. Measured: every point in
    this process, one after another, whatever the engine (a timing run must have the machine to itself).

    ``runtime`` (opmap.phases.runtime): the per-kernel overhead, the fusion policy and the per-step host time the
    predictions assume; default ``engine`` for a predicted sweep (as serve and fit) and ``eager`` for a measured
    one (it times eager PyTorch here, and its predictions beside it assume the same). ``tp`` x ``pp``: each point
    priced as that layout (opmap.mapping.sharding: one batch through every stage; memory per device).

    Stopped (``Interrupted``: Ctrl-C, SIGTERM) once a sequence length has finished, the stop carries as
    ``partial`` the sweep of the lengths finished, with ``interrupted``: the signal, the lengths done and not run."""
    runtime = check_sweep(target, batches, seqs, phase, dtype, measure, engine, runtime, tp, pp)
    if measure:
        check_measured(hw, dtype)
    t0 = time.perf_counter()
    jobs = [SeqJob(target, hw, tuple(batches), s, phase, dtype, measure, repeats, rapl_root, runtime, tp, pp)
            for s in seqs]
    total = len(batches) * len(seqs)
    ran_on = "this process, one point at a time (measured)" if measure else engine
    try:
        results = _run_jobs(jobs, measure, engine, workers, progress, total)
    except Interrupted as e:  # the sequence lengths finished are kept, the rest named
        done = [e.done[i] for i in sorted(e.done)]
        if done:
            e.partial = replace(_result(target, hw, phase, dtype, measure, runtime, tp, pp, done, t0, ran_on),
                                interrupted=SweepStop(e.name, tuple(j.seq for i, j in enumerate(jobs) if i in e.done),
                                                      tuple(j.seq for i, j in enumerate(jobs) if i not in e.done)))
        raise
    if progress:
        progress("done", total, total)
    return _result(target, hw, phase, dtype, measure, runtime, tp, pp, results, t0, ran_on)


def check_sweep(target: str, batches: Sequence[int], seqs: Sequence[int], phase: str, dtype: str, measure: bool,
                engine: str, runtime: str | None, tp: int, pp: int) -> str:
    """A sweep's request checked before any hardware is read or calibrated and before any capture: the phase, the
    engine, the runtime (returned, its default filled in), the layout, a measured sweep's dtype, and the phase's
    own checks on the model."""
    if phase not in PHASES:
        raise OpmapError(f"unknown sweep phase {phase!r}; accepted: {', '.join(PHASES)}")
    from opmap.explore.engine import check_engine
    from opmap.phases.runtime import check_runtime
    from opmap.workloads.phases import PhaseSpec, check_phase

    check_engine(engine)
    runtime = check_runtime(runtime or ("eager" if measure else "engine"))
    if measure and runtime != "eager":
        raise OpmapError(f"--measure times eager PyTorch on this CPU: --runtime {runtime} is for predicted sweeps "
                         "(drop it, or --runtime eager)")
    for name, v in (("--tp", tp), ("--pp", pp)):
        if not (isinstance(v, int) and 1 <= v <= INT_MAX):
            raise OpmapError(f"{name} must be an integer from 1 to {INT_MAX}, got {v!r}")
    if measure and tp * pp > 1:
        raise OpmapError(f"--measure times one local device: --tp {tp} x --pp {pp} needs {tp * pp} (predicted "
                         "sweeps only)")
    if measure and dtype not in MEASURED_DTYPES:
        raise OpmapError(f"--measure runs torch dtypes on this CPU; accepted: {', '.join(MEASURED_DTYPES)} (got "
                         f"{dtype!r}; other formats are predicted only: drop --measure)")
    for s in seqs:  # the phase's own checks (decoder, KV length) before any capture; shapes when built
        check_phase(PhaseSpec(phase, kv_len=s if phase == "decode" else None), target, max(batches))
    return runtime


def check_measured(hw: HardwareSpec, dtype: str) -> None:
    """A measured sweep runs a torch dtype on this CPU, and the prediction set beside it is for a CPU (the host's
    calibrated profile): an H100's beside a CPU's timing compares two devices."""
    if dtype not in MEASURED_DTYPES:
        raise OpmapError(f"--measure runs torch dtypes on this CPU; accepted: {', '.join(MEASURED_DTYPES)} (got "
                         f"{dtype!r}; other formats are predicted only: drop --measure)")
    if hw.device_type != "cpu":
        raise OpmapError(f"--measure times this CPU: the prediction beside it must be for this CPU, not {hw.name} "
                         f"({hw.device_type}); use --hardware local (calibrated here, made on first use)")


def measured_device() -> str:
    """The device a measured sweep runs on, by name: this CPU's model."""
    import torch

    from opmap.calibrate import device_name

    return f"this CPU ({device_name(torch.device('cpu'))})"


def _run_jobs(jobs: list[SeqJob], measure: bool, engine: str, workers: int | None, progress, total: int) -> list:
    """Each sequence length's points: measured one after another here, else one task each on ``engine``. A stop
    (Interrupted) carries the lengths finished, by index."""
    from opmap.explore.engine import get_engine

    if not measure:
        if progress:
            progress(f"{len(jobs)} sequence lengths on {engine}", 0, len(jobs))
        with get_engine(engine, workers) as eng:
            return eng.map(seq_points, jobs, progress=progress, label=lambda j: f"seq {j.seq}: {len(j.batches)} points")
    results: list[SeqPoints] = []  # sequential, in this process: progress per point
    try:
        for j in jobs:
            done0 = sum(len(r.points) for r in results)
            results.append(seq_points(j, None if progress is None else
                                      (lambda what, i, d=done0: progress(what, d + i, total))))
    except KeyboardInterrupt as e:
        raise Interrupted(Interrupted.of(e).signum, dict(enumerate(results))) from None
    return results


def _result(target: str, hw: HardwareSpec, phase: str, dtype: str, measure: bool, runtime: str, tp: int, pp: int,
            results: list[SeqPoints], t0: float, ran_on: str) -> Sweep:
    """The sweep of the sequence lengths' ``results``."""
    points = tuple(p for r in results for p in r.points)
    captures = sum(r.captures for r in results)
    wall = time.perf_counter() - t0
    return Sweep(
        target, hw.name, measured_device() if measure else None, phase, dtype,
        record(get_runtime(hw, runtime)) if not measure else
        {"name": "eager", "note": f"measured: eager PyTorch in {dtype} on this CPU, predicted on {hw.name}"},
        tp, pp, points, knees(points), pareto(points), len(points) / wall if wall else 0.0, captures, wall, ran_on,
        assumptions=(
                "latency: prefill = time to first token of the batch; decode = time per output token at the KV "
                "length given as seq",
                f"predicted under {get_runtime(hw, runtime).line()}" + (
                    f"; laid out tp {tp} x pp {pp}: one batch through every stage (no pipelining across batches), "
                    "memory per device" if tp * pp > 1 else ""),
                "predicted points carry no percentiles; measured points: p50 / p95 / p99 over the repeats, run in "
                "the point's dtype on the point's hardware, beside the prediction (its own hardware and dtype) "
                "for that device",
                "energy (measured points): counter delta over the timed repeats, J; power = J / s of that window; "
                "per token = J / (repeats x tokens per run); each point's power_method says what was read",
                "knee: Kneedle (Satopaa et al. 2011) along the batch per seq, in normalised latency / tokens per s",
                "pareto: no other point has lower latency and higher tokens per second",
                "predicted: one task per sequence length on the engine (local process pool or Ray), same values "
                "either way; measured: one point at a time in this process, whatever the engine"))


@dataclass(frozen=True)
class SeqJob:
    """One sequence length's work: everything a worker needs, nothing it must look up elsewhere."""

    target: str
    hw: HardwareSpec
    batches: tuple[int, ...]
    seq: int
    phase: str
    dtype: str
    measure: bool = False
    repeats: int = 10
    rapl_root: Path = RAPL_ROOT
    runtime: str = "eager"
    tp: int = 1
    pp: int = 1


def seq_points(job: SeqJob, progress: Callable[[str, int], None] | None = None) -> SeqPoints:
    """One sequence length: its batch family (four captures) and every batch point re-priced from it, or a
    capture per point where the graph is not a family."""
    target, hw, phase, dtype, s = job.target, job.hw, job.phase, job.dtype, job.seq
    batches = job.batches
    rt = get_runtime(hw, job.runtime)
    hw_rt = rt.apply(hw)
    points: list[SweepPoint] = []
    captures = 0
    built: dict[int, Any] = {}

    def capture_at(b: int):
        w = built[b] = _workload(target, phase, b, s, dtype, rt.kv_write)
        return capture(w.module, (), w.inputs) if isinstance(w.inputs, dict) else capture(w.module, w.inputs)

    family, why = None, ""
    if len(batches) > 1:
        try:
            family = ShapeFamily(capture_at, FAMILY_VALUES)
            captures += family.captures
        except NotAFamily as e:
            why = str(e)
    proxy = None
    where = measured_device() if job.measure else hw.name
    for b in batches:
        if progress:
            progress(f"seq {s}, batch {b}", len(points))
        if family is not None:
            g, method = family.graph_at(b), f"predicted (re-priced from the batch family of seq {s})"
        else:
            g, method = capture_at(b), "predicted (captured)" + (f": {why}" if why else "")
            captures += 1
        proxy = proxy or next(iter(built.values()), None) or _workload(target, phase, 1, s, dtype, rt.kv_write)
        w = replace(proxy, module=None, inputs=None, batch=b, seq=None if phase == "decode" else s)
        a = analyze_graph(g, w, hw_rt, dtype, fusion=rt.fusion)
        lat, fits, mem_bytes = _layout_figures(a, hw_rt, job.tp, job.pp, s)
        lat += rt.per_step_s  # one graph launch and the engine's host time per step (0 under eager)
        tokens = b * (1 if phase == "decode" else s)
        pt = SweepPoint(b, s, phase, where, dtype, lat, None, None, None, b / lat if lat else 0.0,
                        tokens / lat if lat else 0.0, _bound_mix(a),
                        a.predicted_mfu if job.tp * job.pp == 1 else None, fits, mem_bytes, method)
        if job.measure:  # the prediction (on ``hw``) kept beside the measurement, not mixed into it
            what = f"sweep --measure at batch {b} x seq {s}"
            # in milliseconds, before a build the OOM killer would end
            check_fits(run_bytes(g, build_bytes(dtype)), what)
            with refusal_as_error(what):
                pt = _measure(pt, target, job.repeats, job.rapl_root, hw.name)
        points.append(pt)
    return SeqPoints(tuple(points), captures)


def _layout_figures(a, hw: HardwareSpec, tp: int, pp: int, seq: int) -> tuple[float, bool, float]:
    """(latency s, fits, bytes per device) of analysis ``a`` laid out tp x pp on ``hw``: the analysis itself on one
    device; otherwise opmap.mapping.sharding's layout (one batch through every stage) and its memory per device
    (weights and KV cache split, ``seq`` tokens of context; no activations kept for a backward)."""
    if tp * pp == 1:
        return a.predicted_latency_s, a.memory.fits, a.memory.total_bytes
    from opmap.mapping.sharding import Parallelism, SavedPerBlock, Sharder, sharded_memory

    par = Parallelism(tp=tp, pp=pp, devices=tp * pp)
    sharder = Sharder(a)
    mem = sharded_memory(par, sharder, SavedPerBlock(0.0, 0.0, 0.0, 0.0), a.precision.requested, False, seq)
    return sharder.shard(par, hw).latency_s, mem.fits, mem.total_bytes


def _local_tdp() -> tuple[float, str] | None:
    """(W, how) from the local profile's ``tdp_w`` where ``opmap calibrate`` wrote one and it lists a TDP."""
    from opmap.hardware.local import cache_path
    from opmap.hardware.spec import load_spec_file

    path = cache_path("cpu")
    if not path.exists():
        return None
    try:
        tdp = load_spec_file(path).tdp_w
    except OpmapError:
        return None
    if tdp is None:
        return None
    return tdp, f"the local profile's TDP {tdp:g} W x busy fraction 1 over the timed loop (an upper bound)"


def _measure(pt: SweepPoint, target: str, repeats: int, rapl_root: Path, predicted_on: str) -> SweepPoint:
    """The point ``pt`` (predicted on ``predicted_on``) built on the local CPU in its dtype and timed: ``repeats``
    runs after two warm-ups, the energy counter read before and after the timed runs; its prediction kept beside the
    measurement (``predicted``), not mixed into it."""
    phase, batch, seq, dtype = pt.phase, pt.batch, pt.seq, pt.dtype
    import torch

    from opmap.measure.energy import energy_figures, measure_energy
    from opmap.timing import time_iterations

    w = _workload(target, phase, batch, seq, dtype, "append", device="cpu")  # eager transformers' own cache
    m = w.module.eval()

    def call():
        with torch.inference_mode():
            return m(**w.inputs) if isinstance(w.inputs, dict) else m(*w.inputs)

    dev = torch.device("cpu")
    time_iterations(call, dev, 2)
    timed: dict[str, Any] = {}

    def loop() -> float:
        t0 = time.perf_counter()
        timed["st"] = time_iterations(call, dev, repeats)
        return time.perf_counter() - t0

    _, reading = measure_energy(loop, "cpu", rapl_root)
    st = timed["st"]
    tokens = batch * (1 if phase == "decode" else seq)
    modelled = None if reading.joules is not None else _local_tdp()
    energy = energy_figures(reading, tokens * repeats, modelled)
    if reading.joules is None and modelled is None:
        energy["power_method"] += ("; not modelled either: the local profile lists no tdp_w (opmap calibrate's "
                                   "local.toml; add a sourced tdp_w there to model the draw)")
    return replace(pt, **{k: energy[k] for k in (*ENERGY_KEYS, "power_method")}, latency_s=st.p50_s,
                   latency_p50_s=st.p50_s, latency_p95_s=st.quantile(0.95), latency_p99_s=st.quantile(0.99),
                   throughput_per_s=batch / st.p50_s, tokens_per_s=tokens / st.p50_s,
                   method=f"measured on this CPU ({dtype}, {repeats} runs after 2 warm-ups)", mfu=None, bound_mix={},
                   predicted=Predicted(pt.latency_s, pt.mfu, pt.bound_mix, predicted_on, dtype))


def pareto(points: Sequence[SweepPoint]) -> tuple[BatchSeq, ...]:
    """(batch, seq) of the points no other point beats on both latency and tokens per second."""
    out = []
    for p in points:
        if not any(q is not p and q.latency_s <= p.latency_s and q.tokens_per_s >= p.tokens_per_s
                   and (q.latency_s < p.latency_s or q.tokens_per_s > p.tokens_per_s) for q in points):
            out.append(BatchSeq(p.batch, p.seq))
    return tuple(out)


def knees(points: Sequence[SweepPoint]) -> tuple[BatchSeq, ...]:
    """Per seq, along the batch, (batch, seq) of the point farthest above the chord from the first to the last point
    in normalised (latency, tokens per second); none with fewer than three batches or a straight curve."""
    by_seq: dict[int, list[SweepPoint]] = defaultdict(list)
    for p in points:
        by_seq[p.seq].append(p)
    out = []
    for s, ps in sorted(by_seq.items()):
        ps = sorted(ps, key=lambda p: p.batch)
        if len(ps) < FIT_POINTS:
            continue
        xs = [p.latency_s for p in ps]
        ys = [p.tokens_per_s for p in ps]
        x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
        if x1 == x0 or y1 == y0:
            continue
        nx = [(x - x0) / (x1 - x0) for x in xs]
        ny = [(y - y0) / (y1 - y0) for y in ys]
        # distance above the chord from the first point to the last (normalised)
        ax, ay, bx, by = nx[0], ny[0], nx[-1], ny[-1]
        dist = [((bx - ax) * (y - ay) - (by - ay) * (x - ax)) for x, y in zip(nx, ny)]
        i = max(range(len(ps)), key=lambda k: dist[k])
        if dist[i] > 0:
            out.append(BatchSeq(ps[i].batch, s))
    return tuple(out)
