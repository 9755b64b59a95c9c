"""The number-format registry: one frozen ``Format`` per format, held as data in ``formats.toml`` (read once).

A format's element bits, block scale (block size, scale format and bits; a per-tensor scale), the torch dtype a
model is built in, its matrix fallback chain, its precision policy and whether it serves as a KV-cache, training
or quality-check format are values of its table; every table opmap used to keep per format (bytes per element,
build dtypes, fallbacks, policies, KV and training formats, narrower steps, rate donors) is a view of the
registry. Adding a format is one table in ``formats.toml``.

``registry()`` is the registry in use; ``parse_formats`` builds one from a TOML document's tables (a test builds
its own from a temp table and installs it with ``use``)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from opmap.errors import OpmapError
from opmap.safeio import LIMIT_TOML_BYTES, read_text_bounded

FORMATS_TOML = Path(__file__).with_name("formats.toml")


@dataclass(frozen=True)
class FormatPolicy:
    """What one requested format means for each op family. The four strings are the assumptions block's."""

    capture: str  # the format the graph is captured in (the model's torch dtype)
    weights: str
    activations: str
    accumulate: str
    weight_bytes: float  # stored bytes per weight element, scales included
    quantized: bool = False  # weights stored narrower than the capture: kernel rows name the formats
    one_byte_operands: bool = False  # GEMM operands reach the matrix engine as 1-byte values (fp8, int8)
    weight_only: bool = False  # B (the weights) stored narrow, dequantized inside the GEMM (int4)

    def to_dict(self) -> dict[str, str]:
        return {"capture": self.capture, "weights": self.weights, "activations": self.activations,
                "accumulate": self.accumulate}


@dataclass(frozen=True)
class Format:
    """One number format (``formats.toml`` documents each field)."""

    name: str
    bits: int
    kind: str = "float"
    encoding: str = ""
    scale_block: int | None = None
    scale_format: str | None = None
    scale_bits: int = 0
    tensor_scale_bits: int = 0
    catalog: bool = True
    build: str | None = None
    runnable: bool = False
    fallback: tuple[str, ...] = ()
    narrower: str | None = None
    rate_donor: int | None = None
    kv: bool = False
    kv_needs_engine: bool = False
    alias: str | None = None
    train: tuple[float, float, float] | None = None
    train_scaled_gemms: bool = False
    quality: bool = False
    weight_only_fallback: bool | str = False  # a string: the kernel that runs the fallback, for the note
    policy: FormatPolicy | None = field(default=None, compare=False)

    @property
    def bytes(self) -> float:
        """Bytes per element, the block scale included (bits / 8 + scale_bits / 8 / scale_block); a whole
        number of bytes stays an int. A per-tensor scale is amortised over the tensor and not counted."""
        elem = self.bits // 8 if self.bits % 8 == 0 else self.bits / 8
        return elem + self.scale_bits / 8 / self.scale_block if self.scale_block else elem

    @property
    def scaled(self) -> bool:
        """Block-scaled: a scale per ``scale_block`` elements is part of the format (MX, NVFP4)."""
        return self.scale_block is not None

    @property
    def requestable(self) -> bool:
        """``--dtype`` accepts it: it has a build dtype, a fallback chain and a policy."""
        return self.build is not None

    @property
    def is_fp8(self) -> bool:
        """An 8-bit float element without a block scale (e4m3 / e5m2 with per-tensor or per-channel scales)."""
        return self.kind == "float" and self.bits == 8 and not self.scaled


_KEYS = {"bits", "kind", "encoding", "scale_block", "scale_format", "scale_bits", "tensor_scale_bits", "catalog",
         "build", "runnable", "fallback", "narrower", "rate_donor", "kv", "kv_needs_engine", "alias", "train",
         "train_scaled_gemms", "quality", "weight_only_fallback", "policy"}
_POLICY_KEYS = {"capture", "weights_format", "weight_group", "weight_group_scale_bits", "weights", "activations",
                "accumulate", "quantized", "one_byte_operands", "weight_only"}


class Registry:
    """The formats by name, in table order, and the views every caller asks for."""

    def __init__(self, formats: list[Format]):
        self.formats: dict[str, Format] = {f.name: f for f in formats}

    def __contains__(self, name: object) -> bool:
        return name in self.formats

    def __iter__(self):
        return iter(self.formats.values())

    def get(self, name: str) -> Format | None:
        return self.formats.get(name)

    def names(self, **want: bool) -> tuple[str, ...]:
        """The names, in table order, of the formats whose properties equal ``want`` (``kv=True``, ...)."""
        return tuple(f.name for f in self if all(bool(getattr(f, k)) == v for k, v in want.items()))

    def aliases(self) -> dict[str, tuple[str, ...]]:
        """Each ``--dtype`` alias and its formats, in table order (the order a device is asked for them)."""
        out: dict[str, tuple[str, ...]] = {}
        for f in self:
            if f.alias:
                out[f.alias] = (*out.get(f.alias, ()), f.name)
        return out

    def rate_donors(self) -> tuple[str, ...]:
        """The formats whose measured fraction of peak stands in for another's, in their rank order."""
        return tuple(f.name for f in sorted((f for f in self if f.rate_donor), key=lambda f: f.rate_donor))


