"""Candidate mappings of one signature on a CPU, and the operator each runs.

A ``Candidate`` is one way to run a signature: the thread count, the dtype the operator computes in (its
activations cast in and its output cast back to the model's dtype, weights stored in that dtype), the memory
format of a convolution (channels_last: input converted on entry, weight stored NHWC), the scaled-dot-product
attention backend (``auto``: what torch dispatches; ``math``; ``flash``: torch's fused CPU kernel), and GEMM
blocking by chunking the rows into equal parts (one call per chunk, the outputs concatenated).

``op_for(sig, cand, device)`` builds the operator and its inputs: the same function runs on real tensors
(timed) and on the meta device (captured and costed by opmap's cost model, so the prediction covers exactly
what is timed: casts, conversions and concatenations included).

``torch.compile`` is not a candidate here: inductor's CPU backend builds C++ per graph with the host compiler,
which took 70 s to compile one Linear + GELU (torch 2.13, gcc, this 2-core host shared with other busy
processes, December 2026), longer than a whole tuning run; the axis is named in ``LEFT_OUT`` so tune.json says so.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from opmap.explore.tune.signatures import Signature
from opmap.precision import torch_dtype

SDPA_BACKENDS = ("auto", "math", "flash")
CHUNKS = (1, 2, 4)
MIN_CHUNK_ROWS = 16  # a chunk below this many rows is a matrix-vector product, never a win: not enumerated
LEFT_OUT = {"torch_compile": "inductor's CPU backend compiles C++ per graph: 70 s for one Linear + GELU on the "
                             "2-core host this was built on, longer than a tuning run",
            "triton_configs": "GPU only (Triton GEMM / attention tiles, cuBLAS vs Triton): no CUDA device here"}


@dataclass(frozen=True)
class Candidate:
    """One mapping of a signature (see the module docstring)."""

    threads: int
    dtype: str
    channels_last: bool = False
    sdpa: str = "auto"
    chunks: int = 1

    @property
    def label(self) -> str:
        parts = [f"threads={self.threads}", f"dtype={self.dtype}"]
        if self.channels_last:
            parts.append("channels_last")
        if self.sdpa != "auto":
            parts.append(f"sdpa={self.sdpa}")
        if self.chunks > 1:
            parts.append(f"chunks={self.chunks}")
        return ",".join(parts)

    def to_dict(self) -> dict:
        return {"label": self.label, **asdict(self)}

    @staticmethod
    def from_dict(d: dict) -> Candidate:
        return Candidate(int(d["threads"]), str(d["dtype"]), bool(d.get("channels_last", False)),
                         str(d.get("sdpa", "auto")), int(d.get("chunks", 1)))


def default_candidate(sig: Signature, threads: int) -> Candidate:
    """What eager PyTorch runs without tuning: every thread, the model's dtype, its layout, torch's SDPA pick."""
    return Candidate(threads, sig.dtype, sig.layout == "channels_last")


def thread_counts(cores: int) -> tuple[int, ...]:
    """1, then powers of two up to ``cores``, and ``cores`` itself."""
    out = {1, cores}
    t = 2
    while t < cores:
        out.add(t)
        t *= 2
    return tuple(sorted(out))


def enumerate_candidates(sig: Signature, threads: int, dtypes: tuple[str, ...],
                         sdpa_backends: tuple[str, ...] = SDPA_BACKENDS) -> list[Candidate]:
    """Every candidate of ``sig`` on a CPU with ``threads`` threads, the default first. ``dtypes``: the formats
    the device runs (calibrated); ``sdpa_backends``: those that run here."""
    layouts = (False, True) if sig.family in ("conv", "batch_norm") else (sig.layout == "channels_last",)
    backends = sdpa_backends if sig.family == "attention" else ("auto",)
    rows = sig.shape[0] if sig.family == "gemm" else 0
    chunks = tuple(c for c in CHUNKS if c == 1 or rows // c >= MIN_CHUNK_ROWS) if sig.family == "gemm" else (1,)
    default = default_candidate(sig, threads)
    out = [default]
    for t, dt, cl, b, c in itertools.product(thread_counts(threads), dtypes, layouts, backends, chunks):
        cand = Candidate(t, dt, cl, b, c)
        if cand != default:
            out.append(cand)
    return out


def _sdpa_context(backend: str):
    if backend == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel({"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION}[backend])


def _math_attention(q, k, v, causal: bool):
    """Attention unfused, as the math backend runs it: scores, (mask), softmax, weighted sum."""
    s = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
    if causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril(k.shape[-2] - q.shape[-2])
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def _cast(x: torch.Tensor, dt: torch.dtype, channels_last: bool = False) -> torch.Tensor:
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return x.to(dtype=dt, memory_format=fmt)


def _gemm(sig: Signature, cand: Candidate, dev: torch.device) -> tuple[Callable, tuple]:
    m, n, k, bias = sig.shape
    mt, ct = torch_dtype(sig.dtype), torch_dtype(cand.dtype)
    args = (torch.randn(m, k, device=dev, dtype=mt), torch.randn(n, k, device=dev, dtype=ct) * k ** -0.5,
            torch.randn(n, device=dev, dtype=ct) if bias else None)

    def fn(x, w, b):
        xc = x.to(ct)
        if cand.chunks > 1:
            y = torch.cat([torch.nn.functional.linear(xi, w, b) for xi in xc.chunk(cand.chunks)])
        else:
            y = torch.nn.functional.linear(xc, w, b)
        return y.to(mt)
    return fn, args


def _conv(sig: Signature, cand: Candidate, dev: torch.device) -> tuple[Callable, tuple]:
    bs, cin, h, w_, cout, kh, kw, stride, pad, dil, groups, bias = sig.shape
    mt, ct = torch_dtype(sig.dtype), torch_dtype(cand.dtype)
    x = _cast(torch.randn(bs, cin, h, w_, device=dev), mt, sig.layout == "channels_last")
    wt = _cast(torch.randn(cout, cin // groups, kh, kw, device=dev) * (cin * kh * kw) ** -0.5, ct, cand.channels_last)
    b = torch.randn(cout, device=dev, dtype=ct) if bias else None

    def fn(x, w, b):
        y = torch.nn.functional.conv2d(_cast(x, ct, cand.channels_last), w, b, stride, pad, dil, groups)
        return y.to(mt)
    return fn, (x, wt, b)


def _attention(sig: Signature, cand: Candidate, dev: torch.device) -> tuple[Callable, tuple]:
    b, h, sq, sk, d, causal = sig.shape
    mt, ct = torch_dtype(sig.dtype), torch_dtype(cand.dtype)
    q, k, v = (torch.randn(b, h, s, d, device=dev, dtype=mt) for s in (sq, sk, sk))

    def fn(q, k, v):
        qc, kc, vc = q.to(ct), k.to(ct), v.to(ct)
        if cand.sdpa == "math" and dev.type == "meta":  # captured as the math backend runs it
            return _math_attention(qc, kc, vc, bool(causal)).to(mt)
        with _sdpa_context(cand.sdpa):
            return torch.nn.functional.scaled_dot_product_attention(qc, kc, vc, is_causal=bool(causal)).to(mt)
    return fn, (q, k, v)


def _layer_norm(sig: Signature, cand: Candidate, dev: torch.device) -> tuple[Callable, tuple]:
    rows, feats = sig.shape
    mt, ct = torch_dtype(sig.dtype), torch_dtype(cand.dtype)
    args = (torch.randn(rows, feats, device=dev, dtype=mt), torch.ones(feats, device=dev, dtype=ct),
            torch.zeros(feats, device=dev, dtype=ct))

    def fn(x, w, b):
        return torch.nn.functional.layer_norm(x.to(ct), (feats,), w, b).to(mt)
    return fn, args


def _batch_norm(sig: Signature, cand: Candidate, dev: torch.device) -> tuple[Callable, tuple]:
    mt, ct = torch_dtype(sig.dtype), torch_dtype(cand.dtype)
    c = sig.shape[1]
    x = _cast(torch.randn(*sig.shape, device=dev), mt, sig.layout == "channels_last")
    stats = tuple(torch.ones(c, device=dev, dtype=ct) for _ in range(4))

    def fn(x, rm, rv, w, b):
        return torch.nn.functional.batch_norm(_cast(x, ct, cand.channels_last), rm, rv, w, b, False).to(mt)
    return fn, (x, *stats)


_BUILDERS = {"gemm": _gemm, "conv": _conv, "attention": _attention, "layer_norm": _layer_norm,
             "batch_norm": _batch_norm}


def op_for(sig: Signature, cand: Candidate, device: str | torch.device = "cpu") -> tuple[Callable, tuple]:
    """The operator ``cand`` runs for ``sig`` and its inputs on ``device`` (``meta`` for the cost model)."""
    return _BUILDERS[sig.family](sig, cand, torch.device(device))


@contextlib.contextmanager
def threads(n: int):
    """Run the block on ``n`` intra-op threads, restoring the previous count after (no-op when equal)."""
    prev = torch.get_num_threads()
    if n != prev:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if n != prev:
            torch.set_num_threads(prev)


def runnable(sig: Signature, cand: Candidate, device: str = "cpu") -> Callable[[], object]:
    """A no-argument call that runs ``cand`` once on real tensors (what the timer times)."""
    fn, args = op_for(sig, cand, device)

    def call():
        with threads(cand.threads):
            return fn(*args)
    return call


def runs_here(sig: Signature, cand: Candidate, device: str = "cpu") -> bool:
    """Whether the candidate runs on this device (a backend or dtype it lacks raises): tried on a small shape."""
    small = {"gemm": lambda x: (16 * cand.chunks, 16, 16, x[-1]), "attention": lambda x: (1, 1, 8, 8, *x[4:])}
    s = Signature(sig.family, small.get(sig.family, lambda x: x)(sig.shape), sig.dtype, sig.layout)
    try:
        with torch.no_grad():
            runnable(s, cand, device)()
        return True
    except (RuntimeError, TypeError, ValueError, NotImplementedError):
        return False
