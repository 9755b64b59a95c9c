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
    """The training step's loss, on the first floating-point output. Scores over classes (a [N, C] output) or
    over a vocabulary (a language model's [B, S, V] logits) take the task's loss: cross-entropy in fp32 against
    class 0 (Megatron's vocab-parallel and HF's losses cast the logits to fp32 first; with a 131k vocabulary and a
    small width the softmax, its backward and the casts move as many bytes as a layer). Any other output takes
    the mean in fp32, a stand-in. Shared by the capture and the measured step, so both run the same work."""
    first = next((x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor) and x.is_floating_point()), None)
    if first is None:
        raise OpmapError("the model's output holds no floating-point tensor to train on")
    if first.dim() in (2, 3) and first.shape[-1] > 1 and first.numel() > 0:
        scores = first.float().flatten(0, -2)
        target = torch.zeros(scores.shape[0], dtype=torch.long, device=scores.device)
        return torch.nn.functional.cross_entropy(scores, target)
    return first.float().mean()


def sgd_step(params: Sequence[torch.Tensor], lr: float = 1e-3) -> None:
    """Plain SGD, one in-place update per parameter (what torch.optim.SGD(foreach=False) runs)."""
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)
                p.grad = None


OPTIMIZERS = ("adamw", "adamw-fused", "sgd")


class AdamW:
    """AdamW (Loshchilov & Hutter 2019) as torch.optim.AdamW(foreach=False) runs it per parameter, with fp32
    master weights under mixed precision (a bf16 / fp16 model: the update runs on an fp32 copy of each weight,
    then the weight is cast back), the moments in fp32. The state is made when the optimizer is made (outside a
    capture); ``step`` runs, per parameter: grad to fp32, decoupled weight decay, the first moment (lerp), the
    second (mul, addcmul), sqrt, divide by the bias correction, add eps, addcdiv into the master weight, copy
    back: about ten elementwise ops, memory-bound. Bias corrections are host scalars (capturable=False)."""

    def __init__(self, params: Sequence[torch.Tensor], lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, fused: bool = False):
        self.params = list(params)
        self.fused = fused
        self.lr, self.betas, self.eps, self.wd = lr, betas, eps, weight_decay
        self.t = 0
        with torch.no_grad():
            self.master = [p.detach().float() if p.dtype != torch.float32 else None for p in self.params]
            self.m = [torch.zeros_like(p, dtype=torch.float32) for p in self.params]
            self.v = [torch.zeros_like(p, dtype=torch.float32) for p in self.params]

    def step(self) -> None:
        self.t += 1
        if self.fused:
            return self._fused_step()
        b1, b2 = self.betas
        bc1, bc2 = 1 - b1 ** self.t, 1 - b2 ** self.t
        with torch.no_grad():
            for p, w, m, v in zip(self.params, self.master, self.m, self.v):
                if p.grad is None:
                    continue
                g = p.grad.float() if p.grad.dtype != torch.float32 else p.grad
                w32 = p if w is None else w
                w32.mul_(1 - self.lr * self.wd)
                m.lerp_(g, 1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = (v.sqrt() / bc2 ** 0.5).add_(self.eps)
                w32.addcdiv_(m, denom, value=-self.lr / bc1)
                if w is not None:
                    p.copy_(w32)
                p.grad = None

    def _fused_step(self) -> None:
        """The fused update (torch.optim.AdamW(fused=True), apex / Megatron FusedAdam): one multi-tensor kernel
        (aten._fused_adamw_) reads each fp32 master weight, gradient and both moments once and writes the weight
        and the moments back. Under mixed precision the gradients are cast to fp32 first and the updated master
        weights cast back into the model's weights (Megatron keeps fp32 main gradients and copies main params
        to model params the same way)."""
        with torch.no_grad():
            live = [(p, w, m, v) for p, w, m, v in zip(self.params, self.master, self.m, self.v) if p.grad is not None]
            if not live:
                return
            w32 = [p if w is None else w for p, w, _, _ in live]
            grads = [p.grad.float() if p.grad.dtype != torch.float32 else p.grad for p, _, _, _ in live]
            steps = [torch.tensor(float(self.t), device=p.device) for p, _, _, _ in live]
            torch._fused_adamw_(w32, grads, [m for _, _, m, _ in live], [v for _, _, _, v in live], [], steps,
                                lr=self.lr, beta1=self.betas[0], beta2=self.betas[1], weight_decay=self.wd,
                                eps=self.eps, amsgrad=False, maximize=False)
            for p, w, _, _ in live:
                if w is not None:
                    p.copy_(w)
                p.grad = None
