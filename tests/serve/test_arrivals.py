from __future__ import annotations

import numpy as np
import pytest

from opmap.errors import OpmapError
from opmap.serve import make_requests
from opmap.serve.arrivals import parse_length


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


@pytest.mark.parametrize("kind,what", [("device", "is a device"), ("folder", "is a folder"), ("fifo", "is a FIFO"),
                                       ("link to a device", "is a device"), ("missing", "not found"),
                                       ("over the limit", "over the 256 MiB opmap reads for it")])
def test_a_trace_that_is_not_a_regular_file_is_named(tmp_path, kind, what):
    """trace:/dev/zero and trace:/etc said "not found"; a FIFO blocked the read. Each now says what the path is
    and what is accepted (a link the user made is followed to what it names)."""
    import os

    from opmap.safeio import LIMIT_TRACE_BYTES

    p = {"device": "/dev/zero", "folder": str(tmp_path)}.get(kind, str(tmp_path / "t.jsonl"))
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "link to a device":
        os.symlink("/dev/zero", p)
    elif kind == "over the limit":
        with open(p, "wb") as f:  # sparse: refused on its size, nothing read
            f.truncate(LIMIT_TRACE_BYTES + 1)
    with pytest.raises(OpmapError) as e:
        make_requests(f"trace:{p}", "1", "1")
    assert str(e.value).startswith(f"trace file {p} ") and what in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).endswith("; accepted: JSONL or CSV (UTF-8, a header row) of arrival_s,input_len,output_len")


def test_a_trace_behind_the_users_own_link_is_read(tmp_path):
    j = tmp_path / "t.jsonl"
    j.write_text('{"arrival_s": 0.5}\n')
    (tmp_path / "mine.jsonl").symlink_to(j)
    assert make_requests(f"trace:{tmp_path / 'mine.jsonl'}", "1", "1").arrival_s.tolist() == [0.5]


# -- traces read from text (parse_trace): every value a number in range, one line naming the row and field ------

def _trace_refused(data: str | bytes) -> str:
    from opmap.serve.arrivals import parse_trace

    with pytest.raises(OpmapError) as e:
        parse_trace(data, "t.jsonl")
    assert "\n" not in str(e.value)
    return str(e.value)


ARRIVAL_RANGE = "arrival_s must be a number from 0 to 31536000 s (one year at most)"


@pytest.mark.parametrize("value,got", [
    ("NaN", "nan"), ("Infinity", "inf"), ("-Infinity", "-inf"), ("1e400", "inf"), ("-1", "-1"),
    ("1e30", "1e+30"), ("true", "true"), ('"0.5"', "'0.5'"),
])
def test_jsonl_arrival_times_must_be_numbers_within_a_year(value, got):
    text = '{"arrival_s": 0.1}\n{"arrival_s": ' + value + "}\n"
    assert _trace_refused(text) == f"trace file t.jsonl: row 2: {ARRIVAL_RANGE} (got {got})"


@pytest.mark.parametrize("value,got", [("nan", "nan"), ("inf", "inf"), ("-0.5", "-0.5"), ("soon", "'soon'")])
def test_csv_arrival_times_are_read_as_numbers_and_checked(value, got):
    assert _trace_refused(f"arrival_s\n0.1\n{value}\n") == f"trace file t.jsonl: row 2: {ARRIVAL_RANGE} (got {got})"


@pytest.mark.parametrize("value,got", [("0", "0"), ("-3", "-3"), ("2.5", "2.5"), ("1e30", "1e+30"),
                                       ("true", "true"), ('"7"', "'7'")])
def test_lengths_in_a_trace_are_integers_from_1_to_10m_tokens(value, got):
    text = '{"arrival_s": 0.1, "input_len": ' + value + ', "output_len": 3}\n'
    assert _trace_refused(text) == (f"trace file t.jsonl: row 1: input_len must be an integer from 1 to 10000000 "
                                    f"(got {got})")


def test_binary_empty_and_headless_traces_are_one_line():
    assert _trace_refused(b"\x89PNG\r\n\x1a\n\x00\xff").startswith("trace file t.jsonl is not UTF-8 text (byte 0)")
    assert _trace_refused("").startswith("trace file t.jsonl holds no requests")
    assert _trace_refused("# only a comment\n\n").startswith("trace file t.jsonl holds no requests")
    assert _trace_refused("arrival_s,input_len\n").startswith("trace file t.jsonl holds a header row and no requests")
    assert _trace_refused("time,len\n1,2\n").startswith("trace file t.jsonl: no arrival_s column")
    assert _trace_refused('{"arrival_s": 1}\n[1, 2]\n').startswith("trace file t.jsonl: row 2 is not a JSON object")
    assert _trace_refused('{"input_len": 3}\n').startswith("trace file t.jsonl: row 1 has no arrival_s")


def test_a_length_column_on_some_rows_only_is_refused():
    text = '{"arrival_s": 0.1, "input_len": 4}\n{"arrival_s": 0.2}\n'
    assert _trace_refused(text) == ("trace file t.jsonl: input_len is given on 1 of 2 rows: give it on every row or "
                                    "on none")


def test_parse_trace_sorts_and_takes_bytes():
    from opmap.serve.arrivals import parse_trace

    t = parse_trace(b'\xef\xbb\xbfarrival_s,input_len,output_len\n2,5,1\n0.5,6,2\n')  # a BOM, as Excel writes
    assert t["arrival_s"].tolist() == [0.5, 2.0] and t["input_len"].tolist() == [6, 5]


