"""``opmap calibrate --from-bench RUN [--from-bench RUN ...]``: a serving stack's profile fitted to measured bench
runs (opmap.bench.stack_fit), written for ``--stack PROFILE``; the residuals before and after printed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rich.table import Table

from opmap.cli.common import console, progress_console
from opmap.errors import OpmapError
from opmap.report.text import plain, safe
from opmap.validate import visible

MAX_RUNS = 64


def _launched_setting(runs, key: str):
    """A launched server's setting, the same in every run (None where no run was launched); runs of different
    servers are refused: one profile is one stack."""
    vals = {getattr(r.launched, key) for r in runs if r.launched is not None}
    vals.discard(None)
    if len(vals) > 1:
        raise OpmapError(f"--from-bench: the runs' servers differ in {key} ({', '.join(map(str, sorted(vals)))}): "
                         "a profile is fitted to one stack")
    return vals.pop() if vals else None


def calibrate_stack(runs_in: list[Path], out: Path, config: str | None, hardware: str | None, dtype: str | None,
                    runtime: str) -> Path:
    """Read the runs, price the model, fit, print and write the profile (the module docstring)."""
    from opmap.bench.predict import engine_policy
    from opmap.bench.run_files import read_run
    from opmap.bench.stack_fit import Params, Run, fit, profile
    from opmap.calibrate.stack_profile import write_stack_profile
    from opmap.cli import bench_predict as bp

    if not 1 <= len(runs_in) <= MAX_RUNS:
        raise OpmapError(f"--from-bench takes 1 to {MAX_RUNS} run folders, got {len(runs_in)}")
    runs = [read_run(p) for p in runs_in]
    config = config or _launched_setting(runs, "config")
    if config is None:
        raise OpmapError("--from-bench on runs against a URL needs --config (the served model's Hugging Face config)")
    launched = any(r.launched is not None for r in runs)
    hardware = hardware or ("local" if launched else None)
    if hardware is None:
        raise OpmapError("--from-bench on runs against a URL needs --hardware (the catalog device it runs on)")
    dtype = dtype or (_launched_setting(runs, "dtype") if launched else None) or "bf16"
    tokens, page = _launched_setting(runs, "max_batch_tokens"), _launched_setting(runs, "page_tokens")
    kv_blocks, kv_tokens = _launched_setting(runs, "kv_blocks"), _launched_setting(runs, "kv_tokens")
    policy = engine_policy(tokens or 8192, page or 16)
    cost = bp.price(config, hardware, dtype, runtime, None)
    if kv_tokens:
        cost = replace(cost, kv_capacity_tokens=int(kv_tokens))
    fit_runs = [Run.of(r.folder.name, r.result) for r in runs]
    with progress_console.status("fitting the stack: simulating the runs") as st:
        n = [0]

        def tick():
            n[0] += 1
            if n[0] % 10 == 0:
                st.update(f"fitting the stack: {n[0]} simulations of the {len(runs)} runs")
        p, evals = fit(fit_runs, cost, policy, progress=tick)
    prof = profile(fit_runs, cost, policy, p, device=hardware, model=config, dtype=dtype, runtime=runtime,
                   kv_blocks=kv_blocks, page_tokens=page, max_batch_tokens=tokens, before=Params())
    write_stack_profile(prof, out)
    console.print(_residual_table(prof), highlight=False)
    console.print(safe(prof.line()) + f" ({evals} simulations)", highlight=False)
    console.print(f"wrote {visible(out)}; use it with --stack {visible(out)}", markup=False, highlight=False,
                  soft_wrap=True)
    return out


def _residual_table(prof) -> Table:
    t = Table(title="predicted / measured, before (the model alone) and after the fit")
    for c in ("run", "figure", "before", "after"):
        t.add_column(c, justify="left" if c in ("run", "figure") else "right")
    fmt = lambda v: "-" if v is None else f"{v:.3f}"
    for r in prof.residuals:
        t.add_row(plain(r.run), r.figure, fmt(r.before), fmt(r.after))
    return t
