"""benchmarks/published.py's MaxText rows: the model MaxText builds at each global_parameter_scale and the FLOPs it
divides by, worked by hand from the source (AI-Hypercomputer/maxtext at 04262f3cf: configs/base.yml,
pyconfig.get_individual_scales, maxtext_utils.calculate_tflops_training_per_device). Builds on meta: seconds."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import published  # noqa: E402


# scale -> (width, heads, MLP, layers): log2 scale = 3 q + r; heads and MLP double q + (r > 0) times, the width
# q + (r > 1) times, layers q times, from base.yml's 2048 / 16 / 7168 / 16
@pytest.mark.parametrize("scale,dims", [(16, (4096, 64, 28672, 32)), (32, (8192, 64, 28672, 32)),
                                        (64, (8192, 64, 28672, 64)), (128, (8192, 128, 57344, 64)),
                                        (1024, (16384, 256, 114688, 128))])
def test_maxtext_scaled_model(scale, dims):
    _, cfg = published._maxtext_model(scale, 1)
    assert (cfg.dim, cfg.n_head, cfg.ffn_dim, cfg.n_layer) == dims
    assert cfg.hd == 128 and cfg.n_kv_head == cfg.n_head and cfg.vocab_size == 32000


def test_maxtext_16b_step_flops_by_hand():
    # 6 x 15,831,666,688 parameters x 2048 x 6 tokens + causal attention 6 x 64 heads x 32 layers x 128 x 2048^2 x 6
    # = 1.16722e15 + 3.95137e13 = 1.20673e15 FLOPs per chip; at the README's 120 TFLOP/s a step is 10.056 s
    rows = [r for r in published.maxtext_rows() if r.what.startswith("MaxText 16B")]
    assert len(rows) == 1
    flops = 6 * 15_831_666_688 * 2048 * 6 + 6 * 64 * 32 * 128 * 2048 ** 2 * 6
    assert rows[0].published_s == pytest.approx(flops / 120e12, rel=1e-9)
    assert rows[0].published_s == pytest.approx(10.056, rel=1e-3)
    assert rows[0].device == "tpu-v5e" and rows[0].predicted_s > 0


def test_every_published_table_row_names_its_source():
    # benchmarks/reference/published/*.csv: one file per source, a non-empty source on every row (tables.read_table
    # refuses an empty one); each section reads its file
    from tables import Column, read_table

    files = sorted(published.PUBLISHED_TABLES.glob("*.csv"))
    assert len(files) == 10
    for path in files:
        header = path.read_text().splitlines()[0].split(",")
        rows = read_table(path, [Column(h) for h in header if h != "source"] + [Column("source", required=True)])
        assert rows and all(r["source"].strip() for r in rows)


def test_maxtext_table_is_read_from_its_csv():
    # the README's v5e 16B row (AI-Hypercomputer/maxtext README at 04262f3cf): 256 chips, per-device batch 6, remat
    # full, 120 TFLOP/s per chip
    rows = published._rows("maxtext_2024_03", published._s("device"), published._i("scale"), published._i("chips"),
                           published._i("tp"), published._i("per_device_batch"), published._s("recompute"),
                           published._f("tflops_per_chip"), published._s("tpu_type"))
    assert rows[0][:7] == ("tpu-v5e", 16, 256, 1, 6, "full", 120.0)
    assert rows[0][-1].startswith("AI-Hypercomputer/maxtext README.md (commit 04262f3cf")
