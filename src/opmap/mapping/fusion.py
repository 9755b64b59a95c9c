"""The fusion plan: which nodes run as one kernel.

Policies (recorded in the assumptions):

- ``eager``: each non-view aten op is a kernel, as PyTorch eager runs it (SDPA is one fused kernel already).
- ``compiler``: what an optimising compiler (Inductor, XLA) fuses, legal-only:
  * pointwise chains: a pointwise op joins the kernel of its producer when that kernel is pointwise, a
    reduction's epilogue, or a GEMM / conv epilogue (bias, activation, residual add);
  * reductions with their pointwise neighbours: a norm / softmax / reduction takes a pointwise-only
    producer kernel as its prologue, and pointwise consumers as its epilogue;
  * never across a consumer that needs the whole tensor first: a reduction does not join a GEMM kernel
    (its row is not complete until the GEMM's K loop ends), and nothing joins a kernel as a prologue of a
    GEMM; the exception is attention written out by hand (batched Q @ K^T, pointwise scale / mask,
    softmax, batched @ V): it becomes one fused-attention kernel, softmax computed online as flash
    attention does, so the S x S scores never reach memory; SDPA is one such kernel already;
  * a node joins a kernel only when every other input it reads was produced before that kernel started
    (no cycles, no waiting inside a kernel), and a kernel holds at most MAX_KERNEL_NODES nodes;
  * fusion never raises peak memory: it only removes intermediate writes (an intermediate that other
    kernels still read is written as before).
- ``engine``: what ``compiler`` fuses plus what serving engines (TensorRT-LLM, vLLM, SGLang) ship as single
  kernels, each still legal-only under the rules above:
  * sibling GEMMs merged: matrix products that read the same activation (Q, K and V projections; an MLP's gate
    and up projections; the experts of an MoE layer reading one token block) run as one GEMM over their
    concatenated weights, as engines load them (vLLM QKVParallelLinear / MergedColumnParallelLinear,
    TensorRT-LLM's fused QKV and gated-MLP GEMMs);
  * dtype casts, concatenations and cache writes are elementwise: a norm's fp32 up-cast and bf16 down-cast
    join the norm's kernel (one fused RMSNorm / LayerNorm kernel), RoPE's rotate-half ``cat`` and the KV-cache
    ``copy_`` join the QKV GEMM's epilogue (TensorRT-LLM applies RoPE and writes the KV cache inside its
    attention kernel instead: the same launches);
  * so a gated activation (SiLU x up) is the merged gate/up GEMM's epilogue, and the residual add the epilogue
    of the GEMM before it (o_proj, down_proj), as under ``compiler``; attention is one fused kernel (SDPA:
    flash attention in prefill, paged decode attention in decode);
  * an MoE layer's experts run as one grouped GEMM per projection (TensorRT-LLM's and vLLM's fused MoE, CUTLASS /
    Triton grouped GEMMs): the per-expert GEMMs of one expert weight (``experts.gate_up_proj``, ``experts.N.w1``)
    in one layer are one kernel (``Kernel.grouped``: how many), priced in opmap.mapping.kernels from the group's
    FLOPs and bytes, one launch, where the captured loop runs each expert's GEMM as a kernel of its own.
- ``library``: what training frameworks run (Megatron-Core with Transformer Engine, NeMo; Megatron-LM's fused
  kernels before it): GEMMs from a vendor library run alone (cuBLAS / cuBLASLt, the bias in their epilogue as
  ``addmm`` already has it) and hand-written fused kernels run between them, so ``engine``'s grouping minus every
  GEMM epilogue and prologue:
  * sibling GEMMs merged, as the frameworks define the layer (Megatron-Core's ``linear_qkv`` and ``linear_fc1``
    hold the Q / K / V and the gate / up weights in one matrix each);
  * a (residual add +) norm with its casts one kernel (TE's LayerNorm / RMSNorm, fused with the fp8 cast of its
    output), RoPE one kernel (Megatron-Core's fused RoPE), a (gated) activation one kernel (bias-GELU,
    bias-SwiGLU), dropout with the residual add one kernel (bias-dropout-add), a masked softmax one kernel;
  * nothing joins a kernel that holds a GEMM and a GEMM joins no kernel but its sibling's: the residual add stays
    a kernel of its own, not the projection's epilogue; attention written out by hand stays its GEMMs and a
    fused softmax (fused attention is SDPA's one kernel already); pointwise readers of one GEMM output share a
    kernel (RoPE's two halves); the legality rule is capture order, so a gated activation whose two GEMMs were
    captured apart (HF's ``act(gate(x)) * up(x)``: SiLU runs before ``up``) stays two kernels, SiLU and the
    product, where Megatron-Core's one ``linear_fc1`` output feeds one bias-SwiGLU kernel.
- a plan file (JSON ``{"kernels": [[node ids], ...]}``): the user's groups, checked for the same legality
  (opmap.mapping.fusion_plan).

A kernel's bytes are its nodes' eager bytes (each cost rule's minimum traffic) less what fusion removes:
reads of tensors produced inside the kernel, writes of tensors no node outside it reads (a graph output
is still written), and repeated reads of one outside tensor. Bytes saved and launches saved are against
eager.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from opmap.costs.base import OpCost
from opmap.errors import OpmapError
from opmap.graph import Node, OpGraph
from opmap.mapping.fusion_plan import plan_file_groups
from opmap.ops import KernelClass, MatrixProblem
from opmap.ops import is_pointwise as _op_is_pointwise

POLICIES = ("eager", "compiler", "engine", "library")
# Data-movement ops the engine policy fuses as elementwise work (a cast, a concatenation, a store into a cache).
ENGINE_ELEMENTWISE = frozenset({"aten._to_copy.default", "aten.cat.default", "aten.copy_.default"})
# Larger fused kernels spill registers; Inductor's default cap is similar (max_fusion_size 64 ops, fewer in practice).
MAX_KERNEL_NODES = 16


def kernel_class(node: Node, cost: OpCost) -> KernelClass:
    """matrix (matrix engine), reduction, vector (pointwise), data_movement or collective."""
    if "c10d" in node.op or "all_reduce" in node.op or "all_gather" in node.op:
        return KernelClass.COLLECTIVE
    if cost.matrix_flops > 0:
        return KernelClass.MATRIX
    if cost.vector_kind is not None:  # every vector family is a reduction
        return KernelClass.REDUCTION
    if is_pointwise(node):
        return KernelClass.VECTOR
    return KernelClass.DATA_MOVEMENT if cost.flops == 0 else KernelClass.VECTOR


def is_pointwise(node: Node) -> bool:
    return _op_is_pointwise(node.op)


def expert_gemm_key(node: Node) -> tuple[str, str] | None:
    """The grouped GEMM an expert's weight GEMM belongs to: (the experts module, the expert weight), for stacked
    experts (``mlp.experts`` reading ``mlp.experts.gate_up_proj[i]``) and a ModuleList's (``experts.3.w1`` ->
    (``...experts``, ``w1``)); None for any other node."""
    params = [t.param for t in node.inputs if t.param is not None]
    if not params or not node.module:
        return None
    container, _, weight = params[0].rpartition(".")
    if container.rsplit(".", 1)[-1] == "experts":  # stacked: the parameter is the experts container's projection
        return container, weight
    parts = node.module.split(".")
    for i in range(len(parts) - 1, 0, -1):
        if parts[i].isdigit() and parts[i - 1] == "experts":
            return ".".join(parts[:i]), ".".join(parts[i + 1:])
    return None


@dataclass(frozen=True)
class Kernel:
    id: int
    nodes: tuple[int, ...]  # node ids, in execution order
    kernel_class: KernelClass  # of the anchor
    anchor: int  # the node that defines the kernel (its GEMM, its reduction, else its first node)
    min_bytes: float = 0.0  # what crosses the kernel boundary (each tensor once)
    eager_bytes: float = 0.0  # the same nodes run one kernel each
    grouped: int = 0  # experts' GEMMs run as one grouped GEMM (engine policy): how many; 0: not grouped

    @property
    def launches_saved(self) -> int:
        return len(self.nodes) - 1


@dataclass(frozen=True)
class FusionPlan:
    policy: str
    kernels: tuple[Kernel, ...]
    group_of: dict[int, int]  # node id -> kernel id (kernel nodes only)

    @property
    def eager_kernels(self) -> int:
        return sum(len(k.nodes) for k in self.kernels)

    @property
    def bytes_saved(self) -> float:
        return sum(k.eager_bytes - k.min_bytes for k in self.kernels)

    @property
    def launches_saved(self) -> int:
        return sum(k.launches_saved for k in self.kernels)

    def to_dict(self) -> dict:
        return {"policy": self.policy, "kernels": len(self.kernels), "eager_kernels": self.eager_kernels,
                "bytes_saved": self.bytes_saved, "launches_saved": self.launches_saved,
                "max_kernel_nodes": MAX_KERNEL_NODES}


def _real_producers(graph: OpGraph, is_kernel: Sequence[bool], direct: list[tuple[int, ...]]) -> list[list[int]]:
    """Per node, the kernel nodes whose outputs it reads, looking through views (``direct``: each node's producers,
    ``Node.producers``)."""
    memo: dict[int, list[int]] = {}

    def through(pid: int) -> list[int]:
        if pid in memo:
            return memo[pid]
        if is_kernel[pid]:
            memo[pid] = [pid]
        else:
            memo[pid] = sorted({q for p in direct[pid] for q in through(p)})
        return memo[pid]

    # a node reading kernels only: its producers as they are (sorted, each once)
    return [list(ps) if all(is_kernel[p] for p in ps) else sorted({q for p in ps for q in through(p)})
            for ps in direct]


def _real_consumers(graph: OpGraph, is_kernel: Sequence[bool], producers: list[tuple[int, ...]]) -> list[list[int]]:
    """Per node, the kernel nodes that read its outputs, looking through views (``producers``: each node's,
    ``Node.producers``; the direct consumers are ``OpGraph.consumers``, read off them)."""
    direct: list[list[int]] = [[] for _ in graph.nodes]
    for nid, ps in enumerate(producers):
        for p in ps:
            direct[p].append(nid)
    memo: dict[int, list[int]] = {}

    def through(cid: int) -> list[int]:
        if cid in memo:
            return memo[cid]
        memo[cid] = [cid] if is_kernel[cid] else sorted({q for c in direct[cid] for q in through(c)})
        return memo[cid]

    # consumers appended in node order, each once: a node read by kernels only keeps its list as it is
    return [list(cs) if all(is_kernel[c] for c in cs) else sorted({q for c in cs for q in through(c)})
            for cs in direct]


def _saved_bytes(graph: OpGraph, members: set[int], consumers: list[list[int]], is_kernel,
                 param_bytes: dict[str, float] | None = None) -> float:
    """Traffic the eager kernels of ``members`` move that one fused kernel does not: reads of tensors made
    inside it, writes of tensors nobody outside reads, and repeated reads of the same outside tensor. A parameter
    read in slices (stacked experts: ``gate_up_proj[i]``, one slice per expert's GEMM) is read once in whole: only
    what its reads add past the parameter's size (``param_bytes``, from the graph's parameter sizes) is saved."""
    if len(members) == 1:
        return 0.0
    saved = 0.0
    outside_reads: dict[tuple, float] = {}
    for nid in members:
        n = graph.nodes[nid]
        for t in n.inputs:
            p = t.producer
            if p is not None and (p in members if is_kernel[p] else _root(graph, p, is_kernel) & members):
                saved += t.storage_bytes
            else:
                key = ("param", t.param) if t.param else ("t", t.producer, t.shape, t.dtype, t.stride)
                before = outside_reads.get(key)
                if before is not None:
                    whole = (param_bytes or {}).get(t.param, 0.0) * t.itemsize if t.param else 0.0
                    read = before + t.storage_bytes
                    saved += max(0.0, read - max(whole, before)) if whole > before else t.storage_bytes
                    outside_reads[key] = read
                    continue
                outside_reads[key] = t.storage_bytes
        if consumers[nid] and all(c in members for c in consumers[nid]):
            saved += sum(t.nbytes for t in n.outputs)
    return saved


def _root(graph: OpGraph, nid: int, is_kernel) -> set[int]:
    """The kernel nodes behind ``nid`` (itself, or through a view chain)."""
    if is_kernel[nid]:
        return {nid}
    out: set[int] = set()
    for p in graph.nodes[nid].producers:
        out |= _root(graph, p, is_kernel)
    return out


def plan_fusion(graph: OpGraph, costs: Sequence[OpCost], policy: str = "eager",
                plan_file: Path | None = None) -> FusionPlan:
    """Group the graph's kernel nodes into kernels under ``policy`` (or the groups of ``plan_file``)."""
    if policy not in POLICIES and plan_file is None:
        raise OpmapError(f"unknown fusion policy {policy!r}; accepted: {', '.join(POLICIES)}, or a plan file")
    is_kernel = [c.kernel for c in costs]
    classes = [kernel_class(n, c) if c.kernel else "none" for n, c in zip(graph.nodes, costs)]
    if policy == "eager" and plan_file is None:  # a kernel per node: no edges to read
        return _eager_plan(costs, classes, is_kernel)
    direct = [n.producers for n in graph.nodes]
    producers = _real_producers(graph, is_kernel, direct)
    consumers = _real_consumers(graph, is_kernel, direct)
    if plan_file is not None:
        groups, group_of = plan_file_groups(plan_file, graph, is_kernel, producers)
        grouped_ids: set[int] = set()
        policy = f"plan file {plan_file}"
    else:
        groups, group_of, grouped_ids = _policy_groups(graph, costs, policy, classes, is_kernel, producers, consumers)
    return FusionPlan(policy, _kernels(graph, costs, groups, grouped_ids, classes, consumers, is_kernel), group_of)


