"""``opmap analyze``: capture a model, cost and map it, predict its time on a catalog device."""

from __future__ import annotations

import gc
from dataclasses import replace
from pathlib import Path

import typer

from opmap.cli.common import (
    ATTENTION_DROPOUT_HELP,
    ATTENTION_KERNEL_HELP,
    build_workload,
    console,
    print_wrote,
    stack_hardware,
    warn_unmatched_overrides,
)
from opmap.errors import OpmapError
from opmap.precision import policy, requestable
from opmap.report.text import safe
from opmap.validate import INT_GE0, INT_GE1, options

# --dtype's help: the registry's requestable formats, the weight-only ones marked
_DTYPES = ", ".join(f + (" (weight-only)" if policy(f).weight_only else "") for f in requestable())


def analyze(
    model: str = typer.Argument(..., help="A zoo name (opmap models list), path/to/file.py:factory, "
                                          "path/to/config.json, hf:NAME or path/to/model.onnx."),
    hardware: str = typer.Option("h100-sxm", "--hardware", "-H",
                                 help="Catalog name, any case, or an alias such as h100 (opmap hardware list)."),
    batch: int = typer.Option(1, help="Batch size."),
    seq: int | None = typer.Option(None, help="Sequence length for text models (default: the model's)."),
    image_size: int | None = typer.Option(None, help="Image side in pixels for vision models."),
    dtype: str = typer.Option("bf16", help=f"Precision: {_DTYPES}."),
    out: Path | None = typer.Option(None, help="Write sheet.csv, kernels.csv, sheet.md and analysis.json here."),
    device: str = typer.Option("meta", help="Capture device: meta (no weights allocated), cpu or cuda."),
    layer_type: list[str] = typer.Option([], "--layer-type", help="Override: GLOB=TYPE on the module path."),
    rows: int = typer.Option(25, help="Kernels shown in the terminal sheet (0: all)."),
    fusion: str | None = typer.Option(None, help="Fusion policy: eager (one kernel per op), compiler, engine or "
                                                 "library (training frameworks: GEMMs alone, fused norm / RoPE / "
                                                 "activation kernels between them) (default: the runtime's: eager "
                                                 "under eager and graphs, engine under engine)."),
    runtime: str = typer.Option("eager", "--runtime", help="Prefill / decode: eager (a host launch per kernel, "
                                                          "a PyTorch module as it runs), graphs (one graph launch "
                                                          "per step) or engine (graphs plus a serving engine's "
                                                          "fused kernels and scheduler gap); train runs eager."),
    # rich reads [...] as markup: the brackets are escaped
    fusion_plan: Path | None = typer.Option(None, help='A plan file: JSON {"kernels": \\[\\[node ids], ...]}.'),
    quality: Path | None = typer.Option(None, help="quality.json from opmap quality: evidence for --dtype."),
    layout: str = typer.Option("nchw", help="Activation layout of conv models: nchw or channels_last."),
    store: Path | None = typer.Option(None, "--store", help="Run store file (default $OPMAP_STORE, else the "
                                                              "user's data directory)."),
    no_store: bool = typer.Option(False, "--no-store", help="Do not record this run in the run store."),
    phase: str = typer.Option("prefill", help="prefill (time to first token), decode (one token per sequence "
                                              "against a KV cache: time per output token) or train (forward, "
                                              "backward, AdamW: iteration time, MFU, HFU)."),
    kv_len: int | None = typer.Option(None, help="Decode: tokens in each sequence's KV cache (default: the "
                                                 "model's default --seq)."),
    recompute: str = typer.Option("none", help="Train: activation recomputation, none, selective (Megatron's "
                                               "attention core) or full (each block's forward again)."),
    microbatch: int | None = typer.Option(None, help="Train: sequences per forward + backward (default --batch)."),
    global_batch: int | None = typer.Option(None, help="Train: sequences per optimizer step (a multiple of "
                                                       "--microbatch; default: the microbatch)."),
    zero: int = typer.Option(0, help="Train: ZeRO stage 0-3 for the memory fit (over 1 data-parallel rank here)."),
    optimizer: str = typer.Option("adamw", help="Train: adamw (torch.optim.AdamW, foreach=False: a kernel per op "
                                                "per parameter), adamw-fused (one multi-tensor kernel, fused=True, "
                                                "as apex / Megatron-LM FusedAdam) or sgd."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel size (Megatron column / row splits)."),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel stages."),
    dp: int = typer.Option(1, "--dp", help="Data-parallel replicas."),
    ep: int = typer.Option(1, "--ep", help="Expert-parallel size (MoE; taken from inside dp)."),
    sp: bool = typer.Option(False, "--sp", help="Sequence parallelism (needs --tp above 1)."),
    vp: int = typer.Option(1, "--vp", help="Virtual stages per device (interleaved 1F1B)."),
    cp: int = typer.Option(1, "--cp", help="Context-parallel size: each sequence split over cp devices per TP "
                                           "group, attention as a K/V ring (Megatron-Core / TransformerEngine)."),
    cp_comm: str = typer.Option("p2p", "--cp-comm", help="Context parallelism's exchange: p2p (K/V ring overlapped "
                                                         "with attention, Megatron-Core) or all_gather (Llama 3)."),
    devices: int | None = typer.Option(None, "--devices", help="Check: must equal tp x cp x pp x dp."),
    tuned: bool = typer.Option(False, "--tuned", help="Predict under the mappings `opmap tune` measured best on "
                                                      "this CPU (--hardware local; prefill)."),
    allow_long_context: bool = typer.Option(False, "--allow-long-context",
                                            help="Allow --seq / --kv-len past the model's max_position_embeddings "
                                                 "(rotary models: rope scaling)."),
    dim: list[str] = typer.Option([], "--dim", help="ONNX: bind a dynamic dim, NAME=VALUE (repeatable; --batch and "
                                                    "--seq bind batch- and sequence-named dims)."),
    attention_kernel: str | None = typer.Option(None, "--attention-kernel", help=ATTENTION_KERNEL_HELP),
    attention_dropout: float | None = typer.Option(None, "--attention-dropout", help=ATTENTION_DROPOUT_HELP),
) -> None:
    """Capture MODEL, cost every operator, map them to kernels, predict each one's time on HARDWARE."""
    from opmap.capture import parse_overrides
    from opmap.report.sheet import check_out_dir

    # torch's import leaves a large heap that every garbage collection during capture would walk again: move
    # it to the permanent generation (the 70B analysis: 3.5 s to 2.9 s whole process, benchmarks/README.md)
    gc.freeze()
    options({**{k: (v, INT_GE1) for k, v in (("--batch", batch), ("--seq", seq), ("--image-size", image_size),
                                             ("--kv-len", kv_len), ("--microbatch", microbatch),
                                             ("--global-batch", global_batch), ("--tp", tp), ("--pp", pp),
                                             ("--dp", dp), ("--ep", ep), ("--vp", vp), ("--cp", cp),
                                             ("--devices", devices))},
             "--rows": (rows, INT_GE0), "--zero": (zero, {"lo": 0, "hi": 3, "integer": True})})
    # Checked in this order, each before the work it guards: the hardware name, the overrides and the output
    # folder here; the device, model, shape and dtype by the loader before it builds; the dtype on this
    # hardware, the fusion policy and the plan file by opmap.analyze.analyze before it captures.
    hw = stack_hardware(hardware, attention_kernel, attention_dropout)
    overrides = parse_overrides(layer_type)
    if out is not None:
        check_out_dir(out)
    dims = _onnx_options(model, dim, phase, layout, image_size)
    from opmap.workloads.phases import PhaseSpec, check_phase

    spec = check_phase(PhaseSpec(phase, kv_len, recompute, microbatch, global_batch, zero, dp=dp,
                                 optimizer=optimizer), model, batch, allow_long_context=allow_long_context)
    rt = _runtime(hw, runtime, spec)
    spec = replace(spec, kv_write=rt.kv_write)  # a Hugging Face decode stores its new K and V as the runtime does
    rt, fusion = _kernels_run(rt, fusion, fusion_plan)
    par = _parallelism(spec, batch, tp, pp, dp, ep, sp, vp, cp, cp_comm, devices)
    if tuned and (spec.name != "prefill" or hw.name != "local"):
        raise OpmapError("--tuned applies the choices `opmap tune` measured on this CPU: it takes --hardware local "
                         "and the prefill phase")
    if spec.name != "prefill":
        _analyze_phase(model, hw, spec, batch, seq, image_size, dtype, out, device, overrides, rows, fusion,
                       fusion_plan, quality, layout, par, store, no_store, rt, allow_long_context)
        return
    from opmap.phases.runtime import with_runtime
    from opmap.phases.step import with_figures

    a = _analyze_prefill(model, hw, rt, batch, seq, image_size, dtype, device, layout, overrides, fusion,
                         fusion_plan, quality, dims, allow_long_context)
    if tuned:
        from opmap.explore.tune.tuned import tuned_analysis

        a = tuned_analysis(a)
    _report(with_figures(with_runtime(a, rt)), par, overrides, rows, out, store, no_store)


