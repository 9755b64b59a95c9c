"""Measured collective times inside a device's scale-up domain, as the collective model reads them.

A catalog device may carry, under ``[calibration]``, ``comm_grid``: a JSON file beside its TOML holding NCCL's
measured time of each collective (all-reduce, all-gather, reduce-scatter, all-to-all) per GPU count of one node,
at message sizes doubling from 512 B to 512 MiB (benchmarks/reference/aiconfigurator_comm.py writes it from
NVIDIA's aiconfigurator tables: nccl-tests, out-of-place). Sizes are nccl-tests' (``Collective.message_bytes``:
the all-reduce buffer, the all-gather output, the reduce-scatter input, the all-to-all buffer, per device).

``CommTable.seconds(nbytes)``: between two measured sizes s0 <= s <= s1 the time is interpolated linearly in
log(size) and log(time)::

    t = t0 x (t1 / t0) ^ (log(s / s0) / log(s1 / s0))

below the smallest size the smallest size's time (the latency floor: a smaller message is not faster); above the
largest size the largest size's bandwidth, t = t_last x s / s_last. The time read at a size is the least measured
at that size or any larger one (a smaller message is never slower: the few bumps in the tables, 11.06 us at 512 B
then 6.64 us at 1 KiB for an all-to-all on four H200s, are timing noise such as a first call's warm-up), so the
time never falls as the size grows; where the tables dip (15.03 us at 256 KiB, 13.66 at 512 KiB) it stays flat.
A GPU count the grid does not hold is not priced here (opmap.mapping.collectives keeps its first-principles model
for it).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from opmap.errors import OpmapError
from opmap.hardware.grid_file import CATALOG_DIR, name_pattern, read_tables
from opmap.validate import finite_number, shown

GRID_DIR = CATALOG_DIR  # where a catalog device's comm_grid file lives
COMM_NAME = name_pattern("comm.json")
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
LIMIT_BYTES = 1 << 20  # a grid of 4 kinds x 3 GPU counts x 21 sizes is 4 kB; 1 MiB is far past any real one
MAX_POINTS = 256  # sizes per table (a doubling sweep from 1 B to 2^64 B has 65)


@dataclass(frozen=True)
class CommTable:
    """One collective on one GPU count: sizes in bytes (increasing) and measured seconds."""

    message_bytes: tuple[float, ...]
    seconds_at: tuple[float, ...]

    def seconds(self, nbytes: float) -> float:
        """The measured time of a ``nbytes`` message (module docstring: log-log between sizes, the smallest size's
        time below the grid, the largest size's bandwidth above it)."""
        xs, ts = self.message_bytes, self.seconds_at
        if nbytes <= xs[0]:
            return ts[0]
        if nbytes >= xs[-1]:
            return ts[-1] * nbytes / xs[-1]
        i = bisect.bisect_right(xs, nbytes) - 1
        frac = math.log(nbytes / xs[i]) / math.log(xs[i + 1] / xs[i])
        return ts[i] * (ts[i + 1] / ts[i]) ** frac


@dataclass(frozen=True)
class CommGrid:
    """A device's measured collectives: ``tables[(kind, gpus)]``; ``source`` says where they come from."""

    name: str
    source: str
    tables: dict[tuple[str, int], CommTable]

    def table(self, kind: str, gpus: int) -> CommTable | None:
        return self.tables.get((kind, gpus))


def _table(t: Any, at: str) -> CommTable:
    if not isinstance(t, dict):
        raise OpmapError(f"{at} must be an object with message_bytes and time_us (got {shown(t)})")
    xs, us = t.get("message_bytes"), t.get("time_us")
    if not isinstance(xs, list) or not isinstance(us, list) or not xs or len(xs) != len(us) or len(xs) > MAX_POINTS:
        raise OpmapError(f"{at}: message_bytes and time_us must be lists of equal length, 1 to {MAX_POINTS} points")
    for i, (x, u) in enumerate(zip(xs, us, strict=True)):
        finite_number(x, f"{at}.message_bytes[{i}]", lo=1, unit="B")
        finite_number(u, f"{at}.time_us[{i}]", lo=0, lo_open=True, hi=1e9, unit="us")
    if any(b <= a for a, b in zip(xs, xs[1:])):
        raise OpmapError(f"{at}.message_bytes must increase")
    kept, floor = [], math.inf
    for u in reversed(us):  # a smaller message is never slower: a time above a larger size's is timing noise
        floor = min(floor, float(u) * 1e-6)
        kept.append(floor)
    return CommTable(tuple(float(x) for x in xs), tuple(reversed(kept)))


@lru_cache(maxsize=16)
def load_comm_grid(name: str) -> CommGrid:
    """A catalog device's measured collective grid (module docstring), read once per process. Parsed, never
    executed; one line naming the problem when the file is missing or malformed."""
    raw, tables = read_tables(GRID_DIR, name, COMM_NAME, "collective grid", "aiconfigurator_comm.py", dict,
                              "per collective kind, per GPU count", LIMIT_BYTES)
    out: dict[tuple[str, int], CommTable] = {}
    for kind, per in tables.items():
        if kind not in KINDS or not isinstance(per, dict):
            raise OpmapError(f"collective grid {name}: tables.{kind} must be one of {', '.join(KINDS)}, each an "
                             f"object keyed by GPU count (got {shown(kind)})")
        for gpus, t in per.items():
            if not (isinstance(gpus, str) and gpus.isdigit() and 2 <= int(gpus) <= 1_000_000):
                raise OpmapError(f"collective grid {name}: tables.{kind} key {gpus!r} must be a GPU count of 2 or "
                                 "more")
            out[(kind, int(gpus))] = _table(t, f"collective grid {name}: tables.{kind}.{gpus}")
    source = raw.get("source", "")
    if not isinstance(source, str) or not source:
        raise OpmapError(f"collective grid {name}: 'source' must say where the times come from")
    return CommGrid(name, source, out)
