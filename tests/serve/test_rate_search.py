"""find_capacity's floor: a search stops once a rate under the caller's floor is invalid (every answer it could still
give lies under that rate), and a floor the answer clears changes nothing."""

from __future__ import annotations

from step_runs import step_at  # noqa: E402

from opmap.serve.rate_search import find_capacity


def test_a_floor_stops_the_descent_at_the_first_invalid_rate_under_it():
    """Ceiling 600, capacity 1 requests/s, floor 200: the descent runs 600 (invalid, not under 200), then 300 and 150
    together (both invalid, 150 < 200): the answer is under 150, so it stops after 3 runs where the full search
    runs its descent to 600 / 2^10 = 0.586 and refines [0.586, 1.17] to 1%."""
    full = find_capacity(step_at(1.0), 1.0, ceiling=600.0)
    assert full.limited_by == "slo" and abs(full.rate_per_s - 1.0) <= 0.01 and len(full.runs) > 10
    c = find_capacity(step_at(1.0), 1.0, ceiling=600.0, floor=200.0)
    assert c.limited_by == "floor" and c.rate_per_s == 0.0 and c.bracket == (None, 150.0)
    assert [r.rate_per_s for r in c.runs] == [600.0, 300.0, 150.0] and c.summary is None
    assert full.rate_per_s < c.bracket[1]  # the full answer lies under the rate the floored search stopped at


def test_a_floor_stops_a_refinement_round_too():
    """Capacity 100, ceiling 600: the descent brackets [75, 150]; round one probes 90 | 105 120 135 (inline, up to
    the first invalid, 105), so with a floor of 110 the search stops there, its best valid rate 90 kept."""
    c = find_capacity(step_at(100.0), 1.0, ceiling=600.0, floor=110.0)
    assert c.limited_by == "floor" and c.bracket == (90.0, 105.0) and c.rate_per_s == 90.0
    assert c.summary.validity.valid


def test_a_floor_under_the_answer_changes_nothing():
    for capacity in (100.0, 3.0, 1e12):
        assert (find_capacity(step_at(capacity), 1.0, ceiling=600.0, floor=0.5 * min(capacity, 600.0))
                == find_capacity(step_at(capacity), 1.0, ceiling=600.0))
