"""The noise between runs: the warm-up rule, the t quantiles, the floor and who counts as a repeat."""

from __future__ import annotations

import math
import statistics

import pytest

from opmap.store.noise import drop_warmup, floor, host_fingerprint, measuring_command, repeat_key, t995


def test_the_warmup_rule_drops_leading_outliers_only():
    # the issue's warm-up outlier: +1750% (x18.5) ahead of steady 200 ms steps: dropped
    xs = [3.7, 0.200, 0.202, 0.198, 0.201, 0.199]
    assert drop_warmup(xs) == (xs[1:], 1)
    # the same value in the middle is not warm-up: kept (the median and the rank test absorb it)
    mid = [0.200, 0.202, 3.7, 0.198, 0.201, 0.199]
    assert drop_warmup(mid) == (mid, 0)
    # the fence by hand: the later samples 0.2, 0.2, 0.2, 0.21 have median 0.2 and MAD 0, floored at 1% of the
    # median: 0.002; fence = 0.2 + 3.5 x 0.002 = 0.207
    assert drop_warmup([0.2071, 0.2, 0.2, 0.2, 0.21])[1] == 1
    assert drop_warmup([0.2069, 0.2, 0.2, 0.2, 0.21])[1] == 0
    # the fence with a spread: later samples 1, 2, 3, 4, 5: median 3, MAD 1, 1.4826 x 3.5 = 5.19: fence 8.19
    assert drop_warmup([8.2, 1, 2, 3, 4, 5])[1] == 1 and drop_warmup([8.1, 1, 2, 3, 4, 5])[1] == 0
    # several leading outliers go, but never more than half of the series
    assert drop_warmup([5, 4, 1, 1, 1, 1]) == ([1, 1, 1, 1], 2)
    assert drop_warmup([9, 9, 9, 1, 1, 1])[1] == 3
    # two profiled iterations (--profile-iters 2): the first may go
    assert drop_warmup([3.7, 0.2]) == ([0.2], 1)


def test_t_quantiles_follow_the_table():
    # NIST/SEMATECH 1.3.6.7.2, one-sided 0.995: 4 dof 4.604, 8 dof 3.355; 35 dof interpolated in 1/dof between
    # 30 (2.750) and 40 (2.704): w = (1/30 - 1/35) / (1/30 - 1/40) = 4/7 -> 2.750 - 4/7 x 0.046 = 2.7237 (tabled
    # elsewhere as 2.724); the normal's 2.576 as the limit
    assert t995(4) == 4.604 and t995(8) == 3.355
    assert t995(35) == pytest.approx(2.750 - 4 / 7 * 0.046)
    assert t995(10 ** 6) == pytest.approx(2.576, abs=1e-3)


def test_the_floor_by_hand():
    a = [math.log(x) for x in (0.200, 0.210, 0.190)]
    b = [math.log(x) for x in (0.240, 0.250)]
    ss = sum((x - statistics.fmean(a)) ** 2 for x in a) + sum((x - statistics.fmean(b)) ** 2 for x in b)
    s = math.sqrt(ss / 3)  # 5 runs in 2 groups: 3 degrees of freedom; t(0.995, 3) = 5.841
    f = floor([a, b], 3, 2, 0.15)
    assert f.measured and f.dof == 3 and f.sd_log == pytest.approx(s)
    assert f.noise == pytest.approx(math.expm1(5.841 * s * math.sqrt(1 / 3 + 1 / 2)))
    assert "t(0.995, 3 dof) 5.84" in f.rule
    # one degree of freedom is no estimate: the assumed floor stands, and says so
    g = floor([[0.0, 0.01], [0.3]], 1, 1, 0.15)
    assert not g.measured and g.noise == 0.15 and g.rule.startswith("assumed 15%")


def test_a_repeat_shares_tags_code_command_and_host():
    cmd = "opmap profile m.py:m --iters 20 --out runs/1 --store=s.duckdb --rows 3 --no-store"
    assert measuring_command(cmd) == "opmap profile m.py:m --iters 20"
    host = {"device_name": "AMD EPYC", "device": "cpu", "threads": 2, "host": "ci-1"}
    assert host_fingerprint({"tags": host}) == "AMD EPYC (cpu, 2 threads) on ci-1"
    assert host_fingerprint({}) is None
    tags = {"workload": "m", "git_commit": "abc", "command": cmd}
    k = repeat_key("profile", tags, {"tags": host})
    assert k == repeat_key("profile", {**tags, "command": "opmap profile m.py:m --iters 20 --out runs/2"},
                           {"tags": host})
    assert k != repeat_key("profile", {**tags, "git_commit": "def"}, {"tags": host})
    assert k != repeat_key("profile", tags, {"tags": {**host, "host": "ci-2"}})
    assert k != repeat_key("profile", {**tags, "command": "opmap profile m.py:m --iters 40"}, {"tags": host})