def test_requests_zero_with_a_trace_is_refused(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"arrival_s": 0.5}\n')
    with pytest.raises(OpmapError, match=r"^--requests must be an integer from 1 to 10000000 \(got 0\)$"):
        make_requests(f"trace:{f}", "4", "4", n=0)


# -- arrival and length specs ---------------------------------------------------------------------------------

def test_a_rate_too_low_for_the_requests_is_refused_not_simulated_at_1e10_s():
    # 10 requests at 1e-9 requests/s arrive over ~1e10 s: past a year, float64 times lose the latencies
    with pytest.raises(OpmapError, match=r"arrive over 1\.\d+e\+10 s; arrival times must stay within 31536000 s"):
        make_requests("poisson:1e-9", "4", "4", 10)
    r = make_requests("poisson:1e-9", "4", "4", 10, max_span_s=None)  # a capacity search may go there
    assert r.arrival_s[-1] > 1e9


@pytest.mark.parametrize("spec,expected", [
    ("poisson:nan", "arrival 'poisson:nan': RATE must be a number > 0 and <= 1000000 requests/s (got nan)"),
    ("poisson:inf", "arrival 'poisson:inf': RATE must be a number > 0 and <= 1000000 requests/s (got inf)"),
    ("poisson:0", "arrival 'poisson:0': RATE must be a number > 0 and <= 1000000 requests/s (got 0)"),
    ("gamma:1,1e-200", "arrival 'gamma:1,1e-200': CV must be a number from 0.001 to 1000 (got 1e-200)"),
    ("gamma:1,nan", "arrival 'gamma:1,nan': CV must be a number from 0.001 to 1000 (got nan)"),
    # finite but absurd: a rate past opmap.validate.CEILINGS (a million requests a second) was taken as it was
    ("poisson:1e300", "arrival 'poisson:1e300': RATE must be a number > 0 and <= 1000000 requests/s (got 1e+300)"),
])
def test_arrival_specs_refuse_nan_inf_zero_and_absurd_cv(spec, expected):
    from opmap.serve.arrivals import parse_arrival

    with pytest.raises(OpmapError) as e:
        parse_arrival(spec)
    assert str(e.value).startswith(expected + "; accepted: poisson:RATE")


@pytest.mark.parametrize("spec,expected", [
    ("99999999999999999999", "length 99999999999999999999 must be an integer from 1 to 10000000"),
    ("normal:nan,1", "length 'normal:nan,1': MEAN must be a number from 1 to 10000000 (got nan)"),
    ("lognormal:100,inf", "length 'lognormal:100,inf': SIGMA must be a number >= 0 (got inf)"),
    ("uniform:1.5,4", "length 'uniform:1.5,4': A must be an integer from 1 to 10000000 (got 1.5)"),
])
def test_length_specs_refuse_nan_inf_and_absurd_sizes(spec, expected):
    from opmap.serve.arrivals import parse_length

    with pytest.raises(OpmapError) as e:
        parse_length(spec)
    assert str(e.value).startswith(expected)


def test_a_wide_lognormal_is_clipped_to_10m_tokens_not_wrapped_negative():
    # sigma 50: exp(ln 100 + 50 z) overflows float64 to inf for z > ~14 and passes 2**63 for z > ~0.8, where a
    # cast to int64 wraps to a negative length; clipped, every length stays within 1 .. 10M
    r = make_requests("offline", "lognormal:100,50", "1", 2000, seed=0)
    assert r.input_len.min() >= 1 and r.input_len.max() == 10_000_000


def test_a_capped_length_is_truncated_at_its_max():
    """``lognormal:MEDIAN,SIGMA,MAX`` draws no length above MAX and redraws those that were (a truncated
    distribution): with median 152 and sigma 0.872 about 1.5% of draws exceed 1023 (ln(1023/152) / 0.872 = 2.19
    standard deviations), so 24,576 draws capped at 1023 keep their median near 152 and all lie at or under 1023,
    while the uncapped draws of the same seed go past it. A cap under the median is refused in one line."""
    capped = make_requests("offline", "lognormal:152,0.872,1023", "1", 24_576, seed=0).input_len
    free = make_requests("offline", "lognormal:152,0.872", "1", 24_576, seed=0).input_len
    assert capped.max() <= 1023 < free.max()
    assert 0.005 < (free > 1023).mean() < 0.03
    assert abs(np.median(capped) / 152 - 1) < 0.05
    assert parse_length("lognormal:152,0.872,1023").spec() == "lognormal:152,0.872,1023"
    assert parse_length("normal:300,50,400").cap == 400
    with pytest.raises(OpmapError, match="MAX"):
        parse_length("lognormal:152,0.872,100")
    with pytest.raises(OpmapError, match="accepted"):
        parse_length("uniform:1,5,9")


@pytest.mark.parametrize("spec, longest", [("512", 512), ("uniform:100,3000", 3000), ("normal:800,200,1500", 1500),
                                           ("lognormal:1000,0.5,4096", 4096), ("lognormal:1000,0.5", None),
                                           ("trace", None)])
def test_the_longest_length_a_spec_draws_is_known_before_drawing(spec, longest):
    """What bench --predict prices its prefill points to before the load is drawn: N, B, or the cap; None where a
    distribution has no bound. Every draw stays within it."""
    from opmap.serve.arrivals import Arrival

    length = parse_length(spec)
    assert length.longest() == longest
    if longest is not None:
        drawn = make_requests(Arrival("poisson", 1.0), length, parse_length("1"), 2000, 0, max_span_s=None)
        assert int(drawn.input_len.max()) <= longest
        assert int(drawn.input_len.max()) >= 0.5 * longest  # 2000 draws reach near the top of these specs
