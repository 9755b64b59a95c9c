"""Measured decode attention times of a catalog device, as the time model reads them.

A catalog device may carry, under ``[calibration]``, ``attention_grid``: a JSON file beside its TOML
(benchmarks/reference/aiconfigurator_attention.py writes it from NVIDIA's aiconfigurator tables) holding, per KV
format and head configuration (query heads, KV heads, head dim, sliding window; 0: none), the time of one decode
attention kernel (one new token per sequence) at every point of a batch x KV-length grid, in microseconds,
batch-major. ``AttentionGrid.time_s`` prices a decode attention call from it:

- the same head configuration and KV format: log-log interpolation (bilinear in log2 batch and log2 KV length, of
  log time) between the four surrounding points;
- outside the grid (a batch or KV length past its edges): the edge point's efficiency (its measured time over the
  roofline, ``roofline_s``) times the roofline at the point asked for, and the note says so;
- another head configuration: the nearest measured one's efficiency at that batch and KV length (``nearest``:
  distance in log2 of the KV heads, the query heads per KV head and the head dim, the head dim weighted double,
  the same KV format and window first) times this configuration's roofline, so a model of its own benefits;
- a sliding window: a configuration measured with that window at the full KV length, else the window-less one at
  the window-capped KV length;
- a few queries a sequence (a speculative step's verify, up to opmap.mapping.tiling.DECODE_MAX_Q): the one-query
  time's efficiency times the roofline of that many queries (the tables time one).

The roofline (``roofline_s``; a window caps the keys attended): the kernel's bytes (K and V of every attended
token per KV head, Q read and the
output written in bf16) over the device's memory rate, or its FLOPs (4 b h kv d) over its matrix rate, whichever
is longer.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from opmap.errors import OpmapError
from opmap.hardware.grid_file import CATALOG_DIR, name_pattern, read_tables
from opmap.validate import finite_number, shown

GRID_DIR = CATALOG_DIR
GRID_NAME = name_pattern("attn.json")
KV_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}  # a table's KV format -> bytes per element
ACT_BYTES = 2.0  # Q and the output in bf16 (the tables time bf16 activations)


def roofline_s(batch: int, kv: int, heads: int, kv_heads: int, head_dim: int, kv_bytes: float,
               memory_per_s: float, matrix_per_s: float, queries: int = 1) -> float:
    """Decode attention's roofline time, seconds (module docstring): K and V of ``kv`` tokens per KV head at
    ``kv_bytes`` an element plus Q and the output of ``queries`` tokens a sequence, or 4 b q h kv d FLOPs, at the
    device's rates."""
    nbytes = batch * (2.0 * kv_heads * kv * head_dim * kv_bytes + 2.0 * queries * heads * head_dim * ACT_BYTES)
    return max(nbytes / memory_per_s, 4.0 * batch * queries * heads * kv * head_dim / matrix_per_s)


@dataclass(frozen=True)
class HeadConfig:
    """A measured head configuration: KV format, query heads, KV heads, head dim, sliding window (0: none)."""

    kv_dtype: str
    heads: int
    kv_heads: int
    head_dim: int
    window: int

    def label(self) -> str:
        w = f", window {self.window}" if self.window else ""
        return f"{self.heads} heads / {self.kv_heads} KV heads x {self.head_dim}{w}, KV {self.kv_dtype}"


