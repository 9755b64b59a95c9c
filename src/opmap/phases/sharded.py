"""A phase's figures under a layout over several devices (opmap.mapping.sharding)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opmap.phases.runtime import runtime_text

if TYPE_CHECKING:
    from opmap.analyze import Analysis


def sharded_phase_figures(fig: dict[str, Any], sh, a: Analysis) -> dict[str, Any]:
    """A phase's figures under a layout over several devices (``opmap.mapping.sharding.Sharded``): the
    iteration (train) or step (decode, prefill) time is the sharded one, collectives and pipeline bubble
    included; model FLOPs stay the model's, spread over every device for MFU and HFU."""
    p = sh.parallelism
    out = dict(fig, devices=p.devices, layout=p.label())
    peak = a.precision.matrix_peak_flops_per_s
    if fig.get("name") == "train":
        it = sh.step_s
        # the captured step is one microbatch on one replica: the whole iteration runs global_batch sequences
        per_micro = fig["model_flops"] / max(1, fig["microsteps"])
        model = per_micro * (p.global_batch or p.microbatch * p.dp) / fig["microbatch"]
        hw_flops = fig["hardware_flops"] / max(1, fig["microsteps"]) * (p.global_batch or p.microbatch * p.dp) \
            / fig["microbatch"]
        mf = model / (it * p.devices) if it else 0.0
        hf = hw_flops / (it * p.devices) if it else 0.0
        tokens = sh.tokens
        out.update(iteration_s=it, tokens_per_s=tokens / it if it else 0.0, model_flops=model,
                   hardware_flops=hw_flops, model_flops_per_s_per_device=mf, hardware_flops_per_s_per_device=hf,
                   mfu=mf / peak, hfu=hf / peak, global_batch=p.global_batch, dp=p.dp,
                   microsteps=p.microbatches, bubble_fraction=sh.bubble_fraction)
        out["text"] = (f"train on {p.devices} devices ({p.label()}): iteration {it * 1e3:.4g} ms, "
                       f"{out['tokens_per_s']:.4g} tok/s, MFU {mf / peak:.1%}, HFU {hf / peak:.1%}, pipeline bubble "
                       f"{sh.bubble_fraction:.1%}")
        if p.cp > 1:  # per microbatch on the slowest stage: the K/V ring's sends and the part not overlapped
            out.update(cp_exchange_s=sh.cp_exchange_s, cp_exposed_s=sh.cp_exposed_s)
            out["text"] += (f", CP ring {sh.cp_exchange_s * 1e3:.3g} ms per microbatch "
                            f"({sh.cp_exposed_s * 1e3:.3g} ms exposed)")
    elif fig.get("name") == "decode":
        seqs = int(a.assumptions.get("batch") or 1) * p.dp
        lat = sh.latency_s + a.runtime_per_step_s
        out.update(tpot_s=lat, tokens_per_s=seqs / lat if lat else 0.0, kernel_time_s=sh.latency_s)
        out["text"] = (f"decode on {p.devices} devices ({p.label()}): {lat * 1e3:.4g} ms per output token, "
                       f"{out['tokens_per_s']:.4g} tok/s{runtime_text(a)}")
    else:
        lat = sh.latency_s + a.runtime_per_step_s
        out.update(ttft_s=lat, kernel_time_s=sh.latency_s)
        out["text"] = (f"prefill on {p.devices} devices ({p.label()}): time to first token {lat * 1e3:.4g} ms"
                       f"{runtime_text(a)}")
    return out
