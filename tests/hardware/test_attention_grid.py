"""The measured decode attention grids (opmap.hardware.attention_grid): the catalog's files, written by
benchmarks/reference/aiconfigurator_attention.py from NVIDIA aiconfigurator's TensorRT-LLM tables, are bounded and
load; a malformed file is refused in one line; a point between grid points is the log-log interpolation of the
values the file holds; a point past the grid, another head configuration and a sliding window follow the rules
the module's docstring states. Expected values are computed here from the JSON and the formulas written beside."""

from __future__ import annotations

import json
import math

import pytest

from opmap.errors import OpmapError
from opmap.hardware import attention_grid as ag
from opmap.hardware import get_hardware
from opmap.hardware.attention_grid import HeadConfig, load_attention_grid

DEVICES = ("b200", "gb200", "h100-sxm", "h200")
MAX_FILE_BYTES = 300_000  # a few hundred kB a device, like the GEMM grids beside them
MEM, MAT = 8.0e12, 2.25e15  # a memory and a matrix rate (B/s, FLOP/s) for the rule checks


def raw(device: str) -> dict:
    return json.loads((ag.GRID_DIR / f"{device}.attn.json").read_text())


def point(device: str, cfg: tuple, batch: int, kv: int) -> float:
    """The file's latency (s) of configuration ``cfg`` (kv_dtype, heads, kv_heads, head_dim, window) at a grid
    point."""
    t = next(t for t in raw(device)["tables"] if (t["kv_dtype"], t["heads"], t["kv_heads"], t["head_dim"],
                                                   t["window"]) == cfg)
    return t["latency_us"][t["batch"].index(batch) * len(t["kv"]) + t["kv"].index(kv)] * 1e-6


def kv_bytes_per_seq(kv: int, heads: int, kv_heads: int, d: int, kv_elem: float) -> float:
    """Decode attention's bytes per sequence: K and V of kv tokens per KV head, Q read and the output written in
    bf16 (2 B); batch-proportional, so a memory-bound call's time scales with the batch."""
    return 2 * kv_heads * kv * d * kv_elem + 2 * heads * d * 2


@pytest.mark.parametrize("device", DEVICES)
def test_catalog_grid_is_bounded_and_loads(device):
    path = ag.GRID_DIR / f"{device}.attn.json"
    assert path.stat().st_size < MAX_FILE_BYTES
    r = raw(device)
    assert "aiconfigurator" in r["source"] and r["preprocess_removed"] is True
    grid = load_attention_grid(f"{device}.attn.json")
    assert len(grid.tables) == len(r["tables"]) and 100 < len(grid.tables) < 250
    for t in r["tables"]:
        # the collector's grid: batch 1-2048, KV (cached tokens + the new one) 2 to 16384-131072, every point filled
        assert t["batch"][0] == 1 and t["batch"][-1] == 2048 and t["kv"][0] == 2 and t["kv"][-1] <= 131072
        assert len(t["latency_us"]) == len(t["batch"]) * len(t["kv"]) and min(t["latency_us"]) > 0
    hw = get_hardware(device)
    assert hw.curves.decode_attention is grid
    assert f"{device}.attn.json" in hw.calibration["attention_grid"]


@pytest.mark.parametrize("text,expected", [
    ("{not json", "cannot read attention grid"),
    ("{}", "missing 'tables'"),
    ('{"tables": [{"kv_dtype": "int4", "heads": 8, "kv_heads": 8, "head_dim": 64, "window": 0, "batch": [1], '
     '"kv": [2], "latency_us": [1.0]}]}', "kv_dtype must be one of"),
    ('{"tables": [{"kv_dtype": "bf16", "heads": 8, "kv_heads": 3, "head_dim": 64, "window": 0, "batch": [1], '
     '"kv": [2], "latency_us": [1.0]}]}', "do not divide"),
    ('{"tables": [{"kv_dtype": "bf16", "heads": 8, "kv_heads": 8, "head_dim": 64, "window": 0, "batch": [1, 2], '
     '"kv": [2], "latency_us": [1.0]}]}', "must list 2 times"),
    ('{"tables": [{"kv_dtype": "bf16", "heads": 8, "kv_heads": 8, "head_dim": 64, "window": 0, "batch": [2, 1], '
     '"kv": [2], "latency_us": [1.0, 1.0]}]}', "increasing positive integers"),
    ('{"tables": [{"kv_dtype": "bf16", "heads": 8, "kv_heads": 8, "head_dim": 64, "window": 0, "batch": [1], '
     '"kv": [2], "latency_us": [-1.0]}]}', "latency_us[0]"),
])
def test_a_malformed_grid_is_one_clear_error(tmp_path, monkeypatch, text, expected):
    monkeypatch.setattr(ag, "GRID_DIR", tmp_path)
    (tmp_path / "bad.attn.json").write_text(text)
    load_attention_grid.cache_clear()
    try:
        with pytest.raises(OpmapError) as e:
            load_attention_grid("bad.attn.json")
    finally:
        load_attention_grid.cache_clear()
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_a_grid_name_outside_the_catalog_is_refused():
    with pytest.raises(OpmapError, match="accepted: a <device>.attn.json"):
        load_attention_grid("../b200.attn.json")


