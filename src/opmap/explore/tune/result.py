"""What ``opmap tune`` measures, as typed values: a timed candidate's figures (Timing), one row per candidate
(CandidateRow), one signature's outcome (SignatureResult, also the cache entry), the whole model default vs tuned
(WholeModel) and the run (TuneResult, tune.json).

Callers read them by attribute; each ``to_dict`` writes a file's part with a fixed key order (the order tune.json
had on a fresh run), so a run that read its entries from the cache writes the same layout as one that tuned them.
``from_dict`` reads a cache file's part back; a missing or mistyped field raises KeyError / TypeError /
ValueError, which cache.py turns into a miss.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opmap.explore.tune.candidates import Candidate
from opmap.explore.tune.signatures import Signature
from opmap.timing import Sample

TAU_PAIRS = "candidates of one signature compared with each other, pooled over signatures (tau-b)"
NOTE = "timed on a shared machine: medians with their spread (min, max, IQR) per candidate"


def _num(x: object) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"not a number: {x!r}")
    return float(x)


def _opt_num(x: object) -> float | None:
    return None if x is None else _num(x)


@dataclass(frozen=True)
class Timing:
    """A timed callable's median and spread, seconds (opmap.timing.Sample); ``samples_s`` kept where asked."""

    measured_s: float  # the median
    min_s: float
    max_s: float
    iqr_s: float
    samples: int
    samples_s: tuple[float, ...] = ()  # every sample, where written (the whole model's)

    @staticmethod
    def of(s: Sample, keep_samples: bool = False) -> Timing:
        sp = s.spread()
        return Timing(s.median_s, sp["min_s"], sp["max_s"], sp["iqr_s"], int(sp["samples"]),
                      tuple(s.times_s) if keep_samples else ())

    def to_dict(self) -> dict[str, float | list[float]]:
        d: dict[str, float | list[float]] = {"measured_s": self.measured_s, "min_s": self.min_s,
                                             "max_s": self.max_s, "iqr_s": self.iqr_s, "samples": self.samples}
        if self.samples_s:
            d["samples_s"] = list(self.samples_s)
        return d

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Timing:
        return Timing(_num(d["measured_s"]), _num(d["min_s"]), _num(d["max_s"]), _num(d["iqr_s"]),
                      int(d["samples"]), tuple(_num(x) for x in d.get("samples_s", ())))


@dataclass(frozen=True)
class CandidateRow:
    """One candidate of a signature: its prediction, rank, and (where timed) its measured figures."""

    candidate: Candidate
    predicted_s: float
    predicted_rank: int  # 1 = fastest predicted
    timed: bool
    default: bool  # the mapping eager PyTorch runs
    changes_precision: bool  # computes in another format than the signature's
    timing: Timing | None = None  # where timed

    @property
    def label(self) -> str:
        return self.candidate.label

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> CandidateRow:
        timing = Timing.from_dict(d) if "measured_s" in d else None
        return CandidateRow(Candidate.from_dict(d), _num(d["predicted_s"]), int(d["predicted_rank"]),
                            bool(d["timed"]), bool(d["default"]), bool(d["changes_precision"]), timing)


@dataclass(frozen=True)
class SignatureResult:
    """One signature's tuning outcome (run.tune_signature); the cache entry is this without ``cached``."""

    signature: Signature
    candidates: tuple[CandidateRow, ...]  # by predicted rank
    chosen: Candidate
    default: Candidate
    default_s: float  # measured medians
    chosen_s: float
    gain: float  # default_s / chosen_s
    kept_default_because: str  # "" unless a lead within the noise kept the default
    predicted_chosen_s: float
    predicted_default_s: float
    parallel_region_s: float  # the fork / join cost the ranking charged
    parallel_region_probe_s: float | None  # this signature's probe of it
    chosen_alone: Candidate | None = None  # set where the whole model rejected the choice (run._keep_defaults)
    cached: bool = False  # read from the cache this run

    def to_dict(self, with_cached: bool = True) -> dict[str, Any]:
        """tune.json's entry (``with_cached``) or the cache file's body (without)."""
        rows = [{**r.candidate.to_dict(), "predicted_s": r.predicted_s, "predicted_rank": r.predicted_rank,
                 "timed": r.timed, "default": r.default, "changes_precision": r.changes_precision,
                 **(r.timing.to_dict() if r.timing is not None else {})} for r in self.candidates]
        d: dict[str, Any] = {
            "signature": self.signature.to_dict(), "candidates": rows, "chosen": self.chosen.to_dict(),
            "default": self.default.to_dict(), "default_s": self.default_s, "chosen_s": self.chosen_s,
            "gain": self.gain, "kept_default_because": self.kept_default_because,
            "predicted_chosen_s": self.predicted_chosen_s, "predicted_default_s": self.predicted_default_s,
            "parallel_region_s": self.parallel_region_s, "parallel_region_probe_s": self.parallel_region_probe_s}
        if self.chosen_alone is not None:
            d["chosen_alone"] = self.chosen_alone.to_dict()
        if with_cached:
            d["cached"] = self.cached
        return d

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> SignatureResult:
        s = d["signature"]
        sig = Signature(str(s["family"]), tuple(int(x) for x in s["shape"]), str(s["dtype"]), str(s["layout"]),
                        tuple(str(m) for m in s.get("modules", ())), int(s.get("count", 1)))
        alone = d.get("chosen_alone")
        return SignatureResult(
            sig, tuple(CandidateRow.from_dict(r) for r in d["candidates"]), Candidate.from_dict(d["chosen"]),
            Candidate.from_dict(d["default"]), _num(d["default_s"]), _num(d["chosen_s"]), _num(d["gain"]),
            str(d["kept_default_because"]), _num(d["predicted_chosen_s"]), _num(d["predicted_default_s"]),
            _num(d["parallel_region_s"]), _opt_num(d["parallel_region_probe_s"]),
            Candidate.from_dict(alone) if alone is not None else None)


