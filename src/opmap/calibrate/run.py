"""Local calibration: measure this device's real ceilings (the microbenchmarks of calibrate/__init__).

``calibrate`` runs, per calibrated format, the GEMM grid (nn.Linear's layout, then a transposed left
operand), the convolutions (forward; fp32 backward) and fused attention; then bandwidth over sizes, the
dispatch and view overheads, the vector and transcendental rates and one rate per vector family. A shape
whose one call would take over MAX_CALL_S at the best rate seen so far is skipped and listed. The host's load
is read before and over the run (load.py): a host already busy is refused before measuring, and the run's own
verdict travels with it (``Calibration.conditions``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from opmap.calibrate import load
from opmap.calibrate.fingerprint import fingerprint
from opmap.calibrate.grids import (
    BUDGET_S,
    CEILING_CALL_S,
    CEILING_MAX,
    FORMATS,
    FRESH_MIN_BYTES,
    MAX_CALL_S,
    PARALLEL_ELEMS,
    SKIP_FLOOR_PER_THREAD,
    VECTOR_ELEMS,
    grid,
)
from opmap.errors import OpmapError
from opmap.ops import causal_pairs
from opmap.precision import torch_dtype
from opmap.timing import Sample, time_interleaved, time_op


@dataclass
class Calibration:
    """Everything one run measured (built up as the microbenchmarks run)."""

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
    parallel: dict[str, float] = field(default_factory=dict)  # a parallel region's fork / join cost (CPU)
    skipped: list[str] = field(default_factory=list)  # shapes left out, with the reason
    conditions: load.Conditions | None = None  # the host's load before and over the run (load.conditions)

    @property
    def busy(self) -> bool:
        """Measured on a busy host (load.py): its figures read low; never the host's profile."""
        return self.conditions is not None and self.conditions.busy

    def peak(self, dtype: str) -> dict | None:
        rows = [r for r in self.matmul if r["dtype"] == dtype]
        return max(rows, key=lambda r: r["flops_per_s"]) if rows else None

    def copy_bandwidth(self) -> dict:
        rows = [r for r in self.bandwidth if r["kind"] == "copy"]
        return max(rows, key=lambda r: r["bytes"])


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
        "batch_norm_train": (lambda x: torch.ops.aten.native_batch_norm(x, ch, ch, ch.clone(), ch.clone(), True, 0.1,
                                                                         1e-5), (img,)),
        "batch_norm_backward": (lambda g, x: torch.ops.aten.native_batch_norm_backward(
            g, x, ch, ch, ch, ch, ch, True, 1e-5, [True, True, True]), (img, img.clone())),
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


