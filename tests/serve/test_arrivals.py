from __future__ import annotations

import numpy as np
import pytest

from opmap.errors import OpmapError
from opmap.serve import make_requests


def test_poisson_and_gamma_gaps_have_the_stated_mean_and_cv():
    for spec, cv in (("poisson:20", 1.0), ("gamma:20,3", 3.0), ("gamma:20,0.5", 0.5)):
        gaps = np.diff(make_requests(spec, "1", "1", 100_000, seed=5).arrival_s)
        assert gaps.mean() == pytest.approx(1 / 20, rel=0.03)
        assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.05)


def test_lengths():
    r = make_requests("offline", "uniform:3,5", "normal:2,10", 10_000, seed=0)
    assert np.all(r.arrival_s == 0)
    assert set(np.unique(r.input_len)) == {3, 4, 5}
    assert r.output_len.min() == 1  # clipped


def test_trace_jsonl_and_csv(tmp_path):
    j = tmp_path / "t.jsonl"
    j.write_text('{"arrival_s": 1.0, "input_len": 7, "output_len": 3}\n# note\n{"arrival_s": 0.5, "input_len": 9, '
                 '"output_len": 2}\n')
    r = make_requests(f"trace:{j}", "trace", "trace")
    assert r.arrival_s.tolist() == [0.5, 1.0] and r.input_len.tolist() == [9, 7]
    c = tmp_path / "t.csv"
    c.write_text("arrival_s,input_len\n0.2,5\n0.1,6\n")
    r = make_requests(f"trace:{c}", "trace", "4", n=1)
    assert r.input_len.tolist() == [6] and r.output_len.tolist() == [4]
    with pytest.raises(OpmapError, match="output_len column"):
        make_requests(f"trace:{c}", "trace", "trace")
    with pytest.raises(OpmapError, match="not found"):
        make_requests(f"trace:{tmp_path / 'nope.csv'}", "1", "1")
