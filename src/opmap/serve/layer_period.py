"""A decoder's stack of layers as a prefix and a repeating period, so serve prices it from two shallow captures
(opmap.serve.model_cost).

Each layer has a signature: what its step costs depends on, read off the built model. Its parameters' names and
shapes (a MoE layer against a dense one: DeepSeek-V3's ``first_k_dense_replace``, Llama 4's
``interleave_moe_layer_step``, Qwen3-MoE's ``mlp_only_layers``), its modules' settings that transformers reads off
the config when it builds a layer (gpt-oss's ``layer_type`` and ``sliding_window``, Llama 4's ``use_rope`` and
``is_moe_layer``; the layer's own index left out), the config's per-layer entries (``layer_types``,
``no_rope_layers``; a list of layer indices such as ``moe_layers`` as whether the layer is in it) and the layer's
attention in the workload's geometry (its kind, heads, window). Two layers of one signature run the same kernels.

The stack is periodic from layer ``p`` with period ``q`` when layer i >= p has the signature of layer
p + ((i - p) mod q): DeepSeek-R1, three dense then 58 MoE layers, p 3 q 1; gpt-oss, sliding and full layers in
turn, p 0 q 2; Llama 4, a NoPE global layer every fourth, p 0 q 4. With L = p + m q + r (0 <= r < q) layers, the
first ``short`` = p + q + r layers and the first ``long`` = p + 2q + r layers each hold the prefix, one or two
periods and the tail (layers p + kq .. p + kq + r - 1 have the signatures of p .. p + r - 1, as the model's last r
layers do), so any figure that adds up over layers is t(L) = t(short) + (m - 1)(t(long) - t(short)): exact, each
period adding the same kernels and the same boundaries. A homogeneous stack is p 0 q 1: t(L) = t(1) + (L - 1)(t(2)
- t(1)). Of every (p, q) that holds, ``find_period`` keeps the one with the fewest layers to capture (``long``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# a module attribute naming the layer's position, not its kind (transformers' ``layer_idx``)
_INDEX = re.compile(r"(?:^|_)(?:idx|index|id|number)$")


@dataclass(frozen=True)
class Stack:
    """``layers`` layers as a prefix of ``prefix`` layers, then a period of ``period`` layers repeated ``repeats``
    times and a tail of ``tail`` layers (the period's first ``tail``). ``short`` and ``long``: the layer counts of
    the two captures (one and two periods); ``block(i)``: the block of the ``long`` capture that prices layer i."""

    layers: int
    prefix: int
    period: int

    @property
    def repeats(self) -> int:
        return (self.layers - self.prefix) // self.period

    @property
    def tail(self) -> int:
        return (self.layers - self.prefix) % self.period

    @property
    def short(self) -> int:
        return self.prefix + self.period + self.tail

    @property
    def long(self) -> int:
        return self.short + self.period

    def block(self, i: int) -> int:
        """The ``long`` capture's block that prices layer ``i``: the prefix's own, a layer of the period as the
        capture's second period (the homogeneous case's second block), the tail as the capture's tail."""
        p, q = self.prefix, self.period
        if i < p:
            return i
        if i >= self.layers - self.tail:
            return self.long - (self.layers - i)
        return p + q + (i - p) % q

    def blocks(self) -> tuple[int, ...]:
        return tuple(self.block(i) for i in range(self.layers))

    @property
    def text(self) -> str:
        lead = f"{self.prefix} layer{'s' if self.prefix > 1 else ''}, then " if self.prefix else ""
        return (f"{lead}a period of {self.period} layer{'s' if self.period > 1 else ''} x {self.repeats}"
                + (f" and {self.tail} more" if self.tail else ""))


