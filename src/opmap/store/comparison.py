"""The typed result of ``opmap compare`` (store/compare.py makes it, cli/compare.py renders it): frozen values
for a kernel pair, a layer type, a kernel without a partner, the runs' totals and the verdict. Their record
(opmap.record) is the JSON ``opmap compare --json`` prints: each block a nested value declared in its place (a
stable output: key order and values as before the values were typed). Times in s; relative changes as fractions
(0.2: +20%)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from opmap.record import key
from opmap.store.noise import Floor


@dataclass(frozen=True)
class RankTest:
    """A Mann-Whitney U test of two sample series after the warm-up rule: ``p`` two-sided, ``effect`` the change
    of the medians (B over A, minus one), ``n_a`` / ``n_b`` the samples kept a side."""

    p: float
    effect: float
    n_a: int
    n_b: int


@dataclass(frozen=True)
class KernelChange:
    """One matched kernel pair: A's kernel ``a_idx`` against B's ``b_idx``; times, MFU, stall fraction and bytes
    on both sides with their deltas (None where a side lacks the figure); ``test`` None without samples."""

    a_idx: int
    b_idx: int
    name: str
    layer_type: str | None
    a_s: float
    b_s: float
    delta_s: float
    rel: float | None
    measured: bool
    mfu_a: float | None
    mfu_b: float | None
    mfu_delta: float | None
    stall_a: float | None
    stall_b: float | None
    stall_delta: float | None
    bytes_a: float | None
    bytes_b: float | None
    bytes_delta: float | None
    test: RankTest | None = field(metadata=key(flatten=True, omit="none"))  # its figures beside the pair's
    matched_by: str
    verdict: str = ""  # set once the family is tested (Benjamini-Hochberg over every pair)

    @property
    def p(self) -> float | None:
        """The rank test's p-value (None: not tested)."""
        return self.test.p if self.test else None


@dataclass(frozen=True)
class Unmatched:
    """A kernel without a partner on the other side (``side`` "a" or "b"), with its time."""

    side: str
    idx: int
    name: str
    layer_type: str | None
    time_s: float


@dataclass(frozen=True)
class LayerTypeChange:
    """A layer type: its kernels' times summed on each side, matched (``kernels`` pairs) or not (``only_a`` /
    ``only_b``), the store's MFU / stall / bytes deltas, and the rank test on the per-iteration sums (its figures
    written beside the row's)."""

    layer_type: str
    kernels: int
    only_a: int
    only_b: int
    a_s: float
    b_s: float
    delta_s: float
    rel: float | None
    measured: bool
    mfu_delta: float | None
    stall_delta: float | None
    bytes_delta: float | None
    test: RankTest | None = field(metadata=key(flatten=True, omit="none"))
    verdict: str = ""

    @property
    def p(self) -> float | None:
        """The rank test's p-value (None: not tested)."""
        return self.test.p if self.test else None


@dataclass(frozen=True)
class Unpartnered:
    """One side's kernels without a partner: how many, and their time (s)."""

    kernels: int
    time_s: float


@dataclass(frozen=True)
class Totals:
    """Each run's total over every one of its kernels: the matched part plus the kernels without a partner
    (``only_a`` in A; likewise B); ``rel`` B over A minus one. Recorded with each side's total after its own
    kernels without a partner."""

    RECORD: ClassVar[tuple[str, ...]] = ("matched_a_s", "matched_b_s", "only_a", "a_s", "only_b", "b_s", "rel")
    matched_a_s: float
    matched_b_s: float
    only_a: Unpartnered
    only_b: Unpartnered

    @property
    def a_s(self) -> float:
        return self.matched_a_s + self.only_a.time_s

    @property
    def b_s(self) -> float:
        return self.matched_b_s + self.only_b.time_s

    @property
    def rel(self) -> float | None:
        return self.b_s / self.a_s - 1 if self.a_s else None


@dataclass(frozen=True)
class Noise:
    """The run verdict's noise block: the floor between runs (``measured`` false: not measured, ``noise`` None),
    the minimum effect it set, and the runs on each side."""

    noise: float | None
    measured: bool
    n_a: int
    n_b: int
    sd_log: float | None
    dof: int
    t: float | None
    rule: str
    minimum_effect: str
    runs_a: tuple[str, ...]
    runs_b: tuple[str, ...]


@dataclass(frozen=True)
class RunTest:
    """The run-level Mann-Whitney U test on the two sides' latency samples (``u`` of side A, two-sided ``p``),
    recorded with its name first."""

    RECORD: ClassVar[tuple[Any, ...]] = ("name", ...)
    u: float
    p: float
    n_a: int
    n_b: int
    name: str = "Mann-Whitney U (two-sided, normal approximation, tie and continuity corrected)"


@dataclass(frozen=True)
class Warmup:
    """The warm-up rule applied to each run's latency samples, and the leading samples it dropped per run."""

    rule: str
    dropped_a: tuple[int, ...]
    dropped_b: tuple[int, ...]


@dataclass(frozen=True)
class Evidence:
    """What a tested verdict rests on: the minimum effect used, the ``noise`` block, the warm-up and the host."""

    min_effect_used: float
    noise: Noise
    warmup: Warmup
    host: str | None


@dataclass(frozen=True)
class Verdict:
    """The run's verdict: ``verdict`` (regression, improvement, no significant change, inconclusive, predicted
    change, no change) and its ``line``; ``effect`` the run's relative change. With latency samples on both sides:
    the ``test`` and its ``evidence``; without: ``test`` None and a ``note``. Recorded in the comparison's place
    (flattened): test, effect, verdict, verdict_line, then the note or the evidence."""

    RECORD: ClassVar[tuple[str, ...]] = ("test", "effect", "verdict", "line", "note", "evidence")
    verdict: str
    line: str = field(metadata=key("verdict_line"))
    effect: float
    test: RunTest | None = None
    note: str | None = field(default=None, metadata=key(omit="none"))
    evidence: Evidence | None = field(default=None, metadata=key(flatten=True, omit="none"))


@dataclass(frozen=True)
class Comparison:
    """Run B against run A (store/compare.py ``compare``): the kernel pairs largest absolute change first, the
    kernels without a partner, the totals, the layer types largest absolute change first, and the verdict. Its
    record is the JSON ``opmap compare --json`` prints: the kernel pairs' and layer types' rows with their rank
    test's figures beside them where tested, the layer types keyed by name, the verdict's keys in its place."""

    a: str
    b: str
    forced_tags: tuple[str, ...]
    matched_by: tuple[tuple[str, int], ...] = field(metadata=key(mapping=True))  # (how, kernels) sorted by how
    times: str  # "measured" or "predicted"
    kernels: tuple[KernelChange, ...]
    unmatched: tuple[Unmatched, ...]
    totals: Totals
    layer_types: tuple[LayerTypeChange, ...] = field(metadata=key(mapping="layer_type"))
    min_effect: float
    alpha: float
    per_kernel_test: str
    kernel_floor: Floor
    warmup_rule: str
    verdict: Verdict = field(metadata=key(flatten=True))

    @property
    def regressed(self) -> bool:
        return self.verdict.verdict == "regression"
