"""The training step a training capture records and a training profile runs: the loss and the update.

Both sides (capture(train=True) on meta, run_profile(train=True) on the device) use these two functions, so
the captured step and the measured step are the same work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from opmap.errors import OpmapError


def training_loss(out: Any) -> torch.Tensor:
    """The training step's loss: the mean of the first floating-point output, in fp32. A stand-in for a
    task loss (cross-entropy adds a softmax over the output, small beside the model), the same on every
    run so measured and captured steps match."""
    first = next((x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor) and x.is_floating_point()), None)
    if first is None:
        raise OpmapError("the model's output holds no floating-point tensor to train on")
    return first.float().mean()


def sgd_step(params: Sequence[torch.Tensor], lr: float = 1e-3) -> None:
    """Plain SGD, one in-place update per parameter (what torch.optim.SGD(foreach=False) runs)."""
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)
                p.grad = None
