"""What ``opmap tune`` measures, as typed values: a timed candidate's figures (Timing), one row per candidate
(CandidateRow), one signature's outcome (SignatureResult, also the cache entry), the whole model default vs tuned
(WholeModel) and the run (TuneResult, tune.json).

Callers read them by attribute; each one's record (``opmap.record``) is a file's part with a fixed key order (the
order tune.json had on a fresh run: the fields in order, ``RECORD`` where derived blocks join them), so a run that
read its entries from the cache writes the same layout as one that tuned them. ``TuneResult.stored`` is what the run
store takes. ``from_dict`` reads a cache file's part back; a missing or mistyped field raises KeyError / TypeError /
ValueError, which cache.py turns into a miss.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from opmap.explore.tune.candidates import Candidate
from opmap.explore.tune.signatures import Signature
from opmap.record import key
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
    samples_s: tuple[float, ...] = field(default=(), metadata=key(omit="empty"))  # every sample, where kept

    @staticmethod
    def of(s: Sample, keep_samples: bool = False) -> Timing:
        sp = s.spread()
        return Timing(s.median_s, sp["min_s"], sp["max_s"], sp["iqr_s"], int(sp["samples"]),
                      tuple(s.times_s) if keep_samples else ())

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Timing:
        return Timing(_num(d["measured_s"]), _num(d["min_s"]), _num(d["max_s"]), _num(d["iqr_s"]),
                      int(d["samples"]), tuple(_num(x) for x in d.get("samples_s", ())))


@dataclass(frozen=True)
class CandidateRow:
    """One candidate of a signature: its prediction, rank, and (where timed) its measured figures. Its record:
    the candidate's keys, the prediction, the timing's keys where timed."""

    candidate: Candidate = field(metadata=key(flatten=True))
    predicted_s: float
    predicted_rank: int  # 1 = fastest predicted
    timed: bool
    default: bool  # the mapping eager PyTorch runs
    changes_precision: bool  # computes in another format than the signature's
    timing: Timing | None = field(default=None, metadata=key(flatten=True, omit="none"))  # where timed

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
    """One signature's tuning outcome (run.tune_signature): tune.json's entry; the cache entry is its record
    without ``cached`` (cache.write_entry)."""

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
    # set where the whole model rejected the choice (run._keep_defaults)
    chosen_alone: Candidate | None = field(default=None, metadata=key(omit="none"))
    cached: bool = False  # read from the cache this run

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
    """The model as built and with the choices applied, timed interleaved (seconds per forward): tune.json's
    ``whole_model``; the cache entry is its record without ``cached`` (cache.write_whole)."""

    default: Timing  # with its samples
    tuned: Timing
    gain: float  # default median / tuned median
    spread_s: float  # the larger IQR of the two
    tuned_within_spread: bool
    applied: int  # choices that differ from their default
    not_applied: tuple[str, ...]  # one note per choice that could not be put on the model
    # set once the run decided (the cache entry always has it)
    adopted: bool | None = field(default=None, metadata=key(omit="none"))
    cached: bool = False

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> WholeModel:
        adopted = d.get("adopted")
        return WholeModel(Timing.from_dict(d["default"]), Timing.from_dict(d["tuned"]), _num(d["gain"]),
                          _num(d["spread_s"]), bool(d["tuned_within_spread"]), int(d["applied"]),
                          tuple(str(n) for n in d["not_applied"]), None if adopted is None else bool(adopted))


@dataclass(frozen=True)
class TuneAxes:
    """The candidate axes of the run (what was enumerated) and those left out, with why: tune.json's ``axes``."""

    RECORD: ClassVar[tuple[str, ...]] = ("threads", "dtypes", "sdpa_backends", "chunks", "channels_last", "left_out")
    threads: tuple[int, ...]
    dtypes: tuple[str, ...]
    sdpa_backends: tuple[str, ...]
    chunks: tuple[int, ...]
    left_out: dict[str, str]
    channels_last: str = "conv and batch norm signatures"


@dataclass(frozen=True)
class ParallelRegion:
    """The fork / join cost of a parallel region: the profile's calibrated figures and the run's own probe."""

    calibrated: dict[str, Any]
    now: dict[str, float]


@dataclass(frozen=True)
class CacheUse:
    """Where the run's cache is and how many signatures it answered: tune.json's ``cache``."""

    dir: str
    hits: int
    misses: int


@dataclass(frozen=True)
class TuneResult:
    """One ``opmap tune`` run on a CPU: its record is tune.json (``RECORD``); ``stored`` is the run store's
    payload."""

    RECORD: ClassVar[tuple[str, ...]] = (
        "schema_version", "model", "hardware", "dtype", "device", "threads", "top_k", "rounds", "fingerprint",
        "versions", "axes", "parallel_region", "signatures", "kendall_tau", "kendall_tau_resolved", "tau_pairs",
        "cache", "whole_model", "elapsed_s", "note")
    tau_pairs: ClassVar[str] = TAU_PAIRS
    note: ClassVar[str] = NOTE
    schema_version: int
    model: str
    hardware: str
    dtype: str
    threads: int
    top_k: int
    rounds: int
    fingerprint: dict[str, Any]  # calibrate.fingerprint's device description
    versions: dict[str, str]  # cache.versions()
    axes: TuneAxes
    parallel_calibrated: dict[str, Any]  # the profile's parallel-region figures
    parallel_now: dict[str, float]  # calibrate.run.parallel_overhead at the start of the run
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

    @property
    def parallel_region(self) -> ParallelRegion:
        return ParallelRegion(self.parallel_calibrated, self.parallel_now)

    @property
    def cache(self) -> CacheUse:
        return CacheUse(self.cache_dir, self.hits, self.misses)

    @property
    def stored(self) -> TuneStored:
        return TuneStored(self)


@dataclass(frozen=True)
class TunedKernel:
    """A timed candidate as the run store's kernel row: the signature and mapping, predicted and measured
    seconds, the family as the layer type, whether it is the chosen or the default mapping."""

    op: str
    layer_type: str
    predicted_s: float
    measured_s: float
    bound: str  # "chosen" | "default" | ""


@dataclass(frozen=True)
class WholeModelSamples:
    """The whole model's samples, as the run store's metrics ``whole_model:default`` / ``whole_model:tuned``."""

    default: tuple[float, ...] = field(metadata=key("whole_model:default"))
    tuned: tuple[float, ...] = field(metadata=key("whole_model:tuned"))


@dataclass(frozen=True)
class TuneStored:
    """What the run store takes of a tune run: tune.json, and beside it one kernel row per timed candidate and the
    whole-model samples."""

    RECORD: ClassVar[tuple[str, ...]] = ("result", "kind", "kernels", "samples")
    kind: ClassVar[str] = "tune"
    result: TuneResult = field(metadata=key(flatten=True))

    @property
    def kernels(self) -> tuple[TunedKernel, ...]:
        return tuple(TunedKernel(f"{e.signature.key} {r.label}", e.signature.family, r.predicted_s,
                                 r.timing.measured_s,
                                 "chosen" if r.label == e.chosen.label else ("default" if r.default else ""))
                     for e in self.result.signatures for r in e.candidates if r.timed and r.timing is not None)

    @property
    def samples(self) -> WholeModelSamples:
        w = self.result.whole_model
        return WholeModelSamples(w.default.samples_s, w.tuned.samples_s)
