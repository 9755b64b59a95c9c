"""The typed result of ``opmap compare`` (store/compare.py makes it, cli/compare.py renders it): frozen values
for a kernel pair, a layer type, a kernel without a partner, the runs' totals and the verdict, with ``to_dict``
on the whole comparison only, the JSON ``opmap compare --json`` prints (key order and values as before the
values were typed: the JSON is a stable output). Times in s; relative changes as fractions (0.2: +20%)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opmap.record import record
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
    test: RankTest | None
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
    ``only_b``), the store's MFU / stall / bytes deltas, and the rank test on the per-iteration sums."""

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
    test: RankTest | None
    verdict: str = ""

    @property
    def p(self) -> float | None:
        """The rank test's p-value (None: not tested)."""
        return self.test.p if self.test else None


@dataclass(frozen=True)
class Totals:
    """Each run's total over every one of its kernels: the matched part plus the kernels without a partner
    (``only_a_kernels`` of them in A, taking ``only_a_s``; likewise B); ``rel`` B over A minus one."""

    matched_a_s: float
    matched_b_s: float
    only_a_kernels: int
    only_a_s: float
    only_b_kernels: int
    only_b_s: float

    @property
    def a_s(self) -> float:
        return self.matched_a_s + self.only_a_s

    @property
    def b_s(self) -> float:
        return self.matched_b_s + self.only_b_s

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
    """The run-level Mann-Whitney U test on the two sides' latency samples (``u`` of side A, two-sided ``p``)."""

    u: float
    p: float
    n_a: int
    n_b: int
    name: str = "Mann-Whitney U (two-sided, normal approximation, tie and continuity corrected)"


@dataclass(frozen=True)
class Verdict:
    """The run's verdict: ``verdict`` (regression, improvement, no significant change, inconclusive, predicted
    change, no change) and its ``line``; ``effect`` the run's relative change. With latency samples on both sides:
    the ``test``, the minimum effect used, the ``noise`` block, the warm-up samples dropped per run and the host;
    without: ``test`` None and a ``note``."""

    verdict: str
    line: str
    effect: float
    test: RunTest | None = None
    note: str | None = None
    min_effect_used: float | None = None
    noise: Noise | None = None
    warmup_rule: str | None = None
    dropped_a: tuple[int, ...] = ()
    dropped_b: tuple[int, ...] = ()
    host: str | None = None


@dataclass(frozen=True)
class Comparison:
    """Run B against run A (store/compare.py ``compare``): the kernel pairs largest absolute change first, the
    kernels without a partner, the totals, the layer types largest absolute change first, and the verdict."""

    a: str
    b: str
    forced_tags: tuple[str, ...]
    matched_by: tuple[tuple[str, int], ...]  # (how, kernels) sorted by how
    times: str  # "measured" or "predicted"
    kernels: tuple[KernelChange, ...]
    unmatched: tuple[Unmatched, ...]
    totals: Totals
    layer_types: tuple[LayerTypeChange, ...]
    min_effect: float
    alpha: float
    per_kernel_test: str
    kernel_floor: Floor
    warmup_rule: str
    verdict: Verdict

    @property
    def regressed(self) -> bool:
        return self.verdict.verdict == "regression"

    def to_dict(self) -> dict[str, Any]:
        """The comparison as ``opmap compare --json`` prints it (the kernel pairs' and layer types' rows with their
        rank test's figures beside them, where tested).
        A computed shape: kernel pairs, layer types and the verdict's test or noise blocks regrouped."""
        t = self.totals
        kernels = [{"a_idx": k.a_idx, "b_idx": k.b_idx, "name": k.name, "layer_type": k.layer_type, "a_s": k.a_s,
                    "b_s": k.b_s, "delta_s": k.delta_s, "rel": k.rel, "measured": k.measured, "mfu_a": k.mfu_a,
                    "mfu_b": k.mfu_b, "mfu_delta": k.mfu_delta, "stall_a": k.stall_a, "stall_b": k.stall_b,
                    "stall_delta": k.stall_delta, "bytes_a": k.bytes_a, "bytes_b": k.bytes_b,
                    "bytes_delta": k.bytes_delta, **(record(k.test) if k.test else {}), "matched_by": k.matched_by,
                    "verdict": k.verdict} for k in self.kernels]
        layer_types = {lt.layer_type: {"kernels": lt.kernels, "only_a": lt.only_a, "only_b": lt.only_b, "a_s": lt.a_s,
                                       "b_s": lt.b_s, "delta_s": lt.delta_s, "rel": lt.rel, "measured": lt.measured,
                                       "mfu_delta": lt.mfu_delta, "stall_delta": lt.stall_delta,
                                       "bytes_delta": lt.bytes_delta, **(record(lt.test) if lt.test else {}),
                                       "verdict": lt.verdict} for lt in self.layer_types}
        out = {"a": self.a, "b": self.b, "forced_tags": list(self.forced_tags), "matched_by": dict(self.matched_by),
               "times": self.times, "kernels": kernels,
               "unmatched": [{"side": u.side, "idx": u.idx, "name": u.name, "layer_type": u.layer_type,
                              "time_s": u.time_s} for u in self.unmatched],
               "totals": {"matched_a_s": t.matched_a_s, "matched_b_s": t.matched_b_s,
                          "only_a": {"kernels": t.only_a_kernels, "time_s": t.only_a_s}, "a_s": t.a_s,
                          "only_b": {"kernels": t.only_b_kernels, "time_s": t.only_b_s}, "b_s": t.b_s,
                          "rel": t.rel},
               "layer_types": layer_types,
               "min_effect": self.min_effect, "alpha": self.alpha, "per_kernel_test": self.per_kernel_test,
               "kernel_floor": self.kernel_floor.to_dict(), "warmup_rule": self.warmup_rule}
        v = self.verdict
        if v.test is None:
            return {**out, "test": None, "effect": v.effect, "verdict": v.verdict, "verdict_line": v.line,
                    "note": v.note}
        n = v.noise
        return {**out, "test": {"name": v.test.name, "u": v.test.u, "p": v.test.p, "n_a": v.test.n_a,
                                "n_b": v.test.n_b},
                "effect": v.effect, "verdict": v.verdict, "verdict_line": v.line, "min_effect_used": v.min_effect_used,
                "noise": {"noise": n.noise, "measured": n.measured, "n_a": n.n_a, "n_b": n.n_b, "sd_log": n.sd_log,
                          "dof": n.dof, "t": n.t, "rule": n.rule, "minimum_effect": n.minimum_effect,
                          "runs_a": list(n.runs_a), "runs_b": list(n.runs_b)},
                "warmup": {"rule": v.warmup_rule, "dropped_a": list(v.dropped_a), "dropped_b": list(v.dropped_b)},
                "host": v.host}

