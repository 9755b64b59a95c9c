"""opmap.validate: one checker for every number read from outside, and JSON that never holds a bare NaN."""

from __future__ import annotations

import json
import math

import pytest

from opmap.errors import OpmapError
from opmap.validate import accepted, count, finite_number, json_text, positive


@pytest.mark.parametrize("value,shown", [
    (float("nan"), "nan"), (float("inf"), "inf"), (float("-inf"), "-inf"), (True, "true"), (False, "false"),
    ("1", "'1'"), (None, "null"), ([1], "[1]"),
])
def test_non_numbers_are_refused_naming_the_field_and_the_range(value, shown):
    with pytest.raises(OpmapError) as e:
        finite_number(value, "rate", lo=0, lo_open=True, unit="requests/s")
    assert str(e.value) == f"rate must be a number > 0 requests/s (got {shown})"


@pytest.mark.parametrize("value", [0, 0.0, -1, -1e-300])
def test_positive_refuses_zero_and_negatives(value):
    with pytest.raises(OpmapError, match=r"^x must be a number > 0 \(got "):
        positive(value, "x")


def test_range_ends_open_and_closed():
    assert finite_number(0, "a", lo=0, hi=1) == 0.0 and finite_number(1, "a", lo=0, hi=1) == 1.0
    for v in (0, 1):
        with pytest.raises(OpmapError, match=r"a must be a number > 0 and < 1 \(got"):
            finite_number(v, "a", lo=0, hi=1, lo_open=True, hi_open=True)
    with pytest.raises(OpmapError, match=r"^a must be a number from 0 to 1 \(got 1.5\)$"):
        finite_number(1.5, "a", lo=0, hi=1)


def test_integers_refuse_fractions_and_take_whole_floats():
    assert count(2.0, "n") == 2 and isinstance(count(2.0, "n"), int)
    with pytest.raises(OpmapError, match=r"^n must be an integer >= 1 \(got 1.9\)$"):
        count(1.9, "n")
    with pytest.raises(OpmapError, match=r"^n must be an integer from 1 to 3 \(got 4\)$"):
        count(4, "n", hi=3)
    with pytest.raises(OpmapError, match=r"got 100000000000\.\.\. \(31 digits\)\)$"):
        count(10**30, "n", hi=2**31 - 1)


def test_accepted_words():
    assert accepted(1, None, integer=True) == "an integer >= 1"
    assert accepted(None, None) == "a finite number"
    assert accepted(0, 3.5e7, unit="s") == "a number from 0 to 35000000 s"


def test_json_text_writes_null_for_non_finite_and_says_where():
    text = json_text({"a": [1.0, float("nan")], "b": {"c": float("inf")}, "d": "nan"}, indent=1)
    assert "NaN" not in text and "Infinity" not in text
    back = json.loads(text)  # strict JSON: json.loads would accept NaN, so check the constants too
    assert back["a"] == [1.0, None] and back["b"] == {"c": None} and back["d"] == "nan"
    assert back["non_finite"] == {"a[1]": "nan", "b.c": "inf"}


def test_json_text_leaves_finite_documents_unchanged():
    doc = {"x": 1.5, "y": [1, 2], "z": None}
    assert json_text(doc) == json.dumps(doc) and "non_finite" not in json.loads(json_text(doc))
    assert json.loads(json_text([math.nan])) == [None]  # a top-level array has no room for the note


def test_an_int_past_the_float_range_is_refused_not_overflowed():
    with pytest.raises(OpmapError, match=r"^x must be a finite number \(got 1000"):
        finite_number(10**400, "x")  # quoted short: "100000000000... (401 digits)"


def test_every_json_output_is_written_without_bare_nan():
    """Each json.dumps in src/opmap passes allow_nan=False or goes through json_text; the exceptions, counted,
    write nothing a user reads as JSON."""
    import ast
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src" / "opmap"
    exempt = {"validate.py": 1,  # quoting a bool or None in a message
              # a hash key; a graph entry's payload (read back by opmap only: a graph's args may hold -inf)
              "capture/cache.py": 2,
              "report/html.py": 1}  # tags shown as text inside <pre>
    found: dict[str, int] = {}
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "dumps"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "json"
                    and not any(k.arg == "allow_nan" and getattr(k.value, "value", True) is False
                                for k in node.keywords)):
                rel = path.relative_to(src).as_posix()
                if not rel.startswith("store/"):  # the store's own rows and spool, read back by opmap only
                    found[rel] = found.get(rel, 0) + 1
    assert found == exempt


def test_visible_shows_a_name_as_written():
    from pathlib import Path

    from opmap.validate import visible

    assert visible(Path("out/run 1/sheet.csv")) == "out/run 1/sheet.csv"  # printable: as it is
    assert visible("out/é/ü") == "out/é/ü"
    assert visible("out/\x1b[2Jx") == "'out/\\x1b[2Jx'"  # an escape: quoted, as Python's repr
    assert visible("a\nb\u202ec") == "'a\\nb\\u202ec'"  # a new line, a right-to-left override
    assert visible("a\\x1b") == "'a\\\\x1b'"  # a backslash: quoted too, so it cannot pass for an escape
    assert visible("'q'") == '"\'q\'"'  # a leading quote: quoted, so it cannot pass for a repr


def test_every_unit_with_a_ceiling_refuses_past_it_and_says_the_range():
    """A finite number far past anything real (1e308 ms for a latency, 1e300 W for a power budget) was taken as
    it was; positive_in / positive now close each unit at its plausibility ceiling (validate.CEILINGS)."""
    from opmap.validate import CEILINGS, Rule, plausible, positive_in

    for unit, (hi, _why) in CEILINGS.items():
        assert positive_in(unit).check(hi, "x") == hi  # the ceiling itself is accepted
        with pytest.raises(OpmapError, match=rf"^x must be a number > 0 and <= {hi:.15g}".replace("+", r"\+")):
            positive_in(unit).check(1e308, "x")
        assert positive(hi, "x", unit=unit) == hi
        with pytest.raises(OpmapError):
            positive(hi * 2, "x", unit=unit)
    assert plausible("s").check(0, "x") == 0.0  # a closed lower end where a zero means something
    with pytest.raises(OpmapError, match=r"^--slo-ttft must be a number > 0 and <= 86400000 ms \(one day at most\) "
                                         r"\(got 1e\+308\)$"):
        positive_in("ms").check(1e308, "--slo-ttft")
    assert positive_in("tokens") == Rule(lo=0, lo_open=True, unit="tokens")  # no ceiling known: none imposed
