"""The one JSON record serializer: a frozen dataclass declares its JSON shape, ``record`` builds it.

A class's record is its fields in declaration order, each under its name, each value made JSON-ready (a nested
dataclass as its own record, a tuple as a list, a dict's values converted, a path as its text; numbers, strings,
booleans and None as they are). What a class changes is declared beside its fields, never coded in a method:

- per field, ``field(metadata=key(...))``: ``name`` writes the field under another key; ``omit="none"`` leaves the
  key out while the value is None, ``omit="empty"`` while it is falsy (``""``, ``()``, 0), ``omit="default"`` while
  it equals the field's default (a key that only a later feature's layouts carry: ``ep`` > 1); ``flatten=True`` writes
  the nested record's keys in the field's place instead of one key holding it; ``skip=True`` never writes it;
- per class, ``RECORD: ClassVar[tuple]``: the keys in order, by attribute name. A name that is not a field is a
  derived value (a property, or a class constant) written under that name; a pair ``(key, name)`` writes the
  derived value ``name`` under ``key`` (a view of a field written in the field's place under the field's key:
  ``("layout", "layout_brief")``); ``...`` stands for every field not named elsewhere in the tuple, in declaration
  order. Without ``RECORD`` a class writes ``(...,)``: its fields.

A class whose JSON shape is genuinely computed (keys chosen per instance, values regrouped into blocks that are
not the class's fields) keeps a ``to_dict`` method saying why; ``record`` calls it, so every caller writes
``record(x)`` whatever ``x`` is. Like ``dataclasses.asdict`` the result shares nothing mutable with the value.

A leaf module: every layer's results are recorded with it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from types import MappingProxyType
from typing import Any

_META = "opmap.record"  # the metadata key ``key`` sets
_OMITS = (None, "none", "empty", "default")
_SCALARS = (str, int, float, bool, type(None))
# field annotations whose values are written as they are / as a list, without a look at each value (the compiled
# builder's fast path; any other annotation goes through ``jsonable``)
_SCALAR_TYPES = {"str", "int", "float", "bool", "None"}
_SCALAR_TUPLES = {f"tuple[{t}, ...]" for t in ("str", "int", "float", "bool")}
# per class: the function that records it (``_builder``), made on first use
_BUILDERS: dict[type, Callable[[Any], dict[str, Any]]] = {}


def key(name: str | None = None, *, omit: str | None = None, flatten: bool = False,
        skip: bool = False) -> MappingProxyType[str, Any]:
    """A field's metadata for ``record``: its key (``name``, default the field's name), when it is left out
    (``omit``: None never, ``"none"`` while None, ``"empty"`` while falsy, ``"default"`` while it equals the field's
    default), whether its record's keys are written
    in its place (``flatten``) and whether it is never written (``skip``)."""
    if omit not in _OMITS:
        raise ValueError(f"omit={omit!r}: accepted None, 'none', 'empty'")
    return MappingProxyType({_META: (name, omit, flatten, skip)})


def record(value: Any) -> dict[str, Any]:
    """``value``'s JSON record (module docstring): its own ``to_dict`` where its shape is computed, else the
    record its class declares. ``value`` must be a dataclass instance."""
    build = _BUILDERS.get(type(value))
    if build is None:
        build = _builder(type(value))
    return build(value)


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


def _builder(cls: type) -> Callable[[Any], dict[str, Any]]:
    """The function that records a ``cls``: its own ``to_dict``, or one compiled from its plan (``_plan``), as
    ``dataclasses`` compiles ``__init__``: the generic path costs a dict lookup more than a hand-written
    ``to_dict`` (a 70B model's analysis records some 10^5 tensors)."""
    own = getattr(cls, "to_dict", None)
    if own is None:
        lines = ["def build(v):", "    out = {}"]
        plan = _plan(cls)  # refuses what is not a dataclass, first
        defaults = {f.name: f.default for f in fields(cls)}
        scope: dict[str, Any] = {}
        for k, attr, omit, flatten, kind in plan:
            lines.append(f"    x = v.{attr}")
            pad = "    "
            if omit is not None:
                if omit == "default":
                    scope[f"DEFAULT_{attr}"] = defaults[attr]
                test = {"none": "x is not None", "empty": "x", "default": f"x != DEFAULT_{attr}"}[omit]
                lines.append(f"    if {test}:")
                pad = "        "
            value = {"scalar": "x", "tuple": "list(x)"}.get(kind, "x if type(x) in SCALARS else jsonable(x)")
            lines.append(f"{pad}out.update(record(x))" if flatten else f"{pad}out[{k!r}] = {value}")
        lines.append("    return out")
        scope.update({"SCALARS": _SCALARS, "jsonable": jsonable, "record": record})
        exec("\n".join(lines), scope)  # noqa: S102 (source built above from the class's own field names)
        own = scope["build"]
    _BUILDERS[cls] = own
    return own


def _plan(cls: type) -> tuple[tuple[str, str, str | None, bool, str], ...]:
    """The entries of ``cls``'s record (key, attribute, omit, flatten, kind), in order (module docstring); kind
    is ``scalar`` or ``tuple`` where the field's annotation says its value needs no conversion or is a tuple of
    scalars (a list is written), else ``any``."""
    if not is_dataclass(cls):
        raise TypeError(f"record() takes a dataclass instance, not {cls.__name__}")
    fs = {f.name: f for f in fields(cls)}
    order = getattr(cls, "RECORD", (...,))
    named = {n for n in order if n is not ... and not isinstance(n, tuple)}
    plan: list[tuple[str, str, str | None, bool, str]] = []
    for n in order:
        if isinstance(n, tuple):  # (key, a derived value's name)
            k, name = n
            if name in fs or not name.isidentifier() or not hasattr(cls, name):
                raise TypeError(f"{cls.__name__}.RECORD pairs {k!r} with {name!r}: not a derived attribute")
            plan.append((k, name, None, False, "any"))
            continue
        for name in ([f for f in fs if f not in named] if n is ... else [n]):
            f = fs.get(name)
            if f is None:
                if not name.isidentifier() or not hasattr(cls, name):
                    raise TypeError(f"{cls.__name__}.RECORD names {name!r}: neither a field nor an attribute")
                plan.append((name, name, None, False, "any"))
                continue
            k, omit, flatten, skip = f.metadata.get(_META, (None, None, False, False))
            if not skip:
                plan.append((k or name, name, omit, flatten, _kind(f.type)))
    return tuple(plan)


def _kind(annotation: Any) -> str:
    """``scalar``, ``tuple`` or ``any`` for a field's annotation (``_plan``): a string under ``from __future__
    import annotations``, a type otherwise."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    text = text.replace("typing.", "").replace(" ", "")
    parts = set(text.split("|"))
    if parts <= _SCALAR_TYPES:
        return "scalar"
    return "tuple" if text.replace(",...", ", ...") in _SCALAR_TUPLES else "any"
