"""``tune``: rank each signature's candidates by the cost model, time the top k on the device, keep the winner.

Per signature (signatures.py) of the model's captured plan:

1. enumerate the candidates that run here (candidates.py), re-measure the parallel region's fork / join cost
   (calibrate.run.parallel_overhead: it follows the host's load), predict each (rank.predict_candidate);
2. time the top ``top_k`` by prediction plus the default with opmap.timing.time_interleaved (warm-up, then
   ``rounds`` rounds of one sample each, order rotated: median and spread per candidate);
3. choose the fastest median; a winner whose lead over the default is within the noise (not more than the
   larger interquartile range of the two) is not taken: the default stays, so a choice is never a coin toss;
4. cache the entry (cache.py); a later run with the same device, versions and candidate list reads it.

Then Kendall's tau-b between predicted and measured order, pooled over signatures (rank.kendall_tau), and
the whole model run twice, as built and with every choice applied (apply.py), timed interleaved: the gain
measured, not summed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from opmap.calibrate.run import parallel_overhead
from opmap.explore.tune import cache
from opmap.explore.tune.apply import apply_choices
from opmap.explore.tune.candidates import (
    CHUNKS,
    LEFT_OUT,
    SDPA_BACKENDS,
    Candidate,
    default_candidate,
    enumerate_candidates,
    runnable,
    runs_here,
    thread_counts,
)
from opmap.explore.tune.rank import kendall_tau, predict_candidate
from opmap.explore.tune.result import CandidateRow, SignatureResult, Timing, TuneAxes, TuneResult, WholeModel
from opmap.explore.tune.signatures import Signature, signatures
from opmap.hardware.spec import HardwareSpec
from opmap.timing import Sample, time_interleaved

SCHEMA_VERSION = 1
MAX_TOP_K = 16
Progress = Callable[[str, int, int], None]


def _choose(timed: list[tuple[Candidate, Sample]], default: Candidate) -> tuple[Candidate, str]:
    """The fastest median; the default where the winner's lead is within the larger IQR of the two."""
    best, bs = min(timed, key=lambda cs: cs[1].median_s)
    ds = dict(timed)[default]
    noise = max(bs.spread()["iqr_s"], ds.spread()["iqr_s"])
    if best != default and ds.median_s - bs.median_s <= noise:
        return default, f"{best.label} led by {ds.median_s - bs.median_s:.3g} s, within the spread {noise:.3g} s"
    return best, ""


@dataclass(frozen=True)
class Setup:
    """What one tuning run holds fixed: the device's axes and the timing discipline."""

    threads: int  # intra-op threads now (the default candidate's)
    dtypes: tuple[str, ...]  # formats calibrated and running here
    backends: tuple[str, ...]  # SDPA backends running here
    top_k: int = 3  # candidates timed per signature, by predicted rank (the default is timed besides)
    rounds: int = 5  # interleaved rounds: samples per candidate
    min_time_s: float = 0.005  # each sample at least this long (back-to-back calls)
    parallel_s: float = 0.0  # a parallel region's fork / join cost when the run started (rank.py)
    calibrated_threads: int = 1  # the threads the profile was measured on
    probes: list[float] = field(default_factory=list)  # this run's fork / join probes, seconds (appended)


def tune_signature(sig: Signature, hw: HardwareSpec, st: Setup) -> SignatureResult:
    """One signature's entry: every candidate predicted, the top k and the default timed, the choice."""
    threads, top_k = st.threads, st.top_k
    # the fork / join cost, probed again just before this signature is ranked: on a shared host it follows the
    # other tenants' load (0.09 ms to 23 ms within minutes here). The ranking uses the median of this run's
    # probes so far, so one probe that lands in a calm second does not flip every thread-count ranking
    probe = parallel_overhead(torch.device("cpu"), rounds=3).get("overhead_s")
    if probe is not None:
        st.probes.append(probe)
    par = statistics.median(st.probes) if st.probes else st.parallel_s
    cands = [c for c in enumerate_candidates(sig, threads, st.dtypes, st.backends) if runs_here(sig, c)]
    default = default_candidate(sig, threads)
    pred = {c: predict_candidate(sig, c, hw, st.calibrated_threads, par) for c in cands}
    ranked = sorted(cands, key=lambda c: pred[c])
    timed_c = ranked[:top_k] + ([default] if default not in ranked[:top_k] else [])
    with torch.no_grad():
        samples = time_interleaved([runnable(sig, c) for c in timed_c], torch.device("cpu"), rounds=st.rounds,
                                   min_time_s=st.min_time_s)
    timed = list(zip(timed_c, samples))
    chosen, kept = _choose(timed, default)
    meas = dict(timed)
    rows = tuple(CandidateRow(c, pred[c], i + 1, c in meas, c == default, c.dtype != sig.dtype,
                              Timing.of(meas[c]) if c in meas else None) for i, c in enumerate(ranked))
    d_s, c_s = meas[default].median_s, meas[chosen].median_s
    return SignatureResult(sig, rows, chosen, default, d_s, c_s, d_s / c_s, kept, pred[chosen], pred[default], par,
                           probe)


