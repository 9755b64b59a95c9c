"""The self-contained HTML dashboard of a run (``opmap report``): one file that needs no network when opened.

Plotly's JavaScript bundle is inlined once (``plotly.offline.get_plotlyjs()``, 4.8 MB for plotly 7); each
figure is a div drawn by ``Plotly.newPlot`` from the figure JSON embedded in the page (report.chart.Figure's
to_plotly_json), its numbers rounded to 4 significant digits (report.chart.sig). The page's size is checked
against a budget (BUDGET_BYTES, 8 MB: the bundle plus about 3 MB of data, a 3,000-kernel model's table and
roofline) before anything is written.

Sections: the assumptions block (hardware, precision policy, batch, sequence, fusion and batching policies,
versions), headline figures, the figures of report.dashboard, the mapping sheet as a sortable, filterable
table (plain JavaScript: click a header to sort, type to filter), the Chrome trace beside the page
(PAGE_trace.json, or a profile folder's own trace.json, linked: Perfetto cannot be embedded in a file), and the
run's telemetry tags as JSON in ``<script type="application/json" id="opmap-tags">``. The same figures go beside
it as PNGs (PAGE_NAME.png, report.figures) for Markdown reports. PAGE is the page's file name without .html
(report_roofline.png beside report.html), so reports written into one folder keep each other's files.

User strings (workload, module and file names, tags) never leave their element: text is HTML-escaped, and JSON
inside a <script> element has ``<``, ``>`` and ``&`` written as \\u escapes, so no ``</script>`` or ``<!--``
can occur in it. The page, its trace and its PNGs are written as one set (report.outputs.write_set), a
PAGE_NAME.png of an earlier page of that name that this one does not draw removed with it. A file at one of those
names that opmap did not write (made_by_opmap: the page's generator meta element, the trace's opmap schema, the PNG's
Software chunk) is not replaced unless ``force``.
"""

from __future__ import annotations

import html
import importlib.util
import json
from pathlib import Path
from typing import Any

from opmap.errors import OpmapError
from opmap.record import record
from opmap.report.chart import Figure, sig
from opmap.report.dashboard import Sources, figures
from opmap.report.sheet import si
from opmap.validate import json_text, visible

