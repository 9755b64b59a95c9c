"""The typed tables of an engine preset's TOML (opmap/engines/*.toml), read once where the file is loaded
(``read_table``: every field present, no key unknown, lists as tuples): a sourced default (``Sourced``: a value and
where it was read) and each sizing rule's constants with their ``source`` (``BatchDefaults`` ... ``BytesPerElement``;
the rules themselves are opmap.engines.rules). ``RULES`` names the tables each engine's versions carry."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar

from opmap.errors import OpmapError

T = TypeVar("T")


@dataclass(frozen=True)
class Sourced:
    """One default of the engine (``[versions."V".key] value = ..., source = ...``)."""

    value: bool | int | float | str
    source: str


@dataclass(frozen=True)
class BatchDefaults:
    """vLLM's usage-context defaults (EngineArgs.get_batch_defaults): a device of ``large_memory_gib`` or more whose
    name lacks ``excluded_name`` takes the large values; offline runs (the LLM class) the offline ones."""

    TABLE: ClassVar[str] = "batch_defaults"
    large_memory_gib: int
    excluded_name: str
    large_offline_tokens: int
    large_server_tokens: int
    large_offline_seqs: int
    large_server_seqs: int
    small_offline_tokens: int
    small_server_tokens: int
    small_offline_seqs: int
    small_server_seqs: int
    source: str

    def sizes(self, large: bool, offline: bool) -> tuple[int, int]:
        """(max_num_batched_tokens, max_num_seqs) of a large / small device, offline / server."""
        size, ctx = ("large" if large else "small"), ("offline" if offline else "server")
        return int(getattr(self, f"{size}_{ctx}_tokens")), int(getattr(self, f"{size}_{ctx}_seqs"))


@dataclass(frozen=True)
class VllmGraphs:
    """vLLM's default capture sizes: ``first`` + range(8, ``step8_below``, 8) + range(``step16_from``, max + 1, 16),
    max = min(max_num_seqs x ``per_seq``, ``cap``)."""

    TABLE: ClassVar[str] = "cuda_graphs"
    first: tuple[int, ...]
    step8_below: int
    step16_from: int
    cap: int
    per_seq: int
    source: str


@dataclass(frozen=True)
class SglangGraphs:
    """SGLang's capture sizes start at ``first`` (the ranges after it are in the rule)."""

    TABLE: ClassVar[str] = "cuda_graphs"
    first: tuple[int, ...]
    source: str


@dataclass(frozen=True)
class TrtllmGraphs:
    """TensorRT-LLM's capture sizes: range(1, 32) + ``first`` + powers of 2 below ``max_batch_size``."""

    TABLE: ClassVar[str] = "cuda_graphs"
    first: tuple[int, ...]
    max_batch_size: int
    source: str


@dataclass(frozen=True)
class MemoryBuckets:
    """SGLang's device-memory buckets (MiB bounds, ``below_mib``): chunked_prefill_size and cuda_graph_max_bs below
    tp 4 / at tp 4 or more, per bucket; the ``above_`` values past the last bound."""

    TABLE: ClassVar[str] = "memory_buckets"
    below_mib: tuple[int, ...]
    chunked_prefill_size: tuple[int, ...]
    cuda_graph_max_bs_small_tp: tuple[int, ...]
    cuda_graph_max_bs_large_tp: tuple[int, ...]
    above_chunked_prefill_size: int
    above_cuda_graph_max_bs: int
    source: str


@dataclass(frozen=True)
class MemFraction:
    """SGLang's mem_fraction_static: the MiB reserved (base, per chunked token, per graph batch, per rank, a floor
    on large devices)."""

    TABLE: ClassVar[str] = "mem_fraction"
    base_mib: int
    per_chunk_token_mib: float
    min_chunk: int
    per_graph_bs_mib: int
    per_rank_mib: int
    floor_above_mib: int
    floor_mib: int
    source: str


