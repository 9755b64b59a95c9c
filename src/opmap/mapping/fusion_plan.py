"""A fusion plan file: the user's kernels as JSON ``{"kernels": [[node ids], ...]}``, read without trusting it
(``parse_fusion_plan``, ``read_fusion_plan``), checked against the graph (every id a kernel node, in one kernel at
most; the nodes it leaves out run alone; no cycle between kernels) and put in the order the kernels can run
(``plan_file_groups``, which opmap.mapping.fusion.plan_fusion prices as it prices a policy's groups).
"""

from __future__ import annotations

import json
from pathlib import Path

from opmap.errors import OpmapError
from opmap.graph import OpGraph
from opmap.safeio import LIMIT_JSON_BYTES, read_bounded
from opmap.validate import count, shown

PLAN_ACCEPTED = 'expected JSON {"kernels": [[node ids], ...]}, node ids integers >= 0'


def parse_fusion_plan(text: str | bytes, origin: str = "<plan>") -> list[list[int]]:
    """The kernels of a fusion plan file's text, as lists of node ids, unchecked against any graph (no file
    read). OpmapError on anything but JSON ``{"kernels": [[id, ...], ...]}`` with integer ids >= 0: a bool
    (``true`` is not node 1), a string (``"1"``), a fraction (1.9) or an overflow (1e400 reads as inf) is
    refused, naming the kernel and the position."""
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise OpmapError(f"cannot read fusion plan {origin}: {PLAN_ACCEPTED} ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:80]})") from None
    kernels = raw.get("kernels") if isinstance(raw, dict) else None
    if not isinstance(kernels, list):
        raise OpmapError(f"fusion plan {origin}: no \"kernels\" list at the top level: {PLAN_ACCEPTED}")
    groups = []
    for i, g in enumerate(kernels):
        if not isinstance(g, list):
            raise OpmapError(f"fusion plan {origin}: kernels[{i}] must be a list of node ids (got {shown(g)})")
        groups.append([count(x, f"fusion plan {origin}: kernels[{i}][{j}] (a node id)", lo=0)
                       for j, x in enumerate(g)])
    return groups


def read_fusion_plan(path: Path) -> list[list[int]]:
    """The kernels of the plan file at ``path`` (``parse_fusion_plan``), unchecked against any graph. The path is
    the user's (their own link is followed); what it names must be a regular file of at most LIMIT_JSON_BYTES
    (opmap.safeio): a link to /dev/zero, a FIFO or a folder is one line, never a hang or a MemoryError."""
    return parse_fusion_plan(read_bounded(path, LIMIT_JSON_BYTES, "fusion plan", follow_links=True), str(path))


def plan_file_groups(plan_file: Path, graph: OpGraph, is_kernel: list[bool],
                     producers: list[list[int]]) -> tuple[list[list[int]], dict[int, int]]:
    """(kernels, node -> kernel) of the user's plan file: checked for cycles, the kernels in execution order."""
    groups = _read_plan(plan_file, graph, is_kernel)
    group_of = {nid: g for g, members in enumerate(groups) for nid in members}
    _check_plan(groups, group_of, producers)
    groups = _execution_order(groups, group_of, producers)
    return groups, {nid: g for g, members in enumerate(groups) for nid in members}


def _read_plan(path: Path, graph: OpGraph, is_kernel) -> list[list[int]]:
    groups = read_fusion_plan(path)
    seen: set[int] = set()
    for g in groups:
        for nid in g:
            if not 0 <= nid < len(graph.nodes):
                raise OpmapError(f"fusion plan {path}: node {nid} does not exist (the graph has "
                                 f"{len(graph.nodes)} nodes)")
            if not is_kernel[nid]:
                raise OpmapError(f"fusion plan {path}: node {nid} ({graph.nodes[nid].op}) is a view or allocation, "
                                 "not a kernel")
            if nid in seen:
                raise OpmapError(f"fusion plan {path}: node {nid} is in two kernels")
            seen.add(nid)
    missing = [i for i, k in enumerate(is_kernel) if k and i not in seen]
    groups += [[i] for i in missing]  # nodes the plan leaves out run alone
    return sorted((sorted(g) for g in groups if g), key=lambda g: g[0])


def _execution_order(groups: list[list[int]], group_of: dict[int, int], producers: list[list[int]]) -> list[list[int]]:
    """The kernels in the order they can run: a fused kernel launches once every kernel it reads from is done,
    so it follows all of them even where one of its own nodes comes first in the graph (Kahn's algorithm; among
    the ready kernels, the one whose first node comes first)."""
    import heapq

    deps = [{group_of[p] for m in members for p in producers[m] if group_of.get(p, g) != g}
            for g, members in enumerate(groups)]
    users: list[list[int]] = [[] for _ in groups]
    for g, ds in enumerate(deps):
        for d in ds:
            users[d].append(g)
    waiting = [len(ds) for ds in deps]
    ready = [(groups[g][0], g) for g in range(len(groups)) if not waiting[g]]
    heapq.heapify(ready)
    order = []
    while ready:
        _, g = heapq.heappop(ready)
        order.append(groups[g])
        for u in users[g]:
            waiting[u] -= 1
            if not waiting[u]:
                heapq.heappush(ready, (groups[u][0], u))
    return order  # _check_plan has refused cycles, so every kernel is placed


def _check_plan(groups: list[list[int]], group_of: dict[int, int], producers: list[list[int]]) -> None:
    """A kernel may not need an output of a kernel that needs one of its own (a cycle)."""
    deps = {g: {group_of[p] for m in members for p in producers[m] if group_of.get(p, g) != g}
            for g, members in enumerate(groups)}
    state: dict[int, int] = {}

    def visit(g: int, path: list[int]) -> None:
        if state.get(g) == 2:
            return
        if state.get(g) == 1:
            cyc = " -> ".join(str(groups[x][0]) for x in path[path.index(g):] + [g])
            raise OpmapError(f"fusion plan is illegal: kernels (named by first node) form a cycle {cyc}")
        state[g] = 1
        for d in deps[g]:
            visit(d, path + [g])
        state[g] = 2

    for g in range(len(groups)):
        visit(g, [])
