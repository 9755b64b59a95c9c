"""Shared fixtures: small zoo captures on the meta device (no weights allocated)."""

from __future__ import annotations

import functools

import pytest

from opmap.analyze import analyze
from opmap.hardware import get_hardware
from opmap.workloads import build_zoo


@functools.cache
def analysis(name: str, batch: int, seq: int, dtype: str = "fp32", hw: str = "h100-sxm"):
    return analyze(build_zoo(name, batch, seq, dtype), get_hardware(hw), dtype)


@pytest.fixture
def analysis_of():
    return analysis