def _policy_groups(graph: OpGraph, costs: Sequence[OpCost], policy: str, classes: list[str], is_kernel: list[bool],
                   producers: list[list[int]], consumers: list[list[int]],
                   ) -> tuple[list[list[int]], dict[int, int], set[int]]:
    """(kernels, node -> kernel, the kernels that are grouped GEMMs) under ``policy`` (compiler, engine or library;
    the module docstring): each kernel node, in execution order, joins the kernel its rules allow, else starts one."""
    kinds = [c.vector_kind for c in costs]
    problems = [c.problem for c in costs]
    first_inside_of = {n.id: _first_inside(graph, n.id, is_kernel) for n in graph.nodes
                       if is_kernel[n.id] and classes[n.id] == "matrix"}
    groups: list[list[int]] = []
    group_of: dict[int, int] = {}
    engine = policy in ("engine", "library")
    gemm_alone = policy == "library"
    # the classes fusion decides by: under engine, casts / concatenations / cache writes count as elementwise
    fuse_classes = [("vector" if engine and c == "data_movement" and n.op in ENGINE_ELEMENTWISE else c)
                    for n, c in zip(graph.nodes, classes)]
    sibling_of: dict[tuple, int] = {}  # engine: a GEMM's activation input -> the kernel of the first GEMM reading it
    grouped_of: dict[tuple[str, str], int] = {}  # engine: an expert weight -> its grouped GEMM's kernel
    prologue = _reduction_prologues(graph, fuse_classes, kinds, consumers) if engine else set()
    for n in graph.nodes:
        if not is_kernel[n.id]:
            continue
        matrix = classes[n.id] == "matrix"
        gkey = expert_gemm_key(n) if engine and not gemm_alone and matrix else None
        if gkey is not None:  # one grouped GEMM per expert weight and layer (module docstring)
            _place(n.id, _grouped_target(gkey, grouped_of, len(groups)), groups, group_of)
            continue
        target = (None if gemm_alone and matrix else
                  _fuse_target(n.id, fuse_classes, producers, groups, group_of, kinds, problems, first_inside_of,
                               n.id in prologue or gemm_alone))
        key = _gemm_input_key(graph, n.id, is_kernel) if engine and matrix and not _is_batched_gemm(problems[n.id]) \
            else None
        if target is None and gemm_alone and fuse_classes[n.id] == "vector":
            target = _consumer_sibling_target(n.id, producers, consumers, groups, group_of, fuse_classes)
        if target is None and key is not None and key in sibling_of:
            target = _sibling_target(n.id, sibling_of[key], producers, groups, group_of)
        if key is not None:
            sibling_of.setdefault(key, target if target is not None else len(groups))
        _place(n.id, target, groups, group_of)
    return groups, group_of, set(grouped_of.values())


