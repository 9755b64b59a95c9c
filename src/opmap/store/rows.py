"""A run's payload as the store holds it: its telemetry tags (analysis, calibration, common) and its kernel,
layer-type and sample rows. Pure functions of the payload: no store is opened here."""

from __future__ import annotations

import hashlib
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opmap import __version__
from opmap.tags import Fingerprint, Tags


def _git_commit() -> str | None:
    try:
        p = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() or None if p.returncode == 0 else None


def _field(x: Any, key: str, default: Any = None) -> Any:
    """``x[key]`` where ``x`` is a JSON object holding it, else ``default``: a folder's file is data someone else
    may have damaged (a field of the wrong type is taken as absent)."""
    return x.get(key, default) if isinstance(x, dict) else default


def _arr(x: Any) -> list[Any]:
    return x if isinstance(x, list) else []


def graph_hash(nodes: list[dict[str, Any]]) -> str:
    """A stable hash of a graph's operators and tensor shapes (analysis.json ``nodes``), order included; a field of
    the wrong type (a damaged file) hashes as absent, never raises."""
    h = hashlib.sha256()
    for n in _arr(nodes):
        h.update(str(_field(n, "op", "")).encode())
        for t in _arr(_field(n, "inputs", [])) + _arr(_field(n, "outputs", [])):
            shape = _field(t, "shape", ())
            h.update(repr(tuple(shape) if isinstance(shape, list) else shape).encode())
    return h.hexdigest()[:16]


def analysis_tags(d: dict[str, Any]) -> Tags:
    """The telemetry tags of an analysis.json (or profile.json) body; a field of the wrong type is taken as
    absent (the body may be a run folder's file, read as data)."""
    a, par = d.get("assumptions"), d.get("parallelism")
    return Tags("analysis", workload=_field(a, "workload"), hardware=_field(a, "hardware"),
                phase=_field(d.get("phase"), "name", "prefill"), precision=_field(a, "dtype"),
                batch=_field(a, "batch"), seq=_field(a, "seq"), fusion=_field(a, "fusion_policy"),
                parallelism=(f"tp{par.get('tp')} pp{par.get('pp')} dp{par.get('dp')} ep{par.get('ep')}"
                             if isinstance(par, dict) and par else "single device"),
                graph_hash=d.get("graph_hash") or graph_hash(d.get("nodes", [])),
                opmap_version=_field(a, "opmap_version", __version__), torch_version=_field(a, "torch_version"))


@dataclass(frozen=True)
class CalibrationRun:
    """A calibration profile as a calibrate run: the file's tables as the store records them (``payload``) and the
    run's telemetry tags read from them (``calibration_tags``)."""

    payload: dict[str, Any]
    tags: Tags


def read_profile(path: Path, quick: bool = False) -> CalibrationRun:
    """A calibration profile (TOML) as a calibrate run (``quick``: calibrated with --quick): the file calibrate
    wrote, a regular file of at most LIMIT_TOML_BYTES read without following a link (opmap.safeio)."""
    import tomllib

    from opmap.safeio import LIMIT_TOML_BYTES, read_text_bounded

    payload = tomllib.loads(read_text_bounded(path, LIMIT_TOML_BYTES, "calibration profile"))
    return CalibrationRun(payload, calibration_tags(payload, quick))


def calibration_tags(d: dict[str, Any], quick: bool = False) -> Tags:
    """The telemetry tags of a calibration profile: the hardware is the local fingerprint (device and model)."""
    cal = d.get("calibration") or {}
    fp = cal.get("fingerprint") or {}
    return Tags("calibration", workload="calibration" + (" (quick)" if quick else ""),
                hardware=f"{d.get('name', 'local')}: {fp.get('model', '?')}", phase="calibrate", precision=None,
                torch_version=fp.get("torch_version"),
                fingerprint=Fingerprint(**{k: fp.get(k) for k in ("model", "machine", "threads", "cores",
                                                                   "memory_bytes")}))


def recorded_tags(tags: Tags) -> Tags:
    """``tags`` as a recorded run carries them: opmap's version, this checkout's git commit and the command line
    ahead of the command's own tags."""
    return tags.as_recorded(__version__, _git_commit(), shlex.join(["opmap", *sys.argv[1:]]) if sys.argv else None)


