"""What the dashboard shows, as data: a run's sources (an output folder or a recorded run) and its figures as
typed Plotly figure specs (report.chart.Figure), rendered by report.html (inlined Plotly, the spec's JSON) and
report.figures (matplotlib PNGs). Nothing here imports plotly or matplotlib. Every string of a run placed in a
figure (a model id, a server's address, a layer type, a kernel's name, a reason) goes through
report.text.plotly_text: Plotly draws ``<a href>`` and other tags in titles, legends, axis labels and hover text.

Figures, each present when its source is:
- roofline: each kernel at (FLOPs / bytes, FLOPs / time), one colour per layer type, predicted points as
  circles and measured points (profile runs) as crosses; the device's ceilings: the memory slope
  (bandwidth x intensity) up to the matrix peak, the matrix peak at the run's matrix format and the vector
  peak (the values the run's assumptions carry; the catalog's where they are missing).
- time, MFU and memory-stall fraction by layer type (predicted; measured where profiled).
- sweep latency against throughput, one curve per sequence length; p50 / p95 / p99 where measured.
- serving latency CDFs (serve.json ``cdf``; an older serve.json without it: its percentiles as points); a
  measured load run's (bench.json ``cdf``) the same way.
- the fit matrix as a heatmap of throughput at the SLO; perf per watt of its cells.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from opmap.errors import OpmapError
from opmap.report.chart import (
    SIG_DIGITS,
    Axis,
    Bar,
    ColorBar,
    Figure,
    Heatmap,
    Layout,
    Line,
    Marker,
    Scatter,
    Title,
    Trace,
)
from opmap.report.sheet import si
from opmap.report.text import plotly_text as _p
from opmap.safeio import LIMIT_JSON_BYTES, read_json_object

FILES = ("profile.json", "analysis.json", "sweep.json", "serve.json", "fit.json", "bench.json")
KINDS = ("analyze", "profile", "sweep", "serve", "fit", "bench")
# one colour per layer type, the same in the HTML and the PNGs (Plotly's default qualitative palette, D3's)
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")


@dataclass
class Sources:
    """Everything one report shows. ``body``: the analysis.json / profile.json body (None for a sweep, serve
    or fit alone); ``kernels`` and ``layer_types``: its rows as the run store holds them."""

    title: str
    origin: str  # "run ID" or the folder
    tags: dict[str, Any]  # the run's telemetry tags as its file or the store holds them (opmap.tags.Tags.to_dict)
    body: dict[str, Any] | None = None
    kernels: list[dict[str, Any]] = field(default_factory=list)
    layer_types: list[dict[str, Any]] = field(default_factory=list)
    sweep: dict[str, Any] | None = None
    serve: dict[str, Any] | None = None
    fit: dict[str, Any] | None = None
    bench: dict[str, Any] | None = None  # a measured load run (opmap bench)
    trace: Path | None = None  # a Chrome trace already written (a profile's trace.json)

    @property
    def measured(self) -> bool:
        return any(k.get("measured_s") for k in self.kernels)


# the field each file cannot be without (a file lacking it is not opmap's)
REQUIRED = {"profile.json": "assumptions", "analysis.json": "assumptions", "sweep.json": "points",
            "serve.json": "latency", "fit.json": "cells", "bench.json": "latency"}


def _not_opmaps(path: Path) -> str:
    """Why a folder's JSON file is refused: it lacks the field it cannot be without."""
    return (f"{path} is not opmap's {path.name} (no {REQUIRED.get(path.name)!r}); accepted: the file opmap "
            f"{path.stem.replace('analysis', 'analyze')} --out writes")


def _check(d: dict[str, Any], path: Path) -> None:
    """A folder's JSON file holds the field it cannot be without (read by opmap.safeio.read_json_object: a regular
    file, never through a symbolic link)."""
    need = REQUIRED.get(path.name)
    if need and not d.get(need):
        raise OpmapError(_not_opmaps(path))