class _Bench:
    """Times shapes for one calibration, skipping those the best rate so far says would take too long."""

    def __init__(self, cal: Calibration, dev: torch.device, quick: bool, step: Callable[[str], None],
                 budgeted: bool = True):
        self.cal, self.dev, self.step = cal, dev, step
        self.threads = torch.get_num_threads() if dev.type == "cpu" else 1
        self.quick, self.budgeted = quick, budgeted
        self.deadline: tuple[float, str] | None = None  # (perf_counter deadline, why) of the family being measured
        # 5 samples of 5 ms each (3 where one call alone is long: time_op keeps a microbenchmark near 0.4 s) and
        # one warm-up call: the whole run in about a minute (92 s before, on an AVX-512 EPYC: issue 23)
        self.reps = 3 if quick else 5
        self.min_time = 0.002 if quick else 0.005

    def budget(self, family: str, formats: int = 1) -> None:
        """Start ``family``'s share of the time budget for ``formats`` formats (grids.BUDGET_S; none for the quick
        grid)."""
        share = BUDGET_S.get(family, 0.0) * formats or None
        self.deadline = None if self.quick or not self.budgeted or share is None else (
            time.perf_counter() + share, f"past the {share:g} s share of the time budget for {family}")

    def time(self, fn: Callable[[], object]) -> Sample:
        return time_op(fn, self.dev, warmup=1, repeats=self.reps, min_time_s=self.min_time)

    def shape(self, label: str, flops: float, make: Callable[[], Callable[[], object]], rates: dict[str, float],
              family: str) -> Sample | None:
        """Time one shape unless the best rate so far (this family's, else any family's at this dtype) says
        one call would take over MAX_CALL_S."""
        if self.deadline is not None and time.perf_counter() > self.deadline[0]:
            self.cal.skipped.append(f"{label}: {self.deadline[1]}")
            self.step(f"{label} skipped")
            return None
        best = max(rates.get(family) or max(rates.values(), default=0.0), SKIP_FLOOR_PER_THREAD * self.threads)
        if flops / best > MAX_CALL_S:
            self.cal.skipped.append(f"{label}: one call would take {flops / best:.2g} s at {best / 1e9:.3g} GFLOP/s")
            self.step(f"{label} skipped")
            return None
        s = self.time(make())
        # the fastest sample: on a shared host a descheduled worker thread can stall every call of a small shape,
        # and a rate read from that stall would skip the whole rest of the grid
        rates[family] = max(rates.get(family, 0.0), flops / s.spread()["min_s"])
        self.step(label)
        return s


    def shapes(self, labels: list[str], flops: float, makes: list[Callable[[], Callable[[], object]]],
               rates: list[dict[str, float]], family: str) -> list[Sample | None]:
        """One shape in several formats (label, make and rates per format), the formats the skip rules keep timed
        interleaved (opmap.timing.time_interleaved), so a stall on a shared host falls on every format alike and
        their ratio holds. A Sample (or None: skipped) per format."""
        keep = []
        for i, (label, rate) in enumerate(zip(labels, rates)):
            why = None
            if self.deadline is not None and time.perf_counter() > self.deadline[0]:
                why = self.deadline[1]
            else:
                best = max(rate.get(family) or max(rate.values(), default=0.0), SKIP_FLOOR_PER_THREAD * self.threads)
                if flops / best > MAX_CALL_S:
                    why = f"one call would take {flops / best:.2g} s at {best / 1e9:.3g} GFLOP/s"
            if why:
                self.cal.skipped.append(f"{label}: {why}")
                self.step(f"{label} skipped")
            else:
                keep.append(i)
        out: list[Sample | None] = [None] * len(labels)
        if keep:
            samples = time_interleaved([makes[i]() for i in keep], self.dev, warmup=1, rounds=self.reps,
                                       min_time_s=self.min_time)
            for i, s in zip(keep, samples):
                rates[i][family] = max(rates[i].get(family, 0.0), flops / s.spread()["min_s"])
                out[i] = s
                self.step(labels[i])
        return out


def _matmuls(b: _Bench, formats: list[tuple[str, torch.dtype]], shapes: dict, rates: dict[str, dict]) -> None:
    """The GEMM grid, each shape timed in every format at once (interleaved: _Bench.shapes)."""
    dev, cal = b.dev, b.cal
    layouts = (("nt", "gemm", "gemm"), ("tt", "gemm_ta", "gemm_ta"), ("tn", "gemm_wgrad", "gemm_wgrad"))
    for layout, family, key in layouts:
        b.budget(family, len(formats))
        for m, n, k in sorted(shapes[key], key=lambda s: s[0] * s[1] * s[2]):
            def mk(m=m, n=n, k=k, layout=layout, dt=torch.float32):
                if layout == "tn":  # a weight gradient: x.T @ dy, dy row-major
                    xt, dy = torch.randn(k, m, device=dev).to(dt), torch.randn(k, n, device=dev).to(dt)
                    return lambda: torch.mm(xt.t(), dy)
                w = torch.randn(n, k, device=dev).to(dt)
                if layout == "nt":
                    a = torch.randn(m, k, device=dev).to(dt)
                    return lambda: torch.mm(a, w.t())
                at = torch.randn(k, m, device=dev).to(dt)
                return lambda: torch.mm(at.t(), w.t())
            tail = {"nt": "", "tt": " (A transposed)", "tn": " (weight gradient)"}[layout]
            labels = [f"matmul {name} {m}x{n}x{k}{tail}" for name, _ in formats]
            makes = [lambda dt=dt, mk=mk: mk(dt=dt) for _, dt in formats]
            samples = b.shapes(labels, 2.0 * m * n * k, makes, [rates[name] for name, _ in formats], family)
            for (name, _), s in zip(formats, samples):
                if s is not None:
                    cal.matmul.append({"m": m, "n": n, "k": k, "dtype": name, "layout": layout,
                                       "flops_per_s": 2.0 * m * n * k / s.median_s, **s.spread()})


