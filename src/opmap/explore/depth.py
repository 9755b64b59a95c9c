"""A deep model priced from a shallow capture: capture two of its identical blocks, not eighty.

A layout search prices one graph many times (opmap.mapping.sharding.Sharder), and the capture is what costs: a
70B model's training step is 17,662 operators, and every microbatch size is captured again. A transformer's
blocks are one block repeated, so ``shallow`` keeps the model's first ``keep`` blocks (its largest
``nn.ModuleList`` of one class, opmap.mapping.activations.find_blocks), captures that, and hands the Sharder a
``Depth`` (the real layer count, parameters and parameter bytes) so the last captured block stands for every
layer past the captured ones.

Proven, not assumed, on each model: every block must match every other one in its modules' classes, parameter
and buffer names, shapes and dtypes, and their plain attributes (int, float, str, bool, None), an attribute
that counts the blocks (a layer index, 0..L-1 or 1..L) left out. A model whose blocks differ (alternating
sliding and global attention, dense blocks before MoE ones) is refused, and ``captured_blocks_match`` refuses
a capture whose captured blocks did not price the same; the caller then captures the whole model. What lies
outside the blocks (embedding, final norm, head, loss) is captured as it is.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from opmap.mapping.sharding import Depth

KEEP = 2  # the first block (its input is the embedding's output) and one that stands for the rest
_SIMPLE = (bool, int, float, str, type(None))


def _attributes(block) -> dict[tuple[str, str], Any]:
    """The block's structure: per submodule its class and plain attributes, per tensor its shape and dtype."""
    out: dict[tuple[str, str], Any] = {}
    for name, m in block.named_modules():
        out[(name, "<class>")] = type(m).__qualname__
        for k, v in vars(m).items():
            if not k.startswith("_") and isinstance(v, _SIMPLE):
                out[(name, k)] = v
    for kind, items in (("param", block.named_parameters()), ("buffer", block.named_buffers())):
        for name, t in items:
            out[(name, kind)] = (tuple(t.shape), str(t.dtype))
    return out


def identical_blocks(blocks: list) -> str:
    """Empty when every block has one structure (a block-index attribute left out), else the first difference."""
    attrs = [_attributes(b) for b in blocks]
    keys = set().union(*attrs)
    n = len(blocks)
    for key in sorted(keys, key=str):
        vals = [a.get(key, "<missing>") for a in attrs]
        if all(v == vals[0] for v in vals):
            continue
        if vals == list(range(n)) or vals == list(range(1, n + 1)):
            continue  # a layer index
        i = next(i for i, v in enumerate(vals) if v != vals[0])
        return f"block {i} differs from block 0 at {key[0] or '<block>'}.{key[1]}: {vals[i]!r} vs {vals[0]!r}"
    return ""


def shallow(workload, keep: int = KEEP):
    """(the workload with only its first ``keep`` blocks, the ``Depth`` they stand for), or (None, why not)."""
    import torch

    from opmap.capture.tracer import _param_count
    from opmap.mapping.activations import find_blocks

    module = workload.module
    blocks = find_blocks(module)
    if len(blocks) <= keep:
        return None, f"{len(blocks)} repeated blocks: captured whole"
    path = blocks[0][0]
    if "." not in path:
        return None, "the model is itself the list of blocks: captured whole"
    why = identical_blocks([b for _, b in blocks])
    if why:
        return None, why
    params, pbytes, _ = _param_count(module)
    parent_path, _, _ = path.rpartition(".")
    owner_path, _, attr = parent_path.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    setattr(owner, attr, torch.nn.ModuleList([b for _, b in blocks[:keep]]))
    geometry = workload.geometry.first(keep) if getattr(workload, "geometry", None) is not None else None
    return replace(workload, module=module, geometry=geometry), Depth(len(blocks), params, pbytes)


def captured_blocks_match(sharder, rel: float = 1e-9) -> str:
    """Empty when every captured block prices the same (kernel count, FLOPs and time terms per block), else
    what differed: the check that the shallow capture's blocks are one block."""
    per: dict[int, list[float]] = {}
    for r in sharder.rows:
        if 0 <= r.pos < sharder.L and r.role != "optimizer":
            acc = per.setdefault(r.pos, [0.0] * 6)
            for j, x in enumerate((1.0, r.matrix_s, r.vector_s, r.memory_s, r.overhead_s, r.matrix_flops)):
                acc[j] += x
    if len(per) != sharder.L:
        return f"{len(per)} of {sharder.L} captured blocks hold kernels"
    ref = per[0]
    for b, acc in per.items():
        for x, y in zip(acc, ref):
            if abs(x - y) > rel * max(abs(x), abs(y), 1e-30):
                return f"captured block {b} prices differently from block 0 ({x:.6g} vs {y:.6g})"
    return ""
