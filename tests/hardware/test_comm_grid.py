"""Measured collective grids (opmap.hardware.comm_grid) and the collectives priced off them
(opmap.mapping.collectives). Golden values: the log-log interpolation formula written out by hand on two times read
straight from the catalog's JSON (NVIDIA's nccl-tests times, aiconfigurator-core 0.12.0), never from the loader."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from opmap.errors import OpmapError
from opmap.hardware import comm_grid, get_hardware
from opmap.hardware.comm_grid import load_comm_grid
from opmap.mapping.collectives import Collective, collective_time

CATALOG = Path(comm_grid.__file__).with_name("catalog")
H100 = get_hardware("h100-sxm")


def raw(name: str) -> dict:
    return json.loads((CATALOG / name).read_text())


def hand_loglog(s: float, s0: float, t0: float, s1: float, t1: float) -> float:
    """log t linear in log s between (s0, t0) and (s1, t1)."""
    return math.exp(math.log(t0) + (math.log(s) - math.log(s0)) / (math.log(s1) - math.log(s0))
                    * (math.log(t1) - math.log(t0)))


def rising_pair(table: dict, above: int = 0) -> int:
    """The first index i from ``above`` whose time rises to i + 1, with no larger size faster than either (no
    noise bump: the loader reads the least time at a size or any larger one)."""
    us = table["time_us"]
    for i in range(above, len(us) - 1):
        if us[i] < us[i + 1] and us[i] <= min(us[i:]) and us[i + 1] <= min(us[i + 1:]):
            return i
    raise AssertionError("no rising pair")


def test_catalog_grids_are_modest_and_load():
    names = sorted(p.name for p in CATALOG.glob("*.comm.json"))
    assert "h100-sxm.comm.json" in names and "rtx-pro-6000.comm.json" in names
    for name in names:
        assert (CATALOG / name).stat().st_size < 16_000, name
        g = load_comm_grid(name)
        assert g.table("all_reduce", 2) is not None and "nccl-tests" in g.source


def test_every_grid_is_named_by_its_catalog_entry():
    for name in sorted(p.name for p in CATALOG.glob("*.comm.json")):
        device = name.removesuffix(".comm.json")
        assert get_hardware(device).calibration["comm_grid"] == name


def test_interpolation_is_log_log_between_measured_sizes():
    t = raw("h100-sxm.comm.json")["tables"]["all_reduce"]["2"]
    i = rising_pair(t, above=10)
    s0, s1 = t["message_bytes"][i], t["message_bytes"][i + 1]
    t0, t1 = t["time_us"][i] * 1e-6, t["time_us"][i + 1] * 1e-6
    s = s0 * 1.3
    got = collective_time(H100, Collective("all_reduce", s, 2))
    assert got.algorithm == "measured"
    assert got.seconds == pytest.approx(hand_loglog(s, s0, t0, s1, t1), rel=1e-12)
    assert "nccl-tests" in got.detail["measured_source"]
    assert any(k.startswith("model/") for k in got.detail["candidates_s"])
    # on a measured size, the measured time itself
    assert collective_time(H100, Collective("all_reduce", s1, 2)).seconds == pytest.approx(t1, rel=1e-12)


def test_beyond_the_grid_at_the_largest_size_bandwidth_and_below_at_the_smallest_time():
    t = raw("rtx-pro-6000.comm.json")["tables"]["all_to_all"]["8"]
    hw = get_hardware("rtx-pro-6000")
    big, t_big = t["message_bytes"][-1], t["time_us"][-1] * 1e-6
    assert collective_time(hw, Collective("all_to_all", 4 * big, 8)).seconds == pytest.approx(4 * t_big, rel=1e-12)
    small = t["message_bytes"][0]
    assert collective_time(hw, Collective("all_to_all", small / 8, 8)).seconds == pytest.approx(
        min(t["time_us"]) * 1e-6, rel=1e-12)


def test_a_bump_at_a_small_size_reads_the_least_time_at_larger_sizes():
    """Four H200s' all-to-all: 11.06 us at 512 B, 6.64 us at 1 KiB in the table (a first call's warm-up): 512 B is
    priced at the least time at 512 B or larger, and no size is priced faster than a smaller one."""
    t = raw("h200.comm.json")["tables"]["all_to_all"]["4"]
    hw = get_hardware("h200")
    first = collective_time(hw, Collective("all_to_all", t["message_bytes"][0], 4)).seconds
    assert first == pytest.approx(min(t["time_us"]) * 1e-6, rel=1e-12)
    assert first < t["time_us"][0] * 1e-6
    times = [collective_time(hw, Collective("all_to_all", x, 4)).seconds for x in t["message_bytes"]]
    assert all(a <= b for a, b in zip(times, times[1:], strict=False))


def test_pcie_all_gather_reads_the_measured_rate_not_the_link():
    """8 x RTX PRO 6000 (PCIe Gen5 x16, 64 GB/s a direction): the measured all-gather of 128 MiB (64 Mi half
    elements) reaches algbw S / t, far below the ring bound's S / ((n - 1) / n x S / 64e9) = 73 GB/s."""
    t = raw("rtx-pro-6000.comm.json")["tables"]["all_gather"]["8"]
    s = 128 * 2**20
    got = collective_time(get_hardware("rtx-pro-6000"), Collective("all_gather", s, 8))
    assert got.seconds == pytest.approx(t["time_us"][t["message_bytes"].index(s)] * 1e-6, rel=1e-12)
    assert got.detail["algbw_bytes_per_s"] < 0.5 * 64e9 / (7 / 8)


