"""Roles of a captured graph's nodes under tensor, expert and sequence parallelism (Megatron-LM's splits), read
off the graph: which node is a column- or row-parallel GEMM, a vocabulary-parallel one, an expert's, the router,
split by the tensor-parallel region or replicated; the repeated blocks and the geometry the layout checks need
(layers, heads, KV heads, hidden, experts). opmap.mapping.sharding prices layouts from them.

Roles come from graph edges and module structure, never from the model's name:

- repeated blocks: the module path's first numeric part (``h.3``, ``layers.17``): a ModuleList child;
- a weight GEMM (a GEMM reading a parameter) inside a block whose activation input is *not* in the block's
  tensor-parallel region is **column-parallel** (q / k / v or fused qkv, MLP up / gate / fc: they read the
  norm's output); one whose input *is* in that region is **row-parallel** (attention out, MLP down / fc2: their
  output goes to the residual add). The region starts at column-parallel outputs and spreads along edges to
  every op that reads a split tensor (reshapes, RoPE, SDPA, the activation function) until a row GEMM;
- GEMMs of a ModuleList inside a block (``mlp.experts.3``) are **expert** GEMMs, split over EP (and each expert
  over TP, Megatron-core's expert tensor parallelism = tp); the block's other GEMM whose width is the expert
  count is the **router** (replicated);
- embedding gathers and the last weight GEMM outside the blocks (the head) are **vocabulary-parallel**;
- everything else (norms, residual adds) is **replicated** over TP, or split over the sequence with SP
  (Korthikanti et al. 2022, sec. 4.2.2).

Backward nodes take the role of the forward nodes of their module (autograd keeps the module path).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from opmap.graph import Node, OpGraph
from opmap.ops import GEMM_OPS

ROLES = ("column", "row", "vocab", "expert_column", "expert_row", "router", "split", "replicated", "optimizer")
SPLIT_ROLES = frozenset({"column", "row", "vocab", "expert_column", "expert_row", "split"})

_NUM = re.compile(r"^\d+$")


def block_of(module: str) -> str | None:
    """The repeated block a module path sits in: the path up to its first numeric part (a ModuleList child)."""
    parts = module.split(".")
    for i, p in enumerate(parts):
        if _NUM.match(p):
            return ".".join(parts[: i + 1])
    return None


def _expert_of(module: str, block: str) -> str | None:
    """The expert (a ModuleList child inside the block) a module path sits in, if any."""
    rest = module[len(block) + 1:].split(".") if module.startswith(block + ".") else []
    for i, p in enumerate(rest):
        if _NUM.match(p):
            return block + "." + ".".join(rest[: i + 1])
    return None


def is_weight_gemm(n: Node) -> bool:
    return n.packet in GEMM_OPS and any(t.param is not None for t in n.inputs)


def _activation_input(n: Node):
    ins = [t for t in n.inputs if t.param is None and len(t.shape) >= 2]
    return ins[0] if ins else None


def _source(nodes, producer: int | None) -> int | None:
    """The first non-view node behind a tensor (q / k / v each reshape the norm's output through a view)."""
    while producer is not None and nodes[producer].is_view and nodes[producer].inputs:
        producer = nodes[producer].inputs[0].producer
    return producer


def phase_of(n: Node) -> str:
    """forward, backward or optimizer: the part of a training step the node ran in (forward for inference)."""
    return n.args.get("phase") or "forward"


@dataclass(frozen=True)
class Geometry:
    """What the layout checks need, read off the graph."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    experts: int
    act_bytes: float  # bytes of one residual-stream activation (b s h at its dtype), 0 without blocks


@dataclass(frozen=True)
class Roles:
    """Per node: its role (``ROLES``), its block (None: outside the repeated blocks) and the block order."""

    role: dict[int, str]
    block: dict[int, str | None]
    blocks: tuple[str, ...]
    geometry: Geometry
    # per block, the forward TP groups: row-parallel groups (one all-reduce each) and column groups (one input
    # gradient all-reduce each in backward); expert routed bytes (the all-to-all message)
    row_groups: int = 0
    column_groups: int = 0
    routed_bytes: float = 0.0
    expert_params: float = 0.0
    kv_width: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def counts(self, block: str, role: str) -> int:
        return sum(1 for i, r in self.role.items() if r == role and self.block[i] == block)


def infer_roles(graph: OpGraph) -> Roles:
    """Roles of every node from graph edges and module structure (module docstring)."""
    nodes = graph.nodes
    block = {n.id: block_of(n.module) for n in nodes}
    order: list[str] = []
    for n in nodes:
        b = block[n.id]
        if b is not None and b not in order:
            order.append(b)
    role: dict[int, str] = {}
    fwd = [n for n in nodes if phase_of(n) == "forward"]
    split: set[int] = set()
    # experts per block: ModuleList children inside the block that hold weight GEMMs
    experts: dict[str, set[str]] = defaultdict(set)
    for n in fwd:
        b = block[n.id]
        if b is not None and is_weight_gemm(n):
            e = _expert_of(n.module, b)
            if e is not None:
                experts[b].add(e)
    gemms_out = [n for n in fwd if is_weight_gemm(n) and block[n.id] is None]
    head = gemms_out[-1].id if gemms_out and order and gemms_out[-1].id > max(
        n.id for n in fwd if block[n.id] == order[-1]) else None
    sdpa = None
    row_parents: dict[str, set[str]] = defaultdict(set)
    col_inputs: dict[str, set[int | None]] = defaultdict(set)
    routed_keys: dict[str, set] = defaultdict(set)
    expert_params: dict[str, float] = {}
    for n in fwd:
        b = block[n.id]
        if n.packet == "embedding":
            role[n.id] = "vocab"
            continue
        if is_weight_gemm(n):
            if b is None:
                role[n.id] = "vocab" if n.id == head else "replicated"
                if n.id == head:
                    split.add(n.id)
                continue
            x = _activation_input(n)
            x_split = x is not None and x.producer in split
            if _expert_of(n.module, b) is not None:
                role[n.id] = "expert_row" if x_split else "expert_column"
                for t in n.inputs:
                    if t.param is not None:
                        expert_params[t.param] = t.numel
                if not x_split and x is not None:
                    routed_keys[b].add((_expert_of(n.module, b), x.producer, x.nbytes))
                if x_split:
                    continue  # an expert's row-parallel output is whole
            elif experts.get(b) and n.outputs and n.outputs[0].shape[-1] == len(experts[b]):
                role[n.id] = "router"
                continue
            elif x_split:
                role[n.id] = "row"
                row_parents[b].add(n.module.rsplit(".", 1)[0])
                continue  # its output is whole (after the all-reduce)
            else:
                role[n.id] = "column"
                col_inputs[b].add(_source(nodes, x.producer) if x is not None else None)
            split.add(n.id)
            continue
        if any(t.producer in split for t in n.inputs):
            role[n.id] = "split"
            split.add(n.id)
            if n.op == "aten.scaled_dot_product_attention.default" and sdpa is None:
                sdpa = n
        else:
            role[n.id] = "replicated"
    # an MoE block's experts end in one combine: one all-reduce for the block's MoE output
    for b, e in experts.items():
        if e:  # the experts end in one combine, and their inputs' gradients in one reduction
            row_parents[b].add("<experts>")
            col_inputs[b].add(-1)
    # backward and optimizer nodes: the role of the forward nodes of their module
    by_module: dict[str, list[str]] = defaultdict(list)
    for n in fwd:
        by_module[n.module].append(role[n.id])
    for n in nodes:
        if n.id in role:
            continue
        if phase_of(n) == "optimizer":
            role[n.id] = "optimizer"
            continue
        rs = by_module.get(n.module, [])
        gem = [r for r in rs if r in ("column", "row", "vocab", "expert_column", "expert_row", "router")]
        if n.packet in GEMM_OPS and gem:
            role[n.id] = gem[0]
        elif rs:
            s = sum(r in SPLIT_ROLES for r in rs)
            role[n.id] = "split" if s * 2 > len(rs) else "replicated"
        else:
            role[n.id] = "replicated"
    # geometry
    heads = kv = hd = 0
    if sdpa is not None:
        named = dict(zip(sdpa.input_names, sdpa.inputs))
        q, k = named.get("query", sdpa.inputs[0]), named.get("key", sdpa.inputs[1])
        heads, kv, hd = q.shape[-3], k.shape[-3], q.shape[-1]
    hidden = 0
    act = 0.0
    if order:
        first_row = next((n for n in fwd if role.get(n.id) == "row"), None)
        if first_row is not None and first_row.outputs:
            hidden = first_row.outputs[0].shape[-1]
            act = first_row.outputs[0].nbytes
    b0 = order[0] if order else None
    n_experts = len(experts.get(b0, ())) if b0 else 0
    # the experts the model holds, not only those a (decode) step ran: every parameter under the expert
    # containers the graph saw, read off the model's parameter list where the capture kept it
    containers = {e.rsplit(".", 1)[0] + "." for es in experts.values() for e in es if e.rsplit(".", 1)[-1].isdigit()}
    if containers and graph.param_sizes:
        held = {name: n for name, n in graph.param_sizes if any(name.startswith(c) for c in containers)}
        if held:
            expert_params = held
            c0 = next((c for c in containers if b0 and c.startswith(b0 + ".")), None)
            if c0 is not None:
                n_experts = max(n_experts, len({name[len(c0):].split(".", 1)[0] for name in held if
                                                name.startswith(c0)}))
    geo = Geometry(len(order), heads, kv, hd, hidden, n_experts, act)
    return Roles(role, block, tuple(order), geo,
                 len(row_parents.get(b0, ())) if b0 else 0, len(col_inputs.get(b0, ())) if b0 else 0,
                 float(sum(k[2] for k in routed_keys.get(b0, ()))) if b0 else 0.0, float(sum(expert_params.values())),
                 kv * hd if kv < heads else 0)