def _first_inside(graph: OpGraph, nid: int, is_kernel: list[bool]):
    """Whether the node's first tensor operand was made inside a given set of nodes (through views): a test of a
    set of node ids."""
    n = graph.nodes[nid]
    src = n.inputs[0].producer if n.inputs else None
    roots = _root(graph, src, is_kernel) if src is not None else set()
    return lambda members: bool(roots) and roots <= members


def _grouped_target(gkey: tuple[str, str], grouped_of: dict[tuple[str, str], int], new: int) -> int | None:
    """Engine: the kernel of the grouped GEMM an expert's weight GEMM (``gkey``: expert_gemm_key) joins; None for the
    first GEMM of its group, which starts kernel ``new``, recorded as the group's."""
    if gkey in grouped_of:
        return grouped_of[gkey]
    grouped_of[gkey] = new
    return None


def _place(nid: int, target: int | None, groups: list[list[int]], group_of: dict[int, int]) -> None:
    """Node ``nid`` into kernel ``target``, or into a kernel of its own (``target`` None)."""
    if target is None:
        group_of[nid] = len(groups)
        groups.append([nid])
    else:
        group_of[nid] = target
        groups[target].append(nid)


def _kernels(graph: OpGraph, costs: Sequence[OpCost], groups: list[list[int]], grouped_ids: set[int],
             classes: list[str], consumers: list[list[int]], is_kernel: list[bool]) -> tuple[Kernel, ...]:
    """The groups as kernels: each anchored on its GEMM (else its reduction, else its first node), its bytes its
    nodes' eager bytes less what fusion saves (``_saved_bytes``); a grouped GEMM's count of experts."""
    kernels = []
    param_numel = dict(graph.param_sizes or ())
    for g, members in enumerate(groups):
        anchor = next((m for m in members if classes[m] == "matrix"), None)
        if anchor is None:
            anchor = next((m for m in members if classes[m] == "reduction"), members[0])
        eager = sum(costs[m].bytes for m in members)
        saved = min(eager, _saved_bytes(graph, set(members), consumers, is_kernel, param_numel))
        experts = sum(1 for m in members if classes[m] == "matrix") if g in grouped_ids else 0
        kernels.append(Kernel(g, tuple(members), classes[anchor], anchor, eager - saved, eager, experts))
    return tuple(kernels)


