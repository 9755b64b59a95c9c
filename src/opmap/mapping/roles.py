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
- a GEMM whose output is normalized over (most of) its width before anything else reads it is a **low-rank down
  projection**, run whole on every rank (**replicated**): a norm cannot run on a slice of the vector it
  normalizes. MLA's q_a_proj and kv_a_proj_with_mqa (DeepSeek-V2, arXiv 2405.04434 sec. 2.1) are held so by vLLM
  and SGLang (ReplicatedLinear), and the up projections after them (q_b_proj, kv_b_proj) are the column GEMMs.
  A norm over one head's slice (Qwen3's q_norm / k_norm over head_dim) leaves the split alone;
- a batched weight GEMM (bmm) reading a split tensor stays in the region: its batch is the heads (MLA's absorbed
  W_UK and W_UV, one matrix a head), split with them;
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

from opmap.geometry import forward_calls, layer_specs
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
    expert_blocks: tuple[str, ...] = ()  # the captured blocks with routed experts (a MoE layer each)

    def counts(self, block: str, role: str) -> int:
        return sum(1 for i, r in self.role.items() if r == role and self.block[i] == block)


@dataclass
class _Walk:
    """The forward walk's findings: roles, the tensor-parallel region, the first attention call in it, and per
    block the row GEMMs' parents, the column GEMMs' inputs, the experts' routed inputs and parameters."""

    role: dict[int, str] = field(default_factory=dict)
    split: set[int] = field(default_factory=set)
    attention: int | None = None  # node id of the first fused attention call in the region
    row_parents: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    col_inputs: dict[str, set[int | None]] = field(default_factory=lambda: defaultdict(set))
    routed_keys: dict[str, set] = field(default_factory=lambda: defaultdict(set))
    stacked: dict[int, str] = field(default_factory=dict)  # _stacked_experts' names
    n_stacked: int = 0  # the experts a stacked-experts parameter holds
    first_read: dict[str, int | None] = field(default_factory=dict)  # expert -> its first GEMM's input producer
    expert_params: dict[str, float] = field(default_factory=dict)
    origin: dict[int, int] = field(default_factory=dict)  # a split node -> the column GEMM its split came from
    lowrank: set[int] = field(default_factory=set)  # low-rank down projections (module docstring): replicated


def _block_order(nodes, block: dict[int, str | None]) -> list[str]:
    order: list[str] = []
    for n in nodes:
        b = block[n.id]
        if b is not None and b not in order:
            order.append(b)
    return order


