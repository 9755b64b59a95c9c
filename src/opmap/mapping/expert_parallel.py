"""Expert parallelism for inference: the default expert load imbalance (``expert_parallel.toml``, typed and
sourced like the catalog) and the words a result states about it.

An EP rank holds E / ep experts; with top-k routing the mean rank computes tokens x k / ep routed tokens a MoE
layer, the busiest ``ep_imbalance`` times that (its expert GEMMs' token-proportional work, and its share of the
dispatch, scale by it; the weights it reads do not). opmap.mapping.device_time applies it, opmap.mapping.
layout_collectives prices the dispatch and combine all-to-all.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from opmap.errors import OpmapError

if TYPE_CHECKING:
    from opmap.mapping.shard_types import Parallelism

FILE = Path(__file__).with_name("expert_parallel.toml")


@dataclass(frozen=True)
class Sourced:
    """A value with its kind (measured, datasheet, assumed) and source."""

    value: float
    kind: str
    source: str


@lru_cache(maxsize=1)
def default_imbalance() -> Sourced:
    """The default ``--ep-imbalance`` (the busiest EP rank's routed tokens over the mean) and its source."""
    try:
        d = tomllib.loads(FILE.read_text())["default"]["ep_imbalance"]
        v = float(d["value"])
    except (OSError, KeyError, TypeError, ValueError, tomllib.TOMLDecodeError) as e:
        raise OpmapError(f"{FILE}: no readable [default] ep_imbalance ({e})") from None
    if not 1.0 <= v:
        raise OpmapError(f"{FILE}: ep_imbalance {v} is below 1 (the busiest rank over the mean)")
    return Sourced(v, str(d.get("kind", "assumed")), str(d.get("source", "")))


def imbalance_for(ep: int, given: float | None) -> float:
    """The imbalance a layout of ``ep`` ranks runs at: ``given``, else the default; 1 without expert parallelism."""
    if ep <= 1:
        return 1.0
    return default_imbalance().value if given is None else given


def ep_note(p: Parallelism) -> str:
    """The words of a layout's expert parallelism: where the experts sit, what the dispatch costs, the imbalance."""
    d = default_imbalance()
    where = (f"E / {p.ep} experts a device, each over tp / ep = {p.tp // p.ep}; every rank holds the step's tokens "
             "(attention tensor-parallel), so the dispatch is local and the combine is the TP all-reduce after the "
             "MoE (vLLM --enable-expert-parallel at dp 1)" if p.ep_over_tp else
             f"E / {p.ep} experts a device, each over tp {p.tp}; each EP rank its own tokens"
             + (" (DP attention: each rank its own batch and KV cache, as SGLang --enable-dp-attention)"
                if p.dp_attention else "") + "; dispatch and combine an all-to-all each per MoE layer of tokens x "
             "top_k x hidden bytes a rank (x (ep - 1) / ep on the wire, x the imbalance for the busiest)")
    return (f"ep {p.ep}: {where}; expert load imbalance {p.ep_imbalance:g} (the busiest rank's routed tokens over "
            f"the mean; default {d.value:g}: {d.source})")