def test_an_unmeasured_count_keeps_the_model():
    """GB200 is measured on 2 and 4 GPUs of a tray: a group of 8 or 72 in the NVL72 domain keeps the model."""
    hw = get_hardware("gb200")
    model = replace(hw, calibration={k: v for k, v in hw.calibration.items() if k != "comm_grid"})
    assert load_comm_grid("gb200.comm.json").table("all_to_all", 8) is None
    for n in (8, 72):
        c = Collective("all_to_all", 2**24, n)
        assert collective_time(hw, c) == collective_time(model, c)
        assert collective_time(hw, c).algorithm == "direct"
    assert collective_time(hw, Collective("all_to_all", 2**24, 4)).algorithm == "measured"


def test_across_domains_and_devices_without_a_grid_are_priced_as_before():
    model = replace(H100, calibration={k: v for k, v in H100.calibration.items() if k != "comm_grid"})
    for c in (Collective("all_reduce", 2**26, 16), Collective("all_to_all", 2**20, 8, "scale_out"),
              Collective("send_recv", 2**20, 2)):
        assert collective_time(H100, c) == collective_time(model, c)
    mi = get_hardware("mi300x")
    assert "comm_grid" not in mi.calibration
    assert collective_time(mi, Collective("all_reduce", 2**26, 8)).algorithm in ("ring", "tree")


@pytest.mark.parametrize("text,match", [
    ("{", "cannot read collective grid"),
    ('{"source": "x"}', "missing 'tables'"),
    ('{"source": "x", "tables": {"broadcast": {}}}', "must be one of all_reduce"),
    ('{"source": "x", "tables": {"all_reduce": {"1": {"message_bytes": [1], "time_us": [1]}}}}', "GPU count of 2"),
    ('{"source": "x", "tables": {"all_reduce": {"2": {"message_bytes": [2, 1], "time_us": [1, 2]}}}}', "increase"),
    ('{"source": "x", "tables": {"all_reduce": {"2": {"message_bytes": [1, 2], "time_us": [1]}}}}', "equal length"),
    ('{"source": "x", "tables": {"all_reduce": {"2": {"message_bytes": [1], "time_us": [-1]}}}}', "time_us"),
    ('{"tables": {"all_reduce": {"2": {"message_bytes": [1], "time_us": [1]}}}}', "source"),
])
def test_a_malformed_grid_is_one_error_line(tmp_path, monkeypatch, text, match):
    monkeypatch.setattr(comm_grid, "GRID_DIR", tmp_path)
    load_comm_grid.cache_clear()
    (tmp_path / "bad.comm.json").write_text(text)
    try:
        with pytest.raises(OpmapError, match=match) as e:
            load_comm_grid("bad.comm.json")
        assert "\n" not in str(e.value)
    finally:
        load_comm_grid.cache_clear()