def _eager_plan(costs: Sequence[OpCost], classes: list[str], is_kernel: list[bool]) -> FusionPlan:
    """The eager plan: each kernel node a kernel of its own, its bytes its cost's (the grouping loop of
    ``plan_fusion`` with no target, without the producer and consumer lists it would not read)."""
    kernels = []
    group_of: dict[int, int] = {}
    for nid, c in enumerate(costs):
        if is_kernel[nid]:
            group_of[nid] = g = len(kernels)
            eager = c.bytes
            kernels.append(Kernel(g, (nid,), classes[nid], nid, eager - min(eager, 0.0), eager))
    return FusionPlan("eager", tuple(kernels), group_of)


def _reduction_prologues(graph: OpGraph, classes: list[str], kinds: list, consumers: list[list[int]]) -> set[int]:
    """Engine: the elementwise nodes that lead into a norm-like reduction and feed no GEMM: a norm's up-cast and
    square, back to and including the residual add that joins two activations (the walk stops there: the
    activation before it stays its GEMM's epilogue). They stay with the reduction, one fused (add +) norm kernel
    as engines ship it (vLLM fused_add_rms_norm), instead of joining the GEMM before them as an epilogue.
    Softmax is left out: hand-written attention keeps its scale and mask in the scores kernel (flash
    attention)."""
    out: set[int] = set()
    through: set[int] = set()  # nodes the walk continues back through: norm reductions and single-input links
    for nid in range(len(classes) - 1, -1, -1):  # node ids are in execution order: consumers come later
        cs = consumers[nid]
        if classes[nid] == "reduction" and kinds[nid] != "softmax":
            through.add(nid)
            continue
        if classes[nid] != "vector" or not cs or any(classes[c] == "matrix" for c in cs):
            continue
        if any(c in through for c in cs):
            out.add(nid)
            if sum(1 for t in graph.nodes[nid].inputs if t.param is None) < 2:
                through.add(nid)
    return out