def _policy(name: str, raw: dict[str, Any], bits_of) -> FormatPolicy:
    unknown = set(raw) - _POLICY_KEYS
    if unknown:
        raise OpmapError(f"format {name}: unknown policy keys {', '.join(sorted(unknown))}; accepted: "
                         f"{', '.join(sorted(_POLICY_KEYS))}")
    wf = raw.get("weights_format", raw["capture"])
    stored = float(bits_of(wf)) / 8  # the stored weight format's element, plus a scale per group of weights
    group = raw.get("weight_group")
    weight_bytes = stored + float(raw.get("weight_group_scale_bits", 0)) / 8 / group if group else stored
    return FormatPolicy(raw["capture"], raw["weights"], raw["activations"], raw["accumulate"], weight_bytes,
                        bool(raw.get("quantized", False)), bool(raw.get("one_byte_operands", False)),
                        bool(raw.get("weight_only", False)))


def parse_formats(tables: dict[str, Any], what: str = "formats table") -> Registry:
    """A registry from TOML tables (name -> values); a reference to an unknown format or key is refused."""
    fmts = []
    for name, raw in tables.items():
        if not isinstance(raw, dict) or "bits" not in raw or set(raw) - _KEYS:
            bad = sorted(set(raw) - _KEYS) if isinstance(raw, dict) else ["not a table"]
            raise OpmapError(f"{what}: format {name!r} needs bits and takes only {', '.join(sorted(_KEYS))} "
                             f"(got {', '.join(bad) or 'no bits'})")
        vals = {k: v for k, v in raw.items() if k != "policy"}
        vals["fallback"] = tuple(raw.get("fallback", ()))
        vals["train"] = tuple(raw["train"]) if "train" in raw else None
        fmts.append(Format(name, **vals))
    bits = {f.name: f.bits for f in fmts}

    def bits_of(n: str) -> int:
        if n not in bits:
            raise OpmapError(f"{what}: unknown format {n!r}; known: {', '.join(bits)}")
        return bits[n]

    out = []
    catalog = {f.name for f in fmts if f.catalog}
    for f in fmts:
        for ref in (*f.fallback, *([f.narrower] if f.narrower else [])):
            bits_of(ref)
        pol = tables[f.name].get("policy")
        if f.requestable and (pol is None or not f.fallback):
            raise OpmapError(f"{what}: format {f.name!r} has a build dtype, so needs a fallback chain and a policy")
        if set(f.fallback) - catalog:  # a chain names the matrix peaks a device is asked for
            raise OpmapError(f"{what}: format {f.name!r} falls back to {', '.join(sorted(set(f.fallback) - catalog))}, "
                             "not a catalog format (catalog = false): a chain names catalog peak keys only")
        if f.alias is not None and (f.alias in bits or not f.requestable):
            raise OpmapError(f"{what}: format {f.name!r}: alias {f.alias!r} must be requestable and not a format name")
        out.append(replace(f, policy=_policy(f.name, pol, bits_of)) if pol else f)
    builds = {}
    for f in out:  # an alias is built (captured) before its device is known: one build dtype for all its formats
        if f.alias and builds.setdefault(f.alias, f.build) != f.build:
            raise OpmapError(f"{what}: the formats of alias {f.alias!r} need one build dtype; {f.name} has {f.build}")
    return Registry(out)


def load_formats(path: str | Path = FORMATS_TOML) -> Registry:
    text = read_text_bounded(path, LIMIT_TOML_BYTES, "formats table")
    try:
        return parse_formats(tomllib.loads(text), f"formats table {path}")
    except (tomllib.TOMLDecodeError, TypeError, KeyError) as e:
        raise OpmapError(f"cannot read formats table {path}: {e}") from None


_REGISTRY: list[Registry] = []


def registry() -> Registry:
    """The registry in use: ``formats.toml``, read on first use."""
    if not _REGISTRY:
        _REGISTRY.append(load_formats())
    return _REGISTRY[-1]


def use(reg: Registry | None) -> None:
    """Install ``reg`` as the registry in use (None: back to ``formats.toml``)."""
    _REGISTRY[:] = [] if reg is None else [reg]


def spoken(names: tuple[str, ...] | list[str]) -> str:
    """``a, b, c or d``: a list of format names as a help line or a refusal says it."""
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else "".join(names)


def get_format(name: str) -> Format:
    """The format called ``name``; an unknown name is refused with the known ones."""
    f = registry().get(name)
    if f is None:
        raise OpmapError(f"unknown format {name!r}; accepted: {', '.join(registry().names(catalog=True))}")
    return f
