"""The facade over the pipeline: a model loaded once, then stepped per phase, shape, hardware, runtime and layout.

A command parses its options into the config values here (``Shape``, ``Phase``, ``Layout``, ``RuntimeChoice``:
frozen, each validating itself in ``__post_init__`` with one OpmapError line naming the option and what is
accepted), hands them to a ``Model`` and renders what it returns (opmap.analyze.Analysis,
opmap.phases.step.PhaseAnalysis). A ``Model`` keeps every step it captured (by phase and shape): a second
hardware, runtime or layout of the same step is analysed again without building or capturing anything, and a zoo
model on meta is kept across processes in the capture cache (opmap.capture.cache).

Every capture-cache key of a model is made here (``capture_key``): a zoo model on meta, at a requestable dtype, is
a pure function of its name, build dtype and the fields that say what was captured; anything else (a user's file, a
Hugging Face config, a real device) is not cacheable. ``graph_hash`` is the run store's hash of a captured graph
(operators and tensor shapes, in order; opmap.store.rows.graph_hash reads the same from a file's nodes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opmap.errors import OpmapError
from opmap.validate import INT_GE1, Rule, options

if TYPE_CHECKING:
    from opmap.capture.cache import CachedWorkload

# what a command shows while a step builds, captures or predicts: a plain line (no markup), in a context manager
Status = Callable[[str], contextlib.AbstractContextManager]


def _quiet(_message: str) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


# -- cache keys and cached captures ----------------------------------------------------------------------------

def capture_key(model: str, dtype: str, fields: dict[str, Any], device: str = "meta") -> str | None:
    """The capture-cache key of ``model`` built at ``dtype``'s build dtype and captured as ``fields`` say (None: not
    cacheable: not a zoo model, not on meta, a dtype that is not requestable, or the cache turned off)."""
    from opmap.capture import cache
    from opmap.precision import accepted, build_dtype
    from opmap.workloads import MODELS

    if device != "meta" or model not in MODELS or dtype not in accepted() or not cache.enabled():
        return None
    return cache.key({"model": model, "build_dtype": build_dtype(dtype), **fields})


def step_key(model: str, dtype: str, device: str, shape: Shape, layout: str, overrides,
             phase: dict | None = None) -> str | None:
    """The key of an analysed step: a prefill at ``shape`` keeps its key of before phases existed (the graphs
    cached then stay valid); another phase adds its fields."""
    fields = {"batch": shape.batch, "seq": shape.seq, "image_size": shape.image_size, "layout": layout,
              "overrides": list(overrides)}
    if phase is not None:
        fields["phase"] = phase
    return capture_key(model, dtype, fields, device)


def workload_fields(w) -> CachedWorkload:
    """What the capture cache keeps of a workload (opmap.capture.cache.CachedWorkload)."""
    from opmap.capture.cache import CachedWorkload

    return CachedWorkload(w.name, w.batch, w.seq, tuple(w.assumptions), getattr(w, "geometry", None))


def cached(key: str | None, train: bool | None = None) -> tuple | None:
    """(graph, Workload without module, SavedActivations or None) cached under ``key``, or None. ``train``: a phase
    entry (written with its saved activations, None outside training) of that kind only."""
    from opmap.capture import cache
    from opmap.mapping.activations import SavedActivations
    from opmap.workloads.zoo import Workload

    hit = cache.load(key, SavedActivations) if key else None
    if hit is None or (train is not None and not (len(hit) == 3 and (hit[2] is not None) == train)):
        return None
    f = hit[1]
    w = Workload(f.name, None, None, f.batch, f.seq, f.assumptions, geometry=f.geometry)
    saved = hit[2] if len(hit) == 3 else None
    return hit[0], w, saved


def keep(key: str | None, graph, w, *saved) -> None:
    """Store a capture under ``key`` (nothing when None); a phase entry passes its saved activations (or None)."""
    from opmap.capture import cache

    if key:
        cache.store(key, graph, workload_fields(w), *saved)


def graph_hash(graph) -> str:
    """The run store's graph hash (operators and tensor shapes, in order) of a captured graph."""
    import hashlib

    h = hashlib.sha256()
    for n in graph.nodes:
        h.update(n.op.encode())
        for t in (*n.inputs, *n.outputs):
            h.update(repr(tuple(t.shape)).encode())
    return h.hexdigest()[:16]