def _kernels_run(rt, fusion: str | None, fusion_plan: Path | None):
    """(the runtime, the fusion policy): the kernels the step runs are the ones the header names: a plan file, an
    explicit --fusion, else the runtime's."""
    if fusion_plan is not None:
        return replace(rt, fusion=f"plan file {fusion_plan}"), fusion or "eager"
    if fusion is not None:
        return replace(rt, fusion=fusion), fusion
    return rt, rt.fusion


def _parallelism(spec, batch: int, tp: int, pp: int, dp: int, ep: int, sp: bool, vp: int, cp: int, cp_comm: str,
                 devices: int | None):
    """The layout of the options (checked by Parallelism): the microbatch and global batch of a training step,
    the batch of a prefill or decode step on each data-parallel replica."""
    from opmap.mapping.sharding import Parallelism

    mb = spec.microbatch or batch if spec.train else batch
    return Parallelism(tp=tp, pp=pp, dp=dp, ep=ep, sp=sp, vp=vp, cp=cp, cp_comm=cp_comm, devices=devices,
                       microbatch=mb,
                       global_batch=(spec.global_batch or mb * dp) if spec.train else batch * dp,
                       recompute=spec.recompute if spec.train else "none", zero=spec.zero)


def _analyze_prefill(model, hw, rt, batch, seq, image_size, dtype, device, layout, overrides, fusion, fusion_plan,
                     quality, dims, allow_long_context):
    """The prefill analysis under the runtime: a zoo model captured on meta before, at these shapes and this build
    dtype, is not built or captured again (opmap.capture.cache: keyed by the inputs, the opmap and torch versions
    and the model and tracer sources)."""
    from opmap.analyze import analyze as run_analyze
    from opmap.analyze import analyze_graph, check_analysis_inputs
    from opmap.capture import cache as graph_cache
    from opmap.workloads import with_layout

    hw_rt = rt.apply(hw)
    key = _graph_key(model, batch, seq, image_size, dtype, device, layout, overrides)
    hit = graph_cache.load(key) if key else None
    if hit is not None:
        graph, w = hit[0], _cached_workload(hit[1])
        evidence = _evidence(quality, w.name, dtype)
        check_analysis_inputs(hw, dtype, fusion, fusion_plan)
        with console.status(f"predicting {safe(w.name)} on {hw.name} (graph from the capture cache)"):
            return analyze_graph(graph, w, hw_rt, dtype, overrides, fusion, fusion_plan, evidence)
    w = with_layout(build_workload(model, batch, seq, image_size, dtype, device, allow_long_context, dims=dims,
                                   overrides=overrides), layout)
    evidence = _evidence(quality, w.name, dtype)
    with console.status(f"capturing {safe(w.name)} and predicting on {hw.name}"):
        a = run_analyze(w, hw_rt, dtype, overrides, fusion, fusion_plan, evidence=evidence)
    if key:
        graph_cache.store(key, a.graph, _workload_fields(w))
    return a


