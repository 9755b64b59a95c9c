"""The closure memo of the runs that are not one graph's kernels: fit, plan, sweep, serve (and shape-check).

Each kind's findings are the ones its result supports, owners assigned as the kernel memo (memo.py) assigns
them, by bound class (``BOUND_OWNER``: memory and compute to the ML compiler owner, overhead and interconnect to
the runtime owner) or by what the fix touches (a parallel layout, a batch cap, admission and replicas: the
runtime owner; a prediction that disagrees with a measurement: the performance modelling owner):

- **fit**: per workload, the ranking (the winner, how far ahead of the runner-up, its bound), each struck cell
  with its reason, and the SLO (how many platforms it leaves, the winner's p99 against the limit);
- **plan**: the best layout and why (against the best layout of another shape: throughput, bubble, MFU,
  memory), a pipeline bubble worth a finding, the layouts memory rejected;
- **sweep**: the knee (latency against throughput along the batch), the bound there, points that do not fit;
- **serve**: the SLO verdict, and the tail (p99 over p50, the queueing share of it, utilisation);
- **bench** (a measured load run): the throughput carried (achieved of offered, tokens/s, requests ok), TTFT /
  TPOT / end-to-end p50 / p95 / p99 against the SLO and the goodput, validity, failed requests by kind, a client
  that fell behind its schedule, a saturated server (achieved under offered), the TTFT tail, usage counts that
  differ from what was asked;
- **shape-check**: each kernel class whose synthetic shape does not stand for production.

Every value is read from the run's own result; nothing is re-run. A field the result lacks gives no finding
rather than a wrong one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from opmap.report.finding import Check, Finding
from opmap.store.source import Run

BOUND_OWNER = {
    "memory": ("ML compiler", "fuse the elementwise work into its producers, narrower activations (--fusion "
                              "compiler)", "low: numerics unchanged by fusion; watch compile time"),
    "compute": ("ML compiler", "a better tile or the next narrower matrix format", "high without quality evidence "
                                                                                     "for a narrower format (opmap "
                                                                                     "quality)"),
    "overhead": ("runtime", "remove launches: CUDA graphs, or more work per launch (a larger batch)",
                 "medium: graph capture fixes shapes; dynamic shapes need buckets"),
    "interconnect": ("runtime", "overlap the collective with compute or change the parallel layout (opmap plan)",
                     "medium: overlap needs spare bandwidth and streams"),
}
SLO_REQUESTS = 1000  # a p99 over fewer requests rests on fewer than 10 of them


def _dicts(x: Any) -> list[dict[str, Any]]:
    return [v for v in x if isinstance(v, dict)] if isinstance(x, list) else []


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _si(x: float | None, unit: str = "") -> str:
    from opmap.report.sheet import si

    return "-" if x is None else si(x, unit)


def _finding(text: str, owner: str, fix: str, risk: str, rollback: str, gain_s: float | None = None,
             gain: str | None = None) -> Finding:
    return Finding(text, owner, fix, gain_s, gain, risk, rollback)


def _by_bound(bound: Any) -> tuple[str, str, str]:
    return BOUND_OWNER.get(str(bound), ("performance modelling", f"no owner rule for bound {bound!r}: look at the "
                                        "kernels (opmap analyze)", "low"))


def _rollback(run: Run) -> str:
    return f"keep what runs today; run {run.id} records this {run.kind}: re-run it after the change"


def fit_findings(run: Run) -> list[Finding]:
    p = run.payload
    cells = _dicts(p.get("cells"))
    out = []
    for m in dict.fromkeys(str(c.get("model")) for c in cells):
        mine = [c for c in cells if str(c.get("model")) == m]
        ranked = sorted((c for c in mine if isinstance(c.get("rank"), int) and _num(c.get("throughput_at_slo"))),
                        key=lambda c: c["rank"])
        if ranked:
            out.append(_fit_winner(run, m, ranked))
        out += [_fit_struck(run, m, c) for c in mine if c.get("excluded_reason")]
        out.append(_fit_slo(run, m, mine, ranked))
    return out


def _fit_winner(run: Run, m: str, ranked: list[dict[str, Any]]) -> Finding:
    w = ranked[0]
    owner, fix, risk = _by_bound(w.get("bound"))
    text = (f"{m}: {w.get('hardware')} ranks first, {_si(_num(w['throughput_at_slo']))} output tokens/s at the SLO "
            f"on {w.get('devices')} device(s), p99 {_si(_num(w.get('latency_p99_s')), 's')}, {w.get('bound')}-bound, "
            f"software risk {w.get('risk')}")
    gain = None
    if len(ranked) > 1 and _num(ranked[1]["throughput_at_slo"]):
        x = w["throughput_at_slo"] / ranked[1]["throughput_at_slo"]
        text += f"; x{x:.3g} the runner-up {ranked[1].get('hardware')}"
        gain = f"x{x:.3g} tokens/s at the SLO over {ranked[1].get('hardware')} (from the model)"
    return _finding(text, owner, f"deploy on {w.get('hardware')}; then, for its {w.get('bound')} bound: {fix}",
                    risk, _rollback(run), gain=gain)


def _fit_struck(run: Run, m: str, c: dict[str, Any]) -> Finding:
    why = str(c["excluded_reason"])
    if why.startswith("does not fit"):
        owner, fix = "runtime", "more devices per replica (tensor parallel across nodes) or a narrower weight format"
    elif why.startswith(("draws", "power")):
        owner, fix = "runtime", "a lower rate or fewer devices under the budget (opmap serve --find-capacity)"
    else:
        owner, fix, _ = _by_bound(c.get("bound"))
    return _finding(f"{m} on {c.get('hardware')} struck: {why}", owner, fix,
                    "low: the platform stays out of the ranking until this changes", _rollback(run))


def _slo_text(slo: dict[str, Any]) -> str:
    if _num(slo.get("p99_s")) is not None:
        return f"p99 end to end {slo['p99_s'] * 1e3:g} ms"
    parts = [f"p99 {k} {slo[f'{k.lower()}_s'] * 1e3:g} ms" for k in ("TTFT", "TPOT")
             if _num(slo.get(f"{k.lower()}_s")) is not None]
    return ", ".join(parts) or "-"


def _fit_slo(run: Run, m: str, mine: list[dict[str, Any]], ranked: list[dict[str, Any]]) -> Finding:
    slo = run.payload.get("slo") if isinstance(run.payload.get("slo"), dict) else {}
    text = f"{m}: the SLO ({_slo_text(slo)}) leaves {len(ranked)} of {len(mine)} platforms"
    if ranked and _num(ranked[0].get("latency_p99_s")) is not None:
        text += f"; the winner serves at p99 end to end {_si(ranked[0]['latency_p99_s'], 's')}"
    return _finding(text, "runtime", "the batching policy's token budget trades throughput for the p99: probe the "
                    "winner's capacity (opmap serve --find-capacity)", "low: a policy setting", _rollback(run))


def fit_pitfalls(run: Run) -> list[Check]:
    p = run.payload
    cells = _dicts(p.get("cells"))
    n = _num(p.get("requests"))
    modelled = [c for c in cells if str(c.get("power_method", "")).startswith("modelled")]
    risky = sorted({str(c.get("hardware")) for c in cells if c.get("rank") == 1 and c.get("risk") not in ("low",)})
    return [_sim_check(),
            _p99_check(n),
            Check("power modelled, not measured",
                  (f"flag: {len(modelled)} of {len(cells)} cells' watts are modelled (TDP and busy fraction); "
                   "measure the winner's draw before quoting perf per watt") if modelled else "ok: -"),
            Check("software-stack risk of the winner",
                  ("flag: " + ", ".join(risky) + " ranks first at a risk above low") if risky else
                  "ok: every winner's stack is low risk")]


def _sim_check() -> Check:
    return Check("simulated, not measured load",
                 "flag: a discrete-event simulation priced by the cost model; measure the chosen platform "
                 "under real load before committing")


def _p99_check(n: float | None) -> Check:
    ok = n is not None and n >= SLO_REQUESTS
    return Check("a p99 over too few requests",
                 (f"ok: {n:.0f} requests" if ok else
                  f"flag: {'-' if n is None else f'{n:.0f}'} requests per run: a p99 rests on fewer than "
                  f"10 of them (use --requests {SLO_REQUESTS} or more)"))


def plan_findings(run: Run) -> list[Finding]:
    p = run.payload
    ranked, rejected = _dicts(p.get("ranked")), _dicts(p.get("rejected"))
    if not ranked:
        return [_finding("no layout is legal and fits", "runtime", "more devices, a shorter sequence or a smaller "
                         "batch", "low", _rollback(run))]
    best = ranked[0]
    out = [_plan_best(run, best, ranked)]
    bubble, step = _num(best.get("bubble_fraction")) or 0.0, _num(best.get("step_s"))
    if bubble >= 0.1:
        out.append(_finding(f"pipeline bubble {bubble:.0%} of {best.get('layout')}'s step", "runtime",
                            "more microbatches per step or interleaved stages (--vp)", "low: the schedule only",
                            _rollback(run), gain_s=step * bubble if step else None))
    memory = [c for c in rejected if "memory" in str(c.get("reason", "")) or "fit" in str(c.get("reason", ""))]
    if memory:
        out.append(_finding(f"{len(memory)} of {len(rejected)} rejected layouts fail on memory, e.g. "
                            f"{memory[0].get('layout')}: {memory[0].get('reason')}", "runtime",
                            "activation recompute or a higher ZeRO stage admits them (opmap plan ranks them then)",
                            "medium: recompute costs step time", _rollback(run)))
    return out


def _shape(c: dict[str, Any]) -> tuple:
    return tuple(c.get(k) for k in ("tp", "pp", "dp", "ep"))


def _plan_best(run: Run, best: dict[str, Any], ranked: list[dict[str, Any]]) -> Finding:
    p = run.payload
    mem, cap = _num(best.get("memory_bytes")), _num(best.get("capacity_bytes"))
    text = (f"{best.get('layout')} ranks first by {p.get('objective', 'throughput')}: "
            f"{_si(_num(best.get('tokens_per_s')))} tokens/s, step {_si(_num(best.get('step_s')), 's')}, "
            f"MFU {(_num(best.get('mfu')) or 0):.1%}, bubble {(_num(best.get('bubble_fraction')) or 0):.0%}, "
            f"memory {_si(mem, 'B')} of {_si(cap, 'B')}")
    other = next((c for c in ranked[1:] if _shape(c) != _shape(best)), None)
    gain = None
    if other is not None:
        t0, t1 = _num(best.get("tokens_per_s")), _num(other.get("tokens_per_s"))
        text += (f"; why: ahead of the best other shape {other.get('layout')}"
                 + (f" (x{t0 / t1:.3g} tokens/s)" if t0 and t1 else "")
                 + f": bubble {(_num(best.get('bubble_fraction')) or 0):.0%} vs "
                   f"{(_num(other.get('bubble_fraction')) or 0):.0%}, MFU {(_num(best.get('mfu')) or 0):.1%} vs "
                   f"{(_num(other.get('mfu')) or 0):.1%}")
        s0, s1 = _num(best.get("step_s")), _num(other.get("step_s"))
        gain = s1 - s0 if s0 is not None and s1 is not None and s1 > s0 else None
    return _finding(text, "runtime", f"run the step as {best.get('layout')}",
                    "medium: a new layout moves memory per device; profile the step before and after",
                    _rollback(run), gain_s=gain, gain=None if gain is None else
                    f"{_si(gain, 's')} per step against {other.get('layout')} (from the model)")


def plan_pitfalls(run: Run) -> list[Check]:
    p = run.payload
    ranked = _dicts(p.get("ranked"))
    out = [Check("a predicted plan", "flag: every layout's time is predicted; profile the top two "
                                      "layouts on the devices before committing")]
    overlap = [str(a) for a in (p.get("assumptions") or []) if "overlap" in str(a)]
    out.append(Check("overlap of collectives assumed",
                     ("flag: " + "; ".join(overlap) + " (a runtime that overlaps differently reorders the "
                      "ranking)") if overlap else "ok: no overlap assumption recorded"))
    if ranked:
        top = _num(ranked[0].get("tokens_per_s"))
        ties = [c for c in ranked if top and _num(c.get("tokens_per_s")) == top]
        least = min(ties, key=lambda c: _num(c.get("memory_bytes")) or 0.0)
        out.append(Check("ties at the top",
                         (f"flag: {len(ties)} layouts tie at {_si(top)} tokens/s; the least memory is "
                          f"{least.get('layout')} ({_si(_num(least.get('memory_bytes')), 'B')})")
                         if len(ties) > 1 else "ok: one best layout"))
    return out


def sweep_findings(run: Run) -> list[Finding]:
    p = run.payload
    points = _dicts(p.get("points"))
    at = {(c.get("batch"), c.get("seq")): c for c in points}
    out = []
    for k in _dicts(p.get("knee")):
        kp = at.get((k.get("batch"), k.get("seq")))
        if kp is not None:
            line = sorted((c for c in points if c.get("seq") == kp.get("seq")), key=lambda c: _num(c.get("batch")) or 0)
            out += _knee(run, kp, line, len(_dicts(p.get("pareto"))))
    unfit = [c for c in points if c.get("fits") is False]
    if unfit:
        out.append(_finding(f"{len(unfit)} of {len(points)} points do not fit memory, from batch "
                            f"{min(c.get('batch') or 0 for c in unfit)} (seq {unfit[0].get('seq')})", "runtime",
                            "a paged KV cache, recompute, or a batch cap below them", "low", _rollback(run)))
    return out


def _knee(run: Run, kp: dict[str, Any], line: list[dict[str, Any]], pareto: int) -> list[Finding]:
    first, last = line[0], line[-1]
    lat, tps = _num(kp.get("latency_s")), _num(kp.get("tokens_per_s"))
    l0, t0, ll = _num(first.get("latency_s")), _num(first.get("tokens_per_s")), _num(last.get("latency_s"))
    text = (f"knee at batch {kp.get('batch')}, seq {kp.get('seq')}: {_si(lat, 's')}, {_si(tps)} tokens/s"
            + (f" (x{tps / t0:.3g} the tokens/s of batch {first.get('batch')} for x{lat / l0:.3g} its latency)"
               if lat and tps and l0 and t0 else "")
            + f"; past it latency grows faster than throughput; {pareto} points on the Pareto front")
    saved = ll - lat if ll is not None and lat is not None and ll > lat else None
    out = [_finding(text, "runtime", f"cap the batch at {kp.get('batch')} where latency matters (the Pareto end "
                    "where throughput does)", "low: a batching setting", _rollback(run), gain_s=saved,
                    gain=None if saved is None else f"{_si(saved, 's')} less latency than batch {last.get('batch')} "
                                                    "(from the model)")]
    mix = kp.get("bound_mix") if isinstance(kp.get("bound_mix"), dict) else {}
    if mix:
        bound, share = max(mix.items(), key=lambda kv: _num(kv[1]) or 0.0)
        owner, fix, risk = _by_bound(bound)
        out.append(_finding(f"at the knee {(_num(share) or 0):.0%} of the time is {bound}-bound", owner, fix, risk,
                            _rollback(run)))
    return out


def sweep_pitfalls(run: Run) -> list[Check]:
    points = _dicts(run.payload.get("points"))
    tails = [c for c in points if _num(c.get("latency_p99_s")) is not None]
    seqs = {c.get("seq") for c in points}
    measured = [c for c in points if _num(c.get("energy_j")) is not None]
    return [Check("averages without p95 / p99",
                  (f"ok: p50 / p95 / p99 at {len(tails)} of {len(points)} points" if tails and
                   len(tails) == len(points) else "flag: predicted points carry no distribution; measure the "
                                                   "knee (opmap sweep --measure) before quoting a latency")),
            Check("energy measured",
                  (f"ok: measured at {len(measured)} points" if measured else "flag: no point's energy was "
                                                                            "measured")),
            Check("one sequence length generalised",
                  ("flag: one sequence length only; sweep the production range before generalising"
                   if len(seqs) < 2 else f"ok: {len(seqs)} sequence lengths"))]


def serve_findings(run: Run) -> list[Finding]:
    p = run.payload
    val = p.get("validity") if isinstance(p.get("validity"), dict) else {}
    lat = p.get("latency") if isinstance(p.get("latency"), dict) else {}
    verdict = str(val.get("verdict", "-"))
    reason = str(val.get("reason", ""))
    if verdict == "VALID":
        owner, fix = "runtime", "raise the load to the capacity the SLO allows (opmap serve --find-capacity)"
    elif "TPOT" in reason and "TTFT" not in reason:
        owner, fix, _ = _by_bound("memory")  # a decode step reads the weights and the KV cache: memory-bound
    else:
        owner, fix = "runtime", "admission and prefill scheduling: chunked prefill, a token budget, more replicas"
    out = [_finding(f"SLO {verdict}: {reason}", owner, fix, "low: a serving setting", _rollback(run))]
    tail = _tail(p, lat)
    if tail is not None:
        out.append(replace(tail, rollback=_rollback(run)))
    return out


def _tail(p: dict[str, Any], lat: dict[str, Any]) -> Finding | None:
    e2e = lat.get("e2e") if isinstance(lat.get("e2e"), dict) else {}
    ttft = lat.get("ttft") if isinstance(lat.get("ttft"), dict) else {}
    queue = lat.get("queue") if isinstance(lat.get("queue"), dict) else {}
    p50, p99 = _num(e2e.get("p50_s")), _num(e2e.get("p99_s"))
    if not p50 or p99 is None:
        return None
    q99, t99 = _num(queue.get("p99_s")), _num(ttft.get("p99_s"))
    util = [u for u in (p.get("utilization") or []) if _num(u) is not None]
    qshare = q99 / t99 if q99 is not None and t99 else None
    text = (f"tail: p99 end to end {_si(p99, 's')}, x{p99 / p50:.3g} the p50"
            + (f"; queueing is {qshare:.0%} of the p99 TTFT" if qshare is not None else "")
            + (f"; utilisation {max(util):.0%}" if util else ""))
    if qshare is not None and qshare > 0.5:
        fix = "the tail is queueing: more replicas, least-loaded routing or a larger token budget"
    else:
        fix = "the tail is service time: chunked prefill keeps long prompts from stalling decodes"
    return _finding(text, "runtime", fix, "medium: more replicas cost devices; chunking costs TTFT", "",
                    gain_s=(q99 if qshare is not None and qshare > 0.5 else None))


def serve_pitfalls(run: Run) -> list[Check]:
    p = run.payload
    reqs = p.get("requests") if isinstance(p.get("requests"), dict) else {}
    a = p.get("assumptions") if isinstance(p.get("assumptions"), dict) else {}
    kv = str(a.get("kv_cache", ""))
    return [_sim_check(), _p99_check(_num(reqs.get("count"))),
            Check("the memory tail (KV pressure, preemption)",
                  ("flag: " + kv + ": the p99 under KV pressure is not modelled") if "no preemption" in kv
                  else "ok: " + (kv or "-"))]


def shape_check_findings(run: Run) -> list[Finding]:
    p = run.payload
    out = []
    for c in _dicts(p.get("classes")):
        if c.get("production_kernels") and c.get("verdict") != "carries over":
            out.append(_finding(f"{c.get('class')}: the synthetic slice {p.get('synthetic')} {c.get('verdict')} for "
                                f"production run {p.get('production')} "
                                f"({(_num(c.get('represented_share_of_class')) or 0):.0%} of the class's production "
                                "time represented)", "performance modelling",
                                "add a synthetic slice at the production shapes the class lacks", "low: the "
                                "benchmark only", _rollback(run)))
    return out


def calibrate_findings(run: Run) -> list[Finding]:
    p = run.payload
    peaks = p.get("matrix_peak_flops_per_s") if isinstance(p.get("matrix_peak_flops_per_s"), dict) else {}
    bw = p.get("memory_bandwidth_bytes_per_s") if isinstance(p.get("memory_bandwidth_bytes_per_s"), dict) else {}
    rates = ", ".join(f"{dt} {_si(_num(v.get('value')), 'FLOP/s')}" for dt, v in peaks.items() if isinstance(v, dict))
    skipped = (p.get("calibration") or {}).get("skipped") if isinstance(p.get("calibration"), dict) else None
    text = (f"measured on {p.get('display_name', run.tags.get('hardware'))}: matrix peaks {rates or '-'}; copy "
            f"bandwidth {_si(_num(bw.get('value')), 'B/s')}" + (f"; skipped: {skipped}" if skipped else ""))
    return [_finding(text, "performance modelling", "predict and profile with --hardware local (this profile); "
                     "re-calibrate when the runtime changes", "low: the model only",
                     "keep the previous profile file (opmap calibrate --out writes elsewhere)")]


def calibrate_pitfalls(run: Run) -> list[Check]:
    quick = "(quick)" in str(run.tags.get("workload", ""))
    return [Check("a quick calibration",
                  "flag: --quick is a smoke test, not a profile to trust" if quick else "ok: the full grid")]


def bench_findings(run: Run) -> list[Finding]:
    p = run.payload
    val = p.get("validity") if isinstance(p.get("validity"), dict) else {}
    errs = {k: v for k, v in (p.get("errors") or {}).items() if _num(v)} if isinstance(p.get("errors"), dict) else {}
    lag = p.get("scheduler_lag") if isinstance(p.get("scheduler_lag"), dict) else {}
    rate = p.get("rate") if isinstance(p.get("rate"), dict) else {}
    ttft = (p.get("latency") or {}).get("ttft") if isinstance(p.get("latency"), dict) else None
    use = p.get("usage_check") if isinstance(p.get("usage_check"), dict) else {}
    rb = _rollback(run)
    out = [f for f in (_bench_throughput(p, rb), _bench_slo(p, rb)) if f is not None]
    if val:
        out.append(_finding(f"measured load {val.get('verdict', '-')}: {val.get('reason', '')}",
                            "performance modelling", "run long enough for the rule (--duration 600, --requests past "
                            "--min-queries)", "low: the benchmark only", rb))
    if errs:
        out.append(_finding("failed requests: " + ", ".join(f"{k} {v}" for k, v in errs.items()), "runtime",
                            "the server's log: an HTTP 400 is a prompt past the context, timeouts a load past "
                            "capacity, dropped streams a crash or a proxy limit", "low: diagnosis", rb))
    if lag.get("behind"):
        out.append(_finding(f"the client fell behind its schedule (send lag p99 {_si(_num(lag.get('p99_s')), 's')}): "
                            "the figures measure the client as well as the server", "performance modelling",
                            "a lower rate, or the client on a machine of its own (benchmarks/bench_loadgen.py "
                            "gives the client's ceiling)", "low: the benchmark only", rb))
    off, ach = _num(rate.get("offered_per_s")), _num(rate.get("achieved_per_s"))
    if off and ach is not None and ach < 0.95 * off:
        out.append(_finding(f"saturated: {ach:.4g} requests/s achieved of {off:.4g} offered", "runtime",
                            "more replicas or a larger batch budget on the server; or take the achieved rate as "
                            "its capacity", "medium: replicas cost devices", rb))
    if isinstance(ttft, dict) and _num(ttft.get("p50_s")) and _num(ttft.get("p99_s")) is not None:
        r = ttft["p99_s"] / ttft["p50_s"]
        out.append(_finding(f"TTFT tail: p99 {_si(ttft['p99_s'], 's')}, x{r:.3g} the p50", "runtime",
                            "queueing at admission: chunked prefill, a token budget, or more replicas" if r > 3 else
                            "a tight tail: no action", "low: a serving setting", rb))
    if _num(use.get("output_mismatches")):
        out.append(_finding(f"output tokens differ from max_tokens on {use['output_mismatches']} requests (mean "
                            f"{use.get('output_diff_mean')}): the server stopped early (EOS) or ignores ignore_eos",
                            "performance modelling", "send ignore_eos where the server takes it, or compare "
                            "per output token (TPOT)", "low: the benchmark only", rb))
    return out


def _bench_throughput(p: dict[str, Any], rb: str) -> Finding | None:
    """What the server carried: requests ok of those measured, the achieved rate (of the offered one in an open
    loop), output and total tokens/s. None where the result holds no throughput."""
    tp = p.get("throughput") if isinstance(p.get("throughput"), dict) else {}
    reqs = p.get("requests") if isinstance(p.get("requests"), dict) else {}
    rate = p.get("rate") if isinstance(p.get("rate"), dict) else {}
    ach = _num(rate.get("achieved_per_s"))
    ach = ach if ach is not None else _num(tp.get("requests_per_s"))
    if ach is None:
        return None
    off = _num(rate.get("offered_per_s"))
    ok, n, failed = _num(reqs.get("ok")), _num(reqs.get("measured")), _num(reqs.get("failed"))
    text = (f"throughput: {ach:.4g} requests/s achieved" + (f" of {off:.4g} offered" if off else "")
            + f", {_si(_num(tp.get('output_tokens_per_s')), 'tokens/s')} out, "
            f"{_si(_num(tp.get('tokens_per_s')), 'tokens/s')} in all"
            + (f"; {ok:.0f} of {n:.0f} requests ok" + (f", {failed:.0f} failed" if failed else ", none failed")
               if ok is not None and n is not None else ""))
    return _finding(text, "runtime", "the rate this server carried at this load; raise the load (--concurrency, "
                    "--arrival poisson:R) to find where the SLO breaks", "low: the benchmark only", rb)


def _pcts(d: Any) -> tuple[float | None, ...]:
    d = d if isinstance(d, dict) else {}
    return tuple(_num(d.get(k)) for k in ("p50_s", "p95_s", "p99_s"))


def _bench_slo(p: dict[str, Any], rb: str) -> Finding | None:
    """TTFT, TPOT and end-to-end p50 / p95 / p99 against the SLO the run was given (--slo-ttft / --slo-tpot: a
    request within both counts toward goodput), and the goodput. None where the result holds no latency."""
    lat = p.get("latency") if isinstance(p.get("latency"), dict) else {}
    good = p.get("goodput") if isinstance(p.get("goodput"), dict) else {}
    slo = good.get("slo") if isinstance(good.get("slo"), dict) else {}
    parts, over = [], []
    for key, name in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "end to end")):
        ps = _pcts(lat.get(key))
        if all(v is None for v in ps):
            continue
        limit = _num(slo.get(f"{key}_s"))
        text = f"{name} p50 / p95 / p99 " + " / ".join(_si(v, "s") for v in ps)
        if limit is not None:
            missed = ps[2] is not None and ps[2] > limit
            text += f" ({'over' if missed else 'within'} the SLO {_si(limit, 's')} at p99)"
            if missed:
                over.append(name)
        parts.append(text)
    if not parts:
        return None
    g, att = _num(good.get("requests_per_s")), _num(good.get("attainment"))
    if g is not None:
        within = "within the SLO" if any(_num(v) is not None for v in slo.values()) else "ok (no SLO given)"
        parts.append(f"goodput {g:.4g} requests/s" + (f", {att:.1%} of requests {within}" if att is not None else ""))
    if "TTFT" in over:
        owner, fix = "runtime", "admission and prefill scheduling: chunked prefill, a token budget, more replicas"
    elif over:
        owner, fix, _ = _by_bound("memory")  # a decode step reads the weights and the KV cache: memory-bound
    else:
        owner, fix = "runtime", ("the SLO holds at this load: raise it to the capacity the SLO allows" if slo and
                                 any(_num(v) is not None for v in slo.values()) else
                                 "give the SLO (--slo-ttft, --slo-tpot) to count goodput against it")
    return _finding("latency: " + "; ".join(parts), owner, fix, "low: a serving setting", rb)


def bench_pitfalls(run: Run) -> list[Check]:
    p = run.payload
    reqs = p.get("requests") if isinstance(p.get("requests"), dict) else {}
    use = p.get("usage_check") if isinstance(p.get("usage_check"), dict) else {}
    missing = _num(use.get("requests_without_usage"))
    return [_p99_check(_num(reqs.get("ok"))),
            Check("token counts from the server's usage",
                  (f"flag: {missing:.0f} requests without usage: their tokens counted from stream events, "
                   "which may merge tokens") if missing else "ok: every request's usage reported")]


KINDS = {"bench": (bench_findings, bench_pitfalls), "fit": (fit_findings, fit_pitfalls),
         "plan": (plan_findings, plan_pitfalls),
         "sweep": (sweep_findings, sweep_pitfalls), "serve": (serve_findings, serve_pitfalls),
         "shape-check": (shape_check_findings, lambda run: []),
         "calibrate": (calibrate_findings, calibrate_pitfalls)}
