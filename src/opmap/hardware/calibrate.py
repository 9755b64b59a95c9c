"""Local calibration: measure this device's real ceilings and write them as a hardware profile.

Microbenchmarks, each with warm-up, repeats, the median and the spread (min, max, interquartile range):

- matmul rate per dtype (fp32, bf16, fp16 where the device runs them) over a grid of shapes: square sizes
  and skinny / wide aspects, so the profile carries an efficiency curve by size and aspect, not one number;
  the matrix peak is the best median over the grid;
- copy, read and write bandwidth over sizes that cross the cache levels (copy counts read + write bytes);
  the memory bandwidth is the copy rate at the largest size (past the last-level cache);
- per-op dispatch / launch overhead: the median time of a one-element add;
- vector (pointwise) rate: a fused-free multiply-add chain on a cache-resident tensor.

Timing: ``time.perf_counter`` around ``reps`` back-to-back calls on the CPU; CUDA events with a
synchronize on a GPU. The profile uses the catalog schema, every value of kind ``measured``, with the
machine fingerprint; it is written to ``$XDG_CACHE_HOME/opmap/local.toml`` (default ``~/.cache``), where
``--hardware local`` finds it.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from opmap import __version__
from opmap.errors import OpmapError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# (m, n, k): squares that cross the cache sizes, then skinny-M (decode-like) and wide-K shapes
FULL_GRID = ((256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096),
             (16, 4096, 4096), (128, 4096, 4096), (4096, 4096, 256), (4096, 256, 4096))
QUICK_GRID = ((128, 128, 128), (256, 256, 256), (16, 512, 512))
FULL_SIZES = tuple(2 ** p for p in range(16, 31, 2))  # 64 KiB .. 1 GiB per buffer
QUICK_SIZES = (2 ** 16, 2 ** 20)
MAX_CALL_S = 0.25  # a shape whose one call would take longer (slow dtype on this device) is skipped, and said


def cache_path() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "opmap" / "local.toml"


@dataclass(frozen=True)
class Sample:
    """Repeated timings of one microbenchmark, seconds per call."""

    times_s: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    def spread(self) -> dict[str, float]:
        ts = sorted(self.times_s)
        q = statistics.quantiles(ts, n=4) if len(ts) >= 4 else [ts[0], statistics.median(ts), ts[-1]]
        return {"min_s": ts[0], "max_s": ts[-1], "iqr_s": q[2] - q[0], "samples": len(ts)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_op(fn: Callable[[], object], device: torch.device, *, warmup: int = 2, repeats: int = 7,
            min_time_s: float = 0.02) -> Sample:
    """Median-ready timings of ``fn``: each sample runs enough back-to-back calls to last ``min_time_s``."""
    for _ in range(warmup):
        fn()
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    once = max(time.perf_counter() - t0, 1e-7)
    calls = max(1, int(min_time_s / once))
    repeats = max(3, min(repeats, int(1.0 / (once * calls)) or 3))  # about 1 s per microbenchmark at most
    out = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / 1e3 / calls)
        else:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            out.append((time.perf_counter() - t0) / calls)
    return Sample(tuple(out))


@dataclass
class Calibration:
    device: str
    fingerprint: dict[str, object]
    matmul: list[dict] = field(default_factory=list)  # m, n, k, dtype, flops_per_s, spread
    bandwidth: list[dict] = field(default_factory=list)  # kind, bytes, bytes_per_s, spread
    launch_overhead: Sample | None = None
    vector: dict[str, float] = field(default_factory=dict)  # dtype -> flops_per_s
    skipped: list[str] = field(default_factory=list)  # shapes left out, with the reason

    def peak(self, dtype: str) -> dict | None:
        rows = [r for r in self.matmul if r["dtype"] == dtype]
        return max(rows, key=lambda r: r["flops_per_s"]) if rows else None

    def copy_bandwidth(self) -> dict:
        rows = [r for r in self.bandwidth if r["kind"] == "copy"]
        return max(rows, key=lambda r: r["bytes"])


def fingerprint(device: torch.device) -> dict[str, object]:
    fp: dict[str, object] = {"torch_version": torch.__version__, "opmap_version": __version__,
                             "python_version": platform.python_version(), "machine": platform.machine(),
                             "threads": torch.get_num_threads(), "cores": os.cpu_count() or 0}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        fp.update(model=p.name, compute_units=p.multi_processor_count, memory_bytes=p.total_memory)
    else:
        fp["memory_bytes"] = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        model = platform.processor()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        fp["model"] = model or "unknown CPU"
    return fp


def _supported(dtype: torch.dtype, device: torch.device) -> bool:
    try:
        a = torch.ones(8, 8, dtype=dtype, device=device)
        (a @ a).sum().item()
        return True
    except (RuntimeError, TypeError):
        return False


def calibrate(device: str = "cpu", quick: bool = False, progress: Callable[[str], None] | None = None) -> Calibration:
    """Run every microbenchmark on ``device``. ``quick`` shrinks the grid (tests, smoke runs)."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise OpmapError("calibrate --device cuda: no CUDA device here; accepted: cpu")
    if dev.type not in ("cpu", "cuda"):
        raise OpmapError(f"calibrate cannot run on {device!r}; accepted: cpu, cuda")
    step = progress or (lambda _msg: None)
    cal = Calibration(str(dev), fingerprint(dev))
    grid = QUICK_GRID if quick else FULL_GRID
    sizes = QUICK_SIZES if quick else FULL_SIZES
    reps = 3 if quick else 7
    min_time = 0.002 if quick else 0.02
    with torch.no_grad():
        for name, dt in DTYPES.items():
            if not _supported(dt, dev):
                continue
            rate = None  # the best rate so far for this dtype, to skip shapes that would take too long
            for m, n, k in grid:
                if rate is not None and 2.0 * m * n * k / rate > MAX_CALL_S:
                    cal.skipped.append(f"matmul {name} {m}x{n}x{k}: one call would take "
                                       f"{2.0 * m * n * k / rate:.2g} s at {rate / 1e9:.3g} GFLOP/s")
                    step(f"matmul {name} {m}x{n}x{k} skipped")
                    continue
                a = torch.randn(m, k, device=dev).to(dt)
                b = torch.randn(k, n, device=dev).to(dt)
                s = time_op(lambda: torch.mm(a, b), dev, repeats=reps, min_time_s=min_time)
                cal.matmul.append({"m": m, "n": n, "k": k, "dtype": name,
                                   "flops_per_s": 2.0 * m * n * k / s.median_s, **s.spread()})
                rate = max(rate or 0.0, 2.0 * m * n * k / s.median_s)
                step(f"matmul {name} {m}x{n}x{k}")
        for nbytes in sizes:
            n = nbytes // 4
            src = torch.randn(n, device=dev)
            dst = torch.empty_like(src)
            for kind, fn, moved in (("copy", lambda: dst.copy_(src), 2 * nbytes),
                                    ("read", lambda: src.sum(), nbytes),
                                    ("write", lambda: dst.fill_(1.0), nbytes)):
                s = time_op(fn, dev, repeats=reps, min_time_s=min_time)
                cal.bandwidth.append({"kind": kind, "bytes": nbytes, "bytes_per_s": moved / s.median_s,
                                      **s.spread()})
            step(f"bandwidth {nbytes} B")
        one = torch.ones(1, device=dev)
        cal.launch_overhead = time_op(lambda: torch.add(one, one), dev, repeats=reps, min_time_s=min_time)
        step("dispatch overhead")
        for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            x = torch.randn(2 ** 16, device=dev).to(dt)  # 256 KiB fp32: stays in L2
            y = torch.empty_like(x)
            s = time_op(lambda: torch.addcmul(x, x, x, out=y), dev, repeats=reps, min_time_s=min_time)
            cal.vector[name] = 2.0 * x.numel() / s.median_s
            step(f"vector {name}")
    return cal