@dataclass(frozen=True)
class DecodeTable:
    """One configuration's grid: log2 batch and log2 KV axes, log seconds batch-major."""

    config: HeadConfig
    log_batch: tuple[float, ...]
    log_kv: tuple[float, ...]
    log_s: tuple[float, ...]

    def inside(self, batch: int, kv: int) -> bool:
        x, y = math.log2(max(batch, 1)), math.log2(max(kv, 1))
        return self.log_batch[0] <= x <= self.log_batch[-1] and self.log_kv[0] <= y <= self.log_kv[-1]

    def clamped(self, batch: int, kv: int) -> tuple[int, int]:
        """The nearest grid-edge point (batch, kv) to a point outside the grid (itself inside it)."""
        b = min(max(math.log2(max(batch, 1)), self.log_batch[0]), self.log_batch[-1])
        k = min(max(math.log2(max(kv, 1)), self.log_kv[0]), self.log_kv[-1])
        return round(2 ** b), round(2 ** k)

    def interpolate(self, batch: int, kv: int) -> float:
        """Seconds at (batch, kv), bilinear in log2 axes of log time; the point is clamped to the grid."""
        idx, frac = [], []
        for ax, v in ((self.log_batch, batch), (self.log_kv, kv)):
            x = min(max(math.log2(max(v, 1)), ax[0]), ax[-1])
            i = min(max(bisect.bisect_right(ax, x) - 1, 0), len(ax) - 2) if len(ax) > 1 else 0
            idx.append(i)
            frac.append((x - ax[i]) / (ax[i + 1] - ax[i]) if len(ax) > 1 else 0.0)
        nk = len(self.log_kv)
        acc = 0.0
        for db in (0, 1):
            wb = frac[0] if db else 1.0 - frac[0]
            for dk in (0, 1):
                w = wb * (frac[1] if dk else 1.0 - frac[1])
                if w:
                    acc += w * self.log_s[(idx[0] + db) * nk + idx[1] + dk]
        return math.exp(acc)


@dataclass(frozen=True)
class DecodeTime:
    """A decode attention call priced off the grid: seconds, the configuration measured, and how (the note)."""

    seconds: float
    config: HeadConfig
    note: str


@dataclass(frozen=True)
class AttentionGrid:
    """A device's measured decode attention tables (module docstring) and where they come from."""

    name: str
    source: str
    tables: tuple[DecodeTable, ...]

    @property
    def head_dims(self) -> tuple[int, ...]:
        return tuple(sorted({t.config.head_dim for t in self.tables}))

    def measures(self, head_dim: int) -> bool:
        """Whether some configuration was measured at ``head_dim`` (the grid prices no other: MLA's 576-wide latent
        runs another kernel than a 64- or 128-wide head's)."""
        return any(t.config.head_dim == head_dim for t in self.tables)

    def nearest(self, want: HeadConfig) -> DecodeTable:
        """The measured configuration closest to ``want`` (module docstring): the same KV format and window
        preferred, then the least distance in log2 of KV heads, query heads per KV head and head dim (x 2)."""
        def dist(t: DecodeTable) -> tuple:
            c = t.config
            d = math.hypot(math.log2(c.kv_heads / want.kv_heads),
                           math.log2((c.heads / c.kv_heads) / (want.heads / want.kv_heads)),
                           2.0 * math.log2(c.head_dim / want.head_dim))
            return (c.kv_dtype != want.kv_dtype, c.window != want.window, d, c.heads, c.kv_heads, c.head_dim)
        return min(self.tables, key=dist)

    def time_s(self, want: HeadConfig, batch: int, kv: int, memory_per_s: float, matrix_per_s: float,
               queries: int = 1) -> DecodeTime:
        """Seconds of one decode attention call of ``want`` at ``batch`` sequences against ``kv`` keys each (the
        window already in ``want``: a measured window is looked up at the full KV length, else the window-less
        configuration at the window-capped one); ``queries`` > 1 tokens a sequence (a speculative step's verify):
        the one-query time's efficiency x the roofline of that many queries."""
        if want.window and not any(t.config.window == want.window for t in self.tables):
            kv = min(kv, want.window)
            want = HeadConfig(want.kv_dtype, want.heads, want.kv_heads, want.head_dim, 0)
        t = self.nearest(want)
        c = t.config
        kvb = KV_BYTES.get(c.kv_dtype, 2.0)
        def roof(cfg: HeadConfig, b: int, k: int, e: float) -> float:  # a window caps the keys attended
            return roofline_s(b, min(k, cfg.window) if cfg.window else k, cfg.heads, cfg.kv_heads, cfg.head_dim, e,
                              memory_per_s, matrix_per_s)
        notes = []
        if t.inside(batch, kv):
            s = t.interpolate(batch, kv)
        else:
            eb, ek = t.clamped(batch, kv)
            s = t.interpolate(eb, ek) * roof(c, batch, kv, kvb) / roof(c, eb, ek, kvb)
            notes.append(f"past the grid (batch {batch}, KV {kv}): its edge's efficiency at batch {eb}, KV {ek} x "
                         "the roofline")
        if c != want:
            wkvb = KV_BYTES.get(want.kv_dtype, kvb)
            s *= roof(want, batch, kv, wkvb) / roof(c, batch, kv, kvb)
            notes.append(f"{want.label()} not measured: the efficiency of {c.label()} x its roofline")
        if queries > 1:
            e = KV_BYTES.get(want.kv_dtype, kvb)
            k = min(kv, want.window) if want.window else kv
            s *= roofline_s(batch, k, want.heads, want.kv_heads, want.head_dim, e, memory_per_s, matrix_per_s,
                            queries) / roofline_s(batch, k, want.heads, want.kv_heads, want.head_dim, e,
                                                  memory_per_s, matrix_per_s)
            notes.append(f"{queries} queries a sequence: the one-query efficiency x their roofline")
        return DecodeTime(s, c, "; ".join(notes))


