"""Shared fixtures: small zoo captures on the meta device (no weights allocated).

The capture cache stays off in tests (a user's cache must not answer for the code under test);
tests/capture/test_cache.py turns it on in a temporary folder."""

from __future__ import annotations

import functools
import os
import tempfile

import pytest

os.environ["OPMAP_GRAPH_CACHE"] = "0"
# the run store of the whole test session lives in a temporary folder, never in the user's data directory
os.environ["OPMAP_STORE"] = os.path.join(tempfile.mkdtemp(prefix="opmap-store-"), "runs.duckdb")

from opmap.analyze import analyze
from opmap.hardware import get_hardware
from opmap.workloads import build_zoo


@functools.cache
def analysis(name: str, batch: int, seq: int, dtype: str = "fp32", hw: str = "h100-sxm"):
    return analyze(build_zoo(name, batch, seq, dtype), get_hardware(hw), dtype)


@pytest.fixture
def analysis_of():
    return analysis
