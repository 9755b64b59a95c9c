"""``opmap models list``, ``opmap hardware list``, ``opmap hardware show``: the zoo and the hardware catalog."""

from __future__ import annotations

import typer
from rich.table import Table

from opmap.cli.common import console

models_app = typer.Typer(help="The built-in model zoo.", no_args_is_help=True)
hardware_app = typer.Typer(help="The hardware catalog.", no_args_is_help=True)


@models_app.command("list")
def models_list() -> None:
    """The zoo: names, published parameter counts and shape knobs."""
    from opmap.workloads import MODELS

    t = Table(title="opmap model zoo (random weights; parameter counts match the published figures)")
    for col in ("name", "description", "params", "knob", "default", "max", "source"):
        t.add_column(col, overflow="fold")
    for m in MODELS.values():
        t.add_row(m.name, m.description, f"{m.published_params:,}", "seq" if m.kind == "text" else "image-size",
                  str(m.default_seq), str(m.max_seq), m.params_source)
    console.print(t)


@hardware_app.command("list")
def hardware_list(as_json: bool = typer.Option(False, "--json", help="Print the catalog as JSON (numbers in SI "
                                                                   "base units: FLOP/s, B, B/s, W) instead of a table.")
                  ) -> None:
    """Every catalog device with its headline dense peaks and bandwidth. The name column (what --hardware takes)
    is never cut, whatever the terminal's width: the other columns wrap."""
    from opmap.hardware import catalog

    devices = list(catalog().values())
    if as_json:
        import json

        print(json.dumps({"schema_version": 1, "devices": [_catalog_record(h) for h in devices]}, indent=1,
                         allow_nan=False))
        return
    t = Table(title="opmap hardware catalog (dense peaks; achievable: what the time model runs at)")
    for col in ("name", "device", "bf16", "fp8", "fp32", "bf16 achievable", "memory", "bandwidth",
                "bw achievable", "priced", "TDP", "idle", "sw risk"):
        if col == "name":
            t.add_column(col, no_wrap=True, min_width=max(len(h.name) for h in devices))
        else:
            t.add_column(col, justify="left" if col in ("device", "priced") else "right", overflow="fold")
    for h in devices:
        t.add_row(*_catalog_row(h))
    console.print(t)
    console.print("priced: 'like for like' where the catalog has an achievable matrix rate and memory bandwidth "
                  "(measured, or derived from a measurement); 'datasheet only' names what is missing (the time model "
                  "then runs at the dense peak, and streams at the datasheet bandwidth x DRAM_EFFICIENCY)")


def _catalog_record(h) -> dict:
    """One device of ``hardware list --json``: the table's figures as numbers (None where the catalog has none)."""
    def value(table, dtype):
        v = table.get(dtype)
        return v.value if v and v.value else None

    bw = h.fields.get("achievable_memory_bandwidth_bytes_per_s")
    return {"name": h.name, "display_name": h.display_name, "vendor": h.vendor,
            "matrix_peak_flops_per_s": {d: value(h.matrix_peak_flops_per_s, d) for d in ("bf16", "fp8", "fp32")},
            "achievable_matrix_flops_per_s_bf16": value(h.achievable_matrix_flops_per_s, "bf16"),
            "memory_bytes": h.memory_bytes, "memory_bandwidth_bytes_per_s": h.memory_bandwidth_bytes_per_s,
            "achievable_memory_bandwidth_bytes_per_s": bw.value if bw else None, "priced": _priced(h),
            "tdp_w": h.tdp_w, "idle_power_w": h.idle_power_w, "software_risk": h.software_risk}


def _catalog_row(h) -> list[str]:
    from opmap.report.sheet import si

    def peak(d):
        v = h.matrix_peak_flops_per_s.get(d)
        return si(v.value, "FLOP/s") if v and v.value else "-"

    tdp, idle = h.tdp_w, h.idle_power_w
    idle_kind = h.fields["idle_power_w"].kind if idle is not None else ""
    ach = h.achievable_matrix_flops_per_s.get("bf16")
    bw = h.fields.get("achievable_memory_bandwidth_bytes_per_s")
    return [h.name, h.display_name, peak("bf16"), peak("fp8"), peak("fp32"),
            f"{si(ach.value, 'FLOP/s')} ({ach.kind})" if ach and ach.value else "-", _gib(h.memory_bytes),
            si(h.memory_bandwidth_bytes_per_s, "B/s"), f"{si(bw.value, 'B/s')} ({bw.kind})" if bw else "-",
            _priced(h), f"{tdp:.0f} W" if tdp else "-",
            f"{idle:.0f} W ({idle_kind})" if idle is not None else "-", h.software_risk or "-"]


