"""A probe run for the capacity search's tests: its SLO holds exactly up to a known capacity (requests/s), so the
search's answer can be worked by hand."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opmap.serve.metrics import Validity


@dataclass(frozen=True)
class Ran:
    """What a probe's run reports to the search (a ServeReport's validity and steady state)."""

    validity: Validity
    steady_state: Any = None


def step_at(capacity: float):
    """A run whose SLO holds exactly up to ``capacity`` requests/s."""
    def run(rate: float) -> Ran:
        ok = rate <= capacity
        return Ran(Validity(ok, "VALID" if ok else "INVALID", f"{rate:g} vs {capacity:g}", "a step at the capacity"))
    return run