def test_a_grid_file_is_read_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(comm_grid, "GRID_DIR", tmp_path)
    load_comm_grid.cache_clear()
    (tmp_path / "huge.comm.json").write_text(" " * (comm_grid.LIMIT_BYTES + 1))
    try:
        with pytest.raises(OpmapError) as e:
            load_comm_grid("huge.comm.json")
        assert "\n" not in str(e.value)
        with pytest.raises(OpmapError, match="no collective grid file"):
            load_comm_grid("missing.comm.json")
    finally:
        load_comm_grid.cache_clear()


def test_a_catalog_entry_naming_a_bad_grid_is_refused():
    from opmap.hardware.curves import check_calibration

    with pytest.raises(OpmapError, match=r"comm_grid must name a file beside the catalog"):
        check_calibration({"comm_grid": "../etc/passwd"}, "x: calibration")


# -- on captured models: a TP all-reduce priced off the grid -------------------------------------------------------

def _tp2_all_reduces(target: str, batch: int, seq: int):
    from opmap.analyze import analyze_graph
    from opmap.capture import capture
    from opmap.mapping.sharding import Parallelism, Sharder
    from opmap.workloads.load import load_workload

    w = load_workload(target, batch, seq, "bf16")
    s = Sharder(analyze_graph(capture(w.module, w.inputs), w, H100, "bf16"))
    return [c for c in s.shard(Parallelism(tp=2)).collectives
            if c.collective.kind == "all_reduce" and c.stage == "forward"]


def _grid_time(msg: float) -> float:
    t = raw("h100-sxm.comm.json")["tables"]["all_reduce"]["2"]
    xs = t["message_bytes"]
    i = max(j for j in range(len(xs) - 1) if xs[j] <= msg)
    us = [min(t["time_us"][j:]) for j in range(len(xs))]  # the least at this size or larger (a bump is noise)
    return hand_loglog(msg, xs[i], us[i] * 1e-6, xs[i + 1], us[i + 1] * 1e-6)


def test_hf_tp2_all_reduce_on_h100_is_the_grid_time(tmp_path):
    """Qwen3-8B (Hugging Face config, 2 layers), tp 2 on H100 SXM: each forward all-reduce of b s h x 2 bytes
    (Shoeybi et al. 2019) takes the measured two-GPU NCCL time at that size."""
    pytest.importorskip("transformers")
    from hf_family_configs import QWEN3_8B, shallow

    path = tmp_path / "config.json"
    path.write_text(json.dumps(shallow(QWEN3_8B, 2)))
    b, s = 2, 96
    ar = _tp2_all_reduces(str(path), b, s)
    msg = b * s * QWEN3_8B["hidden_size"] * 2
    assert ar and all(c.collective.message_bytes == msg for c in ar)
    assert all(c.algorithm == "measured" for c in ar)
    assert ar[0].predicted_s == pytest.approx(_grid_time(msg), rel=1e-12)


def test_zoo_tp2_all_reduce_on_h100_is_the_grid_time():
    ar = _tp2_all_reduces("llama-3-8b", 2, 32)
    msg = 2 * 32 * 4096 * 2
    assert ar and all(c.collective.message_bytes == msg and c.algorithm == "measured" for c in ar)
    assert ar[0].predicted_s == pytest.approx(_grid_time(msg), rel=1e-12)
