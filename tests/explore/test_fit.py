"""The fit matrix: the power model by hand, a served cell's figures consistent, constraints keep cells with reasons."""

from __future__ import annotations

import pytest

from opmap.explore.fit import IDLE_FRACTION, _power_w, fit_matrix
from opmap.hardware import get_hardware
from opmap.serve.metrics import Slo


def test_power_model_by_hand():
    # H100 SXM TDP 700 W (datasheet): 2 devices at a 50% busy fraction draw 2 x (0.15 x 700 + 0.85 x 700 x 0.5)
    h100 = get_hardware("h100-sxm")
    assert _power_w(h100, 2, [0.5]) == pytest.approx(2 * (IDLE_FRACTION * 700 + (1 - IDLE_FRACTION) * 700 * 0.5))
    assert _power_w(h100, 1, [0.0]) == pytest.approx(IDLE_FRACTION * 700)


def test_a_served_cell_and_a_struck_one():
    slo = Slo(0.5, 0.05)
    r = fit_matrix(["gpt2"], ["h100-sxm", "l4"], slo, "256", "32", 150, power_budget_w=100.0,
                   prices={"h100-sxm": 2.0})
    h100, l4 = (next(c for c in r["cells"] if c["hardware"] == h) for h in ("h100-sxm", "l4"))
    assert h100["fits"] and h100["devices"] == 1 and h100["throughput_at_slo"] > 0
    # energy per token and perf per watt are one figure, two ways; perf per dollar from the price per device-hour
    assert h100["energy_per_token_j"] == pytest.approx(h100["power_w"] / h100["throughput_at_slo"])
    assert h100["perf_per_watt"] == pytest.approx(1 / h100["energy_per_token_j"])
    assert h100["perf_per_dollar"] == pytest.approx(h100["throughput_at_slo"] * 3600 / 2.0)
    # the H100 idles at 105 W (15% of 700) alone: over a 100 W budget it is kept, struck, with the numbers
    assert "over the 100 W budget" in h100["excluded_reason"] and h100["rank"] is None
    assert l4["excluded_reason"] == "" and l4["rank"] == 1  # 72 W TDP: inside the budget
    assert l4["bound"] in ("memory", "compute", "overhead") and l4["risk"] == "not in the catalog"
