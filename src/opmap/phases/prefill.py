"""Prefill: the prompt's forward pass, priced as time to first token."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opmap.phases.common import dominant_bound, kernel_times
from opmap.phases.runtime import runtime_text

if TYPE_CHECKING:
    from opmap.analyze import Analysis


def prefill_figures(a: Analysis) -> dict[str, Any]:
    """The prefill pass: time to first token = its kernels (``predicted_latency_s``) + the runtime's per-step
    time."""
    step = a.runtime_per_step_s
    lat = a.predicted_latency_s + step
    bound = dominant_bound([(b, t) for _, b, t in kernel_times(a)])
    return {"name": "prefill", "ttft_s": lat, "bound": bound, "kernel_time_s": a.predicted_latency_s,
            "runtime_per_step_s": step, "kernels": a.kernels,
            "text": f"prefill: time to first token {lat * 1e3:.4g} ms ({bound}-bound{runtime_text(a)})"}