def from_dir(folder: Path) -> Sources:
    """The outputs of analyze / profile / sweep / serve / fit found in ``folder`` (profile.json is preferred to
    analysis.json: it is the same analysis with the measurement joined)."""
    from opmap.store.db import analysis_tags, payload_rows
    from opmap.store.source import folder_tags

    folder = Path(folder)
    if not folder.is_dir():
        raise OpmapError(f"{folder} is neither a run id in the store nor a folder")
    for name in (*FILES, "trace.json"):
        if (folder / name).is_symlink():  # a link could carry any file of this machine into the report
            raise OpmapError(f"{folder / name} is a symbolic link: opmap report reads only regular files in the "
                             "folder (copy the file in, or report the folder it points into)")
    found = {f: folder / f for f in FILES if (folder / f).is_file()}
    if not found:
        raise OpmapError(f"nothing to report in {folder}: accepted: a folder holding analysis.json, profile.json, "
                         "sweep.json, serve.json, fit.json or bench.json (opmap analyze/profile/sweep/serve/fit/"
                         "bench --out), "
                         "or a run id")
    src = Sources(title=f"opmap report: {folder}", origin=str(folder), tags={})
    main = found.get("profile.json") or found.get("analysis.json")
    if main is not None:
        src.body = read_json_object(main, LIMIT_JSON_BYTES, "run file", _not_opmaps(main))
        _check(src.body, main)
        src.kernels, src.layer_types = payload_rows(src.body)
        src.tags = dict(src.body.get("tags") or analysis_tags(src.body).to_dict())
        if (folder / "trace.json").is_file():
            src.trace = folder / "trace.json"
    for kind in ("sweep", "serve", "fit", "bench"):
        if f"{kind}.json" in found:
            f = found[f"{kind}.json"]
            d = read_json_object(f, LIMIT_JSON_BYTES, "run file", _not_opmaps(f))
            _check(d, f)
            setattr(src, kind, d)
            if not src.tags:
                src.tags = folder_tags(kind, d).to_dict()
    return src


def from_run(run_id: str, store: Path | None = None) -> Sources:
    """A recorded run (opmap runs list): its payload, tags and the store's kernel and layer-type rows."""
    from opmap.store import show_run
    from opmap.store.reading import run_rows

    run = show_run(run_id, store)
    kind = run.kind
    if kind not in KINDS:
        raise OpmapError(f"run {run_id} is a {kind} run; opmap report renders {', '.join(KINDS)} runs")
    src = Sources(title=f"opmap report: {kind} run {run_id}", origin=f"run {run_id}", tags=run.tags)
    if kind in ("analyze", "profile"):
        src.body = run.payload
        src.kernels, src.layer_types = run_rows(run_id, store)
    else:
        setattr(src, kind, run.payload)
    return src


def _colours(names: list[str]) -> dict[str, str]:
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(sorted(set(names)))}


def _value(v: Any) -> float | None:
    """A spec value as the assumptions carry it: a number or {"value": number, ...}."""
    if isinstance(v, dict):
        v = v.get("value")
    return float(v) if isinstance(v, (int, float)) and v > 0 else None


@dataclass(frozen=True)
class Ceilings:
    """The device's roofline ceilings (None: unknown, not drawn)."""

    hardware: str | None  # the device's display name (its catalog name where the run has none)
    format: str | None  # the run's matrix format, the one ``matrix_flops_per_s`` is the peak of
    matrix_flops_per_s: float | None
    vector_flops_per_s: float | None
    memory_bytes_per_s: float | None

    @property
    def top_flops_per_s(self) -> float | None:
        """The higher of the two compute peaks, the roof the memory slope rises to."""
        peaks = [v for v in (self.matrix_flops_per_s, self.vector_flops_per_s) if v]
        return max(peaks) if peaks else None


def _rate(v: Any) -> float | None:
    """A catalog rate (a sourced value) as a number; None where it is missing or zero."""
    return float(v.value) if v is not None and v.value else None


