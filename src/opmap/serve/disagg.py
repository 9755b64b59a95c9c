"""Disaggregated serving (DistServe, Splitwise): P prefill replicas and D decode replicas, each of tp devices.

A request is queued at a prefill replica (the router's choice), prefilled there in iteration-level batches
(the continuous policy's token budget; the prefill pool runs prompts only), and its first token is out when
its prefill step ends. Its KV cache then moves to a decode replica: ``KvTransfer`` prices the move as
latency + prompt tokens x KV bytes per token per device / link bandwidth per device and direction (each of
the tp prefill devices sends its own KV heads to its decode peer, in parallel). The decode pool admits ready
requests at iteration boundaries while their whole KV reservation (prompt + output) fits, and decodes them
with continuous batching; the request's first inter-token gap runs from its first token, so it carries the
transfer and any wait for a decode slot.

Assumptions, stated in the result: a prefill replica frees a request's KV as soon as its transfer starts
(no back-pressure from a full decode pool: DistServe's prefill instances would hold it); the link carries one
transfer per request with no contention between transfers; the decode replica is picked least-loaded.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from opmap.errors import OpmapError
from opmap.serve.arrivals import Requests
from opmap.serve.cost import StepCost
from opmap.serve.policies import Policy
from opmap.serve.sim import MAX_REPLICAS, SimResult, simulate

ACCEPTED = "P:D, the prefill and decode replica counts, integers >= 1 (e.g. 1:3)"


def parse_disaggregate(spec: str) -> tuple[int, int]:
    p, sep, d = spec.strip().partition(":")
    if sep and p.strip().isdigit() and d.strip().isdigit() and 1 <= int(p) and 1 <= int(d):
        if int(p) + int(d) > MAX_REPLICAS:
            raise OpmapError(f"--disaggregate {spec!r}: P + D must be at most {MAX_REPLICAS} replicas")
        return int(p), int(d)
    raise OpmapError(f"bad --disaggregate {spec!r}: accepted: {ACCEPTED}")


@dataclass(frozen=True)
class KvTransfer:
    """The move of a prompt's KV cache from a prefill to a decode replica: ``latency_s`` + tokens x
    ``bytes_per_token`` (per device) / ``bandwidth_bytes_per_s`` (per device, one direction)."""

    bytes_per_token: float
    bandwidth_bytes_per_s: float
    latency_s: float = 0.0
    link: str = "given"

    def __post_init__(self) -> None:
        if not (self.bytes_per_token >= 0 and self.bandwidth_bytes_per_s > 0 and self.latency_s >= 0):
            raise OpmapError("a KV transfer needs bytes_per_token >= 0, bandwidth > 0 and latency >= 0")

    def seconds(self, tokens: np.ndarray) -> np.ndarray:
        return self.latency_s + tokens * self.bytes_per_token / self.bandwidth_bytes_per_s

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def kv_transfer_for(hw, bytes_per_token: float, tp: int, replicas: int) -> KvTransfer:
    """The link a KV transfer takes on ``hw``: the scale-up switch (NVLink: half the catalog's bidirectional
    total per direction) when all ``replicas`` x ``tp`` devices sit in one node behind a switch, else the
    scale-out network (the catalog's per-direction NIC rate per device)."""
    per_node = hw.devices_per_node
    in_node = per_node is not None and replicas * tp <= per_node and hw.scale_up_topology == "switch"
    if in_node and hw.scale_up_bandwidth_bytes_per_s:
        return KvTransfer(bytes_per_token, hw.scale_up_bandwidth_bytes_per_s / 2, hw.scale_up_latency_s or 0.0,
                          f"scale-up ({hw.scale_up_topology}, {replicas * tp} of {per_node} devices in one node)")
    if hw.scale_out_bandwidth_bytes_per_s:
        why = (f"{replicas * tp} devices exceed a node of {per_node}" if per_node and replicas * tp > per_node
               else f"the scale-up topology is {hw.scale_up_topology or 'not given'}, not a switch")
        return KvTransfer(bytes_per_token, hw.scale_out_bandwidth_bytes_per_s, hw.scale_out_latency_s or 0.0,
                          f"scale-out network ({why})")
    raise OpmapError(f"{hw.name} lists no scale-out bandwidth and no scale-up switch: a KV transfer between "
                     "prefill and decode replicas cannot be priced")


def simulate_disaggregated(reqs: Requests, policy: Policy, cost: StepCost, prefill_replicas: int,
                           decode_replicas: int, transfer: KvTransfer, router: str = "round_robin",
                           seed: int = 0) -> SimResult:
    """Serve ``reqs`` on a prefill pool and a decode pool (see the module docstring). ``policy`` must be
    continuous: its token budget bounds a prefill iteration; decode admission is bounded by the KV cache."""
    if policy.name != "continuous":
        raise OpmapError(f"--disaggregate runs iteration-level batching in both pools: use --policy "
                         f"continuous[:TOKEN_BUDGET], got {policy.spec()!r}")
    n = len(reqs)
    ones = np.ones(n, dtype=reqs.output_len.dtype)
    # the prefill pool: each request's work there ends with its first token
    pre = simulate(Requests(reqs.arrival_s, reqs.input_len, ones, reqs.arrival), policy, cost,
                   prefill_replicas, router, seed)
    move_s = transfer.seconds(reqs.input_len.astype(np.float64))
    ready = pre.first_s + move_s
    order = np.argsort(ready, kind="stable")
    dec = simulate(Requests(ready[order], reqs.input_len[order], reqs.output_len[order], reqs.arrival), policy,
                   cost, decode_replicas, "least_loaded", seed, prefilled_first_s=pre.first_s[order])
    back = np.empty(n, dtype=np.int64)
    back[order] = np.arange(n)
    finish = dec.finish_s[back]
    decode_wait = (dec.start_s - dec.arrival_s)[back]
    extra = {"disaggregation": {
        "prefill_replicas": prefill_replicas, "decode_replicas": decode_replicas,
        "kv_transfer": transfer.to_dict(),
        "kv_transfer_s": {"mean_s": float(move_s.mean()) if n else None,
                          "max_s": float(move_s.max()) if n else None},
        "decode_admission_wait_s": {"mean_s": float(decode_wait.mean()) if n else None,
                                    "max_s": float(decode_wait.max()) if n else None},
        "busy_s": {"prefill": list(pre.busy_s), "decode": list(dec.busy_s)},
        "assumptions": "prefill frees a request's KV when its transfer starts (no back-pressure); transfers do "
                       "not contend for the link; decode replica picked least-loaded"}}
    return SimResult(reqs.arrival_s, pre.start_s, pre.first_s, finish, reqs.input_len, reqs.output_len,
                     pre.replica, dec.itl_gap_s, dec.itl_weight, policy.to_dict(), dict(pre.cost), router,
                     prefill_replicas + decode_replicas, reqs.arrival, pre.steps + dec.steps,
                     list(pre.busy_s) + list(dec.busy_s), extra=extra)
