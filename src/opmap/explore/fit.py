"""The workload fit matrix: rows workloads, columns platforms, each cell served under an SLO.

Per (model, platform) cell:

- **devices**: the smallest tensor-parallel group inside one node (1, 2, 4, 8 ...) whose per-device weights
  leave room for a KV cache (``opmap.serve.model_cost``: device memory - weights / tp - workspace -
  activations, over the KV bytes per token per device); a fixed ``devices`` is used as given;
- **throughput at the SLO**: the highest Poisson arrival rate whose simulated run (``opmap.serve``: continuous
  batching, steps priced by the model's prefill and decode analyses on that platform) is VALID under the SLO
  (p99 TTFT and TPOT, or p99 end to end), found by bisection; reported as output tokens per second, with the
  run's p99 end-to-end latency;
- **power**, modelled: each device draws idle + (TDP - idle) x its simulated busy fraction, idle the catalog's
  ``idle_power_w`` (its kind and source carried into ``power_method``); only a device without that field falls
  back to ``IDLE_FRACTION`` of the TDP, and says so; a device without a TDP gets no power figure, with the
  reason; perf per watt = output tokens per second / watts, energy per token = watts / output tokens per second
  (J = W x s per token);
- **perf per dollar** where a price per device-hour is given: output tokens per dollar;
- **bound**: the bound class holding most of a decode step's predicted time at batch 16;
- **risk**: the software-stack risk level the catalog records for the device (low / medium / high), with its
  source in ``risk_source``; "not in the catalog" where the device has none.

Cells that break a constraint (no fit within a node, no valid rate, the power budget) are kept with the reason
in ``excluded_reason``; the others are ranked per workload by throughput at the SLO.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from opmap.errors import OpmapError
from opmap.hardware import get_hardware

SCHEMA_VERSION = 1
# of the TDP, assumed, only for a device whose catalog entry has no idle_power_w: the draw of an idle device with
# its memory powered (the catalog's sourced figures run 11-28% of TDP; 0.15 sits among them)
IDLE_FRACTION = 0.15
DEVICE_STEPS = (1, 2, 4, 8)
POWER_MODEL = "modelled: idle + (TDP - idle) x busy fraction"


def idle_w(hw) -> tuple[float, str]:
    """The idle draw (W) the power model uses for ``hw`` and where it comes from."""
    tdp = hw.tdp_w
    if tdp is None:
        raise OpmapError(f"{hw.name} lists no TDP (tdp_w): its power cannot be modelled")
    v = hw.fields.get("idle_power_w")
    if v is not None and v.value is not None:
        return float(v.value), f"idle {float(v.value):g} W, {v.kind}: {v.source}"
    return IDLE_FRACTION * tdp, (f"idle {IDLE_FRACTION * tdp:g} W = {IDLE_FRACTION:.0%} of the {tdp:g} W TDP "
                                 f"(assumed: {hw.name} lists no idle_power_w)")


def power_method(hw) -> str:
    """``POWER_MODEL`` with the device's TDP and idle source, or why no power is modelled."""
    try:
        _, basis = idle_w(hw)
    except OpmapError as e:
        return f"not modelled: {e}"
    return f"{POWER_MODEL}; TDP {hw.tdp_w:g} W ({hw.fields['tdp_w'].kind}); {basis}"


def _power_w(hw, devices: int, busy: Sequence[float]) -> float:
    """devices x (idle + (TDP - idle) x mean busy fraction), in W."""
    idle, _ = idle_w(hw)
    tdp = float(hw.tdp_w)
    u = sum(busy) / len(busy) if busy else 0.0  # each replica is one tensor-parallel group of ``devices``
    u = min(1.0, u)  # a replica busy the whole run sums its step times to the span, rounding included
    return devices * (idle + (tdp - idle) * u)