def _keep_defaults(entries: list[SignatureResult], d, fp: Mapping[str, Any], labels_of, top_k: int,
                   whole: WholeModel) -> list[SignatureResult]:
    """The whole model ran slower with the choices applied than as built, beyond the spread (casts between
    operators of different formats, thread-count switches between kernels: costs no single signature's timing
    sees): the measurement decides, so every signature keeps its default, in tune.json and in the cache that
    ``analyze --tuned`` reads; what each signature alone measured best stays as ``chosen_alone``."""
    out = []
    why = (f"the whole model ran {1 / whole.gain:.3g}x slower with the choices applied (beyond the spread): "
           "defaults kept")
    for e in entries:
        if e.chosen != e.default:
            e = replace(e, chosen_alone=e.chosen, chosen=e.default, chosen_s=e.default_s, gain=1.0,
                        predicted_chosen_s=e.predicted_default_s, kept_default_because=why)
            cache.write_entry(d, cache.entry_key(fp, e.signature.key), e,
                              cache.candidate_hash(labels_of(e.signature), top_k), fp)
        out.append(e)
    return out


def _tau_groups(entries: list[SignatureResult], noise: bool = False) -> list[tuple[list[float], ...]]:
    """Per signature, the timed candidates' (predicted, measured[, IQR]) lists."""
    out = []
    for e in entries:
        rows = [(r.predicted_s, r.timing) for r in e.candidates if r.timed and r.timing is not None]
        g = ([p for p, _ in rows], [t.measured_s for _, t in rows])
        out.append((*g, [t.iqr_s for _, t in rows]) if noise else g)
    return out


def sdpa_backends_here() -> tuple[str, ...]:
    """The SDPA backends that run a small attention on this CPU."""
    sig = Signature("attention", (1, 1, 8, 8, 16, 0), "fp32", "bhsd")
    return tuple(b for b in SDPA_BACKENDS if runs_here(sig, Candidate(1, "fp32", sdpa=b)))


def device_dtypes(hw: HardwareSpec) -> tuple[str, ...]:
    """The formats calibrated on this device (the profile's matrix peaks) that also run here."""
    sig = Signature("gemm", (16, 16, 16, 0), "fp32", "nt")
    return tuple(dt for dt in ("fp32", "bf16", "fp16")
                 if dt in hw.matrix_peak_flops_per_s and runs_here(sig, Candidate(1, dt)))


def whole_model(load: Callable[[], Any], choices: list[tuple[Signature, Candidate, Candidate]], model_dtype: str,
                rounds: int) -> WholeModel:
    """The model as built and with the choices applied, timed interleaved (seconds per forward)."""
    from opmap.precision import torch_dtype

    base, tuned = load(), load()
    notes = apply_choices(tuned.module, choices, torch_dtype(model_dtype))

    def call(w):
        inputs = w.inputs
        if isinstance(inputs, dict):
            return lambda: w.module(**inputs)
        return lambda: w.module(*(inputs if isinstance(inputs, tuple) else (inputs,)))
    base.module.eval()
    tuned.module.eval()
    with torch.no_grad():
        d, t = time_interleaved([call(base), call(tuned)], torch.device("cpu"), rounds=rounds, min_time_s=0.0)
    spread = max(d.spread()["iqr_s"], t.spread()["iqr_s"])
    return WholeModel(Timing.of(d, keep_samples=True), Timing.of(t, keep_samples=True), d.median_s / t.median_s,
                      spread, t.median_s <= d.median_s + spread, sum(1 for s, c, dft in choices if c != dft),
                      tuple(notes))


def check_setup(hw: HardwareSpec, top_k: int) -> None:
    """Refuse, before any work, a top-k out of range or a device profile that is not this CPU's calibration."""
    from opmap.errors import OpmapError

    if not 1 <= top_k <= MAX_TOP_K:
        raise OpmapError(f"--top-k must be an integer from 1 to {MAX_TOP_K} (got {top_k})")
    if hw.device_type != "cpu" or not hw.calibration:
        raise OpmapError(f"tune ranks with this CPU's calibrated rates, not {hw.name}'s: use --hardware local "
                         "(after `opmap calibrate`)")


