"""``opmap analyze``: capture a model, cost and map it, predict its time on a catalog device."""

from __future__ import annotations

import gc
from dataclasses import dataclass, replace
from pathlib import Path

import typer

from opmap.api import Layout, Model, Phase, RuntimeChoice, Shape, graph_hash
from opmap.cli.common import (
    ATTENTION_DROPOUT_HELP,
    ATTENTION_KERNEL_HELP,
    collector_paused,
    console,
    print_wrote,
    stack_hardware,
    status,
    warn_unmatched_overrides,
)
from opmap.errors import OpmapError
from opmap.precision import aliases, policy, requestable, resolve_dtype
from opmap.validate import INT_GE0, options

EP_HELP = ("Expert-parallel size (MoE): E / ep experts a device. Taken from inside --dp (each EP rank its own tokens; "
           "training, or inference's DP attention) or, for prefill / decode, from inside --tp (attention "
           "tensor-parallel, vLLM's --enable-expert-parallel).")
EP_IMBALANCE_HELP = ("With --ep: the busiest EP rank's routed tokens over the mean, >= 1 (default for prefill / decode "
                     "from a published measurement, opmap/mapping/expert_parallel.toml; 1 for train).")
DP_ATTENTION_HELP = ("With --ep: attention data-parallel over the EP ranks (SGLang --enable-dp-attention): dp = ep "
                     "attention ranks, each its own batch / dp sequences and KV cache; --batch is the step's "
                     "sequences.")

# --dtype's help: the registry's requestable formats, the weight-only ones marked
_DTYPES = ", ".join([*(f + (" (weight-only)" if policy(f).weight_only else "") for f in requestable()),
                     *(f"{a} (per device: {' or '.join(m)}, else the narrowest float format it runs)"
                       for a, m in aliases().items())])


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
    ep: int = typer.Option(1, "--ep", help=EP_HELP),
    ep_imbalance: float | None = typer.Option(None, "--ep-imbalance", help=EP_IMBALANCE_HELP),
    dp_attention: bool = typer.Option(False, "--dp-attention", help=DP_ATTENTION_HELP),
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
    # torch's import leaves a large heap that every garbage collection during capture would walk again: move
    # it to the permanent generation (the 70B analysis: 3.5 s to 2.9 s whole process, benchmarks/README.md)
    gc.freeze()
    lay = Layout(tp, pp, dp, ep, sp, vp, cp, cp_comm, devices, ep_imbalance, dp_attention)
    # --dp-attention: --batch is the step's sequences, each attention rank runs batch / dp of them
    lay, batch = lay.per_rank(batch, train=phase == "train")
    shape = Shape(batch, seq, image_size)
    step = Phase(phase, kv_len, recompute, microbatch, global_batch, zero, lay.dp, optimizer)
    options({"--rows": (rows, INT_GE0)})
    req = _Request(model, hardware, dtype, device, tuple(layer_type), fusion, runtime, fusion_plan, quality, layout,
                   tuned, allow_long_context, tuple(dim), attention_kernel, attention_dropout, out)
    with collector_paused():
        a, overrides = _analysis(req, shape, step, lay)
        _report(a, overrides, rows, out, store, no_store)


@dataclass(frozen=True)
class _Request:
    """The options that say what to analyse and how, as parsed (checked by ``_analysis`` in the order below)."""

    model: str
    hardware: str
    dtype: str
    device: str
    layer_type: tuple[str, ...]
    fusion: str | None
    runtime: str
    fusion_plan: Path | None
    quality: Path | None
    layout: str
    tuned: bool
    allow_long_context: bool
    dim: tuple[str, ...]
    attention_kernel: str | None
    attention_dropout: float | None
    out: Path | None


