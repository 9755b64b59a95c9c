"""The one JSON record serializer (opmap.record): a dataclass's fields in order, renamed, omitted, flattened or
skipped as its field metadata says, derived values where its RECORD names them, nested values made JSON-ready;
a class with a computed shape keeps its own ``to_dict``, which ``record`` calls."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest

from opmap.record import jsonable, key, record


@dataclass(frozen=True)
class Inner:
    a: int
    b: tuple[int, ...] = ()


@dataclass(frozen=True)
class Outer:
    name: str
    inner: Inner
    extra: int | None = field(default=None, metadata=key(omit="none"))
    note: str = field(default="", metadata=key(omit="empty"))
    per_kernel: float = field(default=0.0, metadata=key(name="per_kernel_s"))
    hidden: int = field(default=0, metadata=key(skip=True))


def test_fields_in_order_renamed_and_omitted():
    o = Outer("x", Inner(1, (2, 3)), per_kernel=4.5, hidden=7)
    # the fields in declaration order; extra left out while None, note while "", hidden never
    assert list(record(o)) == ["name", "inner", "per_kernel_s"]
    assert record(o) == {"name": "x", "inner": {"a": 1, "b": [2, 3]}, "per_kernel_s": 4.5}
    o2 = Outer("x", Inner(1), extra=0, note="n")
    # 0 is not None: omit="none" keeps it; a non-empty note is written
    assert list(record(o2)) == ["name", "inner", "extra", "note", "per_kernel_s"]
    assert record(o2)["extra"] == 0 and record(o2)["note"] == "n"


@dataclass(frozen=True)
class Derived:
    RECORD: ClassVar[tuple[Any, ...]] = ("first", "total", ..., "units")
    units: ClassVar[str] = "bytes per device"
    first: int
    second: int
    third: int = 0

    @property
    def total(self) -> int:
        return self.first + self.second + self.third


def test_record_order_with_derived_values_and_the_ellipsis():
    # "..." stands for the fields not named elsewhere (second, third); total and units are derived, in place
    d = record(Derived(1, 2, 3))
    assert list(d) == ["first", "total", "second", "third", "units"]
    assert d == {"first": 1, "total": 1 + 2 + 3, "second": 2, "third": 3, "units": "bytes per device"}


@dataclass(frozen=True)
class Flat:
    count: int
    inner: Inner = field(metadata=key(flatten=True))
    after: bool = False


def test_flatten_writes_the_nested_record_in_place():
    d = record(Flat(3, Inner(1, (4,))))
    assert list(d) == ["count", "a", "b", "after"]
    assert d == {"count": 3, "a": 1, "b": [4], "after": False}


@dataclass(frozen=True)
class Custom:
    x: int

    def to_dict(self) -> dict[str, Any]:
        """A computed shape (test): the value doubled under another key."""
        return {"twice": 2 * self.x}


@dataclass(frozen=True)
class HoldsCustom:
    c: Custom
    cs: tuple[Custom, ...]
    by_name: dict[str, Custom]
    where: Path


def test_a_class_with_its_own_to_dict_is_recorded_by_it_even_nested():
    assert record(Custom(2)) == {"twice": 4}
    h = HoldsCustom(Custom(1), (Custom(2), Custom(3)), {"k": Custom(5)}, Path("/a/b"))
    assert record(h) == {"c": {"twice": 2}, "cs": [{"twice": 4}, {"twice": 6}], "by_name": {"k": {"twice": 10}},
                         "where": "/a/b"}


@dataclass(frozen=True)
class Plain:
    n: int
    xs: tuple[float, ...]
    m: dict[str, list[int]]
    inner: Inner | None = None


def test_a_plain_dataclass_records_as_asdict_writes_it():
    p = Plain(1, (0.5, 1.5), {"a": [1, 2]}, Inner(3, (4, 5)))
    # asdict keeps tuples; JSON writes them as the lists record makes: byte for byte the same
    assert json.dumps(record(p)) == json.dumps(asdict(p))
    assert list(record(p)) == [f for f in asdict(p)]


def test_the_record_shares_nothing_mutable_with_the_value():
    p = Plain(1, (0.5,), {"a": [1, 2]})
    d = record(p)
    d["m"]["a"].append(3)
    d["m"]["b"] = []
    assert p.m == {"a": [1, 2]}


def test_jsonable_of_plain_values():
    assert jsonable((1, (2, 3), {"k": (4,)})) == [1, [2, 3], {"k": [4]}]
    assert jsonable(None) is None and jsonable("s") == "s" and jsonable(1.25) == 1.25


@dataclass(frozen=True)
class BadName:
    RECORD: ClassVar[tuple[Any, ...]] = (..., "nowhere")
    x: int


@dataclass(frozen=True)
class Wide:
    """A field written in brief under its own key: RECORD's pair (key, derived name)."""

    RECORD: ClassVar[tuple[Any, ...]] = ("name", ("inner", "inner_brief"), "n")
    name: str
    inner: Inner
    n: int = 0

    @property
    def inner_brief(self) -> int:
        return self.inner.a


@dataclass(frozen=True)
class BadPair:
    RECORD: ClassVar[tuple[Any, ...]] = (("x", "x"),)
    x: int


def test_a_pair_writes_a_derived_value_under_another_key():
    w = Wide("w", Inner(5, (6,)), 2)
    assert json.dumps(record(w)) == '{"name": "w", "inner": 5, "n": 2}'  # in RECORD's order, the field not written
    with pytest.raises(TypeError, match="BadPair.RECORD pairs 'x' with 'x': not a derived attribute"):
        record(BadPair(1))


def test_misuse_is_named():
    with pytest.raises(TypeError, match="not int"):
        record(3)
    with pytest.raises(TypeError, match="BadName.RECORD names 'nowhere'"):
        record(BadName(1))
    with pytest.raises(ValueError, match="omit='never'"):
        key(omit="never")


def test_a_class_annotated_with_real_types_records_alike():
    # without ``from __future__ import annotations`` a field's annotation is a type, not its text
    from dataclasses import make_dataclass

    c = make_dataclass("C", [("n", int), ("xs", tuple[int, ...]), ("where", Path), ("note", str | None)], frozen=True)
    assert record(c(1, (2, 3), Path("/x"), None)) == {"n": 1, "xs": [2, 3], "where": "/x", "note": None}


def test_omit_default_leaves_out_a_field_at_its_default():
    from dataclasses import dataclass, field

    @dataclass(frozen=True)
    class Lay:
        tp: int
        ep: int = field(default=1, metadata=key(omit="default"))

    assert record(Lay(4)) == {"tp": 4} and record(Lay(4, 4)) == {"tp": 4, "ep": 4}
