"""Serving simulator: arrival processes, batching policies, step costs, a discrete-event simulator, metrics.

    from opmap.serve import parse_arrival, parse_length, parse_policy, TableCost, ServiceTime, simulate
    reqs = make_requests(parse_arrival("poisson:5"), parse_length("512"), parse_length("128"), 1000, seed=0)
    res = simulate(reqs, parse_policy("continuous:8192"), cost, replicas=2, router="least_loaded")
    report = record(summarize(res, slo=Slo(ttft_s=2.0, tpot_s=0.2)))  # serve.json's body (opmap.record.record)

The layer sits above analyze/measure: a StepCost is the only thing it needs from the cost model, and the
integrator builds a TableCost from opmap's analysis of the model (see cost.py).
"""

from opmap.serve.arrivals import Requests, make_requests, parse_arrival, parse_length
from opmap.serve.capacity import find_capacity
from opmap.serve.cost import ServiceTime, StepCost, TableCost, parse_service_time
from opmap.serve.metrics import Slo, summarize
from opmap.serve.policies import Chunked, Continuous, Dynamic, Engine, NoBatching, Static, parse_policy
from opmap.serve.sim import SimResult, simulate

__all__ = ["Requests", "make_requests", "parse_arrival", "parse_length", "ServiceTime", "StepCost", "TableCost",
           "parse_service_time", "Slo", "find_capacity", "summarize", "Chunked", "Continuous", "Dynamic",
           "Engine", "NoBatching", "Static", "parse_policy", "SimResult", "simulate"]
