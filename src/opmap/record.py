"""The one JSON record serializer: a frozen dataclass declares its JSON shape, ``record`` builds it.

A class's record is its fields in declaration order, each under its name, each value made JSON-ready (a nested
dataclass as its own record, a tuple as a list, a dict's values converted, a path as its text; numbers, strings,
booleans and None as they are). What a class changes is declared beside its fields, never coded in a method:

- per field, ``field(metadata=key(...))``: ``name`` writes the field under another key; ``omit="none"`` leaves the
  key out while the value is None, ``omit="empty"`` while it is falsy (``""``, ``()``, 0), ``omit="default"`` while
  it equals the field's default (a key that only a later feature's layouts carry: ``ep`` > 1); ``flatten=True`` writes
  the nested record's keys (a dict's items) in the field's place instead of one key holding it; ``skip=True`` never
  writes it; ``mapping=True`` writes a tuple of (key, value) pairs as one object; ``mapping="attr"`` writes a tuple of
  dataclasses as one object, each under its ``attr`` with its record less the key ``attr`` as the value (a table
  keyed by a column: ``{"mlp": {...}, "attention": {...}}``); ``when="attr"`` writes it only while the value's
  attribute ``attr`` (a field or a property) is truthy (keys that belong to one mode of a value: a layout's EP keys
  while it has expert parallelism);
- per class, ``RECORD: ClassVar[tuple]``: the keys in order, by attribute name. A name that is not a field is a
  derived value (a property, or a class constant) written under that name; ``...`` stands for every field not
  named elsewhere in the tuple, in declaration order. An entry ``(attr, key(...))`` gives a derived value the
  metadata a field takes (another key, omitted while None, flattened, conditional). Without ``RECORD`` a class
  writes ``(...,)``: its fields.

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


def key(name: str | None = None, *, omit: str | None = None, flatten: bool = False, skip: bool = False,
        mapping: bool | str = False, when: str | None = None) -> MappingProxyType[str, Any]:
    """A field's metadata for ``record``: its key (``name``, default the field's name), when it is left out
    (``omit``: None never, ``"none"`` while None, ``"empty"`` while falsy, ``"default"`` while it equals the field's
    default), whether its record's keys are written
    in its place (``flatten``), whether it is never written (``skip``), whether its tuple is written as an object
    (``mapping``: True for (key, value) pairs, an attribute's name for dataclasses keyed by it) and the attribute
    that must be truthy for it to be written (``when``)."""
    if omit not in _OMITS:
        raise ValueError(f"omit={omit!r}: accepted None, 'none', 'empty', 'default'")
    if not (isinstance(mapping, bool) or (isinstance(mapping, str) and mapping.isidentifier())):
        raise ValueError(f"mapping={mapping!r}: accepted True, False or an attribute's name")
    if when is not None and not when.isidentifier():
        raise ValueError(f"when={when!r}: accepted an attribute's name")
    return MappingProxyType({_META: (name, omit, flatten, skip, mapping, when)})


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
        for k, attr, omit, flatten, kind, when in plan:
            pad = "    "
            if when is not None:
                lines.append(f"    if v.{when}:")
                pad = "        "
            lines.append(f"{pad}x = v.{attr}")
            if omit is not None:
                if omit == "default":
                    scope[f"DEFAULT_{attr}"] = defaults[attr]
                test = {"none": "x is not None", "empty": "x", "default": f"x != DEFAULT_{attr}"}[omit]
                lines.append(f"{pad}if {test}:")
                pad += "    "
            value = {"scalar": "x", "tuple": "list(x)", "pairs": "pairs(x)"}.get(kind, "x if type(x) in SCALARS else "
                                                                                     "jsonable(x)")
            if kind.startswith("by:"):
                value = f"keyed(x, {kind[3:]!r})"
            flat = "out.update(jsonable(x) if type(x) is dict else record(x))"
            lines.append(f"{pad}{flat}" if flatten else f"{pad}out[{k!r}] = {value}")
        lines.append("    return out")
        scope.update({"SCALARS": _SCALARS, "jsonable": jsonable, "record": record, "pairs": _pairs, "keyed": _keyed})
        exec("\n".join(lines), scope)  # noqa: S102 (source built above from the class's own field names)
        own = scope["build"]
    _BUILDERS[cls] = own
    return own


def _plan(cls: type) -> tuple[tuple[str, str, str | None, bool, str, str | None], ...]:
    """The entries of ``cls``'s record (key, attribute, omit, flatten, kind, when), in order (module docstring);
    kind is ``scalar`` or ``tuple`` where the field's annotation says its value needs no conversion or is a tuple
    of scalars (a list is written), ``pairs`` or ``by:ATTR`` where its metadata asks for an object (``mapping``),
    else ``any``."""
    if not is_dataclass(cls):
        raise TypeError(f"record() takes a dataclass instance, not {cls.__name__}")
    fs = {f.name: f for f in fields(cls)}
    order = [(n, None) if n is ... or isinstance(n, str) else n for n in getattr(cls, "RECORD", (...,))]
    for n, meta in order:
        if meta is not None and not (isinstance(meta, MappingProxyType) and _META in meta):
            raise TypeError(f"{cls.__name__}.RECORD entry ({n!r}, {meta!r}): a pair is (attribute, key(...))")
    named = {n for n, _ in order if n is not ...}
    plan: list[tuple[str, str, str | None, bool, str, str | None]] = []
    for n, meta in order:
        for name in ([f for f in fs if f not in named] if n is ... else [n]):
            f = fs.get(name)
            _check_attr(cls, name, f)
            k, omit, flatten, skip, mapping, when = (meta if meta is not None else f.metadata if f is not None
                                                     else {}).get(_META, (None, None, False, False, False, None))
            if when is not None:
                _check_attr(cls, when, fs.get(when))
            if not skip:
                kind = ("pairs" if mapping is True else f"by:{mapping}" if mapping
                        else _kind(f.type) if f is not None else "any")
                plan.append((k or name, name, omit, flatten, kind, when))
    return tuple(plan)


def _check_attr(cls: type, name: str, f: Any) -> None:
    """Refuse a RECORD entry (or a ``when``) that names neither a field nor an attribute of ``cls``."""
    if f is None and (not isinstance(name, str) or not name.isidentifier() or not hasattr(cls, name)):
        raise TypeError(f"{cls.__name__}.RECORD names {name!r}: neither a field nor an attribute")


def _pairs(x: Any) -> dict[Any, Any] | None:
    """A field's (key, value) pairs as one object (``key(mapping=True)``); None as None."""
    if x is None:
        return None
    return {k: v if type(v) in _SCALARS else jsonable(v) for k, v in x}


def _keyed(x: Any, attr: str) -> dict[Any, Any] | None:
    """A field's dataclasses as one object, each under its ``attr``, its record less the key ``attr`` as the value
    (``key(mapping="attr")``); None as None."""
    if x is None:
        return None
    out = {}
    for item in x:
        rec = record(item)
        rec.pop(attr, None)
        out[getattr(item, attr)] = rec
    return out


def _kind(annotation: Any) -> str:
    """``scalar``, ``tuple`` or ``any`` for a field's annotation (``_plan``): a string under ``from __future__
    import annotations``, a type otherwise."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    text = text.replace("typing.", "").replace(" ", "")
    parts = set(text.split("|"))
    if parts <= _SCALAR_TYPES:
        return "scalar"
    return "tuple" if text.replace(",...", ", ...") in _SCALAR_TUPLES else "any"
