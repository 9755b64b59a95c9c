"""Energy counters: RAPL read from a sysfs-shaped folder (the device query is the only thing faked)."""

from __future__ import annotations

import pytest

from opmap.measure.energy import NvmlMeter, RaplMeter, measure_energy


def _domain(root, name, uj, max_uj=1_000_000):
    d = root / name
    d.mkdir(parents=True)
    (d / "energy_uj").write_text(f"{uj}\n")
    (d / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return d


def test_rapl_sums_packages_and_handles_wraparound(tmp_path):
    p0 = _domain(tmp_path, "intel-rapl:0", 900_000)
    p1 = _domain(tmp_path, "intel-rapl:1", 100)
    _domain(tmp_path, "intel-rapl:0:0", 5)  # a subdomain (core) of package 0: not counted twice

    def work():
        (p0 / "energy_uj").write_text("100000\n")  # wrapped: 900000 -> 1000000 -> 100000, 200000 uJ
        (p1 / "energy_uj").write_text("300100\n")  # 300000 uJ
        return 2.0

    secs, r = measure_energy(work, "cpu", rapl_root=tmp_path)
    assert secs == 2.0
    assert r.joules == pytest.approx(0.5)  # (200000 + 300000) uJ
    assert r.to_dict()["average_w"] == pytest.approx(0.25)
    assert "RAPL" in r.method


def test_no_counter_means_not_measured(tmp_path):
    secs, r = measure_energy(lambda: 1.0, "cpu", rapl_root=tmp_path / "absent")
    assert r.joules is None and r.method.startswith("not measured")
    assert r.to_dict()["average_w"] is None


def test_rapl_unreadable_says_why(tmp_path):
    d = _domain(tmp_path, "intel-rapl:0", 1)
    (d / "energy_uj").write_text("not a number")
    assert "not readable" in RaplMeter(tmp_path).why_not()


def test_nvml_without_pynvml_or_gpu_says_why():
    why = NvmlMeter().why_not()
    assert why is None or "pynvml" in why or "NVML" in why


def test_energy_figures_units_by_hand():
    from opmap.measure.energy import EnergyReading, energy_figures

    # 12 J over 3 s for 48 tokens: 4 W, 0.25 J per token, 4 tokens per J
    f = energy_figures(EnergyReading(12.0, 3.0, "measured (RAPL package domain, 1 package(s))"), 48)
    assert (f["energy_j"], f["power_w"], f["energy_per_token_j"], f["tokens_per_j"]) == (12.0, 4.0, 0.25, 4.0)
    # no joules: modelled at 100 W over the 3 s window when a model is given (300 J), else all None with the reason
    m = energy_figures(EnergyReading(None, 3.0, "not measured: no RAPL"), 48, (100.0, "a 100 W TDP"))
    assert m["energy_j"] == 300.0 and m["power_w"] == 100.0 and m["power_method"].startswith("modelled: a 100 W TDP")
    n = energy_figures(EnergyReading(None, 3.0, "not measured: no RAPL"), 48)
    assert n["energy_j"] is None and n["power_w"] is None and n["power_method"] == "not measured: no RAPL"