def _int_list(v: Any, where: str) -> list[int]:
    if not isinstance(v, list) or not v or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in v) \
            or any(b <= a for a, b in zip(v, v[1:])):
        raise OpmapError(f"{where} must be a non-empty list of increasing positive integers (got {shown(v)})")
    return v


def _table(t: Any, at: str) -> DecodeTable:
    if not isinstance(t, dict):
        raise OpmapError(f"{at} must be an object (got {shown(t)})")
    if t.get("kv_dtype") not in KV_BYTES:
        raise OpmapError(f"{at}.kv_dtype must be one of {', '.join(KV_BYTES)} (got {shown(t.get('kv_dtype'))})")
    ints = []
    for k in ("heads", "kv_heads", "head_dim", "window"):
        ints.append(finite_number(t.get(k), f"{at}.{k}", lo=0 if k == "window" else 1, integer=True))
    if ints[0] % ints[1]:
        raise OpmapError(f"{at}: {ints[0]} query heads do not divide into {ints[1]} KV heads")
    b, k = _int_list(t.get("batch"), f"{at}.batch"), _int_list(t.get("kv"), f"{at}.kv")
    lat = t.get("latency_us")
    if not isinstance(lat, list) or len(lat) != len(b) * len(k):
        raise OpmapError(f"{at}.latency_us must list {len(b) * len(k)} times (batch x KV, batch-major)")
    log_s = tuple(math.log(finite_number(x, f"{at}.latency_us[{i}]", lo=0, lo_open=True, hi=1e9, unit="us") * 1e-6)
                  for i, x in enumerate(lat))
    return DecodeTable(HeadConfig(t["kv_dtype"], *ints), tuple(math.log2(x) for x in b),
                       tuple(math.log2(x) for x in k), log_s)


@lru_cache(maxsize=16)
def load_attention_grid(name: str) -> AttentionGrid:
    """A catalog device's measured decode attention grid (module docstring), read once per process. Parsed, never
    executed; one line naming the problem when the file is malformed."""
    raw, tables = read_tables(GRID_DIR, name, GRID_NAME, "attention grid", "aiconfigurator_attention.py", list,
                              "a list of head configurations")
    out = tuple(_table(t, f"attention grid {name}: tables[{i}]") for i, t in enumerate(tables))
    seen = set()
    for t in out:
        if t.config in seen:
            raise OpmapError(f"attention grid {name}: {t.config.label()} listed twice")
        seen.add(t.config)
    return AttentionGrid(name, str(raw.get("source", "")), out)
