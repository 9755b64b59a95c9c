"""The workload fit matrix: rows workloads, columns platforms, each cell served under an SLO.

Per (model, platform) cell (the model anything analyze takes that decodes: a zoo decoder, a Hugging Face
config, hf:NAME, a model file):

- **layout**: the layout search of ``opmap.explore.layouts`` over a device budget (default one node): TP up
  to the scale-up domain (72 on an NVL72 rack) as the heads allow, PP across domains, replicas filling the
  budget; the chosen layout is the
  one with the most output tokens per second per device of the budget, and the runner-up is named beside it;
  ``devices`` is the devices the chosen layout uses (replicas x devices per replica), present only where a layout
  was chosen (a cell that fits nowhere or meets the SLO at no rate has none: ``devices_tried`` lists the devices
  per replica its search tried, ``devices_budget`` the budget, ``excluded_reason`` why);
- **engine settings**: every search runs serve's engine policy (``--max-num-seqs``, ``--max-num-batched-tokens``)
  and KV cache (``--kv-dtype``, ``--gpu-memory-utilization``), stated in ``engine_settings``; the chosen layout's
  per-device ``memory`` (weights, KV bytes per token, KV tokens) beside it;
- **throughput at the SLO**: per layout, one replica's steady-state capacity (``opmap.serve.capacity.
  steady_capacity``, the search serve --find-capacity runs: the highest Poisson rate meeting the SLO with a
  stationary queue, warm-up and cool-down excluded, never above the offline saturation rate), its run's output
  tokens per second times the replicas; ``throughput_per_device`` over the budget's devices; the p99 end-to-end
  latency of that same run;
- **power**, modelled: each device draws idle + (TDP - idle) x its simulated busy fraction, idle the catalog's
  ``idle_power_w`` (its kind and source carried into ``power_method``); only a device without that field falls
  back to ``IDLE_FRACTION`` of the TDP, and says so; a device without a TDP gets no power figure, with the
  reason; perf per watt = output tokens per second / watts, energy per token = watts / output tokens per second
  (J = W x s per token);
- **perf per dollar** where a price per device-hour is given: output tokens per dollar, and
  ``cost_per_million_output_tokens`` = price x devices / (output tokens/s x 3600) x 1e6; with prices the cells
  are ranked by it, cheapest first;
- **power budget**: each layout keeps the replicas whose modelled draw fits the budget (``power_fit``: 2 H100s
  at 700 W each fit 1,400 W where 8 do not), the best of those chosen; a cell is struck only where no layout's
  single replica fits;
- **bound**: the bound class holding most of a decode step's predicted time at batch 16 under the runtime;
- **risk**: the software-stack risk level the catalog records for the device (low / medium / high), with its
  source in ``risk_source``; "not in the catalog" where the device has none;
- **datasheet_only**: the achievable figures the device's catalog entry lacks (empty when priced like for like).

Cells that break a constraint (no fit within a node, no valid rate, the power budget) are kept with the reason
in ``excluded_reason``; the others are ranked per workload by throughput per device (by cost per token where
prices are given), datasheet-only devices after the rest (unless asked to rank them together).

Progress: each cell reports the layout it prices or searches (two steps a layout), across the local pool's
processes, so the bar and its estimate of the time left move within a cell (``opmap.explore.fit_progress``).

A fit stopped by a signal keeps its finished cells (``interrupted`` names the signal and the cells not run).

Schema 2 (from 1): ``devices`` is the devices the chosen layout uses and ``throughput_at_slo`` their throughput
(was one tensor-parallel group's); added ``layout``, ``runner_up``, ``layouts``, ``throughput_per_device``,
``capacity``, ``runtime``, ``datasheet_only``, ``devices_budget``.
Schema 3 (from 2): ``devices`` left out where no layout was chosen (was null), ``devices_tried`` added; added
``engine_settings``, ``power_budget_w``, ``prices_usd_per_device_hour``, a cell's ``memory`` and
``cost_per_million_output_tokens``, a layout's ``memory``, ``power_w``, ``power_limited``, ``over_power_budget``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from opmap.errors import Interrupted, OpmapError
from opmap.explore.results import ChosenLayout, Confidence, FitCell, FitMatrix, FitStop, LayoutResult
from opmap.hardware import get_hardware
from opmap.record import record

SCHEMA_VERSION = 3
# of the TDP, assumed, only for a device whose catalog entry has no idle_power_w: the draw of an idle device with
# its memory powered (the catalog's sourced figures run 11-28% of TDP; 0.15 sits among them)
IDLE_FRACTION = 0.15
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


_MODELS: dict[tuple[str, str], Any] = {}  # opmap.api.Model per (model, dtype): its steps captured once a process


def _decode_bound(model: str, hw, dtype: str, runtime: str) -> str:
    """The bound class holding most of a decode step's predicted time at batch 16 and 1024 KV tokens, under the
    runtime's per-kernel overhead and fusion; "-" where the decode step cannot be built here. The step is
    captured once a process for every device (``opmap.api.Model``; a zoo model's is kept in the capture cache,
    so other worker processes analyse it without building it again)."""
    from opmap.api import Model, Shape
    from opmap.phases.runtime import get_runtime
    from opmap.workloads.phases import PhaseSpec

    rt = get_runtime(hw, runtime)
    spec = PhaseSpec("decode", kv_len=1024, kv_write=rt.kv_write)
    m = _MODELS.setdefault((model, dtype), Model(model, dtype))
    try:
        return m.phase(spec, Shape(16), hw, rt, rt.fusion, steady=True).analysis.phase_figures.bound or "-"
    except OpmapError:
        return "-"


def default_policy():
    """The batching policy serve runs by default: ``engine`` where this build has it, else ``continuous``."""
    from opmap.serve.policies import parse_policy

    try:
        return parse_policy("engine")
    except OpmapError:
        return parse_policy("continuous")


def fit_cell(model: str, hardware: str, slo, input_len: str, output_len: str, requests: int, dtype: str = "bf16",
             devices: int | None = None, power_budget_w: float | None = None, price_per_hour: float | None = None,
             seed: int = 0, progress: Callable[[str], None] | None = None, runtime: str = "engine",
             devices_budget: int | None = None, *, policy=None, kv_dtype: str | None = None,
             gpu_memory_utilization: float = 0.9, preset=None) -> FitCell:
    """One (model, platform) cell: the layout search (opmap.explore.layouts) over ``devices_budget`` devices
    (default one node) under the engine ``policy`` (default serve's), the KV cache at ``kv_dtype`` in
    ``gpu_memory_utilization`` of each device; its chosen layout's figures, power and price. Under a power budget
    a layout keeps the replicas the budget powers (``power_fit``). ``preset`` (an opmap.engines.apply.Applied, or
    None): the engine stack of this platform, sizing each layout's memory and scheduler as that engine would; the
    cell names it (``engine_preset``: the chosen layout's setting)."""
    from opmap.api import dtype_on
    from opmap.explore.layouts import choose, default_budget, search
    from opmap.precision import check_kv_format

    hw = get_hardware(hardware)
    budget = devices_budget or default_budget(hw)
    choice = dtype_on(hw, dtype)  # the format this platform prices: an alias (fp4) resolves per platform
    dtype = choice.format
    named = {"dtype": dtype, "dtype_line": choice.header()}
    try:
        if kv_dtype is not None:
            check_kv_format(hw, kv_dtype)
    except OpmapError as e:  # a KV format this platform's engines do not ship: the cell says so, the rest run
        return FitCell(model, hw.name, risk=_risk(hw), devices_budget=budget, excluded_reason=str(e), **named)
    found = search(model, hw, budget, slo, input_len, output_len, requests, dtype, runtime,
                   policy or default_policy(), seed, devices, progress, kv_dtype=kv_dtype,
                   gpu_memory_utilization=gpu_memory_utilization, preset=preset)
    tried = found.tried
    cell = FitCell(model, hw.name, power_method=power_method(hw), risk=_risk(hw), risk_source=_risk_source(hw),
                   datasheet_only=tuple(getattr(hw, "datasheet_only", ())), devices_budget=budget,
                   runtime=found.runtime, devices_tried=tuple(sorted({lay.devices_per_replica for lay in tried})),
                   **named)
    fitting = [lay for lay in tried if lay.fits]
    if not fitting:
        last = tried[-1].reason if tried else "no layout within the node and the budget"
        most = max(cell.devices_tried, default=0)
        return replace(cell, layouts=tried, excluded_reason=(
            f"{last} (no layout of up to {most} devices per replica could be priced: built and fitted in memory)"))
    cell = replace(cell, fits=True, bound=_decode_bound(model, hw, dtype, runtime))
    best, runner = found.chosen, found.runner_up
    over = ""
    if power_budget_w is not None and hw.tdp_w is not None and best is not None:
        tried, within = power_fit(tried, hw, power_budget_w)
        if within:
            best, runner = choose(within)
        else:  # struck, its best layout's figures kept beside the reason
            over = _over_budget(tried, power_budget_w)
    cell = replace(cell, layouts=tried, layout=best, runner_up=runner,
                   confidence=_confidence(hw, dtype, runtime, best or fitting[0]))
    if found.settings is not None:  # the stack this cell ran: the chosen layout's (else the first priced one's)
        s = found.settings.get((best.tp, best.pp, best.ep, best.dp_attention)) if best is not None else None
        s = s or next(iter(found.settings.values()), None)
        cell = replace(cell, engine_preset=record(s) if s is not None else None)
    if best is None:
        return replace(cell, excluded_reason=f"no layout meets the SLO at any rate: {fitting[0].reason}")
    return _priced(cell, best, hw, power_budget_w, price_per_hour, over)


def _priced(cell: FitCell, best, hw, power_budget_w: float | None, price_per_hour: float | None,
            over: str) -> FitCell:
    """``cell`` with its chosen layout ``best``'s figures, modelled power and price; ``over``: why a power budget
    struck it ("" where it did not)."""
    tok_s = best.output_tokens_per_s
    watts = _power_w(hw, best.devices_used, best.utilization or []) if hw.tdp_w is not None else None
    cell = replace(cell, chosen=ChosenLayout(best.devices_used, best.rate_per_s * best.replicas, best.capacity,
                                             best.memory, best.power_limited),
                   throughput_at_slo=tok_s, throughput_per_device=best.per_device_tokens_per_s,
                   latency_p99_s=best.latency_p99_s, power_w=watts, perf_per_watt=tok_s / watts if watts else None,
                   energy_per_token_j=watts / tok_s if watts is not None and tok_s else None)
    if price_per_hour:
        cell = replace(cell, perf_per_dollar=tok_s * 3600.0 / (best.devices_used * price_per_hour),
                       cost_per_million_output_tokens=cost_per_million(price_per_hour, best.devices_used, tok_s))
    why = ""
    if power_budget_w is not None and watts is None:
        why = f"power budget not checkable: {cell.power_method}"
    return replace(cell, excluded_reason=over or why)


def cost_per_million(price_per_hour: float, devices: int, tokens_per_s: float) -> float:
    """USD per million output tokens: price per device-hour x devices / (output tokens/s x 3600 s) x 1e6."""
    return price_per_hour * devices / (tokens_per_s * 3600.0) * 1e6


def power_fit(tried: Sequence[LayoutResult], hw,
              budget_w: float) -> tuple[tuple[LayoutResult, ...], list[LayoutResult]]:
    """The layouts ``tried`` as a power budget leaves them, and those of them (with a rate at the SLO) it allows,
    each cut to the replicas the budget powers: one replica of d devices draws d x (idle + (TDP - idle) x its
    busy fraction) at its SLO rate, the same however many replicas share the traffic (each a Poisson share at
    that rate), so ``budget_w // that`` of them fit (at most the replicas the devices budget holds). A layout cut
    records ``power_limited``; one whose single replica is over the budget, ``over_power_budget``. Every such
    layout gets ``power_w``."""
    out, ok = [], []
    for lay in tried:
        if not lay.rate_per_s:
            out.append(lay)
            continue
        one = _power_w(hw, lay.devices_per_replica, lay.utilization or [])
        k = min(lay.replicas, int(budget_w // one))
        if k < 1:
            out.append(replace(lay, power_w=one, over_power_budget=True))
            continue
        if k < lay.replicas:
            share = k / lay.replicas
            lay = replace(lay, power_limited=f"{k} of {lay.replicas} replicas within the {budget_w:g} W budget",
                          replicas=k, devices_used=k * lay.devices_per_replica,
                          output_tokens_per_s=lay.output_tokens_per_s * share,
                          per_device_tokens_per_s=lay.per_device_tokens_per_s * share)
        lay = replace(lay, power_w=one * k)
        out.append(lay)
        ok.append(lay)
    return tuple(out), ok


def _over_budget(tried: Sequence[LayoutResult], budget_w: float) -> str:
    """Why no layout fits the power budget: the least one replica of any layout draws."""
    from opmap.explore.layouts import label

    low = min((lay for lay in tried if lay.over_power_budget), key=lambda lay: lay.power_w)
    d = low.devices_per_replica
    return (f"no layout fits the power budget: the least, one replica of {label(replace(low, replicas=1))} "
            f"({d} device{'s' if d != 1 else ''}), draws {low.power_w:.0f} W at its SLO rate, over the "
            f"{budget_w:.0f} W budget")


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
    runtime: str = "engine"
    devices_budget: int | None = None
    policy: Any = None
    kv_dtype: str | None = None
    gpu_memory_utilization: float = 0.9
    preset: Any = None  # an opmap.engines.apply.Applied: this platform's engine stack, or None
    notes: Any = None  # a queue (a multiprocessing manager's, across processes) for the search's progress notes


def cell_cost(job: CellJob) -> float:
    """A guess of a cell's run time, to hand the pool the longest first: a decode step reads the weights, so the
    simulated runs last about as long as the zoo's published parameter count over the device's achievable memory
    rate. A model outside the zoo counts as the costliest (its size is not known before it is built)."""
    from opmap.workloads import MODELS

    spec = MODELS.get(job.model)
    if spec is None:
        return math.inf
    return spec.published_params / get_hardware(job.hardware).memory_rate_bytes_per_s


def cell_task(job: CellJob) -> FitCell:
    """``fit_cell`` for one job (module level, so a worker process or a Ray task can import it); its search's
    progress notes go to ``job.notes`` as (cell, note)."""
    from opmap.explore.fit_progress import cell_label

    say = None
    if job.notes is not None:
        cell = cell_label(job)

        def say(note: str) -> None:
            try:
                job.notes.put((cell, note))
            except (OSError, EOFError):  # the parent's queue gone (a stop): a note is never worth the cell
                pass
    return fit_cell(job.model, job.hardware, job.slo, job.input_len, job.output_len, job.requests, job.dtype,
                    job.devices, job.power_budget_w, job.price_per_hour, job.seed, progress=say, runtime=job.runtime,
                    devices_budget=job.devices_budget, policy=job.policy, kv_dtype=job.kv_dtype,
                    gpu_memory_utilization=job.gpu_memory_utilization, preset=job.preset)


MODELS_ACCEPTED = "a zoo decoder ({zoo}), path/to/config.json, hf:NAME or path/to/file.py:factory"


def check_models(models: Sequence[str]) -> None:
    """Every model something fit can serve (what analyze takes, decoders only); one line naming the rest."""
    from pathlib import Path

    from opmap.workloads import MODELS
    from opmap.workloads.hf import is_hf_target

    def ok(m: str) -> bool:
        spec = MODELS.get(m)
        if spec is not None:
            return spec.kind == "text" and m != "bert-base"
        if m.startswith("hf:") or is_hf_target(m):
            return m.startswith("hf:") or Path(m).exists()
        path = m.rpartition(":")[0]
        return path.endswith(".py") and Path(path).is_file()

    bad = [m for m in models if not ok(m)]
    if bad:
        zoo = ", ".join(sorted(n for n, sp in MODELS.items() if sp.kind == "text" and n != "bert-base"))
        raise OpmapError(f"opmap fit serves decoders (it simulates serving); not one: {', '.join(bad)} "
                         f"(accepted: {MODELS_ACCEPTED.format(zoo=zoo)})")


def _confidence(hw, dtype: str, runtime: str, lay) -> Confidence:
    """The cell's confidence label (opmap.hardware.trust) for its layout's collective group."""
    from opmap.hardware.trust import trust

    return Confidence(trust(hw, dtype, runtime, lay.tp * lay.pp))


def rank(cells: Sequence[FitCell], models: Sequence[str], include_datasheet_only: bool = False,
         by_cost: bool = False) -> list[FitCell]:
    """``cells`` with their rank: per workload, the cells kept (no excluded reason) by output tokens per second
    per device, best first; ``by_cost`` (prices given): by cost per million output tokens, cheapest first, the
    cells without a price after the priced ones (by throughput per device). A cell of a device whose catalog entry
    is datasheet only (``datasheet_only``: the achievable figures it lacks) is ranked after every like-for-like
    cell, unless ``include_datasheet_only``."""
    def key(i: int):
        c = cells[i]
        cost = c.cost_per_million_output_tokens if by_cost else None
        return (bool(c.datasheet_only) and not include_datasheet_only, cost is None,
                cost if cost is not None else -c.throughput_per_device)

    out = list(cells)
    for m in models:
        ok = sorted((i for i, c in enumerate(cells) if c.model == m and not c.excluded_reason), key=key)
        for r, i in enumerate(ok, 1):
            out[i] = replace(cells[i], rank=r)
    return out


def fit_matrix(models: Sequence[str], hardware: Sequence[str], slo, input_len: str = "512",
               output_len: str = "128", requests: int | None = None, dtype: str = "bf16", devices: int | None = None,
               power_budget_w: float | None = None, prices: dict[str, float] | None = None, seed: int = 0,
               progress: Callable[[str, int, int], None] | None = None, engine: str = "local",
               workers: int | None = None, runtime: str = "engine", devices_budget: int | None = None,
               include_datasheet_only: bool = False, *, policy=None, kv_dtype: str | None = None,
               gpu_memory_utilization: float = 0.9, presets=None) -> FitMatrix:
    """Every (model, platform) cell, one task each on ``engine`` (``opmap.explore.engine``: a local process pool
    or Ray; the same cells either way), then ranked per workload (by cost per token where ``prices`` are
    given). ``requests``: per capacity run (default ``CAPACITY_REQUESTS``, serve's). ``policy`` (default serve's),
    ``kv_dtype`` and ``gpu_memory_utilization``: the engine settings every cell's search runs under, as serve's.
    ``presets``: vendor (lower case, "*" for all) -> an opmap.engines.apply.Applied: each platform's engine stack
    (a platform whose vendor has none runs ``policy``).
    Stopped (``Interrupted``: Ctrl-C, SIGTERM) once a cell has finished, the stop
    carries as ``partial`` the matrix of the finished cells, ranked among themselves, with ``interrupted``: the
    signal, the cells done and the cells not run."""
    from opmap.explore.engine import check_engine, get_engine
    from opmap.phases.runtime import check_runtime
    from opmap.serve.capacity import CAPACITY_REQUESTS

    check_engine(engine)
    check_runtime(runtime)
    check_models(models)
    requests = requests or CAPACITY_REQUESTS
    policy = policy or default_policy()
    from opmap.serve.model_cost import check_kv_dtype
    from opmap.validate import Rule, options

    kvd = check_kv_dtype(kv_dtype, dtype)  # the engine settings checked once, as serve checks them
    options({"--gpu-memory-utilization": (gpu_memory_utilization, Rule(lo=0, hi=1, lo_open=True))})
    if devices is not None and devices_budget is not None and devices > devices_budget:
        raise OpmapError(f"--devices {devices} per replica exceeds --devices-budget {devices_budget}")
    prices = prices or {}
    unknown = sorted(set(prices) - {get_hardware(h).name for h in hardware})
    if unknown:
        raise OpmapError(f"--price names {', '.join(unknown)}, not among --hardware {', '.join(hardware)}")
    jobs = [CellJob(m, h, slo, input_len, output_len, requests, dtype, devices, power_budget_w,
                    prices.get(get_hardware(h).name), seed, runtime, devices_budget, policy, kv_dtype,
                    gpu_memory_utilization, _stack(presets, h)) for m in models for h in hardware]
    if progress:
        progress(f"{len(jobs)} cells on {engine}", 0, len(jobs))
    stop = None
    from opmap.explore.fit_progress import Notes, cell_label

    with get_engine(engine, workers) as eng, Notes(jobs, progress, engine) as notes:
        try:
            cells = eng.map(cell_task, notes.jobs, progress=notes.cell_done, label=cell_label, cost=cell_cost)
        except Interrupted as e:  # the cells finished are kept, in their order; the rest named
            stop, cells = e, [e.done[i] for i in sorted(e.done)]
    r = FitMatrix(SCHEMA_VERSION, tuple(models), tuple(get_hardware(h).name for h in hardware), slo, input_len,
                  output_len, requests, dtype, runtime, devices_budget, include_datasheet_only,
                  tuple(rank(cells, models, include_datasheet_only, by_cost=bool(prices))), engine,
                  engine_settings(policy, kvd, kv_dtype, gpu_memory_utilization, presets), power_budget_w, prices)
    r = replace(r, assumptions=tuple(assumptions(r)))
    if stop is not None and cells:
        stop.partial = replace(r, interrupted=FitStop(stop.name, len(cells), len(jobs), tuple(
            f"{j.model} on {get_hardware(j.hardware).name}" for i, j in enumerate(jobs) if i not in stop.done)))
    if stop is not None:
        raise stop
    return r


def _stack(presets, hardware: str):
    """The engine preset (an Applied) of ``hardware``'s vendor among ``presets``; None without one."""
    if not presets:
        return None
    vendor = str(get_hardware(hardware).vendor).lower()
    return presets.get(vendor, presets.get("*"))


def engine_settings(policy, kv_dtype: str, kv_dtype_given: str | None, gpu_memory_utilization: float,
                    presets=None) -> dict:
    """The engine settings every cell ran under (serve's --kv-dtype, --max-num-seqs, --max-num-batched-tokens,
    --gpu-memory-utilization): what fit.json and the header state; with ``presets``, each vendor's engine stack
    (a cell's own sizes in its ``engine_preset``)."""
    lim = policy.limits  # the policy's own limits (serve.json's ``scheduler``), None where it has none
    out = {"policy": policy.spec(), "max_num_seqs": lim.max_num_seqs,
           "max_num_batched_tokens": lim.max_num_batched_tokens, "kv_block": lim.kv_block, "kv_dtype": kv_dtype,
           "kv_dtype_source": "--kv-dtype" if kv_dtype_given else "default: the model dtype's activation format",
           "gpu_memory_utilization": gpu_memory_utilization}
    if presets:
        out["engine_presets"] = {v: a.preset.spec for v, a in presets.items()}
    return out


def assumptions(r: FitMatrix) -> list[str]:
    """What a fit assumed, in words: the engine settings, the layouts, the ranking, the power."""
    es = r.engine_settings or {}
    ds = " (here ranked with them: --include-datasheet-only)" if r.include_datasheet_only else ""
    by = ("cost per million output tokens (price per device-hour x devices / (output tokens/s x 3600) x 1e6), "
          "cheapest first, cells without a price after" if r.prices_usd_per_device_hour else
          "output tokens/s per device")
    out = [f"policy {es.get('policy') or default_policy().spec()} (serve's defaults unless given), Poisson "
           "arrivals; capacity per layout: the steady-state search serve --find-capacity runs (the highest rate "
           "meeting the SLO with a stationary queue, warm-up and cool-down excluded, never above the offline "
           "saturation rate)",
           "layouts: TP the powers of two up to the scale-up domain that divide the heads, PP up to twice the "
           "stages the weights need (across domains on the scale-out network), replicas filling the devices "
           "budget (default one node), each replica a Poisson share of the traffic; chosen: the most "
           "output tokens/s per device of the budget, the runner-up beside it",
           f"ranked per workload by {by}; a device whose catalog lacks achievable figures (datasheet only) ranked "
           f"after the others{ds}",
           "power modelled: devices x (idle + (TDP - idle) x busy fraction), idle the catalog's idle_power_w "
           f"(measured or estimated, each cell's power_method says which and why; {IDLE_FRACTION:.0%} of TDP, "
           "assumed, only where a device has none); no device's draw is measured here",
           "one task per cell on the engine (local process pool or Ray): the same cells either way"]
    if es.get("engine_presets"):
        stacks = ", ".join(f"{'every vendor' if v == '*' else v}: {s}" for v, s in es["engine_presets"].items())
        out.insert(1, f"engine stacks ({stacks}): each platform's memory fraction and scheduler sized by that "
                      "engine's rules (opmap.engines) per layout, in its cell's engine_preset; a platform whose "
                      f"vendor has none runs {es.get('policy')}")
    if r.power_budget_w is not None:
        out.append(f"power budget {r.power_budget_w:g} W: each layout keeps the replicas whose modelled draw at "
                   "the SLO rate fits it (fewer devices than the budget where needed); a cell is struck only where "
                   "one replica of every layout with a rate at the SLO draws more (layouts the search pruned by "
                   "their throughput bound are not reconsidered)")
    return out