def _v(value: float, source: str) -> dict:
    return {"value": float(value), "kind": "measured", "source": source}


def to_spec_dict(cal: Calibration) -> dict:
    """The calibration as a catalog-schema dict (every value measured) plus the raw curves."""
    fp = cal.fingerprint
    when = time.strftime("%Y-%m-%d")
    src = f"opmap calibrate {when} on {fp['model']} ({fp['threads']} threads, torch {fp['torch_version']})"
    matrix = {}
    for dt in DTYPES:
        best = cal.peak(dt)
        if best:
            matrix[dt] = _v(best["flops_per_s"], f"{src}: best median over the matmul grid, "
                                                   f"at {best['m']}x{best['n']}x{best['k']}")
    bw = cal.copy_bandwidth()
    lo = cal.launch_overhead
    return {
        "name": "local",
        "display_name": f"local {cal.device}: {fp['model']}",
        "vendor": "measured",
        "device_type": "gpu" if cal.device.startswith("cuda") else "cpu",
        "compute_unit_name": "SM" if cal.device.startswith("cuda") else "thread",
        "notes": "measured by opmap calibrate; curves under [calibration]",
        "matrix_peak_flops_per_s": matrix,
        "vector_peak_flops_per_s": {dt: _v(r, f"{src}: addcmul on a cache-resident tensor")
                                    for dt, r in cal.vector.items()},
        "memory_bandwidth_bytes_per_s": _v(bw["bytes_per_s"], f"{src}: copy (read + write) of "
                                                              f"{bw['bytes']} bytes"),
        "launch_overhead_s": _v(lo.median_s, f"{src}: median one-element add"),
        "compute_units": _v(float(fp.get("compute_units", fp["threads"])), src),
        "memory_bytes": _v(float(fp["memory_bytes"]), f"{src}: device memory as the OS / driver reports it"),
        "calibration": {"device": cal.device, "fingerprint": fp, "matmul": cal.matmul,
                        "bandwidth": cal.bandwidth, "launch_overhead": lo.spread(), "skipped": cal.skipped},
    }


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_toml(d: dict) -> str:
    """A small TOML writer for the profile's shape: scalars, tables of scalars, arrays of such tables."""
    lines = []
    for k, v in d.items():
        if not isinstance(v, dict):
            lines.append(f"{k} = {_toml_value(v)}")

    def table(prefix: str, t: dict) -> None:
        def is_rows(v):
            return isinstance(v, list) and v and all(isinstance(x, dict) for x in v)

        lines.append(f"\n[{prefix}]")
        for k, v in t.items():
            if isinstance(v, list) and not is_rows(v):
                lines.append(f"{k} = [{', '.join(_toml_value(x) for x in v)}]")
            elif not isinstance(v, (dict, list)):
                lines.append(f"{k} = {_toml_value(v)}")
        for k, v in t.items():
            if isinstance(v, dict):
                table(f"{prefix}.{k}", v)
            elif is_rows(v):
                for row in v:
                    lines.append(f"\n[[{prefix}.{k}]]")
                    lines.extend(f"{rk} = {_toml_value(rv)}" for rk, rv in row.items())

    for k, v in d.items():
        if isinstance(v, dict):
            table(k, v)
    return "\n".join(lines) + "\n"


def write_profile(cal: Calibration, path: Path | None = None) -> Path:
    """Write the profile atomically; validate it through the catalog loader first."""
    from opmap.hardware.spec import spec_from_dict

    d = to_spec_dict(cal)
    spec_from_dict(d, "calibration")  # refuse to write a profile the loader would reject
    path = path or cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(to_toml(d))
    os.replace(tmp, path)
    return path