@dataclass(frozen=True)
class MaxRunning:
    """SGLang's max_running_requests: KV tokens x ``per_token``, capped by the request pool."""

    TABLE: ClassVar[str] = "max_running"
    per_token: float
    pool_per_context: int
    pool_min: int
    pool_max: int
    source: str


@dataclass(frozen=True)
class BenchHeuristic:
    """trtllm-bench's engine sizing (tuning.py): the caps, and the rounding steps ((bound, step), ...) of the batch
    size and the token budget."""

    TABLE: ClassVar[str] = "heuristic"
    max_requests: int
    max_tokens: int
    bs_steps: tuple[tuple[int, int], ...]
    bs_step_above: int
    bs_min: int
    token_steps: tuple[tuple[int, int], ...]
    token_step_above: int
    token_min: int
    source: str


@dataclass(frozen=True)
class BytesPerElement:
    """trtllm-bench's bytes per weight element by format (BYTES_PER_ELEM), every key of its table but ``source``."""

    TABLE: ClassVar[str] = "bytes_per_element"
    by_format: Mapping[str, float]
    source: str

    def of(self, fmt: str, default: float = 2.0) -> float:
        """``fmt``'s bytes per element (``default`` for a format not in the table: tuning.py's .get(quant, 2))."""
        return float(self.by_format.get(fmt, default))

    @classmethod
    def from_table(cls, table: Mapping[str, Any], where: str) -> BytesPerElement:
        by = {k: v for k, v in table.items() if k != "source"}
        if "source" not in table or not all(isinstance(v, (int, float)) for v in by.values()):
            raise OpmapError(f"{where}: [{cls.TABLE}] needs a source and a number per format")
        return cls(by, table["source"])


@dataclass(frozen=True)
class BenchUntuned:
    """trtllm-bench's sizing for a checkpoint whose quantization is not among the heuristic's (build.py
    ``get_benchmark_engine_settings``: calc_engine_setting only for ``TUNED_QUANTS``, else BuildConfig's default
    max_batch_size and max_num_tokens): the opmap formats that map to a tuned quant_algo, and the defaults."""

    TABLE: ClassVar[str] = "untuned"
    tuned: tuple[str, ...]  # opmap formats whose TensorRT-LLM quant_algo is in TUNED_QUANTS
    max_batch_size: int
    max_num_tokens: int
    source: str

    def applies(self, fmt: str) -> bool:
        """True where ``fmt`` (an opmap format) is not sized by the heuristic (its quant_algo is not tuned)."""
        return fmt not in self.tuned


# the rule tables each engine's versions carry (every other table of a version is a Sourced default)
RULES: dict[str, tuple[type, ...]] = {
    "vllm": (BatchDefaults, VllmGraphs),
    "sglang": (MemoryBuckets, MemFraction, MaxRunning, SglangGraphs),
    "trtllm": (TrtllmGraphs,),
    "trtllm-bench": (BenchHeuristic, BytesPerElement, BenchUntuned),
}


def read_table(cls: type[T], name: str, table: Any, where: str) -> T:
    """TOML table ``name`` (at ``where``) as a ``cls``: its fields, each present, no other key; lists as tuples."""
    own = getattr(cls, "from_table", None)
    if own is not None:
        return own(table, where)
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(table) - set(names)) if isinstance(table, dict) else ["(not a table)"]
    missing = [n for n in names if n not in table] if isinstance(table, dict) else []
    if unknown or missing:
        raise OpmapError(f"{where}: [{name}] " + "; ".join(
            ([f"unknown keys {', '.join(unknown)}"] if unknown else []) + ([f"lacks {', '.join(missing)}"] if missing
                                                                         else [])) + f"; accepted: {', '.join(names)}")
    return cls(**{n: _frozen(table[n]) for n in names})


def _frozen(v: Any) -> Any:
    return tuple(_frozen(x) for x in v) if isinstance(v, list) else v
