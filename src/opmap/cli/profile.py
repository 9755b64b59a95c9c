"""``opmap profile``: run a model for real, attribute the measured time to its nodes, join the prediction."""

from __future__ import annotations

from pathlib import Path

import typer

from opmap.cli.common import (
    build_workload,
    console,
    print_wrote,
    progress_bar,
    result_only_on_stdout,
    status,
    warn_unmatched_overrides,
)
from opmap.cli.common import hardware as get_hardware
from opmap.precision import RUNNABLE
from opmap.validate import INT_GE0, INT_GE1, json_text, options, visible


def profile(
    model: str = typer.Argument(..., help="A zoo name (opmap models list), path/to/file.py:factory, "
                                          "path/to/config.json, hf:NAME or path/to/model.onnx (run in "
                                          "onnxruntime)."),
    device: str = typer.Option("cpu", help="Where it runs: cpu or cuda."),
    hardware: str = typer.Option("local", "--hardware", "-H",
                                 help="Profile the prediction uses: local (calibrated; made on first use), "
                                      "local-cuda, a catalog name or a .toml file."),
    datasheet: str | None = typer.Option(None, help="Catalog entry for the datasheet MFU (CUDA: matched "
                                                       "by device name)."),
    batch: int = typer.Option(1, help="Batch size."),
    seq: int | None = typer.Option(None, help="Sequence length for text models (default: the model's)."),
    image_size: int | None = typer.Option(None, help="Image side in pixels for vision models."),
    dtype: str = typer.Option("fp32", help=f"Precision: {', '.join(RUNNABLE)}."),
    warmup: int = typer.Option(3, help="Untimed iterations first."),
    iters: int = typer.Option(20, help="Timed iterations (the latency distribution)."),
    profile_iters: int = typer.Option(5, help="Iterations under torch.profiler (the attribution)."),
    out: Path | None = typer.Option(None, help="Write profile.json, sheet.csv, sheet.md, trace.json, "
                                                  "torch_trace.json here."),
    layer_type: list[str] = typer.Option([], "--layer-type", help="Override: GLOB=TYPE on the module path."),
    rows: int = typer.Option(20, help="Nodes shown in the terminal (0: all)."),
    train: bool = typer.Option(False, help="Profile a training step (forward, loss, backward, the --optimizer's "
                                           "update)."),
    optimizer: str | None = typer.Option(None, help="With --train: the update the measured step runs and the "
                                                    "prediction prices, alike: adamw (default; torch.optim.AdamW's "
                                                    "update, two fp32 moments a parameter), adamw-fused or sgd."),
    store: Path | None = typer.Option(None, "--store", help="Run store file (default $OPMAP_STORE)."),
    no_store: bool = typer.Option(False, "--no-store", help="Do not record this run in the run store."),
    dim: list[str] = typer.Option([], "--dim", help="ONNX: bind a dynamic dim, NAME=VALUE (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print profile.json on stdout instead of the report (the "
                                                       "progress and every other line on stderr)."),
) -> None:
    """Run MODEL for real, attribute measured time to every node, join it to the prediction."""
    with result_only_on_stdout(as_json):
        d = _profile(model, device, hardware, datasheet, batch, seq, image_size, dtype, warmup, iters, profile_iters,
                     out, layer_type, rows, train, optimizer, store, no_store, dim, as_json)
    if as_json:
        print(json_text(d, indent=1))