def _stacked_experts(graph: OpGraph, fwd) -> tuple[dict[int, str], int]:
    """The GEMMs of stacked-experts modules (transformers 5's experts: one 3-D ``gate_up_proj`` / ``down_proj``
    parameter a layer, each expert's GEMM reading its slice ``[i]``): node id -> the expert's name (the module path
    and the slice's index, counted in the order the GEMMs read the parameter), and the experts a parameter stacks
    (its elements over one slice's); ({}, 0) for ModuleList experts."""
    sizes = dict(graph.param_sizes or ())
    seen: dict[str, int] = defaultdict(int)
    names: dict[int, str] = {}
    stacked = 0
    for n in fwd:
        if n.packet not in GEMM_OPS:
            continue
        w = next((t for t in n.inputs if t.param is not None), None)
        full = sizes.get(w.param, 0) if w is not None else 0
        # the experts container is the parameter's module (Llama 4's loop records the GEMM at its feed_forward)
        container = w.param.rsplit(".", 1)[0] if w is not None else ""
        if (w is None or container.rsplit(".", 1)[-1] != "experts" or full <= w.numel or not w.numel):
            continue
        names[n.id] = f"{container}.{seen[w.param]}"
        seen[w.param] += 1
        stacked = max(stacked, full // w.numel)
    return names, stacked


def _experts(fwd, block: dict[int, str | None], stacked: dict[int, str]) -> dict[str, set[str]]:
    """Experts per block: ModuleList children inside the block that hold weight GEMMs, or the slices of a
    stacked-experts module (``_stacked_experts``)."""
    experts: dict[str, set[str]] = defaultdict(set)
    for n in fwd:
        b = block[n.id]
        if b is not None and is_weight_gemm(n):
            e = stacked.get(n.id) or _expert_of(n.module, b)
            if e is not None:
                experts[b].add(e)
    return experts


def _weight_gemm_role(w: _Walk, nodes, n: Node, b: str | None, head: int | None, experts) -> None:
    """A weight GEMM's role (module docstring); its output joins the region unless it ends it."""
    if b is None or n.id in w.lowrank:
        w.role[n.id] = "vocab" if n.id == head else "replicated"
        if n.id == head:
            w.split.add(n.id)
        return
    x = _activation_input(n)
    x_split = x is not None and x.producer in w.split
    expert = w.stacked.get(n.id) or _expert_of(n.module, b)
    if expert is not None:
        w.role[n.id] = "expert_row" if x_split else "expert_column"
        for t in n.inputs:
            if t.param is not None:
                w.expert_params[t.param] = t.numel
        # what is routed to the expert: its first GEMM's input (the tokens' hidden states), whatever the walk
        # took that input to be (MLA's absorbed attention can leave the residual stream marked split)
        if x is not None and (expert not in w.first_read or w.first_read[expert] == x.producer):
            w.first_read.setdefault(expert, x.producer)
            w.routed_keys[b].add((expert, x.producer, x.nbytes))
        if x_split:
            return  # an expert's row-parallel output is whole
    elif experts.get(b) and n.outputs and n.outputs[0].shape[-1] in (len(experts[b]), w.n_stacked):
        # the router: one logit per expert (a decode step may run fewer experts than the stack holds)
        w.role[n.id] = "router"
        return
    elif x_split and n.packet == "bmm":
        w.role[n.id] = "column"  # a GEMM a head over split heads (module docstring): no collective
    elif x_split:
        w.role[n.id] = "row"
        w.row_parents[b].add(n.module.rsplit(".", 1)[0])
        return  # its output is whole (after the all-reduce)
    else:
        w.role[n.id] = "column"
        w.col_inputs[b].add(_source(nodes, x.producer) if x is not None else None)
        w.origin[n.id] = n.id
    w.split.add(n.id)


_NORMS = frozenset({"mean", "var", "var_mean", "native_layer_norm", "layer_norm", "rms_norm", "_fused_rms_norm"})


def _normalized_extent(n: Node) -> int:
    """The elements a norm-like reduction ``n`` reduces over its input's last dimension (0: not one)."""
    if n.packet not in _NORMS or not n.inputs or not n.inputs[0].shape:
        return 0
    shape = n.inputs[0].shape
    if n.packet in ("native_layer_norm", "layer_norm", "rms_norm", "_fused_rms_norm"):
        norm = n.args.get("normalized_shape") or [shape[-1]]
        return shape[-1] if list(norm)[-1:] == [shape[-1]] else 0
    dims = n.args.get("dim")
    dims = [dims] if isinstance(dims, int) else list(dims or [])
    return shape[-1] if any(d in (-1, len(shape) - 1) for d in dims) else 0


def _spread(w: _Walk, nodes, n: Node) -> None:
    """``n`` reads the split region: it joins it, carrying the column GEMM its split came from, and marks that
    GEMM a low-rank down projection where ``n`` normalizes over more than half its output's width."""
    w.role[n.id] = "split"
    w.split.add(n.id)
    src = next((w.origin[t.producer] for t in n.inputs if t.producer in w.origin), None)
    if src is None or n.packet in GEMM_OPS:
        return  # a product of split tensors (eager attention's scores) starts nothing a norm can undo
    w.origin[n.id] = src
    extent = _normalized_extent(n)
    if extent and 2 * extent > nodes[src].outputs[0].shape[-1]:
        w.lowrank.add(src)


def _forward_roles(nodes, fwd, block, order, experts, fused: set[int],
                   stacked: dict[int, str] | None = None, n_stacked: int = 0) -> _Walk:
    """The forward walk; walked again with the low-rank down projections it found held whole (a projection is
    known low-rank only once its norm is reached), until none is new."""
    # what each node is, read once for every walk: 1 an embedding, 2 a weight GEMM, 0 anything else
    kinds = [1 if n.packet == "embedding" else 2 if is_weight_gemm(n) else 0 for n in fwd]
    gemms_out = [n for n, kind in zip(fwd, kinds) if kind == 2 and block[n.id] is None]
    head = gemms_out[-1].id if gemms_out and order and gemms_out[-1].id > max(
        n.id for n in fwd if block[n.id] == order[-1]) else None
    lowrank: set[int] = set()
    while True:
        w = _Walk(stacked=stacked or {}, n_stacked=n_stacked, lowrank=set(lowrank))
        for n, kind in zip(fwd, kinds):
            if kind == 1:
                w.role[n.id] = "vocab"
            elif kind == 2:
                _weight_gemm_role(w, nodes, n, block[n.id], head, experts)
            elif any(t.producer in w.split for t in n.inputs):
                _spread(w, nodes, n)
                if n.id in fused and w.attention is None:
                    w.attention = n.id
            else:
                w.role[n.id] = "replicated"
        if w.lowrank <= lowrank:
            return w
        lowrank |= w.lowrank


def _other_roles(nodes, fwd, role: dict[int, str]) -> None:
    """Backward and optimizer nodes: the role of the forward nodes of their module."""
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


def _held_experts(graph: OpGraph, experts, b0: str | None, w: _Walk) -> int:
    """The experts the model holds, not only those a (decode) step ran: every parameter under the expert
    containers the graph saw, read off the model's parameter list where the capture kept it (updates
    ``w.expert_params``)."""
    n_experts = len(experts.get(b0, ())) if b0 else 0
    containers = {e.rsplit(".", 1)[0] + "." for es in experts.values() for e in es if e.rsplit(".", 1)[-1].isdigit()}
    if containers and graph.param_sizes:
        held = {name: n for name, n in graph.param_sizes if any(name.startswith(c) for c in containers)}
        if held:
            w.expert_params = held
            c0 = next((c for c in containers if b0 and c.startswith(b0 + ".")), None)
            if c0 is not None:
                n_experts = max(n_experts, len({name[len(c0):].split(".", 1)[0] for name in held if
                                                name.startswith(c0)}))
    return n_experts


# the graphs last inferred and their roles, by identity: one graph's analysis and sharding each ask (a pure function
# of an immutable graph)
_INFERRED: list[tuple[OpGraph, Roles]] = []
_INFERRED_KEPT = 4


def infer_roles(graph: OpGraph) -> Roles:
    """Roles of every node from graph edges and module structure (module docstring); the heads from the first
    attention call in the tensor-parallel region, as the layer is (opmap.geometry.layer_specs). Kept for the last
    few graphs (by identity), so a graph's precision rules and its sharder infer them once."""
    for g, r in _INFERRED:
        if g is graph:
            return r
    r = _infer_roles(graph)
    _INFERRED.append((graph, r))
    del _INFERRED[:-_INFERRED_KEPT]
    return r


def _infer_roles(graph: OpGraph) -> Roles:
    nodes = graph.nodes
    of_module: dict[str, str | None] = {}  # a module's block, read once per module path
    block = {}
    for n in nodes:
        b = of_module.get(n.module, False)
        if b is False:
            b = of_module[n.module] = block_of(n.module)
        block[n.id] = b
    order = _block_order(nodes, block)
    fwd = [n for n in nodes if phase_of(n) == "forward"]
    stacked, n_stacked = _stacked_experts(graph, fwd)
    experts = _experts(fwd, block, stacked)
    calls = forward_calls(graph)
    specs = {c.node_id: s for c, s in zip(calls, layer_specs(graph, calls)) if c.fused}
    w = _forward_roles(nodes, fwd, block, order, experts, set(specs), stacked, n_stacked)
    # an MoE block's experts end in one combine, and their inputs' gradients in one reduction
    for b, e in experts.items():
        if e:
            w.row_parents[b].add("<experts>")
            w.col_inputs[b].add(-1)
    _other_roles(nodes, fwd, w.role)
    spec = specs.get(w.attention) if w.attention is not None else None
    heads, kv, hd = (spec.n_heads, spec.n_kv_heads, spec.head_dim) if spec is not None else (0, 0, 0)
    hidden = 0
    act = 0.0
    if order:
        # the residual stream's width: the embedding's, where there is one (MLA's absorbed W_UV is a row GEMM
        # whose output is heads x v_head_dim wide, not the hidden size)
        emb = next((n for n in fwd if n.packet == "embedding" and n.outputs), None)
        want = emb.outputs[0].shape[-1] if emb is not None else None
        first_row = next((n for n in fwd if w.role.get(n.id) == "row" and n.outputs
                          and (want is None or n.outputs[0].shape[-1] == want)), None)
        first_row = first_row or next((n for n in fwd if w.role.get(n.id) == "row"), None)
        if first_row is not None and first_row.outputs:
            hidden = first_row.outputs[0].shape[-1]
            act = first_row.outputs[0].nbytes
    b0 = order[0] if order else None
    # the first MoE block (DeepSeek-V3's first_k_dense_replace blocks are dense)
    eb0 = b0 if not b0 or experts.get(b0) else next((b for b in order if experts.get(b)), b0)
    n_experts = max(_held_experts(graph, experts, eb0, w), n_stacked)
    geo = Geometry(len(order), heads, kv, hd, hidden, n_experts, act)
    # the routed bytes of a MoE block: the first block's, or, where the first blocks are dense (DeepSeek-V3's
    # first_k_dense_replace), the largest block's
    routed = {b: float(sum(k[2] for k in keys)) for b, keys in w.routed_keys.items()}
    first = routed.get(b0, 0.0) if b0 else 0.0
    return Roles(w.role, block, tuple(order), geo,
                 len(w.row_parents.get(b0, ())) if b0 else 0, len(w.col_inputs.get(b0, ())) if b0 else 0,
                 first or max(routed.values(), default=0.0),
                 float(sum(w.expert_params.values())), kv * hd if kv < heads else 0,
                 expert_blocks=tuple(b for b in order if routed.get(b)))
