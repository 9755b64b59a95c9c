"""Engine presets as data: one TOML per engine beside this module (vllm.toml, sglang.toml, trtllm.toml,
trtllm-bench.toml), each a table of versions whose values carry their source. ``parse_preset("vllm@0.11")`` gives
one version of one engine; ``parse_presets("nvidia=trtllm,amd=vllm")`` one per vendor (fit). The rules that turn
a preset, a device and a run into scheduler sizes live in opmap.engines.rules."""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opmap.errors import OpmapError

ENGINES = ("vllm", "sglang", "trtllm", "trtllm-bench")
SCHEDULERS = ("vllm", "noevict")  # preemption by recompute; TensorRT-LLM's GUARANTEED_NO_EVICT admission
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class EnginePreset:
    """One version of one engine's defaults: ``values`` is the version's table as the TOML holds it (each sourced
    value a {value, source} table, each rule's constants a table with its ``source``)."""

    engine: str
    display: str
    version: str
    release: str
    scheduler: str  # "vllm" (preemption by recompute) | "noevict" (GUARANTEED_NO_EVICT)
    memory_of: str  # what the memory fraction is of: ServingMemory.fraction_of
    values: dict[str, Any] = field(repr=False, compare=False)

    @property
    def spec(self) -> str:
        return f"{self.engine}@{self.version}"

    def value(self, key: str) -> Any:
        """A sourced scalar's value (``[versions."V".key] value = ...``)."""
        return self.values[key]["value"]

    def source(self, key: str) -> str:
        return self.values[key]["source"]

    def table(self, key: str) -> dict[str, Any]:
        """A rule's constants (with their ``source``)."""
        return self.values[key]

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "name": self.display, "version": self.version, "release": self.release}


@functools.cache
def _load(engine: str) -> dict[str, Any]:
    with open(HERE / f"{engine}.toml", "rb") as f:
        data = tomllib.load(f)
    if data.get("engine") != engine or data.get("default_version") not in data.get("versions", {}):
        raise OpmapError(f"opmap/engines/{engine}.toml: engine or default_version does not match its versions")
    return data


def accepted() -> str:
    return ", ".join(f"{e} (versions {', '.join(versions(e))})" for e in ENGINES)


def versions(engine: str) -> tuple[str, ...]:
    return tuple(_load(engine)["versions"])


def parse_preset(spec: str) -> EnginePreset:
    """``NAME`` or ``NAME@VERSION`` (NAME one of ENGINES) as that version's preset (the TOML's default version
    without one); a bad name or version in one line."""
    s = str(spec).strip()
    name, _, version = s.partition("@")
    name = name.strip().lower()
    if name not in ENGINES:
        raise OpmapError(f"unknown engine preset {spec!r}: accepted: {accepted()}; NAME or NAME@VERSION")
    data = _load(name)
    version = version.strip() or data["default_version"]
    if version not in data["versions"]:
        raise OpmapError(f"engine preset {name} has no version {version!r}: known {', '.join(data['versions'])} "
                         f"(the versions whose defaults were read from the engine's source)")
    v = data["versions"][version]
    if v.get("scheduler") not in SCHEDULERS:
        raise OpmapError(f"opmap/engines/{name}.toml version {version}: scheduler must be one of {SCHEDULERS}")
    return EnginePreset(name, data["display"], version, v["release"], v["scheduler"], v["memory_of"], v)


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