def _onnx_options(model: str, dim: list[str], phase: str, layout: str, image_size: int | None) -> dict[str, int]:
    """An ONNX model's --dim bindings; the options that need a PyTorch module refused for one."""
    from opmap.workloads.onnx import is_onnx_target, parse_dims

    dims = parse_dims(dim)
    if not is_onnx_target(model):
        if dims:
            raise OpmapError("--dim binds an ONNX model's dynamic dims; accepted with path/to/model.onnx only")
        return dims
    if phase != "prefill":
        raise OpmapError(f"--phase {phase} needs a PyTorch module (its KV cache or backward); an ONNX model is "
                         "analysed as its graph runs: drop --phase")
    if layout != "nchw" or image_size is not None:
        raise OpmapError("an ONNX model keeps its own layout and shapes: bind its dynamic dims with --dim NAME=VALUE "
                         "(not --layout / --image-size)")
    return dims


def _runtime(hw, name: str, spec):
    """The runtime the step runs under on ``hw`` (opmap.phases.runtime); a training step only eager."""
    from opmap.phases.runtime import check_runtime, get_runtime

    check_runtime(name)
    if spec.train and name != "eager":
        raise OpmapError(f"--runtime {name} prices serving steps (prefill, decode); --phase train runs eager: "
                         "drop --runtime or pass --runtime eager")
    return get_runtime(hw, name)