def ceilings(body: dict[str, Any]) -> Ceilings:
    """The device's roofline ceilings: matrix peak at the run's matrix format, vector peak, memory bandwidth,
    from the run's assumptions; the catalog entry fills what they lack."""
    a = body.get("assumptions") or {}
    c = Ceilings(hardware=a.get("hardware_display_name") or a.get("hardware"),
                 format=a.get("matrix_dtype") or a.get("dtype"),
                 matrix_flops_per_s=_value(a.get("matrix_peak_flops_per_s")),
                 vector_flops_per_s=_value(a.get("vector_peak_flops_per_s")),
                 memory_bytes_per_s=_value(a.get("memory_bandwidth_bytes_per_s")))
    if None in (c.matrix_flops_per_s, c.vector_flops_per_s, c.memory_bytes_per_s) and a.get("hardware"):
        from opmap.hardware import get_hardware

        try:
            hw = get_hardware(str(a["hardware"]))
        except (OpmapError, OSError, ValueError):
            return c
        c = replace(c, matrix_flops_per_s=c.matrix_flops_per_s or _rate(hw.matrix_peak_flops_per_s.get(str(c.format))),
                    vector_flops_per_s=c.vector_flops_per_s or _rate(hw.vector_peak_flops_per_s.get("fp32")),
                    memory_bytes_per_s=c.memory_bytes_per_s or hw.memory_bandwidth_bytes_per_s)
    return c


def _ceiling_lines(c: Ceilings, xs: list[float]) -> list[Trace]:
    """The memory slope up to the ridge and the matrix and vector peaks, spanning the points ``xs`` (FLOP/byte)
    and the ridge, x4 either side."""
    mem = c.memory_bytes_per_s
    if not xs or not mem:
        return []
    lo, hi = min(xs) / 4, max(xs) * 4
    top = c.top_flops_per_s
    if top:
        lo, hi = min(lo, top / mem / 4), max(hi, top / mem * 4)
    ridge = top / mem if top else hi
    out: list[Trace] = [Scatter(mode="lines", name=f"memory {mem / 1e9:.4g} GB/s", x=(lo, min(ridge, hi)),
                                y=(mem * lo, mem * min(ridge, hi)), line=Line("#000000", "solid"))]
    for peak, label, dash in ((c.matrix_flops_per_s, _p(f"matrix peak ({c.format})"), "dash"),
                              (c.vector_flops_per_s, "vector peak", "dot")):
        if peak:
            out.append(Scatter(mode="lines", name=f"{label} {peak / 1e12:.4g} TFLOP/s", x=(max(peak / mem, lo), hi),
                               y=(peak, peak), line=Line("#444444", dash)))
    return out


def _log_log(title: str, xtitle: str, ytitle: str) -> Layout:
    return Layout(Title(title), Axis(type="log", title=Title(xtitle)), Axis(type="log", title=Title(ytitle)))


def roofline(src: Sources) -> Figure | None:
    """Kernels on the device's roofline: x = FLOPs / bytes, y = FLOPs / time (FLOP/s), log-log."""
    if src.body is None or not src.kernels:
        return None
    pts = [k for k in src.kernels if (k.get("flops") or 0) > 0 and (k.get("bytes") or 0) > 0]
    colours = _colours([k.get("layer_type") or "other" for k in pts])
    data: list[Trace] = []
    for lt, colour in colours.items():
        mine = [k for k in pts if (k.get("layer_type") or "other") == lt]
        for what, key, symbol in (("predicted", "predicted_s", "circle"), ("measured", "measured_s", "x")):
            ks = [k for k in mine if k.get(key)]
            if not ks:
                continue
            data.append(Scatter(mode="markers", name=_p(f"{lt} ({what})"), legendgroup=_p(lt),
                                x=tuple(k["flops"] / k["bytes"] for k in ks), y=tuple(k["flops"] / k[key] for k in ks),
                                text=tuple(f"{_p(k.get('name'))}<br>{_p(k.get('bound') or '')}" for k in ks),
                                marker=Marker(colour, symbol, 7)))
    c = ceilings(src.body)
    data += _ceiling_lines(c, [x for t in data for x in t.x])
    title = _p(f"roofline on {c.hardware}") + (" (predicted and measured)" if src.measured else " (predicted)")
    return Figure(tuple(data), _log_log(title, "arithmetic intensity (FLOP/byte)", "attained FLOP/s"))


