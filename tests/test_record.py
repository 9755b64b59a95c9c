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
    """A field written in brief under its own key: RECORD's pair (derived name, key(field's name))."""

    RECORD: ClassVar[tuple[Any, ...]] = ("name", ("inner_brief", key("inner")), "n")
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
    with pytest.raises(TypeError, match=r"BadPair.RECORD entry \('x', 'x'\): a pair is \(attribute, key\(...\)\)"):
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


@dataclass(frozen=True)
class Row:
    name: str
    t_s: float
    inner: Inner | None = field(default=None, metadata=key(flatten=True, omit="none"))


@dataclass(frozen=True)
class Table:
    counts: tuple[tuple[str, int], ...] = field(metadata=key(mapping=True))
    rows: tuple[Row, ...] = field(metadata=key("by_name", mapping="name"))
    options: dict[str, Any] = field(default_factory=dict, metadata=key(flatten=True))
    none: tuple[Row, ...] | None = field(default=None, metadata=key(mapping="name"))


def test_mapping_writes_pairs_and_keyed_rows_as_objects_and_flatten_takes_a_dict():
    t = Table((("b", 2), ("a", 1)), (Row("mlp", 1.5, Inner(7, (8,))), Row("attn", 0.5)), {"x": [1], "y": (2,)})
    d = record(t)
    # pairs in their order; each row under its name, its record less that key; the dict's items in place
    assert json.dumps(d) == json.dumps({"counts": {"b": 2, "a": 1},
                                        "by_name": {"mlp": {"t_s": 1.5, "a": 7, "b": [8]}, "attn": {"t_s": 0.5}},
                                        "x": [1], "y": [2], "none": None})
    assert record(Table((), ())) == {"counts": {}, "by_name": {}, "none": None}
    d["options_copy"] = d.pop("x")
    d["options_copy"].append(9)
    assert t.options["x"] == [1]  # nothing mutable shared
    with pytest.raises(ValueError, match="mapping='a b'"):
        key(mapping="a b")


def test_when_writes_a_field_only_while_its_flag_holds():
    from dataclasses import dataclass, field

    @dataclass(frozen=True)
    class Lay:
        tp: int
        ep: int = 1
        imbalance: float = field(default=1.0, metadata=key(when="expert_parallel"))

        @property
        def expert_parallel(self) -> bool:
            return self.ep > 1

    # at ep 1 the EP key is left out; at ep 2 it is written even at its default value (omit="default" would not)
    assert record(Lay(2)) == {"tp": 2, "ep": 1}
    assert list(record(Lay(2, 2))) == ["tp", "ep", "imbalance"] and record(Lay(2, 2))["imbalance"] == 1.0
    with pytest.raises(ValueError, match="when='a b'"):
        key(when="a b")


@dataclass(frozen=True)
class DerivedMeta:
    RECORD: ClassVar[tuple[Any, ...]] = ("n", ("doubled", key("twice")), ("maybe", key(omit="none")),
                                         ("inner", key(flatten=True, when="n")))
    n: int

    @property
    def doubled(self) -> int:
        return 2 * self.n

    @property
    def maybe(self) -> int | None:
        return self.n or None

    @property
    def inner(self) -> Inner:
        return Inner(self.n, (self.n,))


def test_a_record_entry_gives_a_derived_value_a_fields_metadata():
    # renamed, omitted while None, flattened and written only while ``n`` is truthy, as a field's metadata says
    assert record(DerivedMeta(3)) == {"n": 3, "twice": 6, "maybe": 3, "a": 3, "b": [3]}
    assert list(record(DerivedMeta(3))) == ["n", "twice", "maybe", "a", "b"]
    assert record(DerivedMeta(0)) == {"n": 0, "twice": 0}
