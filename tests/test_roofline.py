"""The one time model: max of the busy terms plus overhead; bound and limiter from the largest term."""

from __future__ import annotations

import pytest

from opmap.roofline import Bound, Limiter, no_kernel, roofline, stall_split, uncounted


def test_time_is_the_largest_busy_term_plus_overhead():
    r = roofline(matrix_s=3e-6, vector_s=1e-6, memory_s=2e-6, overhead_s=1e-6)
    assert r.predicted_s == pytest.approx(4e-6)
    assert (r.bound, r.limiter) == (Bound.COMPUTE, Limiter.MATRIX)
    r = roofline(matrix_s=1e-6, vector_s=2e-6, memory_s=5e-6, overhead_s=1e-6)
    assert (r.bound, r.limiter, r.predicted_s) == (Bound.MEMORY, Limiter.MEMORY, pytest.approx(6e-6))
    r = roofline(vector_s=4e-6, memory_s=1e-6)
    assert (r.bound, r.limiter) == (Bound.COMPUTE, Limiter.VECTOR)


def test_overhead_and_interconnect_bounds():
    r = roofline(matrix_s=1e-6, memory_s=2e-6, overhead_s=5e-6)
    assert (r.bound, r.limiter, r.predicted_s) == (Bound.OVERHEAD, Limiter.OVERHEAD, pytest.approx(7e-6))
    r = roofline(matrix_s=1e-3, memory_s=2e-3, interconnect_s=3e-3, overhead_s=1e-5)
    assert (r.bound, r.limiter, r.predicted_s) == (Bound.INTERCONNECT, Limiter.INTERCONNECT, pytest.approx(3.01e-3))


def test_ties_go_to_the_earlier_term_and_values_serialise_as_strings():
    import json

    r = roofline(matrix_s=1.0, vector_s=1.0, memory_s=1.0)
    assert r.limiter == Limiter.MATRIX
    assert json.loads(json.dumps(r.to_dict()))["bound"] == "compute"
    assert f"{Bound.MEMORY}" == "memory"


def test_no_kernel_and_uncounted():
    v = no_kernel(Bound.VIEW, 1e-6)
    assert (v.predicted_s, v.limiter) == (1e-6, Limiter.NONE)
    u = uncounted(4e-6)
    assert (u.bound, u.predicted_s) == (Bound.UNCOUNTED, 4e-6)


def test_stall_split_by_hand():
    r = roofline(matrix_s=2e-6, vector_s=1e-6, memory_s=5e-6)
    # measured 10 us: 3 us compute-busy, memory explains 5 - 3 = 2 us more, 5 us other
    assert stall_split(10e-6, r) == pytest.approx((3e-6, 2e-6, 5e-6))
    # measured faster than the compute terms: all compute-busy
    assert stall_split(2e-6, r) == pytest.approx((2e-6, 0.0, 0.0))


def test_serial_memory_time_adds_after_the_overlap():
    # a CPU op computing for 10 ms whose fresh output faults in for 8 ms: the faults stall the thread, 18 ms
    r = roofline(matrix_s=10e-3, memory_s=5e-3 + 8e-3, serial_memory_s=8e-3)
    assert r.predicted_s == pytest.approx(18e-3) and r.limiter == Limiter.MEMORY
    # memory-bound already: the faults are inside the memory term, counted once
    r = roofline(matrix_s=1e-3, memory_s=20e-3 + 8e-3, serial_memory_s=8e-3)
    assert r.predicted_s == pytest.approx(28e-3)
    assert roofline(matrix_s=10e-3, memory_s=5e-3).predicted_s == pytest.approx(10e-3)