def _layer_bars(src: Sources, title: str, ytitle: str, series: list[tuple[str, str]],
                scale: float = 1.0) -> Figure | None:
    rows = sorted(src.layer_types, key=lambda r: -((r.get("measured_s") or r.get("predicted_s")) or 0))
    data: list[Trace] = []
    for name, key in series:
        ys = [r.get(key) for r in rows]
        if any(y is not None for y in ys):
            data.append(Bar(name=name, x=tuple(_p(r["layer_type"]) for r in rows),
                            y=tuple(None if y is None else y * scale for y in ys)))
    if not data:
        return None
    return Figure(tuple(data), Layout(Title(title), Axis(title=Title("layer type")), Axis(title=Title(ytitle)),
                                      barmode="group"))


def layer_time(src: Sources) -> Figure | None:
    return _layer_bars(src, "time by layer type", "time (s)", [("predicted", "predicted_s"),
                                                               ("measured", "measured_s")])


def layer_mfu(src: Sources) -> Figure | None:
    t = "MFU by layer type (matrix FLOPs / (time x dense matrix peak); measured time where profiled)"
    return _layer_bars(src, t, "MFU (%)", [("MFU", "mfu")], 100.0)


def layer_stall(src: Sources) -> Figure | None:
    return _layer_bars(src, "memory-stall fraction by layer type (measured, roofline-estimated)",
                       "stall fraction (%)", [("memory stall", "stall_fraction")], 100.0)


def _sweep_line(s: Any, ps: list[dict[str, Any]], colour: str) -> list[Trace]:
    """One sequence length's curves through its batches ``ps``: the prediction, and the measured percentiles."""
    text = tuple(_p(f"batch {p.get('batch')}") for p in ps)
    x = tuple(p.get("tokens_per_s") or p.get("throughput_per_s") for p in ps)
    measured = any(p.get("latency_p50_s") is not None for p in ps)
    if measured:
        pred = tuple((p.get("predicted") or {}).get("latency_s") for p in ps)
        px = tuple(None if not (t and xx and p.get("latency_s")) else xx * p["latency_s"] / t
                   for t, xx, p in zip(pred, x, ps))
    else:
        pred, px = tuple(p.get("latency_s") for p in ps), x
    hws = [(p.get("predicted") or {}).get("hardware") for p in ps] if measured else []
    on = next((h for h in hws if h), None)
    out: list[Trace] = []
    if any(t is not None for t in pred):
        out.append(Scatter(mode="lines+markers", name=_p(f"seq {s} predicted" + (f" on {on}" if on else "")), x=px,
                           y=pred, text=text, line=Line(colour, "solid"), marker=Marker(colour, "circle")))
    for pct, dash in (("p50", "dot"), ("p95", "dash"), ("p99", "longdash")):
        ys = tuple(p.get(f"latency_{pct}_s") for p in ps)
        if any(y is not None for y in ys):
            out.append(Scatter(mode="lines+markers", name=_p(f"seq {s} {pct} measured"), x=x, y=ys, text=text,
                               line=Line(colour, dash), marker=Marker(colour, "x")))
    return out