def tune(model: str, load_meta: Callable[[], Any], load_cpu: Callable[[], Any], hw: HardwareSpec,
         dtype: str = "fp32", top_k: int = 3, rounds: int = 5, min_time_s: float = 0.005,
         use_cache: bool = True, progress: Progress | None = None,
         cache_dir=None) -> TuneResult:
    """Tune every signature of ``model`` (see the module docstring); tune.json is its record (opmap.record)."""
    from opmap.calibrate.fingerprint import fingerprint
    from opmap.capture import capture

    check_setup(hw, top_k)
    progress = progress or (lambda *_: None)
    t0 = time.perf_counter()
    w = load_meta()
    sigs = signatures(capture(w.module, w.inputs))
    par_cal, par_now = (hw.calibration or {}).get("parallel", {}), parallel_overhead(torch.device("cpu"))
    threads = torch.get_num_threads()
    st = Setup(threads, device_dtypes(hw), sdpa_backends_here(), top_k, rounds, min_time_s,
               par_now.get("overhead_s", 0.0),
               int((hw.calibration or {}).get("fingerprint", {}).get("threads", threads)),
               [par_now["overhead_s"]] if "overhead_s" in par_now else [])
    fp = fingerprint(torch.device("cpu"))
    d = cache_dir or cache.cache_dir()
    entries: list[SignatureResult] = []
    hits = 0

    def labels_of(sig: Signature) -> list[str]:
        return [c.label for c in enumerate_candidates(sig, threads, st.dtypes, st.backends)]

    for i, sig in enumerate(sigs):
        progress(f"tuning {sig.key}", i, len(sigs))
        key, chash = cache.entry_key(fp, sig.key), cache.candidate_hash(labels_of(sig), top_k)
        hit = cache.read_entry(d, key, chash) if use_cache else None
        if hit is not None:
            entries.append(replace(hit, signature=sig, cached=True))
            hits += 1
            continue
        e = tune_signature(sig, hw, st)
        cache.write_entry(d, key, e, chash, fp)
        entries.append(e)
    progress("whole model: default vs tuned", len(sigs), len(sigs))
    whole, entries = _whole(model, dtype, rounds, load_cpu, sigs, entries, use_cache and hits == len(sigs), d, fp,
                            labels_of, top_k)
    return TuneResult(SCHEMA_VERSION, model, hw.name, dtype, threads, top_k, rounds, fp, cache.versions(),
                      TuneAxes(thread_counts(threads), st.dtypes, st.backends, CHUNKS, LEFT_OUT), par_cal, par_now,
                      tuple(entries), kendall_tau(_tau_groups(entries)),
                      # the same over the pairs the measurement can order: a measured difference within the larger
                      # IQR of the two is a tie (a shared host's noise decides those pairs, not the model)
                      kendall_tau(_tau_groups(entries, noise=True)), str(d), hits, whole,
                      time.perf_counter() - t0)


def _whole(model: str, dtype: str, rounds: int, load_cpu: Callable[[], Any], sigs: list[Signature],
           entries: list[SignatureResult], all_cached: bool, d, fp: Mapping[str, Any], labels_of,
           top_k: int) -> tuple[WholeModel, list[SignatureResult]]:
    """The whole model default vs tuned: read from the cache where every signature was a hit and the same choices
    were measured before, else timed (and the defaults kept where the choices made it slower)."""
    def whole_key(chosen: list[Candidate]) -> str:
        return cache.entry_key(fp, "whole:" + cache.candidate_hash(
            [model, dtype, *(f"{s.key}={c.label}" for s, c in zip(sigs, chosen))], rounds))

    choices = [(s, e.chosen, e.default) for s, e in zip(sigs, entries)]
    wkey = whole_key([c for _, c, _ in choices])
    cached_whole = cache.read_whole(d, wkey) if all_cached else None
    if cached_whole is not None:
        return replace(cached_whole, cached=True), entries
    whole = whole_model(load_cpu, choices, dtype, rounds)
    if not whole.tuned_within_spread:  # the choices did not carry over to the whole model: defaults stand
        entries = _keep_defaults(entries, d, fp, labels_of, top_k, whole)
        # the cache now holds the defaults as the choices: the next run keys its whole-model entry by them
        wkey = whole_key([e.chosen for e in entries])
    whole = replace(whole, adopted=whole.tuned_within_spread)
    cache.write_whole(d, wkey, whole)
    return whole, entries
