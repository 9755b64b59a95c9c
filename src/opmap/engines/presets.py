"""Engine presets as data: one TOML per engine beside this module (vllm.toml, sglang.toml, trtllm.toml,
trtllm-bench.toml), each a table of versions whose values carry their source, read once into typed values (an
``EngineFile`` of ``EnginePreset``s: sourced defaults and each rule's table, opmap.engines.tables).
``parse_preset("vllm@0.11")`` gives one version of one engine; ``parse_presets("nvidia=trtllm,amd=vllm")`` one per
vendor (fit). The rules that turn a preset, a device and a run into scheduler sizes live in opmap.engines.rules."""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from opmap.engines.tables import RULES, Sourced, read_table
from opmap.errors import OpmapError
from opmap.record import key

ENGINES = ("vllm", "sglang", "trtllm", "trtllm-bench")
SCHEDULERS = ("vllm", "noevict")  # preemption by recompute; TensorRT-LLM's GUARANTEED_NO_EVICT admission
HERE = Path(__file__).resolve().parent
VERSION_KEYS = ("release", "scheduler", "memory_of")  # a version's own scalars; its tables are defaults and rules
T = TypeVar("T")


@dataclass(frozen=True)
class EnginePreset:
    """One version of one engine's defaults, as its TOML holds them: ``values`` the sourced defaults by name, each
    a ``Sourced``; ``rules`` each sizing rule's constants, a typed table (opmap.engines.tables) with its source.
    Its record (serve.json's ``engine_preset`` head, fit's cells) names the version: engine, name, version,
    release."""

    RECORD: ClassVar[tuple[str, ...]] = ("engine", "display", "version", "release")
    engine: str
    display: str = field(metadata=key("name"))
    version: str
    release: str
    scheduler: str  # "vllm" (preemption by recompute) | "noevict" (GUARANTEED_NO_EVICT)
    memory_of: str  # what the memory fraction is of: ServingMemory.fraction_of
    values: Mapping[str, Sourced] = field(repr=False, compare=False)
    rules: tuple[Any, ...] = field(default=(), repr=False, compare=False)

    @property
    def spec(self) -> str:
        return f"{self.engine}@{self.version}"

    def value(self, name: str) -> Any:
        """A sourced default's value (``[versions."V".name] value = ...``)."""
        return self.values[name].value

    def source(self, name: str) -> str:
        return self.values[name].source

    def rule(self, cls: type[T]) -> T:
        """The constants of one sizing rule: the version's table of type ``cls`` (opmap.engines.tables)."""
        for r in self.rules:
            if type(r) is cls:
                return r
        raise OpmapError(f"engine preset {self.spec} has no [{getattr(cls, 'TABLE', cls.__name__)}] table")


@dataclass(frozen=True)
class EngineFile:
    """One engine's TOML, read and checked: its name, display name, default version and every version's preset."""

    engine: str
    display: str
    default_version: str
    versions: Mapping[str, EnginePreset]


@functools.cache
def _load(engine: str) -> EngineFile:
    with open(HERE / f"{engine}.toml", "rb") as f:
        data = tomllib.load(f)
    if data.get("engine") != engine or data.get("default_version") not in data.get("versions", {}):
        raise OpmapError(f"opmap/engines/{engine}.toml: engine or default_version does not match its versions")
    versions = {v: _version(engine, data["display"], v, t) for v, t in data["versions"].items()}
    return EngineFile(engine, data["display"], data["default_version"], versions)


def _version(engine: str, display: str, version: str, t: dict[str, Any]) -> EnginePreset:
    """One ``[versions."V"]`` table as its preset: the version's scalars, its rule tables typed, every other table
    a sourced default."""
    where = f"opmap/engines/{engine}.toml version {version}"
    if t.get("scheduler") not in SCHEDULERS:
        raise OpmapError(f"{where}: scheduler must be one of {SCHEDULERS}")
    rules = {cls.TABLE: cls for cls in RULES[engine]}  # type: ignore[attr-defined]
    missing = [name for name in rules if name not in t]
    if missing or any(k not in t for k in VERSION_KEYS):
        raise OpmapError(f"{where}: lacks {', '.join(missing or [k for k in VERSION_KEYS if k not in t])}")
    values = {k: read_table(Sourced, k, v, where) for k, v in t.items() if k not in rules and k not in VERSION_KEYS}
    return EnginePreset(engine, display, version, t["release"], t["scheduler"], t["memory_of"],
                        values, tuple(read_table(cls, n, t[n], where) for n, cls in rules.items()))


def accepted() -> str:
    return ", ".join(f"{e} (versions {', '.join(versions(e))})" for e in ENGINES)


def versions(engine: str) -> tuple[str, ...]:
    return tuple(_load(engine).versions)


def parse_preset(spec: str) -> EnginePreset:
    """``NAME`` or ``NAME@VERSION`` (NAME one of ENGINES) as that version's preset (the TOML's default version
    without one); a bad name or version in one line."""
    s = str(spec).strip()
    name, _, version = s.partition("@")
    name = name.strip().lower()
    if name not in ENGINES:
        raise OpmapError(f"unknown engine preset {spec!r}: accepted: {accepted()}; NAME or NAME@VERSION")
    data = _load(name)
    version = version.strip() or data.default_version
    if version not in data.versions:
        raise OpmapError(f"engine preset {name} has no version {version!r}: known {', '.join(data.versions)} "
                         f"(the versions whose defaults were read from the engine's source)")
    return data.versions[version]


def parse_presets(spec: str) -> dict[str, EnginePreset]:
    """fit's ``--engine-preset``: one preset for every device (``vllm``), or one per vendor
    (``nvidia=trtllm,amd=vllm``, vendors case-insensitive): vendor (lower case, or "*" for all) -> preset."""
    parts = [p.strip() for p in str(spec).split(",") if p.strip()]
    if not parts:
        raise OpmapError(f"--engine-preset {spec!r} is empty: give NAME[@VERSION] or VENDOR=NAME[,VENDOR=NAME]")
    if len(parts) == 1 and "=" not in parts[0]:
        return {"*": parse_preset(parts[0])}
    out: dict[str, EnginePreset] = {}
    for p in parts:
        vendor, eq, name = p.partition("=")
        vendor = vendor.strip().lower()
        if not eq or not vendor or not name.strip():
            raise OpmapError(f"--engine-preset {spec!r}: each part is VENDOR=NAME[@VERSION] (nvidia=trtllm,amd=vllm), "
                             f"got {p!r}")
        if vendor in out:
            raise OpmapError(f"--engine-preset {spec!r} names vendor {vendor!r} twice")
        out[vendor] = parse_preset(name)
    return out


def for_vendor(presets: dict[str, EnginePreset] | None, vendor: str) -> EnginePreset | None:
    """The preset of a device's vendor among ``parse_presets``'s (the "*" one for all); None without one."""
    if not presets:
        return None
    return presets.get(str(vendor).lower(), presets.get("*"))