def find_period(signatures: list) -> tuple[int, int]:
    """(p, q) of the stack whose layers have ``signatures``: layer i >= p has the signature of layer
    p + ((i - p) mod q); of every q, p the smallest that holds, and of those the pair with the fewest layers to
    capture (p + 2q + r), the shorter period on a tie. A stack with no repetition gets a pair that needs more layers
    than it has (Stack.long > L: captured whole)."""
    n = len(signatures)
    best: tuple[int, int, int] | None = None
    for q in range(1, max(1, n) + 1):
        last = max((i for i in range(q, n) if signatures[i] != signatures[i - q]), default=-1)
        p = max(0, last - q + 1)
        size = p + 2 * q + (n - p) % q
        if best is None or size < best[0]:
            best = (size, p, q)
    return (best[1], best[2]) if best is not None else (0, 1)


def layer_signatures(config: Any, blocks: list, geometry: Any = None) -> list[tuple]:
    """Per layer of ``blocks`` (the decoder's layers, built), what its cost depends on (module docstring). A
    workload geometry whose attention does not list one layer per block (a hybrid's attention-only list) and is not
    one spec throughout makes every layer its own (no period: captured whole)."""
    n = len(blocks)
    lists = _config_entries(config, n)
    attention = tuple(getattr(geometry, "attention", ()) or ())
    if len(attention) != n:
        attention = (attention[0],) * n if len(set(attention)) == 1 else tuple(range(n)) if attention else ()
    out = []
    for i, b in enumerate(blocks):
        params = tuple((name, tuple(p.shape)) for name, p in b.named_parameters())
        entries = tuple((k, f(i)) for k, f in lists)
        out.append((params, _settings(b), entries, attention[i] if attention else None))
    return out


def describe(signatures: list) -> str:
    """Empty when every layer has one signature; else what differs between them, in words."""
    distinct = set(signatures)  # what differs among the layers differs among their distinct signatures
    if len(distinct) <= 1:
        return ""
    parts = []
    if len({s[0] for s in distinct}) > 1:
        parts.append("layers of different shapes (a MoE with dense layers, or mixed blocks)")
    for idx, what in ((2, "per-layer config entries"), (1, "per-layer settings")):
        entries = [dict(e) for e in {s[idx] for s in distinct}]
        keys = sorted(k for k in {k for e in entries for k in e} if len({e.get(k) for e in entries}) > 1)
        if keys:
            parts.append(f"{what} {', '.join(keys)}")
    if len({s[3] for s in distinct}) > 1:
        parts.append("attention that differs by layer")
    return "; ".join(parts)


def _settings(block) -> tuple:
    """The block's modules' scalar attributes (what transformers read off the config for this layer), by path;
    index-like names left out."""
    out = []
    for path, m in block.named_modules():
        for k, v in vars(m).items():
            if k.startswith("_") or k == "training" or _INDEX.search(k):
                continue
            if v is None or isinstance(v, (bool, int, float, str)):
                out.append((f"{path}.{k}" if path else k, v))
    return tuple(sorted(out, key=lambda kv: kv[0]))


def _config_entries(config: Any, n: int) -> list[tuple[str, Any]]:
    """(name, layer -> entry) of the config's per-layer lists: a list of n entries gives the layer's entry, a list
    of layer indices (strictly increasing integers, its name ending in ``layers``: ``moe_layers``, ``mlp_only_layers``;
    left whole when the stack is cut) whether the layer is in it."""
    out: list[tuple[str, Any]] = []
    for k, v in sorted((vars(config) if config is not None and hasattr(config, "__dict__") else {}).items()):
        if k.startswith("_") or not isinstance(v, (list, tuple)):
            continue
        ints = all(isinstance(x, int) and not isinstance(x, bool) for x in v)
        if k.endswith("layers") and ints and all(x >= 0 for x in v) and all(a < b for a, b in zip(v, v[1:])):
            out.append((k, frozenset(v).__contains__))
        elif len(v) == n:
            out.append((k, lambda i, v=v: _hashable(v[i])))
    return out


def _hashable(x: Any) -> Any:
    if isinstance(x, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return tuple(_hashable(v) for v in x)
    return x