def _analysis(req: _Request, shape: Shape, step: Phase, lay: Layout):
    """(the analysis, laid over the layout's devices, with its runtime and figures; the layer-type overrides).
    Checked in this order, each before the work it guards: the hardware name, the overrides and the output
    folder here; the device, model, shape and dtype by the loader before it builds; the dtype on this
    hardware, the fusion policy and the plan file by opmap.analyze.analyze before it captures."""
    from opmap.capture import parse_overrides
    from opmap.report.sheet import check_out_dir

    hw = stack_hardware(req.hardware, req.attention_kernel, req.attention_dropout)
    overrides = parse_overrides(list(req.layer_type))
    if req.out is not None:
        check_out_dir(req.out)
    dims = _onnx_options(req.model, list(req.dim), step.name, req.layout, shape.image_size)
    spec = step.spec(req.model, shape.batch, req.allow_long_context)
    rt, fusion = RuntimeChoice(req.runtime, req.fusion, req.fusion_plan).resolve(hw, spec)
    spec = replace(spec, kv_write=rt.kv_write)  # a Hugging Face decode stores its new K and V as the runtime does
    par = lay.parallelism(spec, shape.batch)
    if req.tuned and (spec.name != "prefill" or hw.name != "local"):
        raise OpmapError("--tuned applies the choices `opmap tune` measured on this CPU: it takes --hardware local "
                         "and the prefill phase")
    m = Model(req.model, req.dtype, req.device, req.layout, overrides, req.allow_long_context, dims, status)
    fmt = resolve_dtype(hw, req.dtype).format  # the evidence is the format's (--dtype fp4 names one per device)
    evidence = lambda name: _evidence(req.quality, name, fmt)  # noqa: E731
    if spec.name != "prefill":
        a = m.phase(spec, shape, hw, rt, fusion, req.fusion_plan, evidence).analysis
    else:
        from opmap.phases.runtime import with_runtime
        from opmap.phases.step import with_figures

        # a zoo model captured on meta before, at these shapes and this build dtype, is not built or captured
        # again (opmap.capture.cache: keyed by the inputs, the opmap and torch versions and the model and tracer
        # sources)
        a = m.prefill(shape, rt.apply(hw), fusion, req.fusion_plan, evidence)
        if req.tuned:
            from opmap.explore.tune.tuned import tuned_analysis

            a = tuned_analysis(a)
        a = with_figures(with_runtime(a, rt))
    from opmap.phases.runtime import with_confidence

    return with_confidence(_sharded(a, par), _group(par, spec.name)), overrides


def _group(par, phase: str) -> int:
    """The devices a collective of the step spans: a training step's gradients over every device, an inference
    step's tensor / pipeline group, or its expert-parallel all-to-all where that is wider."""
    if par is None:
        return 1
    return par.devices if phase == "train" else max(par.tp * par.pp, par.ep)


def _sharded(a, par):
    """The analysis laid out over the devices of ``par`` (when there are several)."""
    if par is not None and (par.devices > 1 or par.ep > 1):
        from opmap.phases.sharded import shard_analysis

        return shard_analysis(a, par)
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


def _report(a, overrides, rows: int, out: Path | None, store: Path | None = None, no_store: bool = False) -> None:
    """Print and write the analysis; record it in the run store."""
    from opmap.report.sheet import print_report, write_outputs

    warn_unmatched_overrides(overrides, a.graph)
    print_report(a, console, rows)
    if out is not None:
        print_wrote(write_outputs(a, out))
    if not no_store:
        from opmap.cli.common import record_run
        from opmap.store.db import analysis_tags

        d = a.to_dict(nodes=False)
        d["graph_hash"] = graph_hash(a.graph)
        record_run("analyze", d, analysis_tags(d), store, no_store)


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
    if q.workload != workload or q.dtype != dtype:
        raise OpmapError(f"quality file {path} is for {q.workload} at {q.dtype}, not {workload} at {dtype}")
    # quality.json before the "weights" key: the zoo's weights were random, a model file's its own
    weights = q.weights if q.weights is not None else ("random" if ":" not in workload
                                                       else "as the model file builds them")
    on = "on random weights" if weights == "random" else f"on weights {weights}"
    return (f"verified {on} by {path}: relative error {q.rel_error:.3g}, {q.agreement_kind} {q.agreement:.1%} "
            "against fp32")
