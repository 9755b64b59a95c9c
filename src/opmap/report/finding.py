"""A closure memo's values: its findings (report.memo for a graph's kernels, report.memo_kinds for the other run
kinds) and its pitfall checks, frozen; memo.json is written from them (report.memo.memo_json)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    """One finding of a memo: what the run shows, the owner layer of its fix, the fix, what it is expected to
    gain, its risk and its rollback boundary. The fields are memo.json's keys, in its order."""

    finding: str  # the finding itself: what the run shows, with its figures
    owner: str  # "ML compiler", "runtime" or "performance modelling"
    fix: str
    expected_gain_s: float | None  # seconds the fix saves by the model; None: not bounded by a time
    expected_gain: str | None  # the gain in words where it is not seconds (x1.3 tokens/s ...); None: none
    risk: str
    rollback: str  # the rollback boundary: the run to compare against, the setting to restore


@dataclass(frozen=True)
class Check:
    """One pitfall check: the pitfall and its verdict ("ok: ..." or "flag: ..." with the evidence)."""

    check: str
    verdict: str