def _convs(b: _Bench, name: str, dt: torch.dtype, shapes: dict, rate: dict[str, float]) -> None:
    import torch.nn.functional as F

    dev, cal = b.dev, b.cal
    b.budget("conv")
    for bs, cin, cout, side, ks, stride in shapes["conv"]:
        pad = ks // 2 if stride == 1 else (3 if ks == 7 else 0)
        out = (side + 2 * pad - ks) // stride + 1
        gm, gn, gk = bs * out * out, cout, cin * ks * ks
        shape = {"batch": bs, "cin": cin, "cout": cout, "side": side, "kernel": ks, "stride": stride,
                 "m": gm, "n": gn, "k": gk, "dtype": name}

        def mk(bs=bs, cin=cin, cout=cout, side=side, ks=ks, stride=stride, pad=pad):
            x = torch.randn(bs, cin, side, side, device=dev).to(dt)
            w = torch.randn(cout, cin, ks, ks, device=dev).to(dt)
            return lambda: F.conv2d(x, w, stride=stride, padding=pad)
        s = b.shape(f"conv {name} b{bs} {cin}->{cout} {side}px k{ks}", 2.0 * gm * gn * gk, mk, rate, "conv")
        if s is not None:
            cal.conv.append({**shape, "pass": "forward", "flops_per_s": 2.0 * gm * gn * gk / s.median_s,
                             **s.spread()})
        if name != "fp32" or cin == 3:  # training runs fp32 here; the stem's input needs no gradient
            continue

        def mkb(bs=bs, cin=cin, cout=cout, side=side, ks=ks, stride=stride, pad=pad, out=out):
            x = torch.randn(bs, cin, side, side, device=dev)
            w = torch.randn(cout, cin, ks, ks, device=dev)
            go = torch.randn(bs, cout, out, out, device=dev)
            return lambda: torch.ops.aten.convolution_backward(
                go, x, w, None, [stride, stride], [pad, pad], [1, 1], False, [0, 0], 1, [True, True, False])
        # grad input + grad weight: two forward-sized implicit GEMMs
        s = b.shape(f"conv backward {name} b{bs} {cin}->{cout} {side}px k{ks}", 4.0 * gm * gn * gk, mkb, rate,
                    "conv_bwd")
        if s is not None:
            cal.conv.append({**shape, "pass": "backward", "flops_per_s": 4.0 * gm * gn * gk / s.median_s,
                             **s.spread()})


def _attention(b: _Bench, name: str, dt: torch.dtype, shapes: dict, rate: dict[str, float]) -> None:
    import torch.nn.functional as F

    b.budget("attention")
    for bh, sq, d in shapes["attention"]:
        for causal in (False, True):
            flops = 4.0 * bh * (causal_pairs(sq, sq) if causal else sq * sq) * d

            def mk(bh=bh, sq=sq, d=d, causal=causal):
                q = torch.randn(1, bh, sq, d, device=b.dev).to(dt)
                return lambda: F.scaled_dot_product_attention(q, q, q, is_causal=causal)
            s = b.shape(f"attention {name} {bh}x{sq}x{d}{' causal' if causal else ''}", flops, mk, rate, "attention")
            if s is not None:
                b.cal.attention.append({"bh": bh, "sq": sq, "sk": sq, "d": d, "causal": causal, "dtype": name,
                                        "flops_per_s": flops / s.median_s, **s.spread()})