@pytest.mark.parametrize("device", ("b200", "h200"))
def test_between_grid_points_is_log_log_interpolation(device):
    """Llama-3-8B's heads (32 / 8 x 128, bf16 KV): KV 1448 lies between the grid's 1024 and 2048 at batch 256, batch
    362 between 256 and 512 at KV 1024; log-log interpolation is t0^(1-f) t1^f with f the log2 fraction."""
    cfg = ("bf16", 32, 8, 128, 0)
    grid = load_attention_grid(f"{device}.attn.json")
    want = HeadConfig(*cfg)
    t0, t1 = point(device, cfg, 256, 1024), point(device, cfg, 256, 2048)
    f = math.log2(1448) - 10
    got = grid.time_s(want, 256, 1448, MEM, MAT)
    assert got.seconds == pytest.approx(t0 ** (1 - f) * t1 ** f, rel=1e-9) and got.note == ""
    t0, t1 = point(device, cfg, 256, 1024), point(device, cfg, 512, 1024)
    f = math.log2(362) - 8
    assert grid.time_s(want, 362, 1024, MEM, MAT).seconds == pytest.approx(t0 ** (1 - f) * t1 ** f, rel=1e-9)
    # a grid point is the file's value
    assert grid.time_s(want, 2048, 64, MEM, MAT).seconds == pytest.approx(point(device, cfg, 2048, 64), rel=1e-9)


def test_past_the_grid_carries_the_edge_efficiency():
    """Batch 4096 of 32 / 8 x 128 at KV 1024 is past the grid's 2048: the edge's time x the roofline's growth. The
    call is memory-bound at both (4 h kv d FLOPs over its bytes is ~8 FLOP/B, far below 2.25e15 / 8e12 = 281), and
    its bytes are batch-proportional: twice the edge's time."""
    grid = load_attention_grid("b200.attn.json")
    got = grid.time_s(HeadConfig("bf16", 32, 8, 128, 0), 4096, 1024, MEM, MAT)
    assert got.seconds == pytest.approx(2 * point("b200", ("bf16", 32, 8, 128, 0), 2048, 1024), rel=1e-9)
    assert "past the grid (batch 4096, KV 1024)" in got.note


def test_another_head_config_uses_its_nearest_ones_efficiency():
    """80 query heads over 8 KV heads x 128 is not measured. Its nearest is 96 / 8 x 128 (10 query heads a KV head
    against 12; 64 / 8 has 8: log2(10/8) = 0.32 > log2(12/10) = 0.26), and both are memory-bound, so the time is the
    neighbour's measured time x the ratio of their bytes."""
    grid = load_attention_grid("b200.attn.json")
    assert not any((t.config.heads, t.config.kv_heads, t.config.head_dim) == (80, 8, 128) for t in grid.tables)
    got = grid.time_s(HeadConfig("bf16", 80, 8, 128, 0), 256, 1024, MEM, MAT)
    assert "96 heads / 8 KV heads x 128" in got.note and "not measured" in got.note
    ratio = kv_bytes_per_seq(1024, 80, 8, 128, 2) / kv_bytes_per_seq(1024, 96, 8, 128, 2)
    assert got.seconds == pytest.approx(point("b200", ("bf16", 96, 8, 128, 0), 256, 1024) * ratio, rel=1e-9)


def test_a_sliding_window_reads_its_measured_window_or_the_capped_length():
    """gpt-oss's 64 / 8 x 64 layers with a 128-token window: the table measured with that window at the full KV
    length; a 512-token window (none measured) reads the window-less table at KV 512."""
    grid = load_attention_grid("b200.attn.json")
    w = grid.time_s(HeadConfig("bf16", 64, 8, 64, 128), 1024, 8192, MEM, MAT)
    assert w.seconds == pytest.approx(point("b200", ("bf16", 64, 8, 64, 128), 1024, 8192), rel=1e-9)
    capped = grid.time_s(HeadConfig("bf16", 64, 8, 64, 512), 1024, 8192, MEM, MAT)
    assert capped.seconds == pytest.approx(point("b200", ("bf16", 64, 8, 64, 0), 1024, 512), rel=1e-9)


def test_a_few_queries_a_sequence_scale_by_their_roofline():
    """A speculative verify of 3 tokens a sequence (32 / 8 x 128, batch 256, KV 1024): the one-query time x the ratio
    of their rooflines; memory-bound, so the ratio of their bytes (Q and the output 3 times over, K and V once)."""
    grid = load_attention_grid("b200.attn.json")
    got = grid.time_s(HeadConfig("bf16", 32, 8, 128, 0), 256, 1024, MEM, MAT, queries=3)
    one = point("b200", ("bf16", 32, 8, 128, 0), 256, 1024)
    per_seq = lambda q: 2 * 8 * 1024 * 128 * 2 + 2 * q * 32 * 128 * 2  # noqa: E731
    assert got.seconds == pytest.approx(one * per_seq(3) / per_seq(1), rel=1e-9)
    assert "3 queries a sequence" in got.note