def _report(a, par, overrides, rows: int, out: Path | None, store: Path | None = None,
            no_store: bool = False) -> None:
    """Lay the analysis out over the devices of ``par`` (when there are several), then print and write it."""
    from opmap.report.sheet import print_report, write_outputs

    if par is not None and (par.devices > 1 or par.ep > 1):
        from opmap.phases.sharded import shard_analysis

        a = shard_analysis(a, par)
    warn_unmatched_overrides(overrides, a.graph)
    print_report(a, console, rows)
    if out is not None:
        print_wrote(write_outputs(a, out))
    if not no_store:
        from opmap.cli.common import record_run
        from opmap.store.db import analysis_tags

        d = a.to_dict(nodes=False)
        d["graph_hash"] = _graph_hash(a)
        record_run("analyze", d, analysis_tags(d), store, no_store)


def _graph_hash(a) -> str:
    """The run store's graph hash (operators and tensor shapes, in order) from the analysis itself."""
    import hashlib

    h = hashlib.sha256()
    for n in a.graph.nodes:
        h.update(n.op.encode())
        for t in (*n.inputs, *n.outputs):
            h.update(repr(tuple(t.shape)).encode())
    return h.hexdigest()[:16]


def _analyze_phase(model, hw, spec, batch, seq, image_size, dtype, out, device, overrides, rows, fusion, fusion_plan,
                   quality, layout, par=None, store=None, no_store=False, rt=None,
                   allow_long_context=False) -> None:
    """Decode or train: build the phase's workload (or take its graph from the capture cache), capture, predict,
    add the phase's figures and memory fit, report."""
    from opmap.analyze import check_analysis_inputs
    from opmap.capture import cache as graph_cache
    from opmap.phases.step import analyze_phase, capture_phase
    from opmap.phases.train import train_activations
    from opmap.precision import resolve_training_precision
    from opmap.workloads import MODELS, with_layout
    from opmap.workloads.phases import phase_workload

    check_analysis_inputs(hw, dtype, fusion, fusion_plan)
    if spec.train:  # fp8 training needs an fp8 matrix engine: refused here, before any capture
        resolve_training_precision(hw, dtype)
    spec_model = MODELS.get(model)
    if spec_model is not None and spec_model.kind == "vision" and seq is not None:
        raise OpmapError(f"{model} is a vision model: it takes --image-size, not --seq")
    if spec_model is not None and spec_model.kind == "text" and image_size is not None:
        raise OpmapError(f"{model} is a text model: it takes --seq, not --image-size")
    if spec.decode and seq is not None:
        raise OpmapError("--phase decode takes --kv-len (tokens cached), not --seq (one new token per sequence)")
    step_batch = spec.microbatch if spec.train else batch
    key = _graph_key(model, step_batch, seq, image_size, dtype, device, layout, overrides,
                     phase={"name": spec.name, "kv_len": spec.kv_len, "optimizer": spec.optimizer,
                            "recompute": spec.recompute if spec.train else None})
    hit = graph_cache.load(key) if key else None
    saved = act = None
    if hit is not None and len(hit) == 3 and (hit[2] is not None) == spec.train:  # training needs its activations
        graph, w, saved = hit[0], _cached_workload(hit[1]), _cached_saved(hit[2])
    else:
        if spec_model is not None and device != "meta":
            from opmap.cli.common import check_memory

            check_memory(spec_model.published_params, dtype, device)
        with console.status(f"building {safe(model)} for {spec.name} on {safe(device)}"):
            w = with_layout(phase_workload(model, spec, batch, seq if seq is not None else image_size, dtype, device,
                                           allow_long_context), layout)
        with console.status(f"capturing {safe(w.name)} ({spec.name})"):
            graph = capture_phase(w, spec, overrides)
            if spec.train:
                saved, _ = train_activations(w, spec.recompute)
        if key:
            graph_cache.store(key, graph, _workload_fields(w), _saved_fields(saved))
    if spec.train:
        per = saved.total_bytes / (w.batch * (w.seq or 1))
        act = lambda b, s: per * b * s  # noqa: E731 (linear in batch x sequence: fused attention)
    evidence = _evidence(quality, w.name, dtype)
    with console.status(f"predicting {safe(w.name)} ({spec.name}) on {hw.name}"):
        pa = analyze_phase(graph, w, hw, dtype, spec, overrides, fusion, fusion_plan, evidence, saved=saved,
                           activations=act, runtime=rt)
    _report(pa.analysis, par, overrides, rows, out, store, no_store)


