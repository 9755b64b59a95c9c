"""Measured MoE layer times of a catalog device, as the time model reads them.

A catalog device may carry, under ``[calibration]``, a ``moe_grid``: a JSON file beside its TOML
(benchmarks/reference/aiconfigurator_moe.py writes it from NVIDIA's aiconfigurator tables) holding, per opmap format,
the measured time of one fused MoE layer (TensorRT-LLM's ``moe.forward`` on one GPU: routing of given logits, the
activations' quantization, permute, both grouped GEMMs with the gated activation, finalize) at measured shapes
(hidden, inter, topk, experts, tp, ep), each over a num_tokens axis: the tokens entering the layer over the EP
group, each of the GPU's ``experts / ep`` experts receiving ``tokens x topk / experts`` of them (balanced routing).

``MoeGrid.layer_s(fmt, shape, tokens, rates)`` prices one device's MoE layer:

- an exact shape (and layout) hit interpolates the latency over num_tokens, linearly in log tokens and log latency
  between the two measured neighbours; an exact token count returns the measured latency;
- another shape (a user's own MoE, a layout the table does not hold) takes the measured efficiency of the nearest
  measured one: its latency over ``roofline_s`` (the layer's FLOPs at the format's rate, or its active weights
  and tokens at the memory rate, whichever is longer) at the same tokens per expert, times ``roofline_s`` of the
  shape asked for; the nearest is the same model's (hidden, inter, topk, experts) closest layout where the table
  holds the model, else the closest in log2 (hidden, inter / tp, experts / ep, topk) (``_nearest``);
- past the measured token counts, the efficiency at the nearest edge carries over (no extrapolated latency) and
  the note says so.

The latencies are read as their running minimum from the largest token count down: a count never costs more than
a larger count's measured time, since an engine can run it padded to that count (TensorRT-LLM pads decode batches
to its CUDA-graph sizes). So a point above a later one (gpt-oss-120b on a B200, w4a8-mxfp4, tp 1 ep 1: 465 us at
1536 tokens, 434 at 2048; ep 2: 599 us at 3072, 441 at 6144, the autotuner's tactic for that count) prices as the
later one's, and a layer with more tokens, or the busiest EP rank's imbalance, never runs faster.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import lru_cache

from opmap.errors import OpmapError
from opmap.hardware.grid_file import CATALOG_DIR, name_pattern, read_tables
from opmap.validate import finite_number, shown

MOE_GRID_DIR = CATALOG_DIR  # where a catalog device's moe_grid file lives
MOE_GRID_NAME = name_pattern("moe.json")
MAX_SHAPES = 4096  # a table per format holds a few hundred measured shapes; more is not a file the extractor wrote
MAX_TOKENS_AXIS = 256  # the tables measure 27 token counts (1 - 16384)


@dataclass(frozen=True)
class MoeShape:
    """One device's MoE layer: model width ``hidden``, expert width ``inter`` (before the tp split), ``topk`` experts
    a token of ``experts``, each over ``tp`` devices, ``experts / ep`` of them on a device."""

    hidden: int
    inter: int
    topk: int
    experts: int
    tp: int = 1
    ep: int = 1

    def key(self) -> tuple[float, float, float, float]:
        """Where the shape sits for the nearest-shape search: log2 of the per-device sizes."""
        return (math.log2(self.hidden), math.log2(self.inter / self.tp), math.log2(self.experts / self.ep),
                math.log2(self.topk))


@dataclass(frozen=True)
class Rates:
    """What ``roofline_s`` reads of the device and format: the matrix rate (FLOP/s), the memory rate (B/s) and the
    bytes of one expert weight element (scales included)."""

    matrix_flops_per_s: float
    memory_bytes_per_s: float
    weight_bytes: float


def roofline_s(s: MoeShape, tokens: float, r: Rates) -> float:
    """The first-principles time of ``s`` on one device at ``tokens`` entering the layer: its gated expert GEMMs'
    FLOPs (gate and up 2 x inter wide, down inter: 6 x hidden x inter / tp a routed token, 2 FLOPs a multiply-add)
    at the matrix rate, or their bytes at the memory rate (the experts the balanced tokens reach, min(experts,
    tokens x topk) / ep, 3 x hidden x inter / tp weights each, and the tokens in and out at 2 bytes), whichever is
    longer. Only its ratio between two shapes is used (module docstring)."""
    routed = tokens * s.topk / s.ep
    flops = 6.0 * routed * s.hidden * s.inter / s.tp
    active = min(float(s.experts), tokens * s.topk) / s.ep
    weights = active * 3.0 * s.hidden * s.inter / s.tp * r.weight_bytes
    return max(flops / r.matrix_flops_per_s, (weights + 4.0 * tokens * s.hidden) / r.memory_bytes_per_s)


@dataclass(frozen=True)
class MeasuredShape:
    shape: MoeShape
    log_tokens: tuple[float, ...]
    log_us: tuple[float, ...]

    def latency_s(self, tokens: float) -> float:
        """Latency at ``tokens`` (inside the axis): log-log between the measured neighbours."""
        x = math.log(tokens)
        ax = self.log_tokens
        if len(ax) == 1:
            return math.exp(self.log_us[0]) * 1e-6
        i = min(max(bisect.bisect_right(ax, x) - 1, 0), len(ax) - 2)
        f = (x - ax[i]) / (ax[i + 1] - ax[i])
        return math.exp(self.log_us[i] + f * (self.log_us[i + 1] - self.log_us[i])) * 1e-6

    @property
    def tokens_range(self) -> tuple[float, float]:
        return math.exp(self.log_tokens[0]), math.exp(self.log_tokens[-1])


@dataclass(frozen=True)
class MoePrice:
    """A device's MoE layer time (s) and how it was read off the grid (``note``); ``exact``: the shape measured."""

    seconds: float
    note: str
    exact: bool