def _gib(x: float) -> str:
    """A capacity in the unit vendors state: binary GiB for device memory (below 1 TiB), else SI."""
    from opmap.report.sheet import si

    return f"{x / 2**30:.4g} GiB" if x < 2**40 else si(x, "B")


def _priced(h) -> str:
    """'like for like', or 'datasheet only: ...' naming the achievable figures the device lacks."""
    short = {"achievable_matrix_flops_per_s": "matrix rate", "achievable_memory_bandwidth_bytes_per_s": "bandwidth"}
    missing = h.datasheet_only
    return "datasheet only: " + ", ".join(short.get(m, m) for m in missing) if missing else "like for like"


@hardware_app.command("show")
def hardware_show(name: str = typer.Argument(..., help="Catalog name or a .toml file.")) -> None:
    """Every value of one device with its kind and source."""
    from rich.markup import escape

    from opmap.cli.common import hardware

    h = hardware(name)
    console.print(_spec_table(h))
    console.print(escape(f"priced: {_priced(h)}; memory rate the time model streams at: "
                         f"{h.memory_rate_bytes_per_s / 1e12:.4g} TB/s ({h.memory_rate_basis})"))
    if h.notes:
        console.print(escape(h.notes))


def _row(t: Table, *cells) -> None:
    """One row of the spec table, every cell escaped: a spec file's sources and notes are the user's text, never
    terminal markup."""
    from rich.markup import escape

    t.add_row(*(escape(str(c)) for c in cells))


def _spec_table(h) -> Table:
    """Every peak and scalar field of ``h`` with its value, kind and source."""
    from rich.markup import escape

    from opmap.hardware.spec import SCALAR_FIELDS, TEXT_FIELDS
    from opmap.report.sheet import si

    t = Table(title=escape(f"{h.name}: {h.display_name} ({h.vendor}, {h.device_type})"))
    for col in ("field", "value", "kind", "source"):
        t.add_column(col, overflow="fold")
    for label, peaks in (("matrix peak", h.matrix_peak_flops_per_s),
                         ("sparse matrix peak", h.sparse_matrix_peak_flops_per_s),
                         ("vector peak", h.vector_peak_flops_per_s),
                         ("achievable matrix", h.achievable_matrix_flops_per_s),
                         ("sustained matrix", h.sustained_matrix_flops_per_s)):
        for d, v in peaks.items():
            _row(t, f"{label} {d}", si(v.value, "FLOP/s") if v.value else "-", v.kind, v.source)
    if not h.achievable_matrix_flops_per_s:
        _row(t, "achievable matrix", "datasheet only", "-",
                  "no published achievable matrix rate: the time model runs at the dense peak")
    for key, unit in SCALAR_FIELDS.items():
        v = h.fields.get(key)
        if v is None and key == "achievable_memory_bandwidth_bytes_per_s":
            _row(t, key, "datasheet only", "-", f"no published achievable bandwidth: {h.memory_rate_basis}")
        if v is not None:
            val = "-" if v.value is None else (f"{v.value:g}" if unit in ("", "x") else si(v.value, unit))
            _row(t, key, val, v.kind, v.source + (f" ({v.note})" if v.note else ""))
    for key in TEXT_FIELDS:
        if (v := h.fields.get(key)) is not None:
            _row(t, key, str(v.value), v.kind, v.source + (f" ({v.note})" if v.note else ""))
    tables = h.curves.tables if h.calibration else {}
    if tables:  # measured per-shape curves (a catalog device's published timings, or a calibration's)
        fams = ", ".join(sorted(f"{fam.value} {dt} ({tb.size} shapes)" for (fam, dt), tb in tables.items()))
        _row(t, "measured curves", fams, "measured", str(h.calibration.get("source", "opmap calibrate")))
    from opmap.hardware import attention_kernels

    if kernels := attention_kernels(h.calibration):
        _row(t, "attention kernels", ", ".join(kernels), "measured",
                  f"default {h.calibration.get('attention_kernel', kernels[0])}; analyze / plan --attention-kernel "
                  "prices another")
    if rows := h.calibration.get("attention_dropout"):  # time with dropout over time without, per kernel
        _row(t, "attention dropout", ", ".join(f"{r.get('kernel', 'any')} {r['factor']:g}x" for r in rows),
                  "measured", "; ".join(str(r.get("source", "")) for r in rows if r.get("source")) or "calibration")
    return t
