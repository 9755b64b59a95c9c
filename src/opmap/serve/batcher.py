"""A batcher in front of the replicas (router ``batched:SIZE,WAIT_MS``): a serving harness that holds arriving
requests and hands them to the engines in groups, each group to the next replica, round robin.

AMD's MLPerf Inference v4.1 llama2-70b Server harness does this (closed/AMD/code/llama2-70b-99/VllmFp8/sync_sut.py,
``SyncServerSUT.batch_samples_loop``, mlcommons/inference_results_v4.1 @ a2f5d66d; on with ``--enable-batcher`` in
test_VllmFp8_SyncServer_perf.sh, ``--gpu-batch-size`` 96 and ``--batcher-threshold`` 0.3 s by default in
mainVllmFp8_SyncServer.py). Its loop, one thread:

    held = get()                                  # blocks for the first query; the clock starts then
    stamp = now
    loop:
        if held and (len(held) >= SIZE or now - stamp >= WAIT):
            send(held[:SIZE]) to the next engine (round robin); held = held[SIZE:]; stamp = now
        held += get(timeout=WAIT)                  # the next query, or nothing after WAIT

so a group leaves when SIZE are held, or at the first check at least WAIT after the last send: at a query's
arrival (the query goes with the group) or, with none arriving, WAIT after the previous check. A query's wait in
the batcher is part of its TTFT (LoadGen times from its issue).

The dispatch depends on the arrival times alone (the engines never push back), so ``dispatch`` computes every
request's hand-over time and replica before the simulation; the simulator delivers each request then and there and
times its latencies from its arrival.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from opmap.errors import OpmapError
from opmap.validate import INT_MAX, plausible

PREFIX = "batched:"


@dataclass(frozen=True)
class Batcher:
    """Hold requests until ``size`` are held or ``wait_s`` has passed since the last group left (see the module)."""

    size: int
    wait_s: float

    def spec(self) -> str:
        return f"{PREFIX}{self.size},{self.wait_s * 1e3:g}"


def parse_batcher(router: str) -> Batcher | None:
    """The batcher a router spec names (None: the router is not ``batched:SIZE,WAIT_MS``)."""
    if not router.startswith(PREFIX):
        return None
    size, _, wait = router[len(PREFIX):].partition(",")
    bad = OpmapError(f"bad router {router!r}: batched:SIZE,WAIT_MS takes an integer SIZE >= 1 (the most requests "
                     "a group holds) and WAIT_MS > 0 (how long after the last group the next one leaves)")
    if not size.strip().isdigit() or not 1 <= int(size) <= INT_MAX:
        raise bad
    try:
        wait_ms = float(wait)
    except ValueError:
        raise bad from None
    if not wait_ms > 0:
        raise bad
    try:
        wait_ms = plausible("ms").check(wait_ms, "WAIT_MS")
    except OpmapError as e:
        raise OpmapError(f"bad router {router!r}: {e}") from None
    return Batcher(int(size), wait_ms / 1e3)


def dispatch(arrival_s: np.ndarray, batcher: Batcher, replicas: int) -> tuple[np.ndarray, np.ndarray]:
    """(hand-over time, replica) per request, requests in arrival order: the harness loop of the module docstring
    run over the arrival times. Groups go to replicas 0, 1, ... R-1, 0, ... in the order they leave."""
    arr = np.asarray(arrival_s, dtype=np.float64).tolist()
    n = len(arr)
    deliver, where = [0.0] * n, [0] * n
    if not n:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    size, wait = batcher.size, batcher.wait_s
    held: deque[int] = deque([0])
    t = stamp = arr[0]
    i, groups = 1, 0
    while True:
        if held and (len(held) >= size or t - stamp >= wait):  # the check: send a group
            r = groups % replicas
            for _ in range(min(size, len(held))):
                k = held.popleft()
                deliver[k], where[k] = t, r
            groups += 1
            stamp = t
        if i == n and not held:
            break
        nxt = arr[i] if i < n else float("inf")
        if not held or nxt - t < wait:  # the get returns with the next query (at once when nothing is held)
            t = nxt
            held.append(i)
            i += 1
        else:  # the get times out
            t += wait
    return np.asarray(deliver), np.asarray(where, dtype=np.int64)