@dataclass(frozen=True)
class MoeGrid:
    name: str
    source: str
    tables: dict[str, tuple[MeasuredShape, ...]]

    def formats(self) -> tuple[str, ...]:
        return tuple(sorted(self.tables))

    def layer_s(self, fmt: str, s: MoeShape, tokens: float, rates: Rates) -> MoePrice | None:
        """``s``'s layer time on one device at ``tokens`` (module docstring); None where ``fmt`` has no table."""
        table = self.tables.get(fmt)
        if not table or tokens <= 0:
            return None
        near = _nearest(table, s)
        m = near.shape
        exact = m == s
        # the same tokens per expert on the measured shape (exact: the same tokens)
        t = tokens if exact else tokens * (s.topk / s.experts) * (m.experts / m.topk)
        lo, hi = near.tokens_range
        tc = min(max(t, lo), hi)
        measured = near.latency_s(tc)
        where = (f"{fmt} {m.hidden}x{m.inter} top{m.topk} of {m.experts}, tp {m.tp} ep {m.ep}")
        if exact and tc == t:
            return MoePrice(measured, f"measured MoE layer ({self.name}: {where}) at {tokens:.4g} tokens", True)
        eff = measured / roofline_s(m, tc, rates)
        secs = eff * roofline_s(s, tokens, rates)
        edge = "" if tc == t else f", the grid's edge at {tc:.4g} tokens ({t:.4g} asked; not extrapolated)"
        what = "this shape" if exact else f"the nearest measured shape ({where})"
        return MoePrice(secs, f"measured MoE efficiency {eff:.3g} x roofline of {what} in {self.name}{edge}", exact)


def _model(s: MoeShape) -> tuple[int, int, int, int]:
    return s.hidden, s.inter, s.topk, s.experts


def _nearest(table: tuple[MeasuredShape, ...], s: MoeShape) -> MeasuredShape:
    """The measured shape that prices ``s``: among the same model's (hidden, inter, topk, experts) where the table
    has it, else among all, the closest per-device shape (``MoeShape.key``); ties to the closer model, then the
    smaller layout. A per-device tie between models is real (Llama 4 Scout's 16 experts at ep 1 and Maverick's 128
    at ep 8 hold 16 experts a GPU) and their kernels are not: the model's own rows come first."""
    same = [m for m in table if _model(m.shape) == _model(s)]
    q, qm = s.key(), tuple(math.log2(v) for v in _model(s))
    return min(same or table, key=lambda m: (math.dist(q, m.shape.key()),
                                             math.dist(qm, tuple(math.log2(v) for v in _model(m.shape))),
                                             m.shape.tp, m.shape.ep))


def _shape_entry(e, at: str) -> MeasuredShape:
    if not isinstance(e, dict):
        raise OpmapError(f"{at} must be an object with shape, tokens and latency_us (got {shown(e)})")
    sh, toks, lat = e.get("shape"), e.get("tokens"), e.get("latency_us")
    if not isinstance(sh, list) or len(sh) != 6:
        raise OpmapError(f"{at}.shape must list hidden, inter, topk, experts, tp, ep (got {shown(sh)})")
    dims = [finite_number(v, f"{at}.shape[{i}]", lo=1, hi=1 << 24, integer=True) for i, v in enumerate(sh)]
    if not isinstance(toks, list) or not 0 < len(toks) <= MAX_TOKENS_AXIS or \
            not isinstance(lat, list) or len(lat) != len(toks):
        raise OpmapError(f"{at}: tokens must be a non-empty list (at most {MAX_TOKENS_AXIS}) and latency_us one "
                         "time per token count")
    t = [finite_number(v, f"{at}.tokens[{i}]", lo=1, integer=True) for i, v in enumerate(toks)]
    if any(b <= a for a, b in zip(t, t[1:])):
        raise OpmapError(f"{at}.tokens must increase (got {shown(toks)})")
    us = [finite_number(v, f"{at}.latency_us[{i}]", lo=0, lo_open=True, hi=1e9, unit="us")
          for i, v in enumerate(lat)]
    env = [min(us[i:]) for i in range(len(us))]  # more tokens never run faster (module docstring)
    return MeasuredShape(MoeShape(*dims), tuple(math.log(x) for x in t), tuple(math.log(x) for x in env))


@lru_cache(maxsize=16)
def load_moe_grid(name: str) -> MoeGrid:
    """A catalog device's measured MoE grid (module docstring), read once per process. Parsed, never executed; one
    line naming the problem when the file is malformed."""
    raw, tables = read_tables(MOE_GRID_DIR, name, MOE_GRID_NAME, "MoE grid", "aiconfigurator_moe.py", dict,
                              "a table per format")
    out: dict[str, tuple[MeasuredShape, ...]] = {}
    for fmt, t in tables.items():
        at = f"MoE grid {name}: tables.{fmt}"
        shapes = t.get("shapes") if isinstance(t, dict) else None
        if not isinstance(shapes, list) or not 0 < len(shapes) <= MAX_SHAPES:
            raise OpmapError(f"{at}.shapes must be a non-empty list of at most {MAX_SHAPES} measured shapes")
        out[fmt] = tuple(_shape_entry(e, f"{at}.shapes[{i}]") for i, e in enumerate(shapes))
    aliases = raw.get("aliases") or {}
    if not isinstance(aliases, dict):
        raise OpmapError(f"MoE grid {name}: aliases must map a format to a table's (got {shown(aliases)})")
    for alias, target in aliases.items():
        if target not in out:
            raise OpmapError(f"MoE grid {name}: alias {alias} -> {target!r} names no table")
        out[alias] = out[target]
    return MoeGrid(name, str(raw.get("source", "")), out)