def sweep_curves(sw: dict[str, Any] | None) -> Figure | None:
    """Latency against throughput over the sweep's points, a curve per sequence length through its batches:
    the model's prediction, and p50 / p95 / p99 where the sweep measured them (--measure; its predicted
    latency then sits in each point's ``predicted``, at the same tokens per batch: tokens/s x latency)."""
    if not sw or not sw.get("points"):
        return None
    data: list[Trace] = []
    seqs = sorted({p.get("seq") for p in sw["points"]}, key=lambda s: (s is None, s or 0))
    for i, s in enumerate(seqs):
        ps = sorted((p for p in sw["points"] if p.get("seq") == s), key=lambda p: p.get("batch") or 0)
        data += _sweep_line(s, ps, PALETTE[i % len(PALETTE)])
    title = _p(f"sweep: latency against throughput ({sw.get('model')} on {sw.get('hardware')}, {sw.get('phase')})")
    return Figure(tuple(data), _log_log(title, "throughput (tokens/s)", "latency (s)"))


def _cdf_traces(sv: dict[str, Any]) -> list[Trace]:
    data: list[Trace] = []
    cdf = sv.get("cdf")
    for i, m in enumerate(("e2e", "ttft", "queue", "tpot")):
        colour = PALETTE[i]
        if cdf and cdf.get(f"{m}_s"):
            # a log axis: zero latencies (requests that never queued) sit at the left edge, not drawn
            pts = [(x, q) for x, q in zip(cdf[f"{m}_s"], cdf["quantiles"]) if x > 0]
            data.append(Scatter(mode="lines", name=m, x=tuple(x for x, _ in pts), y=tuple(q for _, q in pts),
                                line=Line(colour, "solid")))
        else:
            st = (sv["latency"].get(m) or {})
            qs = [q for q in (50, 90, 95, 99) if st.get(f"p{q}_s") is not None]
            if qs:
                data.append(Scatter(mode="markers", name=f"{m} (percentiles only)",
                                    x=tuple(st[f"p{q}_s"] for q in qs), y=tuple(q / 100 for q in qs),
                                    marker=Marker(colour, "circle")))
    return data


def serve_cdf(sv: dict[str, Any] | None) -> Figure | None:
    """The serving simulation's latency CDFs (quantile against latency) per metric."""
    if not sv or not sv.get("latency"):
        return None
    data = _cdf_traces(sv)
    if not data:
        return None
    a = sv.get("assumptions") or {}
    title = (f"serving latency CDFs: {a.get('model')} on {a.get('hardware')}, "
             f"{(sv.get('policy') or {}).get('spec')}, {sv.get('arrival')}")
    if sv.get("kind") == "bench":
        e, sp = sv.get("endpoint") or {}, sv.get("spec") or {}
        load = f"open loop {sp.get('arrival')}" if sp.get("arrival") else f"concurrency {sp.get('concurrency')}"
        title = f"measured latency CDFs: {e.get('model')} at {e.get('base_url')}, {load}"
    return Figure(tuple(data), Layout(Title(_p(title)), Axis(type="log", title=Title("latency (s)")),
                                      Axis(title=Title("fraction of requests"), range=(0, 1.02))))


def server_series(bench: dict[str, Any] | None) -> Figure | None:
    """What the server's /metrics said while a measured run lasted (bench.json's ``server_metrics``): requests
    running and waiting, and the KV cache in use (as a percentage), against the run's time."""
    m = (bench or {}).get("server_metrics") or {}
    if m.get("status") not in ("scraped", "failed") or not m.get("times_s"):
        return None
    t = tuple(m["times_s"])
    data: list[Trace] = []
    for name, label, scale in (("running", "requests running", 1.0), ("waiting", "requests waiting", 1.0),
                               ("kv_usage", "KV cache in use (%)", 100.0)):
        ys = (m.get("series") or {}).get(name)
        if ys:
            data.append(Scatter(mode="lines", name=label, x=t, y=tuple(None if y is None else y * scale for y in ys)))
    if not data:
        return None
    return Figure(tuple(data), Layout(Title(_p(f"server metrics during the run ({m.get('engine')}, "
                                               f"{m.get('url')})")),
                                      Axis(title=Title("time since the run's start (s)")),
                                      Axis(title=Title("requests, or % of the KV cache"))))