def _bandwidth(b: _Bench, sizes: tuple[int, ...]) -> None:
    """Copy, read, write and fresh-write rates per size: the largest size first (the profile's memory bandwidth),
    then the rest from the smallest up, within the bandwidth share of the time budget."""
    b.budget("bandwidth")
    for nbytes in sorted(sizes, key=lambda x: (x != max(sizes), x)):
        if b.deadline is not None and time.perf_counter() > b.deadline[0]:
            b.cal.skipped.append(f"bandwidth {nbytes} B: {b.deadline[1]}")
            b.step(f"bandwidth {nbytes} B skipped")
            continue
        src = torch.randn(nbytes // 4, device=b.dev)
        dst = torch.empty_like(src)
        n = nbytes // 4
        kinds = [("copy", lambda: dst.copy_(src), 2 * nbytes), ("read", lambda: src.sum(), nbytes),
                 ("write", lambda: dst.fill_(1.0), nbytes)]
        if b.dev.type == "cpu" and nbytes >= FRESH_MIN_BYTES:
            # the same write into a buffer allocated for it: eager PyTorch's out-of-place output. Large blocks go
            # back to the OS when freed, so every first touch of a fresh one faults its pages in
            kinds.append(("fresh_write", lambda n=n: torch.empty(n, device=b.dev).fill_(1.0), nbytes))
        for kind, fn, moved in kinds:
            s = b.time(fn)
            b.cal.bandwidth.append({"kind": kind, "bytes": nbytes, "bytes_per_s": moved / s.median_s, **s.spread()})
        b.step(f"bandwidth {nbytes} B")


def _vector(b: _Bench) -> None:
    """Dispatch and view overheads, the pointwise and transcendental rates, one rate per vector family; each
    rate with the dispatch overhead taken out."""
    dev, cal = b.dev, b.cal
    one = torch.ones(1, device=dev)
    cal.launch_overhead = b.time(lambda: torch.add(one, one))
    lo = cal.launch_overhead.median_s
    b.step("dispatch overhead")
    big = torch.ones(64, 64, device=dev)
    cal.view_overhead_s = b.time(lambda: big.view(4096)).median_s
    b.step("view overhead")
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        x = torch.randn(VECTOR_ELEMS, device=dev).to(dt)
        y = torch.empty_like(x)
        s = b.time(lambda: torch.addcmul(x, x, x, out=y))
        cal.vector[name] = 2.0 * x.numel() / max(s.median_s - lo, s.median_s * 0.1)
        b.step(f"vector {name}")
    x = torch.rand(VECTOR_ELEMS, device=dev)
    y = torch.empty_like(x)
    t = statistics.mean(b.time(lambda f=f: f(x, out=y)).median_s for f in (torch.exp, torch.tanh, torch.erf))
    cal.transcendental_per_s = x.numel() / max(t - lo, t * 0.1)
    b.step("transcendental rate")
    for kind, (fn, args) in _vector_kind_benchmarks(dev).items():
        flops = _rule_vector_flops(fn, args)
        t = b.time(lambda fn=fn, args=args: fn(*args)).median_s
        cal.vector_kinds[kind] = flops / max(t - lo, t * 0.1)
    b.step("vector families")
    cal.parallel = parallel_overhead(dev)
    b.step("parallel region overhead")


def ceiling_side(rate_flops_per_s: float) -> int:
    """The side of the square GEMM whose one call takes about CEILING_CALL_S at ``rate``: large enough that the
    dispatched kernel (oneDNN, BLAS) runs at its sustained rate, in multiples of 256, at most CEILING_MAX."""
    side = int((rate_flops_per_s * CEILING_CALL_S / 2.0) ** (1.0 / 3.0)) // 256 * 256
    return max(256, min(CEILING_MAX, side))


def _ceilings(b: _Bench, names: list[str]) -> None:
    """Each format's ceiling: one large square GEMM in nn.Linear's layout (the kernel torch dispatches for the
    format on this device), all formats at the same size and timed interleaved, so a load that comes and goes
    on a shared host falls on every format alike and their ratio holds. The side is sized on the fastest rate
    the grid saw; a format whose call would then take over 4 x CEILING_CALL_S is left at its grid figures."""
    best = {n: max((r["flops_per_s"] for r in b.cal.matmul if r["dtype"] == n), default=0.0) for n in names}
    side = ceiling_side(max(best.values(), default=0.0) or 1e9)
    flops = 2.0 * side ** 3
    names = [n for n in names if best[n] and flops / best[n] <= 4 * CEILING_CALL_S]
    def build(side: int) -> list[Callable[[], object]]:
        fns = []
        for n in names:
            dt = torch_dtype(n)
            a, w = torch.randn(side, side, device=b.dev).to(dt), torch.randn(side, side, device=b.dev).to(dt)
            fns.append(lambda a=a, w=w: torch.mm(a, w.t()))
        return fns
    fns = build(side)
    if fns and b.deadline is None and not b.quick:
        fns[0]()  # a probe of the first format: a loaded host runs below the grid's best rate, so resize to it
        t0 = time.perf_counter()
        fns[0]()
        took = time.perf_counter() - t0
        if took > 2 * CEILING_CALL_S:
            side = ceiling_side(flops / took)
            flops = 2.0 * side ** 3
            fns = build(side)
    samples = time_interleaved(fns, b.dev, warmup=1, rounds=3, min_time_s=0.0) if fns else []
    for n, s in zip(names, samples):
        b.cal.matmul.append({"m": side, "n": side, "k": side, "dtype": n, "layout": "nt", "ceiling": True,
                             "flops_per_s": flops / s.median_s, **s.spread()})
    b.step(f"ceilings at {side}^3")


def parallel_overhead(dev: torch.device, rounds: int = 5) -> dict[str, float]:
    """A parallel region's fork / join cost on a CPU, seconds: a PARALLEL_ELEMS-element add (past ATen's grain
    size, so it splits over every intra-op thread) timed on all threads and on one, interleaved;
    ``overhead_s`` = time on T threads - time on 1 thread / T (the part that parallel work does not explain:
    waking and joining the workers, which on a host shared with other busy processes includes waiting for the
    scheduler to run them). Empty on a GPU or a one-thread run."""
    n = torch.get_num_threads()
    if dev.type != "cpu" or n < 2:
        return {}
    x = torch.ones(PARALLEL_ELEMS, device=dev)
    y = torch.empty_like(x)

    def one():
        torch.set_num_threads(1)
        try:
            torch.add(x, x, out=y)
        finally:
            torch.set_num_threads(n)
    many, single = time_interleaved([lambda: torch.add(x, x, out=y), one], dev, rounds=rounds, min_time_s=0.002)
    return {"threads": float(n), "many_s": many.median_s, "one_s": single.median_s,
            "overhead_s": max(0.0, many.median_s - single.median_s / n), "iqr_s": many.spread()["iqr_s"]}


def calibrate(device: str = "cpu", quick: bool = False, progress: Callable[[str], None] | None = None,
              budgeted: bool = True, allow_busy: bool = False) -> Calibration:
    """Run every microbenchmark on ``device``. ``quick`` shrinks the grid (tests, smoke runs); ``budgeted=False``
    lifts the time budget (grids.BUDGET_S): every shape the skip rule allows, minutes on a loaded host. A host
    busy before the run (load.precheck) is refused in half a second unless ``allow_busy``; the verdict over the
    run is ``conditions`` (the caller decides what to write: profile_file.write_profile never stores a busy one
    as the host's)."""
    if device.split(":")[0] not in ("cpu", "cuda"):
        raise OpmapError(f"calibrate cannot run on {device!r}; accepted: cpu, cuda")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise OpmapError("calibrate --device cuda: no CUDA device here; accepted: cpu")
    pre = load.precheck()
    if pre.busy and not allow_busy:
        raise OpmapError(f"the host is busy ({load.summary(pre)}): a calibration now would read low, so none was "
                         "run; calibrate when it is quiet (or `opmap calibrate --allow-busy --out PATH`: a profile "
                         "marked busy, kept apart from the host's)")
    cal = Calibration(str(dev), fingerprint(dev))
    start = load.Clock.now()
    _measure(cal, dev, quick, progress, budgeted)
    rows = [*cal.matmul, *cal.conv, *cal.attention, *cal.bandwidth]
    cal.conditions = load.conditions(pre, start, load.Clock.now(), rows, dev.type == "cpu")
    return cal


def _measure(cal: Calibration, dev: torch.device, quick: bool, progress: Callable[[str], None] | None,
             budgeted: bool) -> None:
    """Every microbenchmark, in order, into ``cal``."""
    b = _Bench(cal, dev, quick, progress or (lambda _msg: None), budgeted)
    shapes = grid(quick)
    with torch.no_grad():
        formats = []
        for name in FORMATS:
            if _supported(torch_dtype(name), dev):
                formats.append((name, torch_dtype(name)))
            else:
                b.step(f"{name} not supported")
        # best rate so far per format and family, to skip slow shapes
        rates: dict[str, dict[str, float]] = {name: {} for name, _ in formats}
        _matmuls(b, formats, shapes, rates)
        for name, dt in formats:
            rate = rates[name]
            _convs(b, name, dt, shapes, rate)
            _attention(b, name, dt, shapes, rate)
        b.deadline = None
        _ceilings(b, [n for n in FORMATS if any(r["dtype"] == n for r in cal.matmul)])
        _bandwidth(b, shapes["sizes"])
        b.deadline = None
        _vector(b)