def _profile(model: str, device: str, hardware: str, datasheet: str | None, batch: int, seq: int | None,
             image_size: int | None, dtype: str, warmup: int, iters: int, profile_iters: int, out: Path | None,
             layer_type: list[str], rows: int, train: bool, optimizer: str | None, store: Path | None,
             no_store: bool, dim: list[str], as_json: bool) -> dict:
    """The command's work; returns profile.json's document."""
    from opmap.capture import parse_overrides
    from opmap.cli.calibrate import run_calibration
    from opmap.hardware.local import cache_path
    from opmap.measure import run_profile
    from opmap.measure.oom import refusal_as_error
    from opmap.measure.run import check_profile
    from opmap.report.profile_sheet import print_profile_report, write_profile_outputs
    from opmap.report.sheet import check_out_dir

    # The device and dtype (run_profile's own check), the counts, the output folder, a named datasheet, and a zoo
    # model's shape and the memory it needs fail before the build; the loader checks a user's model and its shape
    # before it builds; and the model is built (a file that is missing or wrong refused) before a first-use
    # calibration, which takes a minute.
    options({**{k: (v, INT_GE1) for k, v in (("--batch", batch), ("--seq", seq), ("--image-size", image_size),
                                             ("--iters", iters), ("--profile-iters", profile_iters))},
             "--warmup": (warmup, INT_GE0), "--rows": (rows, INT_GE0)})
    check_profile(device, dtype)
    optimizer = _check_optimizer(optimizer, train)
    if out is not None:
        check_out_dir(out)
    ds = get_hardware(datasheet) if datasheet else None
    if hardware.strip().lower() == "local" and device == "cuda":
        hardware = "local-cuda"
    first_use = hardware.strip().lower() in ("local", "local-cuda") and not cache_path(device).exists()
    hw = None if first_use else get_hardware(hardware)  # read after its first-use calibration
    overrides = parse_overrides(layer_type)
    what = f"profile of {model} at batch {batch}" + (f" x seq {seq}" if seq else "") + \
        (f" x image {image_size}" if image_size else "")
    _refuse_what_cannot_fit(model, batch, seq, image_size, dtype, device, what)
    onnx_path = _onnx_checks(model, dim, dtype, train, image_size)
    with refusal_as_error(what, device):
        w = build_workload(model, batch, seq, image_size, dtype, device, dims=_dims(dim), overrides=overrides)
    if first_use:
        console.print(f"no calibration for {device} yet ({visible(cache_path(device))}): running opmap calibrate "
                      "first", markup=False, highlight=False, soft_wrap=True)
        run_calibration(device)
    hw = hw or get_hardware(hardware)
    with refusal_as_error(what, device), progress_bar() as bar:
        task = bar.add_task("starting", total=warmup + iters + profile_iters)
        tick = lambda stage, n: bar.update(task, advance=n, description=stage)  # noqa: E731
        if onnx_path is not None:
            from opmap.measure.onnx_run import run_onnx_profile

            p = run_onnx_profile(w, onnx_path, hw, dtype, device, warmup=warmup, iters=iters,
                                 profile_iters=profile_iters, datasheet=ds, progress=tick)
        else:
            p = run_profile(w, hw, dtype, device, warmup=warmup, iters=iters, profile_iters=profile_iters,
                            overrides=overrides, datasheet=ds, train=train, optimizer=optimizer, progress=tick)
    warn_unmatched_overrides(overrides, p.analysis.graph)
    d = p.to_dict()
    if not as_json:
        print_profile_report(p, console, rows, d)
    if out is not None:
        print_wrote(write_profile_outputs(p, out, d))
    if not no_store:
        from opmap.cli.common import record_run
        from opmap.store.db import analysis_tags

        # the raw per-iteration latencies go with the run: opmap compare's rank test reads them
        record_run("profile", {**d, "samples": {"latency_s": list(p.latency.times_s)}}, analysis_tags(d), store,
                   no_store)
    return d


def _check_optimizer(optimizer: str | None, train: bool) -> str:
    """The training step's optimizer (adamw unless named); refused without --train or unknown."""
    from opmap.capture.training import OPTIMIZERS
    from opmap.errors import OpmapError

    if optimizer is not None and not train:
        raise OpmapError("--optimizer names a training step's update: add --train (inference runs no optimizer)")
    if optimizer is not None and optimizer not in OPTIMIZERS:
        raise OpmapError(f"unknown optimizer {optimizer!r}; accepted: {', '.join(OPTIMIZERS)}")
    return optimizer or "adamw"


def _dims(dim: list[str]) -> dict[str, int]:
    from opmap.workloads.onnx import parse_dims

    return parse_dims(dim)


def _onnx_checks(model: str, dim: list[str], dtype: str, train: bool, image_size: int | None) -> Path | None:
    """An ONNX model's path, its options checked (onnxruntime runs the file's own types, inference only); None for
    any other model."""
    from opmap.errors import OpmapError
    from opmap.workloads.onnx import is_onnx_target, read_model, stored_format

    if not is_onnx_target(model):
        if dim:
            raise OpmapError("--dim binds an ONNX model's dynamic dims; accepted with path/to/model.onnx only")
        return None
    _dims(dim)
    if train or image_size is not None:
        raise OpmapError("an ONNX model is profiled as its graph runs (inference, its own shapes): drop --train and "
                         "--image-size, bind dynamic dims with --dim NAME=VALUE")
    path = Path(model)
    stored = stored_format(read_model(path))
    if dtype != stored and not (dtype == "tf32" and stored == "fp32"):
        raise OpmapError(f"{path.name} stores its weights in {stored} and onnxruntime runs them so: profile it with "
                         f"--dtype {stored}")
    return path


def _refuse_what_cannot_fit(model: str, batch: int, seq: int | None, image_size: int | None, dtype: str,
                            device: str, what: str) -> None:
    """A zoo model's meta capture at the requested shape (from the capture cache where analyze or an earlier
    profile made it) gives a floor on the bytes the real run needs (opmap.measure.oom.run_bytes: the weights and
    the largest operator's tensors), checked against the memory available now. A batch that cannot fit is
    refused in seconds, before a first-use calibration or the build, and before the OOM killer: a 20 GB
    allocation on a 24 GB host is granted, then killed as it is written. Other models (a user's file, a Hugging
    Face config) are not built twice; the allocator's refusal still becomes one line for them."""
    from opmap.api import Model, Shape
    from opmap.measure.oom import check_fits, run_bytes
    from opmap.precision import build_bytes
    from opmap.workloads import MODELS

    if model not in MODELS:
        return
    graph = Model(model, dtype, status=status).prefill_graph(Shape(batch, seq, image_size))[0]
    check_fits(run_bytes(graph, float(build_bytes(dtype))), what, device)