def _gemm_input_key(graph: OpGraph, nid: int, is_kernel) -> tuple | None:
    """What identifies a GEMM's activation operand (its first input that is not a parameter): the kernel nodes
    behind it and its shape, or, for a graph input, its shape, dtype and strides (the graph keeps no other
    identity for an input, as ``_saved_bytes`` reads it); None when every operand is a parameter."""
    for t in graph.nodes[nid].inputs:
        if t.param is not None:
            continue
        if t.producer is None:
            return ("input", tuple(t.shape), t.dtype, tuple(t.stride))
        roots = _root(graph, t.producer, is_kernel)
        return (frozenset(roots), tuple(t.shape)) if roots else ("input", tuple(t.shape), t.dtype, tuple(t.stride))
    return None


def _sibling_target(nid: int, g: int, producers: list[list[int]], groups: list[list[int]],
                    group_of: dict[int, int]) -> int | None:
    """Engine: the kernel ``g`` of a GEMM reading the same activation, when ``nid`` may join it (room left, and
    every input it reads made by a kernel that ended before ``g`` started)."""
    members = groups[g]
    if len(members) >= MAX_KERNEL_NODES:
        return None
    start = min(members)
    if all(p in group_of and max(groups[group_of[p]]) < start for p in producers[nid]):
        return g
    return None


