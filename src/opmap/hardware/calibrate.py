"""Local calibration: measure this device's real ceilings and write them as a hardware profile.

Microbenchmarks, each with warm-up, repeats, the median and the spread (min, max, interquartile range):

- matmul rate per dtype (fp32, bf16, fp16 where the device runs them) over a grid of shapes in nn.Linear's
  layout (m from 16 to 4096, n and k from 256 to 4096), so the profile carries an efficiency curve by size
  and aspect, not one number; the matrix peak is the best median over the grid;
- convolutions (ResNet and ViT layer shapes, batch 1 and 8) stored as implicit GEMMs, forward and (fp32)
  backward (convolution_backward for the input and weight gradients), and fused attention
  (scaled_dot_product_attention over sequence lengths, causal and not): their own curves;
- copy, read and write bandwidth over sizes that cross the cache levels (copy counts read + write bytes);
  the memory bandwidth is the copy rate at the largest size (past the last-level cache);
- per-op dispatch / launch overhead: the median time of a one-element add; the host cost of a view op;
- vector (pointwise) rate: addcmul on a cache-resident tensor, and the transcendental rate (exp, tanh,
  erf), each with the dispatch overhead taken out.

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
from opmap.precision import torch_dtype

# The formats calibrated, with the torch dtype each runs in.
DTYPES = {f: torch_dtype(f) for f in ("fp32", "bf16", "fp16")}
# GEMM (m, n, k) in nn.Linear's layout (x[m,k] @ W[n,k].T): m from decode-like to large batches, n and k
# across the weight sizes of the zoo; the time model interpolates between these points (hardware/curves.py).
FULL_GRID = tuple((m, n, k) for m in (16, 64, 256, 1024, 4096) for n in (256, 1024, 4096)
                  for k in (256, 1024, 4096)) + (
    (16, 32768, 1024), (128, 32768, 512), (512, 32768, 256))  # vocabulary-wide heads (LM heads: 30k-150k)
QUICK_GRID = ((128, 128, 128), (256, 256, 256), (16, 512, 512))
# The same GEMM with the left operand a transposed view (x.t() @ W.T): BLAS takes another path for it.
FULL_GRID_TA = tuple((m, n, k) for m in (64, 256, 1024) for n in (256, 1024) for k in (256, 1024))
QUICK_GRID_TA = ((128, 128, 128),)
# Convolutions (batch, Cin, Cout, image side, kernel, stride): ResNet's stem, 3x3 and 1x1 layers at each
# stage, and ViT's 16x16 patch embedding, at batch 1 and 8; each is stored as its implicit GEMM.
FULL_CONV = tuple((b, *c) for b in (1, 8) for c in (
    (3, 64, 224, 7, 2), (64, 64, 56, 3, 1), (64, 256, 56, 1, 1), (256, 64, 56, 1, 1), (128, 128, 28, 3, 1),
    (512, 128, 28, 1, 1), (256, 256, 14, 3, 1), (1024, 256, 14, 1, 1), (512, 512, 7, 3, 1),
    (2048, 512, 7, 1, 1), (3, 768, 224, 16, 16)))
QUICK_CONV = ((1, 16, 16, 16, 3, 1),)
# Fused attention (batch * heads, sequence, head dim), causal and not.
FULL_ATTN = tuple((12, s, 64) for s in (64, 128, 256, 512, 1024, 2048))
QUICK_ATTN = ((2, 32, 16),)
FULL_SIZES = tuple(2 ** p for p in range(16, 31, 2))  # 64 KiB .. 1 GiB per buffer
QUICK_SIZES = (2 ** 16, 2 ** 20)
MAX_CALL_S = 0.1  # a shape whose one call would take longer (slow dtype on this device) is skipped, and said
VECTOR_ELEMS = 2 ** 17  # 512 KiB of fp32: inside a per-core L2, so the vector rate is not a bandwidth


def cache_path(device: str = "cpu") -> Path:
    """Where ``--hardware local`` (CPU) and ``--hardware local-cuda`` find their profiles."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "opmap" / ("local-cuda.toml" if device.startswith("cuda") else "local.toml")


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
    repeats = max(3, min(repeats, int(0.4 / (once * calls)) or 3))  # about 0.4 s per microbenchmark at most
    out: list[float] = []
    for _ in range(2):  # a second round when the first is disturbed (max over min above 3: another tenant)
        out += _samples(fn, device, repeats, calls)
        if max(out) <= 3.0 * min(out):
            break
    return Sample(tuple(out))


