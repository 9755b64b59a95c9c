"""The one time model: terms in; time, bound and limiter out.

A kernel (or a node run as one) keeps several units busy at once: the matrix engine, the vector units, the
memory system and, for collectives, the interconnect. Each term is the time that unit alone would need::

    time  = max(matrix_s, vector_s, memory_s, interconnect_s) + overhead_s

(the busy units overlap; the launch / dispatch overhead does not). The ``limiter`` is the largest term (or
``overhead`` where the overhead exceeds them all); the ``bound`` is its class: ``compute`` for the matrix
or vector units, else the limiter itself. Ties go to the earlier term in that order.

Prediction (predict.py, per node), the kernel rows (mapping/kernels.py, per fused kernel with its tiles)
and the measured stall split (measure/, ``stall_split``) all read time through this module, so a new term
(the interconnect of sharded plans) is added here once.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Bound(StrEnum):
    """The bottleneck class of a kernel or node."""

    COMPUTE = "compute"
    MEMORY = "memory"
    INTERCONNECT = "interconnect"
    OVERHEAD = "overhead"
    VIEW = "view"  # no kernel: a view (host dispatch only)
    ALLOC = "alloc"  # no kernel: an allocation
    UNCOUNTED = "uncounted"  # no cost rule: launch overhead only, listed by name


class Limiter(StrEnum):
    """The term behind the bound."""

    MATRIX = "matrix"
    VECTOR = "vector"
    MEMORY = "memory"
    INTERCONNECT = "interconnect"
    OVERHEAD = "overhead"
    NONE = "none"


@dataclass(frozen=True)
class Roofline:
    """A time with its terms, bound and limiter. Seconds throughout."""

    matrix_s: float
    vector_s: float
    memory_s: float
    overhead_s: float
    predicted_s: float
    bound: Bound
    limiter: Limiter
    interconnect_s: float = 0.0

    def terms(self) -> dict[str, float]:
        """The busy terms by limiter name, in tie-break order."""
        return {"matrix": self.matrix_s, "vector": self.vector_s, "memory": self.memory_s,
                "interconnect": self.interconnect_s}

    def to_dict(self) -> dict[str, float | str]:
        return {"matrix_s": self.matrix_s, "vector_s": self.vector_s, "memory_s": self.memory_s,
                "overhead_s": self.overhead_s, "predicted_s": self.predicted_s, "bound": self.bound,
                "limiter": self.limiter}


def roofline(matrix_s: float = 0.0, vector_s: float = 0.0, memory_s: float = 0.0, overhead_s: float = 0.0,
             interconnect_s: float = 0.0, serial_memory_s: float = 0.0, exposed_s: float = 0.0) -> Roofline:
    """Time, bound and limiter from the terms (see the module docstring).

    ``serial_memory_s``: the part of ``memory_s`` that cannot overlap the other units (a CPU thread faulting
    in fresh output pages stalls its compute too): it counts in the memory term for the bound and is added
    once to the time, after the overlapped maximum.
    ``exposed_s``: busy time of the compute units that the kernel's schedule cannot hide behind the larger
    term (fused attention: the softmax between its two GEMMs), added after the overlapped maximum."""
    terms = {Limiter.MATRIX: matrix_s, Limiter.VECTOR: vector_s, Limiter.MEMORY: memory_s,
             Limiter.INTERCONNECT: interconnect_s}
    limiter = max(terms, key=terms.__getitem__)
    overlapped = {**terms, Limiter.MEMORY: memory_s - serial_memory_s}
    busy = max(overlapped.values()) + serial_memory_s + exposed_s
    if overhead_s > busy:
        limiter = Limiter.OVERHEAD
    bound = Bound.COMPUTE if limiter in (Limiter.MATRIX, Limiter.VECTOR) else Bound(limiter.value)
    return Roofline(matrix_s, vector_s, memory_s, overhead_s, busy + overhead_s, bound, limiter, interconnect_s)


def no_kernel(bound: Bound, host_s: float = 0.0) -> Roofline:
    """A node that runs no kernel (view, allocation): only its host dispatch, if any."""
    return Roofline(0.0, 0.0, 0.0, host_s, host_s, bound, Limiter.NONE)


def uncounted(overhead_s: float) -> Roofline:
    """An op without a cost rule: the launch overhead, bound ``uncounted`` so it shows in every total."""
    return Roofline(0.0, 0.0, 0.0, overhead_s, overhead_s, Bound.UNCOUNTED, Limiter.OVERHEAD)


def stall_split(measured_s: float, r: Roofline) -> tuple[float, float, float]:
    """(compute-busy, memory-stall, other) seconds of a measured time, roofline-estimated from the terms the
    prediction used (the calibrated curves where the profile has them)::

        compute_busy = min(measured, matrix_s + vector_s)
        memory_stall = min(measured - compute_busy, max(0, memory_s - compute_busy))
        other        = measured - compute_busy - memory_stall   (dispatch, inefficiency, unexplained)
    """
    busy = min(measured_s, r.matrix_s + r.vector_s)
    stall = min(measured_s - busy, max(0.0, r.memory_s - busy))
    return busy, stall, measured_s - busy - stall
