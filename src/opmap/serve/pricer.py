"""The pricer behind opmap.serve.model_cost: prefill and decode points of one resolved model on one device under a
layout and a runtime, each priced by opmap's phase analyses of a short capture and extrapolated in the layer count
(opmap.serve.model_cost's docstring gives the method); the whole model's weight and KV bytes per device. The
analyses of this process are kept by what they depend on, so a layout search prices each point once."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

from opmap.serve.resolve import Resolved

# The analyses of this process, by (capture key, device as priced, dtype, fusion): a layout search prices one model
# on one device under up to ten layouts, and every layout's points are the same analyses (the graph does not
# depend on tp or pp; Pricer._terms shards each under its tp, _point splits the layers over pp). Oldest dropped
# first past ANALYSES_KEPT (a 2-layer analysis of a 70B model holds a few MB).
ANALYSES_KEPT = 96
_ANALYSES: dict[tuple, tuple] = {}


@dataclass(frozen=True)
class Point:
    """One priced step on the replica: ``latency_s`` one microbatch through every stage, ``stage_s`` the
    slowest stage with its send; per device, the weight bytes read (``dense_bytes``, ``expert_bytes``)."""

    latency_s: float
    stage_s: float
    dense_bytes: float = 0.0
    expert_bytes: float = 0.0



# -- pricing points ----------------------------------------------------------------------------------------------

def _bf16_extra(a, where: tuple[int, ...]) -> float:
    """What the whole model holds in bf16 beyond its run's format (opmap.mapping.memory.held_weight_bytes: the
    embedding, the LM head, the checkpoint's unquantized modules), from a capture whose block ``where[i]`` prices
    layer i: a parameter of block j (its path's first index, ``model.layers.j.``) counted once per layer it prices,
    one outside the blocks once."""
    import re

    from opmap.mapping.memory import bf16_extra_bytes

    total = 0.0
    for name, extra in bf16_extra_bytes(a.graph, a.precision.weight_scale, a.kept_gemms).items():
        hit = re.search(r"\.(\d+)\.", "." + name)
        total += extra * (where.count(int(hit.group(1))) if hit else 1)
    return total


class Pricer:
    """Prices prefill and decode points of one resolved model on one device under a layout and runtime."""

    def __init__(self, m: Resolved, hw, dtype: str, tp: int, pp: int, rt, queries: int = 1, ep: int = 1,
                 ep_imbalance: float = 1.0, dp_attention: bool = False):
        self.m, self.hw, self.dtype, self.tp, self.pp, self.rt = m, hw, dtype, tp, pp, rt
        self.queries = queries  # new tokens per sequence in a decode step (a speculative verify: K + 1)
        self.ep, self.ep_imbalance = ep, ep_imbalance  # experts over the tp group (opmap.mapping.device_time)
        # DP attention: tp is each rank's (1), the experts over the ep ranks, each rank its own batch
        self.dpa = dp_attention
        self._expert_held = 0.0  # the whole model's expert weight bytes at their stored format
        # the stack as a prefix and a period (opmap.serve.layer_period), or why it is captured whole
        self.stack, self.why_whole = m.stack()
        self.extrapolate = self.stack is not None
        self.experts = self.top_k = 0
        self.moe_grid: str | None = None  # where the MoE layers were priced off a measured grid (the analyses')
        self.expert_bytes_per_expert = 0.0
        self._held: float | None = None  # weight bytes the whole model holds at its stored format
        self._kv_per_token = 0.0  # KV bytes per token of the whole model, as captured
        self._kv_heads = 0
        self._inflight = 0.0
        self._prefill_seq = 0
        self._last_graph = None
        self._hw_key = repr(hw)  # the device as priced (runtime applied): part of the analyses' memo key
        self.rate_basis = ""  # the matrix rate the points ran at (a power-limited card: its sustained rate)

    # one capture at n layers: (analysis, sharder, per-kernel times under tp)
    def _analyze(self, make, spec, n: int, at: tuple[str, int, int]):
        """Capture (or take from the capture cache) the step ``make`` builds at ``n`` layers and analyse it.
        ``at``: (phase, batch, length) for the cache key."""
        from opmap.api import cached, keep
        from opmap.mapping.sharding import Sharder
        from opmap.phases.step import analyze_phase, capture_phase

        k = self.m.capture_key(n, *at)
        memo = (k, self._hw_key, self.dtype, self.rt.fusion) if k else None
        if memo is not None and memo in _ANALYSES:  # another layout of the same model, device and runtime
            g, a, s = _ANALYSES[memo]
            self._last_graph = g
            return a, s
        hit = cached(k)
        if hit is not None:
            g, w = hit[0], hit[1]
        else:
            self.m.set_layers(n)
            w = make()  # built after the layer count is set (a decode cache holds one (K, V) per layer)
            with warnings.catch_warnings():  # transformers' deprecation notes on its cache API: not the user's
                warnings.simplefilter("ignore", FutureWarning)
                g = capture_phase(w, spec)
            keep(k, g, w)
        self._last_graph = g
        # the workload's geometry cut to the n layers captured (Resolved.set_layers; a cache hit keeps it): each
        # layer's KV heads, causality and window as the config says, where the capture shows a windowed layer's SDPA
        # masked, K and V repeated, not causal
        a = analyze_phase(g, w, self.hw, self.dtype, spec, fusion=self.rt.fusion, steady=True).analysis
        s = Sharder(a)
        if memo is not None:
            _ANALYSES[memo] = (g, a, s)
            while len(_ANALYSES) > ANALYSES_KEPT:
                _ANALYSES.pop(next(iter(_ANALYSES)))
        return a, s

    def _terms(self, a, s) -> dict:
        """Per position of the captured graph (before the blocks, each block, after them): time under tp (no pp,
        each block with its TP all-reduces) and weight bytes read per device; the weights held."""

        self.moe_grid = self.moe_grid or a.assumptions.moe_grid
        sh = s.shard(self._layout()) if self.tp > 1 or self.dpa else None
        per_k = sh.kernel_s if sh is not None else [k.predicted_s for k in a.kernel_results]
        n = len(s.roles.blocks)
        index = {b: i for i, b in enumerate(s.roles.blocks)}
        moe = tuple(index[b] for b in s.roles.expert_blocks if b in index)
        blk = [0.0] * n
        for c in sh.collectives if sh is not None else ():  # the EP all-to-alls in the MoE blocks, the rest in each
            on = moe if c.purpose.startswith("EP ") and moe else range(n)
            for i in on:
                blk[i] += c.predicted_s * c.count / len(on)
        pre = post = 0.0
        for r, t in zip(s.rows, per_k):
            if r.pos < 0:
                pre += t
            elif r.pos >= n:
                post += t
            else:
                blk[r.pos] += t
        for r in a.results:
            i = index.get(s.roles.block.get(r.node.id), -1) + 1
            if sh is None and not r.cost.kernel and 0 < i:  # host dispatch of views (Analysis.predicted_latency_s)
                blk[i - 1] += r.pred.predicted_s
            elif sh is None and not r.cost.kernel:
                post += r.pred.predicted_s
        # weight bytes read per device, [outside, block 0, block 1, ...]: the shares analyze's floor reads too
        dense, expert = s.weight_bytes_by_position(self._layout())
        kvh = s.geo.kv_heads
        lat = sh.latency_s if sh is not None else a.predicted_latency_s
        return {"lat": lat, "pre": pre, "post": lat - pre - sum(blk), "blk": blk, "dense": dense,
                "expert": expert, "act": s.geo.act_bytes, "expert_params": s.roles.expert_params,
                "experts": s.geo.experts, "kv_heads": kvh, "blocks": n, "moe_blocks": moe}

    @property
    def how(self) -> str:
        """How the points were priced, for the table's source line."""
        st = self.stack
        if st is None or not self.extrapolate:
            how = f"captured whole ({self.why_whole or 'as asked'})"
        elif st.prefix == 0 and st.period == 1:
            how = "extrapolated in the layer count from 2-layer captures"
        else:
            how = f"extrapolated in the layer count from {st.long}-layer captures: {st.text}"
        return how + f"; steady load, matrix rate: {self.rate_basis}"

    def _layout(self, pp: int = 1):
        """The replica's layout: tp x pp devices, the experts over the tp group when ep > 1; with DP attention ep
        ranks of one device, each its own batch (analyze's Layout(ep=N, dp_attention=True).per_rank)."""
        from opmap.mapping.sharding import Parallelism

        if self.dpa:
            return Parallelism(tp=1, pp=1, dp=self.ep, devices=self.ep, ep=self.ep, ep_imbalance=self.ep_imbalance,
                               dp_attention=True)
        return Parallelism(tp=self.tp, pp=pp, devices=self.tp * pp, ep=self.ep, ep_imbalance=self.ep_imbalance)

    def _point(self, make, spec, at: tuple[str, int, int]) -> Point:
        L, pp, step = self.m.layers, self.pp, self.rt.per_step_s
        if not self.extrapolate:
            from opmap.mapping.sharding import shard

            a, s = self._analyze(make, spec, L, at)
            t = self._terms(a, s)
            self._note(a, t, tuple(range(L)))
            if self.dpa and pp > 1:  # each rank's stages: the capture's blocks are the model's layers
                lat, stage = self._stages(t["pre"], t["blk"], t["post"], t["act"])
            elif pp > 1 or self.tp > 1 or self.dpa:
                sh = shard(a, self._layout(pp))
                lat, stage = sh.latency_s, sh.microbatch_s
            else:
                lat = stage = t["lat"]
            return Point(lat + step, stage + step, sum(t["dense"]) / pp, sum(t["expert"]) / pp)
        st = self.stack
        a, s = self._analyze(make, spec, st.long, at)
        t = self._terms(a, s)
        where = st.blocks()
        self._note(a, t, where)
        lat, stage = self._stages(*self._layer_times(make, spec, at, t), t["act"])
        dense = t["dense"][0] + sum(t["dense"][1 + j] for j in where)
        expert = t["expert"][0] + sum(t["expert"][1 + j] for j in where)
        return Point(lat + step, stage + step, dense / pp, expert / pp)

    def _stages(self, pre: float, layer_s: list[float], post: float, act: float) -> tuple[float, float]:
        """(one microbatch through every stage, the slowest stage with its send): ceil(L / pp) layers a stage, the
        embedding on the first, the head on the last, pp - 1 activation sends."""
        pp = self.pp
        per = math.ceil(len(layer_s) / pp)
        stages = [0.0] * pp
        for i, x in enumerate(layer_s):
            stages[min(pp - 1, i // per)] += x
        stages[0] += pre
        stages[-1] += post
        send = self._send(act) if pp > 1 else 0.0
        return pre + post + sum(layer_s) + (pp - 1) * send, max(stages) + send

    def _layer_times(self, make, spec, at, t: dict) -> tuple[float, list[float], float]:
        """(before the blocks, each of the model's layers, after them) from the ``long`` capture's terms ``t``
        (module docstring): the prefix and tail layers as their own blocks, each period layer as the capture's
        second period. Where a block of the first period prices differently from its twin in the second (a kernel
        straddles a boundary the two periods do not share), the period is t(long) - t(short) from a ``short``
        capture, its layers the second period's blocks plus an equal share of the difference; the total is exact
        either way, a stage boundary inside the stack off by at most that kernel."""
        st = self.stack
        p, q, blk = st.prefix, st.period, t["blk"]
        first, second = blk[p:p + q], blk[p + q:p + 2 * q]
        period = sum(second)
        if any(abs(a - b) > 1e-9 * max(abs(b), 1e-30) for a, b in zip(first, second)):
            period = t["lat"] - self._terms(*self._analyze(make, spec, st.short, at))["lat"]
        d = [x + (period - sum(second)) / q for x in second]
        layer_s = [blk[j] if j < p or j >= p + 2 * q else d[(j - p) % q] for j in st.blocks()]
        pre = t["pre"]
        post = t["lat"] - pre - sum(blk[:p]) - 2 * period - sum(blk[p + 2 * q:])
        return pre, layer_s, post

    def _note(self, a, t, where: tuple[int, ...]) -> None:
        """The whole model's geometry, from a capture whose block ``where[i]`` prices layer i of the model (the
        identity for a whole capture): per-layer figures (experts held, KV bytes per token) summed over the
        model's layers, each as its block says (R1's dense layers hold no experts)."""
        L = len(where)
        n = max(1, t["blocks"])
        self.rate_basis = self.rate_basis or a.precision.rate_basis
        if self._held is None:
            self._held = self.m.held_bytes * a.precision.weight_scale + _bf16_extra(a, where)
        if t["experts"]:
            self.experts = t["experts"]
            self.top_k = self.m.top_k
            moe = set(t["moe_blocks"])
            moe_layers = sum(1 for j in where if j in moe) if moe else L
            per_layer_expert = t["expert_params"] / (len(moe) or n) / self.experts  # one expert in one MoE layer
            itemsize = a.graph.param_bytes / max(1, a.graph.params)
            one = per_layer_expert * itemsize * a.precision.weight_scale
            self.expert_bytes_per_expert = one * moe_layers / self.tp / self.pp
            self._expert_held = one * self.experts * moe_layers
        self._kv_heads = t["kv_heads"] or self._kv_heads
        self._kv_per_token = self._kv_bytes_per_token(a.graph, where, n) or self._kv_per_token

    @staticmethod
    def _kv_bytes_per_token(graph, where: tuple[int, ...], blocks: int) -> float:
        """KV bytes per token of the model, the captured ``graph``'s causal layers summed as ``where`` maps the
        model's layers onto its blocks (one causal attention a block); where the capture has not one a block, its
        mean per layer times the model's layers. 0: no KV cache."""
        from opmap.mapping.memory import kv_geometry

        geo = kv_geometry(graph)
        if not geo.layers:
            return 0.0
        if geo.layers != blocks or geo.geometry is None:
            return geo.bytes_per_token / geo.layers * len(where)
        per = [spec.kv_elements_per_token * geo.itemsize for spec in geo.geometry.attention]
        return float(sum(per[j] for j in where))

    def _send(self, act_bytes: float) -> float:
        """One stage's activation to the next: b s h / tp bytes point to point (opmap.mapping.sharding's PP send);
        under DP attention each rank's own b s h to its next stage's device, ep further on."""
        from opmap.mapping.collectives import Collective, collective_time
        from opmap.mapping.layout_collectives import placement

        if act_bytes <= 0:
            return 0.0
        width = self.ep if self.dpa else self.tp  # the devices of one stage
        link, stride = placement(self.hw, 2 * width, 2)  # the next stage's rank is a stage's width further on
        c = Collective("send_recv", act_bytes / self.tp, 2, link, stride=stride)
        return collective_time(self.hw, c).seconds

    def prefill(self, seq: int) -> Point:
        from opmap.mapping.memory import inflight_activation_bytes
        from opmap.workloads.phases import PhaseSpec

        p = self._point(lambda: self.m.prefill(seq), PhaseSpec("prefill"), ("prefill", 1, seq))
        if seq >= self._prefill_seq:  # the activations in flight, read off the longest prefill graph
            self._prefill_seq = seq
            self._inflight = inflight_activation_bytes(self._last_graph) / seq
        return p

    def decode(self, batch: int, kv: int) -> Point:
        from opmap.workloads.phases import PhaseSpec

        spec = PhaseSpec("decode", kv_len=kv, kv_write=self.rt.kv_write)
        q = self.queries
        phase = "decode" if q == 1 else f"decode q{q}"  # a verify step's graph is cached apart
        return self._point(lambda: self.m.decode(batch, kv, spec.kv_write, q), spec, (phase, batch, kv))

    def memory(self, kv_dtype: str, utilization: float, fraction_of: str = "total"):
        """Per device: capacity x utilization - weights held - runtime reserve (as ``fraction_of`` defines the
        fraction: ServingMemory), over KV bytes per token."""
        from opmap.mapping.memory import (
            ACTIVATION_TOKENS,
            ServingMemory,
            kv_bytes_per_token_per_device,
            runtime_reserve,
        )
        from opmap.precision import format_bytes  # the KV format's bytes per element (model_cost.kv_dtype_bytes)

        held, kv_captured = self._held or 0.0, self._kv_per_token
        per_tok = kv_captured * float(format_bytes(kv_dtype)) / self.m.kv_itemsize
        per_dev = kv_bytes_per_token_per_device(per_tok, self.m.layers, self._kv_heads, self.tp, self.pp)
        act = self._inflight * ACTIVATION_TOKENS / self.tp
        reserve = runtime_reserve(act, self.rt.name != "eager")
        # DP attention: every rank's stage holds its layers' dense weights whole and E / ep of their experts
        weights = (held - self._expert_held * (1 - 1 / self.ep)) / self.pp if self.dpa else held / (self.tp * self.pp)
        return ServingMemory(self.hw.memory_bytes, float(utilization), weights, reserve, per_dev, fraction_of)