def _samples(fn: Callable[[], object], device: torch.device, repeats: int, calls: int) -> list[float]:
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
    return out


@dataclass
class Calibration:
    device: str
    fingerprint: dict[str, object]
    matmul: list[dict] = field(default_factory=list)  # m, n, k, dtype, layout, flops_per_s, spread
    conv: list[dict] = field(default_factory=list)  # the conv shape, its implicit GEMM m, n, k, flops_per_s
    attention: list[dict] = field(default_factory=list)  # bh, sq, sk, d, causal, dtype, flops_per_s
    bandwidth: list[dict] = field(default_factory=list)  # kind, bytes, bytes_per_s, spread
    launch_overhead: Sample | None = None
    vector: dict[str, float] = field(default_factory=dict)  # dtype -> flops_per_s
    transcendental_per_s: float = 0.0  # exp / tanh / erf evaluations per second, fp32
    vector_kinds: dict[str, float] = field(default_factory=dict)  # family -> the cost rule's FLOPs per second
    view_overhead_s: float = 0.0  # one view op (host dispatch, no kernel)
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
        fp.update(cpu_caches())
    return fp


def cpu_caches(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> dict[str, int]:
    """Per-core L1d and L2 and the last-level cache, in bytes, as the OS reports them (sysfs)."""
    out: dict[str, int] = {}
    try:
        for idx in sorted(root.glob("index*")):
            level = int((idx / "level").read_text())
            kind = (idx / "type").read_text().strip()
            size = (idx / "size").read_text().strip()
            mult = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(size[-1], 1)
            nbytes = int(size.rstrip("KMG")) * mult
            if kind in ("Data", "Unified"):
                out[{1: "l1d_bytes", 2: "l2_per_core_bytes"}.get(level, "llc_bytes")] = nbytes
    except (OSError, ValueError):
        pass
    return out


def _supported(dtype: torch.dtype, device: torch.device) -> bool:
    try:
        a = torch.ones(8, 8, dtype=dtype, device=device)
        (a @ a).sum().item()
        return True
    except (RuntimeError, TypeError):
        return False


def _vector_kind_benchmarks(dev: torch.device) -> dict:
    """One representative op per vector family, on cache-resident fp32 activations of typical shapes."""
    import torch.nn.functional as F

    rows = torch.randn(256, 768, device=dev)
    img = torch.randn(4, 64, 56, 56, device=dev)
    ch = torch.ones(64, device=dev)
    return {
        "softmax": (lambda x: torch.softmax(x, -1), (rows,)),
        "layer_norm": (lambda x: F.layer_norm(x, (768,)), (rows,)),
        "batch_norm": (lambda x: F.batch_norm(x, ch, ch, ch, ch, training=False), (img,)),
        "pool": (lambda x: F.max_pool2d(x, 3, 2, 1), (img,)),
        "reduce": (lambda x: x.mean((2, 3)), (img,)),
    }


def _rule_vector_flops(fn: Callable, args: tuple) -> float:
    """The vector FLOPs opmap's own cost rules give this op, so the measured rate is in the rules' units."""
    from opmap.capture import capture
    from opmap.costs import cost_graph

    class _Op(torch.nn.Module):
        def forward(self, *xs):
            return fn(*xs)

    g = capture(_Op(), args)
    return sum(c.vector_flops for c in cost_graph(g)) or 1.0


def steps(quick: bool) -> int:
    """How many progress steps ``calibrate`` reports (for a progress bar's total)."""
    g, c, t, z = (QUICK_GRID, QUICK_CONV, QUICK_ATTN, QUICK_SIZES) if quick else (FULL_GRID, FULL_CONV, FULL_ATTN,
                                                                                  FULL_SIZES)
    ta = QUICK_GRID_TA if quick else FULL_GRID_TA
    backward = sum(1 for x in c if x[1] != 3)
    return len(DTYPES) * (len(g) + len(ta) + len(c) + 2 * len(t)) + backward + len(z) + 6


def calibrate(device: str = "cpu", quick: bool = False, progress: Callable[[str], None] | None = None) -> Calibration:
    """Run every microbenchmark on ``device``. ``quick`` shrinks the grid (tests, smoke runs)."""
    import torch.nn.functional as F

    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise OpmapError("calibrate --device cuda: no CUDA device here; accepted: cpu")
    if dev.type not in ("cpu", "cuda"):
        raise OpmapError(f"calibrate cannot run on {device!r}; accepted: cpu, cuda")
    step = progress or (lambda _msg: None)
    cal = Calibration(str(dev), fingerprint(dev))
    grid, convs, attns = (QUICK_GRID, QUICK_CONV, QUICK_ATTN) if quick else (FULL_GRID, FULL_CONV, FULL_ATTN)
    sizes = QUICK_SIZES if quick else FULL_SIZES
    reps = 3 if quick else 5
    min_time = 0.002 if quick else 0.01

    def bench(label: str, flops: float, make: Callable[[], Callable[[], object]], rates: dict[str, float],
              family: str) -> Sample | None:
        """Time one shape unless the best rate so far (this family's, else any family's at this dtype) says
        one call would take over MAX_CALL_S."""
        best = rates.get(family) or max(rates.values(), default=0.0)
        if best and flops / best > MAX_CALL_S:
            cal.skipped.append(f"{label}: one call would take {flops / best:.2g} s at {best / 1e9:.3g} GFLOP/s")
            step(f"{label} skipped")
            return None
        s = time_op(make(), dev, repeats=reps, min_time_s=min_time)
        rates[family] = max(rates.get(family, 0.0), flops / s.median_s)
        step(label)
        return s

    with torch.no_grad():
        for name, dt in DTYPES.items():
            if not _supported(dt, dev):
                step(f"{name} not supported")
                continue
            rate: dict[str, float] = {}  # best rate so far per family at this dtype, to skip slow shapes
            for m, n, k in sorted(grid, key=lambda s: s[0] * s[1] * s[2]):
                def mk(m=m, n=n, k=k):
                    a = torch.randn(m, k, device=dev).to(dt)
                    w = torch.randn(n, k, device=dev).to(dt)
                    return lambda: torch.mm(a, w.t())
                s = bench(f"matmul {name} {m}x{n}x{k}", 2.0 * m * n * k, mk, rate, "gemm")
                if s is not None:
                    cal.matmul.append({"m": m, "n": n, "k": k, "dtype": name, "layout": "nt",
                                       "flops_per_s": 2.0 * m * n * k / s.median_s, **s.spread()})
            for m, n, k in sorted(QUICK_GRID_TA if quick else FULL_GRID_TA, key=lambda s: s[0] * s[1] * s[2]):
                def mk(m=m, n=n, k=k):
                    a = torch.randn(k, m, device=dev).to(dt)
                    w = torch.randn(n, k, device=dev).to(dt)
                    return lambda: torch.mm(a.t(), w.t())
                s = bench(f"matmul {name} {m}x{n}x{k} (A transposed)", 2.0 * m * n * k, mk, rate, "gemm_ta")
                if s is not None:
                    cal.matmul.append({"m": m, "n": n, "k": k, "dtype": name, "layout": "tt",
                                       "flops_per_s": 2.0 * m * n * k / s.median_s, **s.spread()})
            for b, cin, cout, side, ks, stride in convs:
                pad = ks // 2 if stride == 1 else (3 if ks == 7 else 0)
                out = (side + 2 * pad - ks) // stride + 1
                gm, gn, gk = b * out * out, cout, cin * ks * ks
                def mk(b=b, cin=cin, cout=cout, side=side, ks=ks, stride=stride, pad=pad):
                    x = torch.randn(b, cin, side, side, device=dev).to(dt)
                    w = torch.randn(cout, cin, ks, ks, device=dev).to(dt)
                    return lambda: F.conv2d(x, w, stride=stride, padding=pad)
                s = bench(f"conv {name} b{b} {cin}->{cout} {side}px k{ks}", 2.0 * gm * gn * gk, mk, rate, "conv")
                if s is not None:
                    cal.conv.append({"batch": b, "cin": cin, "cout": cout, "side": side, "kernel": ks,
                                     "stride": stride, "m": gm, "n": gn, "k": gk, "dtype": name, "pass": "forward",
                                     "flops_per_s": 2.0 * gm * gn * gk / s.median_s, **s.spread()})
                if name != "fp32" or cin == 3:  # training runs fp32 here; the stem's input needs no gradient
                    continue

                def mkb(b=b, cin=cin, cout=cout, side=side, ks=ks, stride=stride, pad=pad, out=out):
                    x = torch.randn(b, cin, side, side, device=dev)
                    w = torch.randn(cout, cin, ks, ks, device=dev)
                    go = torch.randn(b, cout, out, out, device=dev)
                    return lambda: torch.ops.aten.convolution_backward(
                        go, x, w, None, [stride, stride], [pad, pad], [1, 1], False, [0, 0], 1, [True, True, False])
                # grad input + grad weight: two forward-sized implicit GEMMs
                s = bench(f"conv backward {name} b{b} {cin}->{cout} {side}px k{ks}", 4.0 * gm * gn * gk, mkb, rate,
                          "conv_bwd")
                if s is not None:
                    cal.conv.append({"batch": b, "cin": cin, "cout": cout, "side": side, "kernel": ks,
                                     "stride": stride, "m": gm, "n": gn, "k": gk, "dtype": name, "pass": "backward",
                                     "flops_per_s": 4.0 * gm * gn * gk / s.median_s, **s.spread()})
            for bh, sq, d in attns:
                for causal in (False, True):
                    pairs = sq * (sq + 1) // 2 if causal else sq * sq
                    flops = 4.0 * bh * pairs * d
                    def mk(bh=bh, sq=sq, d=d, causal=causal):
                        q = torch.randn(1, bh, sq, d, device=dev).to(dt)
                        return lambda: F.scaled_dot_product_attention(q, q, q, is_causal=causal)
                    s = bench(f"attention {name} {bh}x{sq}x{d}{' causal' if causal else ''}", flops, mk, rate,
                              "attention")
                    if s is not None:
                        cal.attention.append({"bh": bh, "sq": sq, "sk": sq, "d": d, "causal": causal,
                                              "dtype": name, "flops_per_s": flops / s.median_s, **s.spread()})
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
        lo = cal.launch_overhead.median_s
        step("dispatch overhead")
        big = torch.ones(64, 64, device=dev)
        cal.view_overhead_s = time_op(lambda: big.view(4096), dev, repeats=reps, min_time_s=min_time).median_s
        step("view overhead")
        for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            x = torch.randn(VECTOR_ELEMS, device=dev).to(dt)
            y = torch.empty_like(x)
            s = time_op(lambda: torch.addcmul(x, x, x, out=y), dev, repeats=reps, min_time_s=min_time)
            cal.vector[name] = 2.0 * x.numel() / max(s.median_s - lo, s.median_s * 0.1)
            step(f"vector {name}")
        x = torch.rand(VECTOR_ELEMS, device=dev)
        y = torch.empty_like(x)
        per = [time_op(lambda f=f: f(x, out=y), dev, repeats=reps, min_time_s=min_time).median_s
               for f in (torch.exp, torch.tanh, torch.erf)]
        t = statistics.mean(per)
        cal.transcendental_per_s = x.numel() / max(t - lo, t * 0.1)
        step("transcendental rate")
        for kind, (fn, args) in _vector_kind_benchmarks(dev).items():
            flops = _rule_vector_flops(fn, args)
            t = time_op(lambda fn=fn, args=args: fn(*args), dev, repeats=reps, min_time_s=min_time).median_s
            cal.vector_kinds[kind] = flops / max(t - lo, t * 0.1)
        step("vector families")
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
        "name": "local-cuda" if cal.device.startswith("cuda") else "local",
        "display_name": f"local {cal.device}: {fp['model']}",
        "vendor": "measured",
        "device_type": "gpu" if cal.device.startswith("cuda") else "cpu",
        "compute_unit_name": "SM" if cal.device.startswith("cuda") else "thread",
        "notes": "measured by opmap calibrate; curves under [calibration]",
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
                        "vector_kinds": cal.vector_kinds,
                        "vector_rates": {"transcendental_per_s": cal.transcendental_per_s,
                                         **{f"{k}_flops_per_s": v for k, v in cal.vector.items()}},
                        "skipped": cal.skipped},
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
    path = path or cache_path(cal.device)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(to_toml(d))
    os.replace(tmp, path)
    return path