BUDGET_BYTES = 8_000_000
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1200px;color:#222;padding:0 1em}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
dl.assume{display:grid;grid-template-columns:max-content auto;gap:.2em 1em;font-size:.9em}
dl.assume dt{font-weight:600}dl.assume dd{margin:0}
.plot{width:100%;height:460px}.note{color:#555;font-size:.9em}
table.sheet{border-collapse:collapse;font-size:.82em;width:100%}
table.sheet th,table.sheet td{border:1px solid #ddd;padding:2px 6px;text-align:right}
table.sheet th{background:#f3f3f3;cursor:pointer;position:sticky;top:0}
table.sheet td.t{text-align:left}table.sheet th[data-dir=asc]::after{content:" \\25B2"}
table.sheet th[data-dir=desc]::after{content:" \\25BC"}
.scroll{max-height:520px;overflow:auto}
"""

JS = """
(function(){
  var figs = JSON.parse(document.getElementById('opmap-figures').textContent);
  var config = JSON.parse(document.getElementById('opmap-plotly-config').textContent);
  Object.keys(figs).forEach(function(name){
    var f = figs[name];
    Plotly.newPlot('fig-' + name, f.data, Object.assign({margin:{t:50}}, f.layout), config);
  });
  var t = document.getElementById('kernel-table');
  if (!t) return;
  var body = t.tBodies[0], heads = t.tHead.rows[0].cells;
  function key(td, num){ var v = td.getAttribute('data-v'); return num ? (v === '' ? -Infinity : +v) : v; }
  Array.prototype.forEach.call(heads, function(th, i){
    th.addEventListener('click', function(){
      var asc = th.getAttribute('data-dir') !== 'asc', num = th.getAttribute('data-type') === 'num';
      Array.prototype.forEach.call(heads, function(h){ h.removeAttribute('data-dir'); });
      th.setAttribute('data-dir', asc ? 'asc' : 'desc');
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function(a, b){
        var x = key(a.cells[i], num), y = key(b.cells[i], num);
        var c = num ? (x === y ? 0 : (x < y ? -1 : 1)) : x.localeCompare(y);
        return asc ? c : -c;
      });
      rows.forEach(function(r){ body.appendChild(r); });
    });
  });
  var f = document.getElementById('kernel-filter');
  f.addEventListener('input', function(){
    var q = f.value.toLowerCase(), n = 0;
    Array.prototype.forEach.call(body.rows, function(r){
      var show = r.textContent.toLowerCase().indexOf(q) >= 0;
      r.style.display = show ? '' : 'none'; n += show ? 1 : 0;
    });
    document.getElementById('kernel-shown').textContent = n;
  });
})();
"""

FIGURE_TITLES = {"roofline": "Roofline", "layer_time": "Time by layer type", "layer_mfu": "MFU by layer type",
                 "layer_stall": "Memory-stall fraction by layer type", "sweep": "Sweep: latency against throughput",
                 "serve_cdf": "Serving latency CDFs",
                 "bench_cdf": "Measured latency CDFs", "bench_server": "Server metrics during the measured run",
                 "fit": "Fit matrix", "perf_per_watt": "Perf per watt"}


def script_json(x: Any) -> str:
    """JSON safe inside a <script> element: ``<``, ``>`` and ``&`` (which JSON has only inside strings) written as
    \\u003c, \\u003e and \\u0026, which JSON.parse reads back unchanged; the rest is ASCII (ensure_ascii)."""
    text = json.dumps(x, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _fmt(x: Any, unit: str = "") -> str:
    return "-" if x is None else si(float(x), unit)


def assumption_items(src: Sources) -> list[tuple[str, str]]:
    """(label, value) lines of the assumptions block, from whichever results the report holds."""
    items: list[tuple[str, str]] = []
    b = src.body
    if b is not None:
        a = b.get("assumptions") or {}
        items.append(("workload", f"{a.get('workload')} ({a.get('mode', 'inference')}, "
                                  f"phase {(b.get('phase') or {}).get('name', 'prefill')})"))
        items.append(("hardware", f"{a.get('hardware_display_name') or a.get('hardware')} ({a.get('hardware')})"))
        pol = a.get("precision_policy") or {}
        items.append(("precision", ", ".join(f"{k} {v}" for k, v in pol.items()) or str(a.get("dtype"))))
        if a.get("precision_evidence"):
            items.append(("precision evidence", str(a["precision_evidence"])))
        items.append(("batch, sequence", f"batch {a.get('batch')}, seq {a.get('seq')}"))
        items.append(("fusion policy", str(a.get("fusion_policy"))))
        for k in ("tiling", "time_model"):
            if a.get(k):
                items.append((k.replace("_", " "), str(a[k])))
        if src.tags.get("parallelism"):
            items.append(("parallelism", str(src.tags["parallelism"])))
        if b.get("kind") == "profile" or src.tags.get("device_name"):
            t = src.tags
            items.append(("measured on", f"{t.get('device_name') or t.get('device')} ({t.get('device')}, "
                                         f"{t.get('threads')} threads, host {t.get('host')})"))
        items.append(("versions", f"opmap {a.get('opmap_version')}, torch {a.get('torch_version')}, "
                                  f"python {a.get('python_version')}"))
    if src.sweep:
        s = src.sweep
        items.append(("sweep", f"{s.get('model')} on {s.get('hardware')}, {s.get('phase')}, {s.get('dtype')}, "
                               f"{len(s.get('points') or [])} points"))
        items += [("sweep assumption", str(x)) for x in s.get("assumptions") or []]
    if src.serve:
        s = src.serve
        a = s.get("assumptions") or {}
        items.append(("serving", f"{a.get('model')} on {a.get('replicas')} x tp{a.get('tp')} {a.get('hardware')}, "
                                 f"{a.get('dtype')}, router {a.get('router')}, seed {a.get('seed')}"))
        items.append(("batching policy", f"{(s.get('policy') or {}).get('spec')}"))
        items.append(("arrivals", f"{s.get('arrival')}, input {a.get('input_len')}, output {a.get('output_len')}, "
                                  f"{(s.get('requests') or {}).get('count')} requests"))
        items.append(("serving cost", f"{a.get('cost')}; KV cache {a.get('kv_cache')}"))
        items.append(("SLO", ", ".join(f"{k} {v}" for k, v in (s.get("slo") or {}).items())))
    if src.bench:
        s = src.bench
        e, sp, c = s.get("endpoint") or {}, s.get("spec") or {}, s.get("client") or {}
        served = ", ".join(map(str, e.get("server_models") or []))
        items.append(("endpoint", f"{e.get('base_url')} ({e.get('api')}), model {e.get('model')}, served "
                                  f"{served}, server {e.get('server_header')}"))
        items.append(("load", f"arrival {sp.get('arrival')}, concurrency {sp.get('concurrency')}, requests "
                              f"{sp.get('requests')}, duration {sp.get('duration_s')} s, warm-up {sp.get('warmup')}, "
                              f"input {sp.get('input_len')}, output {sp.get('output_len')}, seed {sp.get('seed')}"))
        items.append(("client", f"opmap {c.get('opmap')}, {c.get('transport')}, {c.get('mode')} loop"))
    if src.fit:
        f = src.fit
        items.append(("fit matrix", f"{', '.join(f.get('models') or [])} on {', '.join(f.get('hardware') or [])}, "
                                    f"{f.get('dtype')}, input {f.get('input_len')}, output {f.get('output_len')}"))
        items.append(("fit SLO", ", ".join(f"{k} {v}" for k, v in (f.get("slo") or {}).items())))
        items += [("fit assumption", str(x)) for x in f.get("assumptions") or []]
    if not any(k == "versions" for k, _ in items):
        items.append(("versions", f"opmap {src.tags.get('opmap_version', '?')}, "
                                  f"torch {src.tags.get('torch_version', '?')}"))
    return items


def headline(src: Sources) -> list[str]:
    """One-line results: predicted latency and MFU; measured percentiles, MFU and energy; serving; fit."""
    out = []
    b = src.body
    if b is not None:
        t = b.get("totals") or {}
        out.append(f"predicted latency {_fmt(t.get('predicted_latency_s'), 's')}, predicted MFU "
                   f"{(t.get('predicted_mfu') or 0):.2%}, {t.get('kernels', len(src.kernels))} kernels, "
                   f"{_fmt(t.get('flops'), 'FLOP')}, {_fmt(t.get('bytes'), 'B')} moved at least")
        lat = b.get("latency")
        if lat:
            mfu = ((b.get("mfu") or {}).get("calibrated") or {}).get("mfu")
            out.append(f"measured latency p50 {_fmt(lat.get('p50_s'), 's')}, p95 {_fmt(lat.get('p95_s'), 's')}, "
                       f"p99 {_fmt(lat.get('p99_s'), 's')} over {lat.get('n')} iterations"
                       + (f"; measured MFU {mfu:.2%}" if mfu is not None else ""))
        en = b.get("energy")
        if en and en.get("joules") is None:
            out.append(f"energy: {en.get('method')}")
        elif en:
            out.append(f"energy: {_fmt(en.get('joules'), 'J')} over {_fmt(en.get('seconds'), 's')}, average "
                       f"{_fmt(en.get('average_w'), 'W')} ({en.get('method')})")
    if src.serve:
        s = src.serve
        th, v = s.get("throughput") or {}, s.get("validity") or {}
        out.append(f"serving: {(th.get('requests_per_s') or 0):.4g} req/s, {_fmt(th.get('tokens_per_s'), 'tok/s')}; "
                   f"SLO attainment {(s.get('slo_attainment') or 0):.1%}; {v.get('verdict')} ({v.get('reason')})")
    if src.bench:
        s = src.bench
        th, v, lt = s.get("throughput") or {}, s.get("validity") or {}, s.get("latency") or {}
        out.append(f"measured load: TTFT p50 {_fmt((lt.get('ttft') or {}).get('p50_s'), 's')}, p99 "
                   f"{_fmt((lt.get('ttft') or {}).get('p99_s'), 's')}; TPOT p50 "
                   f"{_fmt((lt.get('tpot') or {}).get('p50_s'), 's')}; {(th.get('requests_per_s') or 0):.4g} req/s, "
                   f"{_fmt(th.get('output_tokens_per_s'), 'tok/s')} out; {v.get('verdict')} ({v.get('reason')})")
    if src.sweep and not any(p.get("latency_p50_s") is not None for p in src.sweep.get("points") or []):
        out.append("sweep: predicted points only (no measured percentiles, no energy: a predicted point's energy "
                   "is null; opmap fit models power under load)")
    return out


COLUMNS = (("#", "idx", "num"), ("kernel", "name", "text"), ("layer type", "layer_type", "text"),
           ("bound", "bound", "text"), ("predicted", "predicted_s", "num"), ("measured", "measured_s", "num"),
           ("FLOPs", "flops", "num"), ("bytes", "bytes", "num"), ("FLOP/byte", "intensity", "num"),
           ("MFU", "mfu", "num"), ("stall", "stall_fraction", "num"))


def _cell(key: str, v: Any) -> str:
    if v is None:
        return "-"
    if key in ("predicted_s", "measured_s"):
        return si(v, "s")
    if key in ("flops", "bytes"):
        return si(v)
    if key in ("mfu", "stall_fraction"):
        return f"{v:.1%}"
    if key == "intensity":
        return f"{v:.3g}"
    return str(v)


def kernel_table(src: Sources) -> str:
    """The mapping sheet: one row per kernel, each cell's raw value (rounded) in data-v for sorting."""
    head = "".join(f'<th data-type="{t}">{_e(label)}</th>' for label, _, t in COLUMNS)
    rows = []
    for k in src.kernels:
        k = {**k, "intensity": k["flops"] / k["bytes"] if k.get("flops") and k.get("bytes") else None}
        cells = []
        for _, key, t in COLUMNS:
            v = k.get(key)
            raw = "" if v is None else (sig(float(v)) if t == "num" else v)
            cells.append(f'<td{" class=t" if t == "text" else ""} data-v="{_e(raw)}">{_e(_cell(key, v))}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<p><input id="kernel-filter" type="search" placeholder="filter kernels (name, layer type, bound)" '
            f'size="40"> <span id="kernel-shown">{len(src.kernels)}</span> of {len(src.kernels)} kernels shown; '
            f'click a header to sort.</p><div class="scroll"><table class="sheet" id="kernel-table"><thead><tr>'
            f'{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>')


def require_plotly() -> None:
    if importlib.util.find_spec("plotly") is None:
        raise OpmapError("the HTML report needs plotly: pip install 'opmap[report]' (plotly and matplotlib)")


def render(src: Sources, figs: dict[str, Figure], trace_name: str | None, pngs: list[str]) -> str:
    """The page: ``figs`` (report.dashboard.figures), the trace file's name beside it, the PNGs' names."""
    require_plotly()
    from plotly.offline import get_plotlyjs

    parts = [f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8>{generator_meta()}<title>{_e(src.title)}</title>"
             f"<style>{CSS}</style><script>{get_plotlyjs()}</script></head><body>",
             f"<h1>{_e(src.title)}</h1><p class=note>source: {_e(src.origin)}; reproduce: "
             f"<code>{_e(src.tags.get('command') or 'see the tags below')}</code></p>",
             "<h2>Assumptions</h2><dl class=assume>"]
    parts += [f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in assumption_items(src)]
    parts.append("</dl>")
    lines = headline(src)
    if lines:
        parts.append("<h2>Results</h2><ul>" + "".join(f"<li>{_e(x)}</li>" for x in lines) + "</ul>")
    for name in figs:
        parts.append(f'<h2>{_e(FIGURE_TITLES.get(name, name))}</h2><div class="plot" id="fig-{_e(name)}"></div>')
        if name == "roofline":
            off = sum(1 for k in src.kernels if not (k.get("flops") and k.get("bytes")))
            if off:
                parts.append(f"<p class=note>{off} of {len(src.kernels)} kernels have no FLOPs or no bytes "
                             "(views, pure data movement, collectives) and are not on the roofline; the table "
                             "lists them all.</p>")
    if src.kernels:
        parts.append("<h2>Mapping sheet</h2>" + kernel_table(src))
    parts.append("<h2>Trace</h2>")
    if trace_name:
        parts.append(f'<p>The Chrome trace is beside this page: <a href="{_e(trace_name)}">{_e(trace_name)}</a>. '
                     "Perfetto opens it: go to ui.perfetto.dev and choose Open trace file (a trace cannot be "
                     "embedded in a file:// page); chrome://tracing opens it too.</p>")
    else:
        parts.append("<p class=note>No trace: a sweep, serving or fit result has no kernels to lay out.</p>")
    if pngs:
        parts.append("<p class=note>The figures as PNG for Markdown reports: "
                     + ", ".join(f'<a href="{_e(p)}">{_e(p)}</a>' for p in pngs) + ".</p>")
    plotly_figs = {name: fig.to_plotly_json() for name, fig in figs.items()}  # the page's JSON: Plotly's
    parts.append("<h2>Telemetry tags</h2><p class=note>As JSON in the element #opmap-tags.</p>"
                 f"<pre>{_e(json.dumps(src.tags, indent=1, default=str))}</pre>")
    parts.append(f'<script type="application/json" id="opmap-tags">{script_json(src.tags)}</script>'
                 f'<script type="application/json" id="opmap-figures">{script_json(plotly_figs)}</script>'
                 f'<script type="application/json" id="opmap-plotly-config">{script_json(PLOTLY_CONFIG)}</script>'
                 f"<script>{JS}</script></body></html>\n")
    return "".join(parts)


GENERATOR = "opmap"


def generator_meta() -> str:
    """The page's ``<meta name="generator">`` element: how a later report knows the page is opmap's."""
    from opmap import __version__

    return f'<meta name="generator" content="{GENERATOR} {_e(__version__)}">'


def made_by_opmap(path: Path) -> bool:
    """Whether the file at ``path`` (not followed if a link: a link is never opmap's) is one ``opmap report``
    wrote and may replace: a page with opmap's generator meta element in its head, a trace whose
    otherData.schema names opmap, a PNG whose Software chunk names opmap (report.figures.png_metadata)."""
    from opmap.report.figures import PNG_SOFTWARE, png_software
    from opmap.report.outputs import read_input

    path = Path(path)
    if path.is_symlink() or not path.is_file():
        return False
    try:
        if path.suffix.lower() == ".png":
            with path.open("rb") as f:
                return (png_software(f.read(65536)) or "").startswith(PNG_SOFTWARE + " ")
        if path.suffix.lower() in (".html", ".htm"):
            with path.open("rb") as f:
                return f'<meta name="generator" content="{GENERATOR} '.encode() in f.read(4096)
        other = json.loads(read_input(path)).get("otherData") or {}
        return str(other.get("schema", "")).startswith("opmap ")
    except (OSError, ValueError, AttributeError, OpmapError):
        return False


def beside(out: Path, name: str) -> str:
    """The name of a file the page ``out`` links beside it: the page's own stem, then ``name``
    (report.html: report_roofline.png, report_trace.json; gpt2.html: gpt2_roofline.png), so two reports
    written into one folder never replace or remove each other's files."""
    return f"{Path(out).stem}_{name}"


def write_report(src: Sources, out: Path, max_bytes: int = BUDGET_BYTES, png: bool = True,
                 force: bool = False) -> list[Path]:
    """Write ``out`` (the HTML), its trace and its PNGs beside it (named by the page: ``beside``), all or none
    (a PNG of an earlier page of that name this one does not draw removed with them); the page is refused before
    anything is written when it exceeds ``max_bytes``, and a file at one of those names that opmap did not write
    unless ``force``."""
    from opmap.report.outputs import read_input, write_set
    from opmap.report.trace import kernel_trace

    require_plotly()
    out = Path(out)
    if out.exists() and out.is_dir():
        raise OpmapError(f"--out {visible(out)} is a folder; accepted: a file name ending in .html")
    if out.suffix.lower() not in (".html", ".htm"):
        raise OpmapError(f"--out {visible(out)}: accepted: a file name ending in .html")
    folder = out.parent
    figs = figures(src)
    files: dict[str, str | bytes] = {}
    trace_name = None
    if src.trace is not None and src.trace.resolve() == (folder / src.trace.name).resolve():
        trace_name = src.trace.name  # the run folder's own trace, linked where it lies
    elif src.trace is not None:
        trace_name = beside(out, "trace.json")
        files[trace_name] = read_input(src.trace)
    elif src.kernels:
        trace_name = beside(out, "trace.json")
        files[trace_name] = json_text(record(kernel_trace(src.kernels, src.tags, src.title)))
    pngs: dict[str, bytes] = {}
    if png and importlib.util.find_spec("matplotlib") is not None:
        from opmap.report.figures import png_bytes

        pngs = {beside(out, f"{name}.png"): png_bytes(fig) for name, fig in figs.items()}
    page = render(src, figs, trace_name, list(pngs))
    size = len(page.encode())
    if size > max_bytes:
        raise OpmapError(f"the report would be {size / 1e6:.1f} MB, over the {max_bytes / 1e6:.1f} MB budget "
                         "(plotly.js alone is about 4.8 MB); accepted: --max-mb above it")
    files = {out.name: page, **files, **pngs}
    stale = [n for n in (beside(out, f"{name}.png") for name in FIGURE_TITLES) if n not in files]
    if not force:
        for name in [*files, *stale]:
            p = folder / name
            if (p.exists() or p.is_symlink()) and not made_by_opmap(p):
                raise OpmapError(f"{visible(p)} exists and opmap report did not write it; accepted: --force to replace "
                                 "it, or another --out")
    return write_set(folder, files, remove=stale)
