"""Activation layouts: a workload as built (NCHW) or run channels-last (NHWC)."""

from __future__ import annotations

from dataclasses import replace

import torch

from opmap.errors import OpmapError
from opmap.workloads.zoo import Workload

LAYOUTS = ("nchw", "channels_last")


class _ChannelsLast(torch.nn.Module):
    """Runs ``inner`` with 4-D activations in channels-last (NHWC) memory order. The conversion of the
    inputs is part of the forward pass, so it shows in the graph as the layout-transform kernel it is; the
    weights are converted once, ahead of time, as a deployment would store them."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner.to(memory_format=torch.channels_last)

    def forward(self, *args, **kwargs):
        def conv(x):
            if isinstance(x, torch.Tensor) and x.dim() == 4 and x.is_floating_point():
                return x.contiguous(memory_format=torch.channels_last)
            return x
        return self.inner(*[conv(a) for a in args], **{k: conv(v) for k, v in kwargs.items()})


def with_layout(w: Workload, layout: str) -> Workload:
    """The workload in ``layout``: nchw as built, or channels_last (NHWC) for convolutional models."""
    if layout not in LAYOUTS:
        raise OpmapError(f"unknown layout {layout!r}; accepted: {', '.join(LAYOUTS)}")
    if layout == "nchw":
        return w
    return replace(w, module=_ChannelsLast(w.module),
                   assumptions=(*w.assumptions,
                                "layout: channels_last (NHWC) activations, weights stored channels-last"))