def dtype_on(hw, dtype: str):
    """``dtype`` (a format or an alias, ``--dtype fp4``) on ``hw``: the format priced, how an alias resolved, and
    the format's own fallback there (opmap.precision.DtypeChoice): what serve's header and fit's cells name."""
    from opmap.precision import resolve_dtype, resolve_precision

    c = resolve_dtype(hw, dtype)
    return replace(c, note=resolve_precision(hw, c.format).note)


# -- configs ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    """Sequences per step and their length: ``seq`` tokens for a text model, ``image_size`` pixels a side for a
    vision one (None: the model's default)."""

    batch: int = 1
    seq: int | None = None
    image_size: int | None = None

    def __post_init__(self) -> None:
        options({"--batch": (self.batch, INT_GE1), "--seq": (self.seq, INT_GE1),
                 "--image-size": (self.image_size, INT_GE1)})

    @property
    def length(self) -> int | None:
        return self.seq if self.seq is not None else self.image_size


@dataclass(frozen=True)
class Phase:
    """A phase and its knobs (opmap.workloads.phases.PhaseSpec's), checked alone here and against the model by
    ``spec``."""

    name: str = "prefill"
    kv_len: int | None = None
    recompute: str = "none"
    microbatch: int | None = None
    global_batch: int | None = None
    zero: int = 0
    dp: int = 1
    optimizer: str = "adamw"

    def __post_init__(self) -> None:
        from opmap.workloads.phases import PHASES

        options({"--kv-len": (self.kv_len, INT_GE1), "--microbatch": (self.microbatch, INT_GE1),
                 "--global-batch": (self.global_batch, INT_GE1), "--dp": (self.dp, INT_GE1),
                 "--zero": (self.zero, Rule(lo=0, hi=3, integer=True))})
        if self.name not in PHASES:
            raise OpmapError(f"unknown phase {self.name!r}; accepted: {', '.join(PHASES)}")

    def spec(self, model: str, batch: int, allow_long_context: bool = False):
        """The PhaseSpec of ``model`` at ``batch``, its defaults filled (opmap.workloads.phases.check_phase)."""
        from opmap.workloads.phases import PhaseSpec, check_phase

        return check_phase(PhaseSpec(self.name, self.kv_len, self.recompute, self.microbatch, self.global_batch,
                                     self.zero, dp=self.dp, optimizer=self.optimizer), model, batch,
                           allow_long_context=allow_long_context)


@dataclass(frozen=True)
class Layout:
    """How a step is laid over devices (opmap.mapping.sharding.Parallelism's sizes, checked together there).
    ``ep_imbalance``: the busiest EP rank's routed tokens over the mean (None: opmap.mapping.expert_parallel's
    default for inference, 1 for training); ``dp_attention``: the attention data-parallel over the EP ranks
    (``per_rank``)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    sp: bool = False
    vp: int = 1
    cp: int = 1
    cp_comm: str = "p2p"
    devices: int | None = None
    ep_imbalance: float | None = None
    dp_attention: bool = False

    def __post_init__(self) -> None:
        options({f"--{k}": (getattr(self, k), INT_GE1) for k in ("tp", "pp", "dp", "ep", "vp", "cp", "devices")})
        if self.ep_imbalance is not None:
            options({"--ep-imbalance": (self.ep_imbalance, Rule(lo=1.0, hi=float(max(1, self.ep))))})
        if self.dp_attention and self.ep <= 1:
            raise OpmapError("--dp-attention runs the attention data-parallel over the EP ranks: it needs --ep above 1")

    def per_rank(self, batch: int, train: bool = False) -> tuple[Layout, int]:
        """With ``dp_attention``: (the layout with dp = ep unless --dp names a multiple of ep, the batch each
        attention rank runs: ``batch``, the step's sequences, over dp); else (self, batch)."""
        if not self.dp_attention:
            return self, batch
        if train:
            raise OpmapError("--dp-attention is an inference layout (prefill, decode, serve): training's --dp with "
                             "--ep "
                             "already runs the attention data-parallel")
        dp = self.dp if self.dp > 1 else self.ep
        if dp % self.ep or batch % dp:
            raise OpmapError(f"--dp-attention splits the batch over {dp} attention ranks: --batch {batch} must be a "
                             f"multiple of {dp} (and --dp {self.dp} a multiple of --ep {self.ep})")
        return replace(self, dp=dp), batch // dp

    def parallelism(self, spec, batch: int):
        """The Parallelism of this layout: the microbatch and global batch of a training step, the batch of a
        prefill or decode step on each data-parallel replica."""
        from opmap.mapping.expert_parallel import imbalance_for
        from opmap.mapping.sharding import Parallelism

        mb = spec.microbatch or batch if spec.train else batch
        imb = (self.ep_imbalance or 1.0) if spec.train else imbalance_for(self.ep, self.ep_imbalance)
        par = Parallelism(tp=self.tp, pp=self.pp, dp=self.dp, ep=self.ep, sp=self.sp, vp=self.vp, cp=self.cp,
                          cp_comm=self.cp_comm, devices=self.devices, microbatch=mb,
                          global_batch=(spec.global_batch or mb * self.dp) if spec.train else batch * self.dp,
                          recompute=spec.recompute if spec.train else "none", zero=spec.zero,
                          ep_imbalance=imb, dp_attention=self.dp_attention)
        par.check_phase(spec.train)  # refused here, before the model is built and captured
        return par


@dataclass(frozen=True)
class RuntimeChoice:
    """The runtime a step runs under (opmap.phases.runtime) and the kernels it runs: a plan file, an explicit
    fusion policy, else the runtime's."""

    name: str = "eager"
    fusion: str | None = None
    fusion_plan: Path | None = None

    def __post_init__(self) -> None:
        from opmap.phases.runtime import check_runtime

        check_runtime(self.name)

    def resolve(self, hw, spec) -> tuple[Any, str]:
        """(the Runtime on ``hw``, its kv_write and fusion as the step runs them, the fusion policy); a training
        step runs eager only."""
        from opmap.phases.runtime import get_runtime

        if spec.train and self.name != "eager":
            raise OpmapError(f"--runtime {self.name} prices serving steps (prefill, decode); --phase train runs "
                             "eager: drop --runtime or pass --runtime eager")
        rt = get_runtime(hw, self.name)
        if self.fusion_plan is not None:
            return replace(rt, fusion=f"plan file {self.fusion_plan}"), self.fusion or "eager"
        if self.fusion is not None:
            return replace(rt, fusion=self.fusion), self.fusion
        return rt, rt.fusion


# -- the model -------------------------------------------------------------------------------------------------

def check_memory(params: int, dtype: str, device: str) -> None:
    """Refuse a real-tensor build that cannot fit, before allocating anything. Only a device that can be
    asked is checked (cpu, an available cuda); the loader refuses the others."""
    import os

    from opmap.precision import build_bytes, check_requestable

    need = params * build_bytes(check_requestable(dtype))
    if device == "cpu":
        have = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    else:
        import torch

        if device != "cuda" or not torch.cuda.is_available():
            return
        have = torch.cuda.mem_get_info()[0]
    if need > 0.8 * have:
        raise OpmapError(f"the weights need {need / 1e9:.1f} GB on {device}, {have / 1e9:.1f} GB is free; "
                         "use --device meta (no weights allocated)")


def check_shape_kind(model: str, shape: Shape) -> None:
    """A zoo model takes the length option of its kind: --seq for text, --image-size for vision."""
    from opmap.workloads import MODELS

    spec = MODELS.get(model)
    if spec is not None and spec.kind == "vision" and shape.seq is not None:
        raise OpmapError(f"{model} is a vision model: it takes --image-size, not --seq")
    if spec is not None and spec.kind == "text" and shape.image_size is not None:
        raise OpmapError(f"{model} is a text model: it takes --seq, not --image-size")


def build_workload(model: str, shape: Shape, dtype: str, device: str, allow_long_context: bool = False,
                   dims: dict[str, int] | None = None, overrides=(), status: Status = _quiet):
    """Build MODEL at ``shape`` (a real-tensor build refused first if the weights cannot fit; the loader checks
    the rest, model, shape, dtype, device, before it builds anything)."""
    from opmap.workloads import MODELS, load_workload

    check_shape_kind(model, shape)
    spec = MODELS.get(model)
    if spec is not None and device != "meta":
        check_memory(spec.published_params, dtype, device)
    with status(f"building {model} on {device}"):
        return load_workload(model, shape.batch, shape.length, dtype, device, allow_long_context, dims=dims,
                             overrides=overrides)


@dataclass
class Model:
    """``target`` (a zoo name, a Hugging Face config or hf:NAME, path/to/file.py:factory, a .onnx file) at
    ``dtype`` on the capture ``device``, stepped per phase and shape (each step captured once, in this object and,
    for a zoo model on meta, in the capture cache), and analysed per hardware, runtime and fusion. ``builds`` and
    ``captures`` count the work done."""

    target: str
    dtype: str = "bf16"
    device: str = "meta"
    layout: str = "nchw"
    overrides: tuple = ()
    allow_long_context: bool = False
    dims: dict[str, int] | None = None
    status: Status = _quiet
    builds: int = 0
    captures: int = 0
    _steps: dict = field(default_factory=dict, repr=False)

    def key(self, shape: Shape, phase: dict | None = None) -> str | None:
        return step_key(self.target, self.dtype, self.device, shape, self.layout, self.overrides, phase)

    def prefill(self, shape: Shape, hw, fusion: str, fusion_plan=None, evidence: Callable[[str], str] = str):
        """The prefill Analysis of ``shape`` on ``hw`` (a runtime already applied to it); ``evidence``: the
        precision evidence line for the workload's name."""
        from opmap.analyze import analyze, analyze_graph, check_analysis_inputs
        from opmap.workloads import with_layout

        memo = ("prefill", shape)
        key = self.key(shape)
        hit = self._steps.get(memo) or cached(key)
        if hit is not None:
            graph, w = hit[0], hit[1]
            ev = evidence(w.name)
            check_analysis_inputs(hw, self.dtype, fusion, fusion_plan)
            with self.status(f"predicting {w.name} on {hw.name} (graph from the capture cache)"):
                return analyze_graph(graph, w, hw, self.dtype, self.overrides, fusion, fusion_plan, ev)
        w = with_layout(build_workload(self.target, shape, self.dtype, self.device, self.allow_long_context,
                                       self.dims, self.overrides, self.status), self.layout)
        self.builds += 1
        ev = evidence(w.name)
        with self.status(f"capturing {w.name} and predicting on {hw.name}"):
            a = analyze(w, hw, self.dtype, self.overrides, fusion, fusion_plan, evidence=ev)
        self.captures += 1
        keep(key, a.graph, w)
        self._steps[memo] = (a.graph, w, None)
        return a

    def prefill_graph(self, shape: Shape) -> tuple:
        """(graph, workload) of the prefill at ``shape``, captured without analysing it: from this object, the
        capture cache (where analyze or an earlier call made it), or built and captured."""
        from opmap.capture import capture
        from opmap.workloads import with_layout

        memo = ("prefill", shape)
        key = self.key(shape)
        hit = self._steps.get(memo) or cached(key)
        if hit is None:
            w = with_layout(build_workload(self.target, shape, self.dtype, self.device, self.allow_long_context,
                                           self.dims, self.overrides, self.status), self.layout)
            self.builds += 1
            graph = w.graph if w.graph is not None else capture(w.module, w.inputs, overrides=self.overrides)
            hit = (graph, w, None)
            self.captures += 1
            keep(key, hit[0], w)
        self._steps[memo] = hit
        return hit[0], hit[1]

    def step(self, spec, shape: Shape) -> tuple:
        """(graph, workload, saved activations or None) of the phase ``spec`` (a checked PhaseSpec: decode,
        train, or prefill as a phase) at ``shape``: from this object, the capture cache, or built and captured."""
        from opmap.phases.step import capture_phase
        from opmap.phases.train import train_activations
        from opmap.workloads import MODELS, with_layout
        from opmap.workloads.phases import phase_workload

        memo = (spec, shape)
        if memo in self._steps:
            return self._steps[memo]
        batch = spec.microbatch if spec.train else shape.batch
        key = self.key(replace(shape, batch=batch), {"name": spec.name, "kv_len": spec.kv_len,
                                                     "optimizer": spec.optimizer,
                                                     "recompute": spec.recompute if spec.train else None})
        hit = cached(key, train=spec.train)
        if hit is None:
            model = MODELS.get(self.target)
            if model is not None and self.device != "meta":
                check_memory(model.published_params, self.dtype, self.device)
            with self.status(f"building {self.target} for {spec.name} on {self.device}"):
                w = with_layout(phase_workload(self.target, spec, shape.batch, shape.length, self.dtype,
                                               self.device, self.allow_long_context), self.layout)
            self.builds += 1
            with self.status(f"capturing {w.name} ({spec.name})"):
                graph = capture_phase(w, spec, self.overrides)
                saved = train_activations(w, spec.recompute)[0] if spec.train else None
            self.captures += 1
            keep(key, graph, w, saved)
            hit = (graph, w, saved)
        self._steps[memo] = hit
        return hit

    def phase(self, spec, shape: Shape, hw, rt=None, fusion: str | None = None, fusion_plan=None,
              evidence: Callable[[str], str] = str, steady: bool = False):
        """The PhaseAnalysis of ``spec`` at ``shape`` on ``hw`` under the runtime ``rt`` (decode: the KV cache;
        train: forward, backward and the optimizer, with the memory fit of its saved activations); ``steady``:
        priced under steady load (opmap.phases.step.analyze_phase)."""
        from opmap.analyze import check_analysis_inputs
        from opmap.phases.step import analyze_phase
        from opmap.precision import resolve_training_precision

        check_analysis_inputs(hw, self.dtype, fusion, fusion_plan)
        if spec.train:  # fp8 training needs an fp8 matrix engine: refused here, before any capture
            resolve_training_precision(hw, self.dtype)
        check_shape_kind(self.target, shape)
        if spec.decode and shape.seq is not None:
            raise OpmapError("--phase decode takes --kv-len (tokens cached), not --seq (one new token per sequence)")
        graph, w, saved = self.step(spec, shape)
        act = None
        if spec.train:
            per = saved.total_bytes / (w.batch * (w.seq or 1))
            act = lambda b, s: per * b * s  # noqa: E731 (linear in batch x sequence: fused attention)
        ev = evidence(w.name)
        with self.status(f"predicting {w.name} ({spec.name}) on {hw.name}"):
            return analyze_phase(graph, w, hw, self.dtype, spec, self.overrides, fusion, fusion_plan, ev,
                                 saved=saved, activations=act, runtime=rt, steady=steady)