def _consumer_sibling_target(nid: int, producers: list[list[int]], consumers: list[list[int]],
                             groups: list[list[int]], group_of: dict[int, int], classes: list[str]) -> int | None:
    """Library: a pointwise node reading a GEMM's output joins the GEMM-free kernel of an earlier reader of the same
    tensor (RoPE's ``x cos`` and its rotate-half chain, one fused RoPE kernel) when every input it reads was made by a
    kernel that ended before that kernel started."""
    for p in producers[nid]:
        if classes[p] != "matrix":
            continue
        for c in consumers[p]:
            if c >= nid or c not in group_of:
                continue
            g = group_of[c]
            members = groups[g]
            if len(members) >= MAX_KERNEL_NODES or any(classes[m] == "matrix" for m in members):
                continue
            start = min(members)
            if all(q in group_of and max(groups[group_of[q]]) < start for q in producers[nid]):
                return g
    return None


def _is_batched_gemm(problem: MatrixProblem | None) -> bool:
    return problem is not None and problem.batched_gemm


def _scores_kernel(members: list[int], classes: list[str], kinds: list[str], problems: list) -> bool:
    """A kernel holding one batched GEMM (Q @ K^T) and only pointwise work after it (scale, mask)."""
    mats = [m for m in members if classes[m] == "matrix"]
    return (len(mats) == 1 and _is_batched_gemm(problems[mats[0]])
            and all(classes[m] in ("matrix", "vector") for m in members)
            and "softmax" not in {kinds[m] for m in members})


def _fuse_target(nid: int, classes: list[str], producers: list[list[int]], groups: list[list[int]],
                 group_of: dict[int, int], kinds: list[str], problems: list, first_input_inside,
                 prologue: bool = False) -> int | None:
    """The kernel ``nid`` may legally join under the compiler policy, or None. ``prologue``: the node feeds a
    reduction only (engine), so it joins no GEMM's kernel."""
    cls = classes[nid]
    if cls not in ("vector", "reduction", "matrix"):
        return None
    candidates = sorted({group_of[p] for p in producers[nid] if p in group_of}, reverse=True)
    for g in candidates:
        members = groups[g]
        if len(members) >= MAX_KERNEL_NODES:
            continue
        gclasses = {classes[m] for m in members}
        if prologue and "matrix" in gclasses:
            continue
        if cls == "vector":
            ok = True  # epilogue of a GEMM, a reduction or a pointwise chain
        elif cls == "reduction":
            # a reduction takes a pointwise-only kernel as its prologue (not a GEMM: its rows are incomplete
            # until the K loop ends), except softmax over the scores of a batched GEMM: an attention kernel
            # computes it online, block by block, as flash attention does
            ok = gclasses == {"vector"} or (
                kinds[nid] == "softmax" and _scores_kernel(members, classes, kinds, problems))
        else:  # a batched GEMM on the softmax of a scores kernel closes it: P @ V of a fused attention
            ok = (_is_batched_gemm(problems[nid]) and "softmax" in {kinds[m] for m in members}
                  and sum(classes[m] == "matrix" for m in members) == 1
                  and nid in first_input_inside and first_input_inside[nid](set(members)))
        if not ok:
            continue
        # every other input must come from a kernel that started before this one (or from inside it)
        start = min(members)
        if all(group_of.get(p) == g or (p in group_of and max(groups[group_of[p]]) < start)
               for p in producers[nid]):
            return g
    return None