def _workload_fields(w) -> dict:
    """What the capture cache keeps of a workload: not its module or inputs (a cached graph needs neither)."""
    return {"name": w.name, "batch": w.batch, "seq": w.seq, "assumptions": list(w.assumptions)}


def _cached_workload(fields: dict):
    from opmap.workloads.zoo import Workload

    return Workload(fields["name"], None, None, fields["batch"], fields["seq"], fields["assumptions"])


def _saved_fields(saved) -> dict | None:
    from dataclasses import asdict

    return None if saved is None else {**asdict(saved), "notes": list(saved.notes)}


def _cached_saved(fields: dict | None):
    from opmap.mapping.memory import SavedActivations

    return None if fields is None else SavedActivations(**fields)


def _graph_key(model: str, batch: int, seq: int | None, image_size: int | None, dtype: str, device: str,
               layout: str, overrides, phase: dict | None = None) -> str | None:
    """The capture-cache key of a zoo model on meta (None: not cacheable, such as a user's file or a real
    device)."""
    from opmap.capture import cache as graph_cache
    from opmap.precision import build_dtype, requestable
    from opmap.workloads import MODELS

    if device != "meta" or model not in MODELS or dtype not in requestable() or not graph_cache.enabled():
        return None
    fields = {"model": model, "batch": batch, "seq": seq, "image_size": image_size,
              "build_dtype": build_dtype(dtype), "layout": layout, "overrides": list(overrides)}
    if phase is not None:  # prefill keeps its key (the graphs cached before phases existed stay valid)
        fields["phase"] = phase
    return graph_cache.key(fields)


def _evidence(path: Path | None, workload: str, dtype: str) -> str:
    """The precision evidence line of the assumptions: verified by a matching quality.json, or unverified."""
    from opmap.precision import reference

    if reference(dtype):
        return "reference precision (fp32 storage)"
    if path is None:
        return (f"unverified: no quality evidence for {dtype} (run `opmap quality {workload} --dtype {dtype} "
                "--out DIR`, then pass --quality DIR/quality.json)")
    from opmap.measure.quality import read_quality

    q = read_quality(path)
    got = (q["workload"], q["dtype"], q["rel_error"], q["agreement"], q["agreement_kind"])
    if got[0] != workload or got[1] != dtype:
        raise OpmapError(f"quality file {path} is for {got[0]} at {got[1]}, not {workload} at {dtype}")
    # quality.json before the "weights" key: the zoo's weights were random, a model file's its own
    weights = q.get("weights", "random" if ":" not in workload else "as the model file builds them")
    on = "on random weights" if weights == "random" else f"on weights {weights}"
    return f"verified {on} by {path}: relative error {got[2]:.3g}, {got[4]} {got[3]:.1%} against fp32"
