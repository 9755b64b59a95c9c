"""The one JSON record serializer: a frozen dataclass declares its JSON shape, ``record`` builds it.

A class's record is its fields in declaration order, each under its name, each value made JSON-ready (a nested
dataclass as its own record, a tuple as a list, a dict's values converted, a path as its text; numbers, strings,
booleans and None as they are). What a class changes is declared beside its fields, never coded in a method:

- per field, ``field(metadata=key(...))``: ``name`` writes the field under another key; ``omit="none"`` leaves the
  key out while the value is None, ``omit="empty"`` while it is falsy (``""``, ``()``, 0); ``flatten=True`` writes
  the nested record's keys in the field's place instead of one key holding it; ``skip=True`` never writes it;
- per class, ``RECORD: ClassVar[tuple]``: the keys in order, by attribute name. A name that is not a field is a
  derived value (a property, or a class constant) written under that name; ``...`` stands for every field not
  named elsewhere in the tuple, in declaration order. Without ``RECORD`` a class writes ``(...,)``: its fields.

A class whose JSON shape is genuinely computed (keys chosen per instance, values regrouped into blocks that are
not the class's fields) keeps a ``to_dict`` method saying why; ``record`` calls it, so every caller writes
``record(x)`` whatever ``x`` is. Like ``dataclasses.asdict`` the result shares nothing mutable with the value.

A leaf module: every layer's results are recorded with it.
"""

from __future__ import annotations

import os
from dataclasses import fields, is_dataclass
from types import MappingProxyType
from typing import Any

_META = "opmap.record"  # the metadata key ``key`` sets
_OMITS = (None, "none", "empty")
_SCALARS = (str, int, float, bool, type(None))
# per class: its entries (key, attribute, omit, flatten), built once from its fields, metadata and RECORD
_PLANS: dict[type, tuple[tuple[str, str, str | None, bool], ...]] = {}


def key(name: str | None = None, *, omit: str | None = None, flatten: bool = False,
        skip: bool = False) -> MappingProxyType[str, Any]:
    """A field's metadata for ``record``: its key (``name``, default the field's name), when it is left out
    (``omit``: None never, ``"none"`` while None, ``"empty"`` while falsy), whether its record's keys are written
    in its place (``flatten``) and whether it is never written (``skip``)."""
    if omit not in _OMITS:
        raise ValueError(f"omit={omit!r}: accepted None, 'none', 'empty'")
    return MappingProxyType({_META: (name, omit, flatten, skip)})


def record(value: Any) -> dict[str, Any]:
    """``value``'s JSON record (module docstring): its own ``to_dict`` where its shape is computed, else the
    record its class declares. ``value`` must be a dataclass instance."""
    own = getattr(type(value), "to_dict", None)
    if own is not None:
        return own(value)
    plan = _PLANS.get(type(value))
    if plan is None:
        plan = _plan(type(value))
    out: dict[str, Any] = {}
    for k, attr, omit, flatten in plan:
        v = getattr(value, attr)
        if omit is not None and (v is None if omit == "none" else not v):
            continue
        if flatten:
            out.update(record(v))
        else:
            out[k] = v if type(v) in _SCALARS else jsonable(v)
    return out


def jsonable(v: Any) -> Any:
    """``v`` made JSON-ready the way a record's values are: dataclasses recorded, tuples and lists as new lists,
    dicts as new dicts (keys kept), paths as their text, everything else as it is."""
    if type(v) in _SCALARS:
        return v
    if isinstance(v, (tuple, list)):
        return [x if type(x) in _SCALARS else jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: x if type(x) in _SCALARS else jsonable(x) for k, x in v.items()}
    if is_dataclass(v) and not isinstance(v, type):
        return record(v)
    if isinstance(v, os.PathLike):
        return os.fspath(v)
    return v


def _plan(cls: type) -> tuple[tuple[str, str, str | None, bool], ...]:
    """The entries of ``cls``'s record, in order (module docstring), checked once and kept."""
    if not is_dataclass(cls):
        raise TypeError(f"record() takes a dataclass instance, not {cls.__name__}")
    fs = {f.name: f for f in fields(cls)}
    order = getattr(cls, "RECORD", (...,))
    named = {n for n in order if n is not ...}
    plan: list[tuple[str, str, str | None, bool]] = []
    for n in order:
        for name in ([f for f in fs if f not in named] if n is ... else [n]):
            f = fs.get(name)
            if f is None:
                if not hasattr(cls, name):
                    raise TypeError(f"{cls.__name__}.RECORD names {name!r}: neither a field nor an attribute")
                plan.append((name, name, None, False))
                continue
            k, omit, flatten, skip = f.metadata.get(_META, (None, None, False, False))
            if not skip:
                plan.append((k or name, name, omit, flatten))
    _PLANS[cls] = tuple(plan)
    return _PLANS[cls]