def fit_heatmap(ft: dict[str, Any] | None) -> Figure | None:
    """Throughput at the SLO for each workload (rows) on each platform (columns); excluded cells say why."""
    if not ft or not ft.get("cells"):
        return None
    models, hws = list(ft.get("models") or []), list(ft.get("hardware") or [])
    cell = {(c["model"], c["hardware"]): c for c in ft["cells"]}
    z, text = [], []
    for m in models:
        z.append(tuple((cell.get((m, h)) or {}).get("throughput_at_slo") for h in hws))
        row = []
        for h in hws:
            c = cell.get((m, h)) or {}
            if c.get("throughput_at_slo") is None or c.get("excluded_reason"):
                row.append(_p(f"excluded: {c.get('excluded_reason') or 'no valid rate'}"))
            else:
                row.append(_p(f"#{c.get('rank')}: {si(c['throughput_at_slo'], 'tok/s')} on {c.get('devices')}"))
        text.append(tuple(row))
    heat = Heatmap(x=tuple(_p(h) for h in hws), y=tuple(_p(m) for m in models), z=tuple(z), text=tuple(text),
                   colorscale="Viridis", colorbar=ColorBar(Title("tok/s")),
                   hovertemplate="%{y} on %{x}<br>%{text}<extra></extra>")
    return Figure((heat,), Layout(Title("fit matrix: output tokens/s at the SLO"), Axis(title=Title("platform")),
                                  Axis(title=Title("workload"))))


def perf_per_watt(ft: dict[str, Any] | None, sw: dict[str, Any] | None = None) -> Figure | None:
    """Output tokens per joule of each fit cell (its throughput at the SLO over its modelled power) and of each
    measured sweep point with an energy reading (tokens per joule over its timed repeats)."""
    data: list[Trace] = []
    cells = [c for c in (ft or {}).get("cells") or [] if c.get("perf_per_watt")]
    if cells:
        data.append(Bar(name="fit: output tokens per joule at the SLO",
                        x=tuple(_p(f"{c['model']} on {c['hardware']}") for c in cells),
                        y=tuple(c["perf_per_watt"] for c in cells),
                        text=tuple(_p(f"{c.get('power_w') or 0:.0f} W ({c.get('power_method')})") for c in cells)))
    pts = [p for p in (sw or {}).get("points") or [] if p.get("tokens_per_j")]
    if pts:
        data.append(Bar(name="sweep: tokens per joule (measured)",
                        x=tuple(_p(f"batch {p['batch']} seq {p['seq']}") for p in pts),
                        y=tuple(p["tokens_per_j"] for p in pts),
                        text=tuple(_p(f"{p.get('power_w') or 0:.0f} W ({p.get('power_method')})") for p in pts)))
    if not data:
        return None
    return Figure(tuple(data), Layout(Title("perf per watt: tokens per joule"), Axis(title=Title("cell or point")),
                                      Axis(title=Title("tokens / J"))))


FIGURES = (("roofline", roofline), ("layer_time", layer_time), ("layer_mfu", layer_mfu),
           ("layer_stall", layer_stall))


def figures(src: Sources) -> dict[str, Figure]:
    """Every figure the sources allow, by name (their PNGs are PAGE_NAME.png beside the page: report_NAME.png
    beside report.html), data rounded to ``SIG_DIGITS`` significant digits."""
    out: dict[str, Figure | None] = {}
    for name, fn in FIGURES:
        out[name] = fn(src)
    out["sweep"] = sweep_curves(src.sweep)
    out["serve_cdf"] = serve_cdf(src.serve)
    out["bench_cdf"] = serve_cdf(src.bench)
    out["bench_server"] = server_series(src.bench)
    out["fit"] = fit_heatmap(src.fit)
    out["perf_per_watt"] = perf_per_watt(src.fit, src.sweep)
    return {k: v.rounded(SIG_DIGITS) for k, v in out.items() if v is not None}