def _signature(node: dict[str, Any]) -> str | None:
    """A node's op signature: its op with its inputs' dtypes and shapes (None where the payload has no tensors)."""
    ins = node.get("inputs")
    if ins is None:
        return None
    return f"{node.get('op', '')}(" + ", ".join(f"{t.get('dtype', '')}{list(t.get('shape', ()))}" for t in ins) + ")"


def _matrix_peak(payload: dict[str, Any]) -> float | None:
    """The dense matrix peak the run's MFU is over, recovered from its totals (MFU = matrix FLOPs / (latency x
    peak)); None where the payload has no predicted MFU."""
    t = payload.get("totals") or {}
    mf, lat, m = t.get("matrix_flops"), t.get("predicted_latency_s"), t.get("predicted_mfu")
    return mf / (lat * m) if mf and lat and m else None


def _rows(payload: dict[str, Any]) -> tuple[list[tuple], list[tuple], list[tuple]]:
    """(kernels, layer_types, samples) rows of an analysis.json / profile.json body.

    A kernel's MFU is its FLOPs over its time (measured where there is one, else predicted) times the run's dense
    matrix peak; its stall fraction is the roofline-estimated memory stall of a measured kernel over its measured
    time (profile runs only); a layer type's MFU is its matrix FLOPs over the same."""
    kernels = []
    nodes = {n["id"]: n for n in payload.get("nodes", []) if "id" in n}
    peak = _matrix_peak(payload)
    samples = []
    for i, k in enumerate(payload.get("kernels", [])):
        anchor = nodes.get(k.get("anchor"), {})
        # a kernel's name: its anchor op at its module path (the last matching step of compare)
        name = (f"{anchor.get('op', '')}@{anchor.get('module', '')}" if anchor else
                str(k.get("op") or k.get("collective") or ""))
        flops = sum(nodes.get(n, {}).get("flops") or 0.0 for n in k.get("nodes", ())) if nodes else k.get("flops")
        sigs = [_signature(nodes[n]) for n in k.get("nodes", ()) if n in nodes]
        sig = " | ".join(sigs) if sigs and None not in sigs else None
        t = k.get("measured_s") or k.get("predicted_s")
        mfu = flops / (t * peak) if flops and t and peak else None
        stall = (k["memory_stall_s"] / k["measured_s"] if k.get("memory_stall_s") is not None and k.get("measured_s")
                 else None)
        node_ids = ",".join(str(n) for n in k.get("nodes", ())) or None
        kernels.append((i, name, anchor.get("layer_type") or k.get("layer_type"), k.get("predicted_s"),
                        k.get("measured_s"), flops,
                        k.get("bytes") if k.get("bytes") is not None else k.get("traffic_bytes"), k.get("bound"),
                        node_ids, sig, mfu, stall))
        if k.get("measured_samples_s"):
            samples += [(f"kernel:{i}", j, float(x)) for j, x in enumerate(k["measured_samples_s"])]
    lts = []
    for lt, v in (payload.get("layer_types") or {}).items():
        m = (v.get("measured") or {})
        t = m.get("measured_s") or v.get("predicted_s")
        mfu = v["matrix_flops"] / (t * peak) if v.get("matrix_flops") and t and peak else None
        lts.append((lt, v.get("predicted_s"), m.get("measured_s"), v.get("share_of_time"), mfu,
                    m.get("memory_stall"), v.get("bytes")))
    for metric, values in (payload.get("samples") or {}).items():
        samples += [(metric, i, float(x)) for i, x in enumerate(values or ())]
    return kernels, lts, samples


KERNEL_COLUMNS = ("idx", "name", "layer_type", "predicted_s", "measured_s", "flops", "bytes", "bound", "node_ids",
                  "signature", "mfu", "stall_fraction")
LAYER_COLUMNS = ("layer_type", "predicted_s", "measured_s", "share", "mfu", "stall_fraction", "bytes")


def payload_rows(payload: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(kernels, layer types) of an analysis.json / profile.json body as dicts, exactly as the store would hold
    them (see _rows: one MFU and stall formula for the store, compare and the dashboard)."""
    kernels, lts, _ = _rows(payload)
    return [dict(zip(KERNEL_COLUMNS, r)) for r in kernels], [dict(zip(LAYER_COLUMNS, r)) for r in lts]