def _decode_bound(model: str, hw, dtype: str) -> str:
    from opmap.analyze import analyze_phase, capture_phase
    from opmap.workloads.phases import PhaseSpec, phase_workload

    spec = PhaseSpec("decode", kv_len=1024)
    w = phase_workload(model, spec, 16, None, dtype)
    return analyze_phase(capture_phase(w, spec), w, hw, dtype, spec).analysis.phase.get("bound", "-")


def fit_cell(model: str, hardware: str, slo, input_len: str, output_len: str, requests: int, dtype: str = "bf16",
             devices: int | None = None, power_budget_w: float | None = None, price_per_hour: float | None = None,
             seed: int = 0, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    from opmap.serve.arrivals import make_requests
    from opmap.serve.metrics import find_capacity, summarize
    from opmap.serve.model_cost import model_table_cost
    from opmap.serve.policies import Continuous
    from opmap.serve.sim import simulate

    hw = get_hardware(hardware)
    cell: dict[str, Any] = {"model": model, "hardware": hw.name, "devices": None, "fits": False,
                            "throughput_at_slo": None, "latency_p99_s": None, "perf_per_watt": None,
                            "energy_per_token_j": None, "power_w": None, "power_method": power_method(hw),
                            "perf_per_dollar": None, "bound": None, "risk": _risk(hw), "risk_source": _risk_source(hw),
                            "rank": None, "excluded_reason": ""}
    per_node = hw.devices_per_node or 8
    steps = [devices] if devices else [n for n in DEVICE_STEPS if n <= per_node]
    cost = None
    why = ""
    for n in steps:
        if progress:
            progress(f"{model} on {n} x {hw.name}: pricing")
        try:
            cost = model_table_cost(model, hw.name, dtype, tp=n)
            cell["devices"] = n
            break
        except OpmapError as e:
            why = str(e)
    if cost is None:
        cell["excluded_reason"] = f"does not fit on up to {steps[-1]} devices in a node: {why}"
        return cell
    cell["fits"] = True
    cell["bound"] = _decode_bound(model, hw, dtype)

    def run(rate: float) -> dict[str, Any]:
        reqs = make_requests(f"poisson:{rate}", input_len, output_len, n=requests, seed=seed, max_span_s=None)
        return summarize(simulate(reqs, Continuous(), cost, seed=seed), slo)

    if progress:
        progress(f"{model} on {cell['devices']} x {hw.name}: capacity search")
    first = run(1.0)
    if not first["validity"]["valid"]:
        low = run(0.05)
        if not low["validity"]["valid"]:
            cell["excluded_reason"] = f"misses the SLO even at 0.05 requests/s: {low['validity']['reason']}"
            return cell
    cap = find_capacity(run, 1.0)
    if not cap["rate_per_s"] > 0:  # validity not monotone in the rate here: no grid rate was valid
        runs = cap["runs"]
        cell["excluded_reason"] = (f"no valid rate found by the capacity search ({len(runs)} probes from "
                                   f"{min(r['rate_per_s'] for r in runs):.3g} to "
                                   f"{max(r['rate_per_s'] for r in runs):.3g} requests/s): {runs[-1]['reason']}")
        return cell
    s = run(cap["rate_per_s"])
    tok_s = s["throughput"]["output_tokens_per_s"]
    watts = _power_w(hw, cell["devices"], s.get("utilization", [])) if hw.tdp_w is not None else None
    cell.update(throughput_at_slo=tok_s, rate_at_slo_per_s=cap["rate_per_s"],
                latency_p99_s=s["latency"]["e2e"]["p99_s"], power_w=watts,
                perf_per_watt=tok_s / watts if watts else None,
                energy_per_token_j=watts / tok_s if watts is not None and tok_s else None)
    if price_per_hour:
        cell["perf_per_dollar"] = tok_s * 3600.0 / (cell["devices"] * price_per_hour)
    if power_budget_w is not None:
        if watts is None:
            cell["excluded_reason"] = f"power budget not checkable: {cell['power_method']}"
        elif watts > power_budget_w:
            cell["excluded_reason"] = f"draws {watts:.0f} W at the SLO rate, over the {power_budget_w:.0f} W budget"
    return cell


def _risk(hw) -> str:
    return hw.software_risk or "not in the catalog"


def _risk_source(hw) -> str:
    v = hw.fields.get("software_risk")
    return v.source if v is not None else ""


@dataclass(frozen=True)
class CellJob:
    """One (model, platform) cell's inputs: a task for the engine, self-contained (the seed included)."""

    model: str
    hardware: str
    slo: Any
    input_len: str
    output_len: str
    requests: int
    dtype: str
    devices: int | None
    power_budget_w: float | None
    price_per_hour: float | None
    seed: int


def cell_task(job: CellJob) -> dict[str, Any]:
    """``fit_cell`` for one job (module level, so a worker process or a Ray task can import it)."""
    return fit_cell(job.model, job.hardware, job.slo, job.input_len, job.output_len, job.requests, job.dtype,
                    job.devices, job.power_budget_w, job.price_per_hour, job.seed)


def fit_matrix(models: Sequence[str], hardware: Sequence[str], slo, input_len: str = "512",
               output_len: str = "128", requests: int = 500, dtype: str = "bf16", devices: int | None = None,
               power_budget_w: float | None = None, prices: dict[str, float] | None = None, seed: int = 0,
               progress: Callable[[str, int, int], None] | None = None, engine: str = "local",
               workers: int | None = None) -> dict[str, Any]:
    """Every (model, platform) cell, one task each on ``engine`` (``opmap.explore.engine``: a local process pool
    or Ray; the same cells either way), then ranked per workload."""
    from opmap.explore.engine import check_engine, get_engine

    check_engine(engine)
    from opmap.workloads import MODELS

    bad = [m for m in models if MODELS.get(m) is None or MODELS.get(m).kind != "text"]
    if bad:
        texts = sorted(n for n, sp in MODELS.items() if sp.kind == "text")
        raise OpmapError(f"opmap fit serves zoo text models (decoders: it simulates serving); not one: "
                         f"{', '.join(bad)} (accepted: {', '.join(texts)})")
    prices = prices or {}
    unknown = sorted(set(prices) - {get_hardware(h).name for h in hardware})
    if unknown:
        raise OpmapError(f"--price names {', '.join(unknown)}, not among --hardware {', '.join(hardware)}")
    jobs = [CellJob(m, h, slo, input_len, output_len, requests, dtype, devices, power_budget_w,
                    prices.get(get_hardware(h).name), seed) for m in models for h in hardware]
    if progress:
        progress(f"{len(jobs)} cells on {engine}", 0, len(jobs))
    with get_engine(engine, workers) as eng:
        cells = eng.map(cell_task, jobs, progress=progress, label=lambda j: f"{j.model} on {j.hardware}")
    for m in models:
        ok = sorted((c for c in cells if c["model"] == m and not c["excluded_reason"]),
                    key=lambda c: -c["throughput_at_slo"])
        for i, c in enumerate(ok):
            c["rank"] = i + 1
    return {"schema_version": SCHEMA_VERSION, "models": list(models), "hardware": [get_hardware(h).name
                                                                                 for h in hardware],
            "slo": slo.to_dict(), "input_len": input_len, "output_len": output_len, "requests": requests,
            "dtype": dtype, "cells": cells, "engine": engine,
            "assumptions": [
                "policy continuous (vLLM-style, token budget 8192), one tensor-parallel group per replica, Poisson "
                "arrivals; throughput at the SLO = the highest valid rate's output tokens per second (a fixed "
                "geometric grid of rates, then rounds of evenly spaced probes inside the valid / invalid bracket)",
                "power modelled: devices x (idle + (TDP - idle) x busy fraction), idle the catalog's idle_power_w "
                f"(measured or estimated, each cell's power_method says which and why; {IDLE_FRACTION:.0%} of TDP, "
                "assumed, only where a device has none); no device's draw is measured here",
                "devices: the smallest tensor-parallel group in one node whose weights leave room for a KV cache",
                "one task per cell on the engine (local process pool or Ray): the same cells either way"]}
