"""A calibration as a hardware profile: the catalog schema (every value ``measured``) plus the raw curves and the
host's load while it measured (``[calibration.conditions]``). A calibration measured on a busy host is never
written as the host's profile (the cache ``--hardware local`` reads); written elsewhere, it says so in its name,
notes and conditions."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from opmap.calibrate.grids import FORMATS
from opmap.calibrate.load import summary
from opmap.calibrate.run import Calibration
from opmap.errors import OpmapError
from opmap.hardware.local import cache_path
from opmap.hardware.spec import spec_from_dict
from opmap.record import record
from opmap.validate import visible


def _v(value: float, source: str) -> dict:
    return {"value": float(value), "kind": "measured", "source": source}


def to_spec_dict(cal: Calibration) -> dict:
    """The calibration as a catalog-schema dict (every value measured) plus the raw curves."""
    fp = cal.fingerprint
    when = time.strftime("%Y-%m-%d")
    src = f"opmap calibrate {when} on {fp['model']} ({fp['threads']} threads, torch {fp['torch_version']})"
    matrix = {}
    for dt in FORMATS:
        best = cal.peak(dt)
        if best:
            matrix[dt] = _v(best["flops_per_s"], f"{src}: best median over the matmul grid, "
                                                   f"at {best['m']}x{best['n']}x{best['k']}")
    bw = cal.copy_bandwidth()
    lo = cal.launch_overhead
    busy = f" on a BUSY host ({summary(cal.conditions)}): its figures read low, not this host's profile" \
        if cal.busy else ""
    return {
        "name": "local-cuda" if cal.device.startswith("cuda") else "local",
        "display_name": f"local {cal.device}{' (busy host)' if cal.busy else ''}: {fp['model']}",
        "vendor": "measured",
        "device_type": "gpu" if cal.device.startswith("cuda") else "cpu",
        "compute_unit_name": "SM" if cal.device.startswith("cuda") else "thread",
        "notes": f"measured by opmap calibrate{busy}; curves under [calibration]",
        "matrix_peak_flops_per_s": matrix,
        "vector_peak_flops_per_s": {dt: _v(r, f"{src}: addcmul on a cache-resident tensor, dispatch "
                                                    "overhead taken out")
                                    for dt, r in cal.vector.items()},
        "memory_bandwidth_bytes_per_s": _v(bw["bytes_per_s"], f"{src}: copy (read + write) of "
                                                              f"{bw['bytes']} bytes"),
        "launch_overhead_s": _v(lo.median_s, f"{src}: median one-element add"),
        "compute_units": _v(float(fp.get("compute_units", fp["threads"])), src),
        "memory_bytes": _v(float(fp["memory_bytes"]), f"{src}: device memory as the OS / driver reports it"),
        **({"sram_per_unit_bytes": _v(float(fp["l2_per_core_bytes"]), f"{src}: per-core L2 from sysfs")}
           if fp.get("l2_per_core_bytes") else {}),
        **({"l2_bytes": _v(float(fp["llc_bytes"]), f"{src}: last-level cache from sysfs (the catalog's l2_bytes "
                                                   "holds a CPU's LLC)")} if fp.get("llc_bytes") else {}),
        "calibration": {"device": cal.device, "fingerprint": fp, "matmul": cal.matmul, "conv": cal.conv,
                        "attention": cal.attention, "bandwidth": cal.bandwidth, "launch_overhead": lo.spread(),
                        "view_overhead_s": cal.view_overhead_s,
                        **({"parallel": cal.parallel} if cal.parallel else {}),
                        "vector_kinds": cal.vector_kinds,
                        "vector_rates": {"transcendental_per_s": cal.transcendental_per_s,
                                         **{f"{k}_flops_per_s": v for k, v in cal.vector.items()}},
                        "skipped": cal.skipped, **({"conditions": record(cal.conditions)} if cal.conditions else {})},
    }


def to_toml(d: dict) -> str:
    """The profile as TOML (tomli_w)."""
    import tomli_w

    return tomli_w.dumps(d)


def is_host_profile(path: Path, device: str) -> bool:
    """Whether ``path`` is (or resolves to) the profile ``--hardware local`` / ``local-cuda`` reads for ``device``."""
    host = cache_path(device)
    return path == host or path.resolve() == host.resolve()


def write_profile(cal: Calibration, path: Path | None = None) -> Path:
    """Write the profile atomically; validate it through the catalog loader first. A busy host's calibration is
    refused as the host's profile (``path`` None or the cache), written marked anywhere else. The temporary file is
    created new (mkstemp: O_EXCL, a fresh name), so a link planted at a fixed name is never written through; a link
    at ``path`` is replaced, not followed."""
    path = path or cache_path(cal.device)
    if cal.busy and is_host_profile(path, cal.device):
        raise OpmapError(f"not stored as this host's profile ({visible(path)}): it was measured on a busy host "
                         f"({summary(cal.conditions)}) and reads low; calibrate when the host is quiet")
    d = to_spec_dict(cal)
    spec_from_dict(d, "calibration")  # refuse to write a profile the loader would reject
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(to_toml(d))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
