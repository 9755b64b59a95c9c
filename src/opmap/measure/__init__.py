"""Measurement: real runs, profiler attribution to graph nodes, latency distributions, energy counters."""

from opmap.measure.profile import Profile
from opmap.measure.run import run_profile

__all__ = ["Profile", "run_profile"]
