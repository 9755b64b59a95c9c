"""``opmap analyze --tuned``: predictions under the mappings ``opmap tune`` measured best on this device.

For each node whose signature has a cached choice (cache.py: this device's fingerprint, these library
versions), the node's roofline terms (matrix, vector, memory) are scaled by the cost model's own ratio for
that signature, predicted time of the chosen mapping over the default's (both from rank.predict_candidate:
the chosen thread count, dtype, format, backend or chunking as the model prices it); the kernels are mapped
again from the new node predictions. A node without a cached choice keeps its prediction.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from opmap.errors import OpmapError
from opmap.explore.tune import cache
from opmap.explore.tune.result import SignatureResult
from opmap.explore.tune.signatures import node_signature
from opmap.roofline import roofline


def tuned_choices(graph, cache_dir: Path | None = None) -> dict[str, SignatureResult]:
    """Signature key -> the cached entry, for the signatures of ``graph`` tuned on this device."""
    import torch

    from opmap.calibrate.fingerprint import fingerprint

    fp = fingerprint(torch.device("cpu"))
    d = cache_dir or cache.cache_dir()
    out: dict[str, SignatureResult] = {}
    for n in graph.nodes:
        s = node_signature(n)
        if s is None or s.key in out:
            continue
        e = cache.read_entry(d, cache.entry_key(fp, s.key))
        if e is not None:
            out[s.key] = e
    return out


def tuned_analysis(a, cache_dir: Path | None = None):
    """``a`` (an Analysis on ``--hardware local``) with tuned nodes re-predicted (see the module docstring)."""
    from opmap.mapping.kernels import map_kernels

    if a.hardware.name != "local":
        raise OpmapError("--tuned reads the choices `opmap tune` measured on this CPU: use it with --hardware local")
    choices = tuned_choices(a.graph, cache_dir)
    if not choices:
        raise OpmapError(f"no tuned choices cached for {a.workload} on this device: run `opmap tune {a.workload}` "
                         "first with the same --batch, --seq / --image-size and --dtype")
    results, tuned = [], 0
    for r in a.results:
        s = node_signature(r.node)
        e = choices.get(s.key) if s is not None else None
        if e is None or not e.predicted_default_s:
            results.append(r)
            continue
        f = e.predicted_chosen_s / e.predicted_default_s
        p = r.pred
        results.append(replace(r, pred=roofline(p.matrix_s * f, p.vector_s * f, p.memory_s * f, p.overhead_s)))
        tuned += 1
    costs = [r.cost for r in results]
    kernels = tuple(map_kernels(a.plan, a.graph.nodes, costs, [r.pred for r in results], a.hardware,
                                a.precision, a.hardware.curves)) if a.plan is not None else a.kernel_results
    labels = sorted({e.chosen.label for e in choices.values()})
    note = (f"tuned: {tuned} nodes over {len(choices)} signatures predicted under the mappings opmap tune measured "
            f"best on this device ({', '.join(labels)})")
    return replace(a, results=tuple(results), kernel_results=kernels, assumptions=replace(a.assumptions, tuned=note))