@dataclass(frozen=True)
class WholeModel:
    """The model as built and with the choices applied, timed interleaved (seconds per forward)."""

    default: Timing  # with its samples
    tuned: Timing
    gain: float  # default median / tuned median
    spread_s: float  # the larger IQR of the two
    tuned_within_spread: bool
    applied: int  # choices that differ from their default
    not_applied: tuple[str, ...]  # one note per choice that could not be put on the model
    adopted: bool | None = None  # set once the run decided (the cache entry always has it)
    cached: bool = False

    def to_dict(self, with_cached: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {"default": self.default.to_dict(), "tuned": self.tuned.to_dict(), "gain": self.gain,
                             "spread_s": self.spread_s, "tuned_within_spread": self.tuned_within_spread,
                             "applied": self.applied, "not_applied": list(self.not_applied)}
        if self.adopted is not None:
            d["adopted"] = self.adopted
        if with_cached:
            d["cached"] = self.cached
        return d

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> WholeModel:
        adopted = d.get("adopted")
        return WholeModel(Timing.from_dict(d["default"]), Timing.from_dict(d["tuned"]), _num(d["gain"]),
                          _num(d["spread_s"]), bool(d["tuned_within_spread"]), int(d["applied"]),
                          tuple(str(n) for n in d["not_applied"]), None if adopted is None else bool(adopted))


@dataclass(frozen=True)
class TuneAxes:
    """The candidate axes of the run (what was enumerated) and those left out, with why."""

    threads: tuple[int, ...]
    dtypes: tuple[str, ...]
    sdpa_backends: tuple[str, ...]
    chunks: tuple[int, ...]
    left_out: Mapping[str, str]
    channels_last: str = "conv and batch norm signatures"


@dataclass(frozen=True)
class TuneResult:
    """One ``opmap tune`` run on a CPU: tune.json (``to_dict()``) and the run store's payload
    (``to_dict(store=True)``)."""

    schema_version: int
    model: str
    hardware: str
    dtype: str
    threads: int
    top_k: int
    rounds: int
    fingerprint: Mapping[str, Any]  # calibrate.fingerprint's device description
    versions: Mapping[str, str]  # cache.versions()
    axes: TuneAxes
    parallel_calibrated: Mapping[str, Any]  # the profile's parallel-region figures
    parallel_now: Mapping[str, float]  # calibrate.run.parallel_overhead at the start of the run
    signatures: tuple[SignatureResult, ...]
    kendall_tau: float | None
    kendall_tau_resolved: float | None  # ties within the noise not counted
    cache_dir: str
    hits: int
    whole_model: WholeModel
    elapsed_s: float
    device: str = field(default="cpu")

    @property
    def misses(self) -> int:
        return len(self.signatures) - self.hits

    def to_dict(self, store: bool = False) -> dict[str, Any]:
        """tune.json; with ``store``, as the run store takes it: beside the document, one kernel row per timed
        candidate (name: the signature and mapping; predicted and measured seconds; layer type: the family) and
        the whole-model samples (metrics ``whole_model:default`` / ``whole_model:tuned``)."""
        ax = self.axes
        d: dict[str, Any] = {
            "schema_version": self.schema_version, "model": self.model, "hardware": self.hardware,
            "dtype": self.dtype, "device": self.device, "threads": self.threads, "top_k": self.top_k,
            "rounds": self.rounds, "fingerprint": dict(self.fingerprint), "versions": dict(self.versions),
            "axes": {"threads": list(ax.threads), "dtypes": list(ax.dtypes), "sdpa_backends": list(ax.sdpa_backends),
                     "chunks": list(ax.chunks), "channels_last": ax.channels_last, "left_out": dict(ax.left_out)},
            "parallel_region": {"calibrated": dict(self.parallel_calibrated), "now": dict(self.parallel_now)},
            "signatures": [e.to_dict() for e in self.signatures], "kendall_tau": self.kendall_tau,
            "kendall_tau_resolved": self.kendall_tau_resolved, "tau_pairs": TAU_PAIRS,
            "cache": {"dir": self.cache_dir, "hits": self.hits, "misses": self.misses},
            "whole_model": self.whole_model.to_dict(), "elapsed_s": self.elapsed_s, "note": NOTE}
        if not store:
            return d
        rows = [{"op": f"{e.signature.key} {r.label}", "layer_type": e.signature.family,
                 "predicted_s": r.predicted_s, "measured_s": r.timing.measured_s,
                 "bound": "chosen" if r.label == e.chosen.label else ("default" if r.default else "")}
                for e in self.signatures for r in e.candidates if r.timed and r.timing is not None]
        w = self.whole_model
        return {**d, "kind": "tune", "kernels": rows,
                "samples": {"whole_model:default": list(w.default.samples_s),
                            "whole_model:tuned": list(w.tuned.samples_s)}}
