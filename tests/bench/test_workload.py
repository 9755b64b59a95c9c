"""The load's schedule and prompts: the same arrival times and lengths as opmap serve draws for the same specs
and seed (so --predict simulates the very workload sent), constant arrivals, durations, warm-up marks."""

from __future__ import annotations

import numpy as np
import pytest

from opmap.bench.workload import (
    WORDS,
    closed_specs,
    open_specs,
    parse_load_arrival,
    schedule,
    word_prompt,
)
from opmap.errors import OpmapError
from opmap.serve.arrivals import make_requests, parse_length


def test_schedule_is_serves_workload_for_the_same_seed():
    t, i, o = schedule(parse_load_arrival("poisson:5"), parse_length("uniform:10,20"), parse_length("8"), 50,
                       None, 7)
    ref = make_requests("poisson:5", "uniform:10,20", "8", 50, 7)
    assert np.array_equal(t, ref.arrival_s) and np.array_equal(i, ref.input_len) and np.array_equal(o, ref.output_len)


def test_constant_arrivals_and_a_duration():
    t, _, _ = schedule(parse_load_arrival("constant:4"), parse_length("8"), parse_length("8"), None, 2.0, 0)
    assert t == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0])  # one every 1/4 s, first one gap in
    assert parse_load_arrival(" constant:4 ").spec() == "constant:4"
    t, _, _ = schedule(parse_load_arrival("poisson:50"), parse_length("8"), parse_length("8"), None, 3.0, 1)
    assert t.max() <= 3.0 and 100 < len(t) < 200  # 150 expected; Poisson sd ~12
    ref = make_requests("poisson:50", "8", "8", len(t) + 1, 1).arrival_s
    assert ref[len(t)] > 3.0  # exactly the arrivals within the duration


def test_bad_arrival_names_the_accepted_forms():
    with pytest.raises(OpmapError, match="constant:RATE"):
        parse_load_arrival("burst:3")
    with pytest.raises(OpmapError, match="RATE must be a number > 0"):
        parse_load_arrival("constant:-1")
    with pytest.raises(OpmapError, match="--requests N, not --duration"):
        schedule(parse_load_arrival("offline"), parse_length("8"), parse_length("8"), None, 1.0, 0)


def test_specs_carry_lengths_warmup_and_distinct_word_prompts():
    t, i, o = np.array([0.1, 0.2, 0.3]), np.array([5, 6, 7]), np.array([2, 3, 4])
    specs = list(open_specs(t, i, o, warmup=1, seed=0))
    assert [s.warmup for s in specs] == [True, False, False]
    assert [len(s.prompt.split()) for s in specs] == [5, 6, 7] and [s.max_tokens for s in specs] == [2, 3, 4]
    assert len({s.prompt.split()[0] + s.prompt for s in specs}) == 3
    assert all(w in WORDS for s in specs for w in s.prompt.split())
    c = list(closed_specs(parse_length("4"), parse_length("3"), 5, 2, 0))
    assert len(c) == 5 and [s.warmup for s in c] == [True, True, False, False, False]
    assert all(s.scheduled_s is None and s.input_tokens == 4 for s in c)
    endless = closed_specs(parse_length("4"), parse_length("3"), None, 0, 0)
    assert len([next(endless) for _ in range(5000)]) == 5000  # a --duration run draws as it goes


def test_word_prompt_is_deterministic_for_a_seed():
    a = word_prompt(0, 30, np.random.default_rng(3))
    assert a == word_prompt(0, 30, np.random.default_rng(3)) and len(a.split()) == 30
