"""Apply chosen mappings to a real model, so the whole-model gain is measured, not summed.

Each signature's choice goes onto the modules its nodes were called from (signatures.Signature.modules):

- a leaf nn.Linear, nn.Conv2d, nn.LayerNorm or nn.BatchNorm2d: its parameters and buffers stored in the
  chosen dtype (and a conv weight channels_last), its forward wrapped to run on the chosen thread count with
  its input cast (and converted) on entry, its output cast back to the model's dtype, and a Linear's rows cut
  into the chosen number of chunks;
- an attention module: while its forward runs, a TorchFunctionMode catches its scaled_dot_product_attention
  calls of the signature's shape and runs them with the chosen backend, dtype and threads.

Exactly what candidates.op_for times per operator, now in place in the model.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from opmap.explore.tune.candidates import Candidate, _sdpa_context, threads
from opmap.explore.tune.signatures import Signature
from opmap.precision import torch_dtype

_LEAVES = {"gemm": torch.nn.Linear, "conv": torch.nn.Conv2d, "layer_norm": torch.nn.LayerNorm,
           "batch_norm": torch.nn.BatchNorm2d}


def _leaf_forward(m: torch.nn.Module, cand: Candidate, model_dtype: torch.dtype):
    orig, ct, chunks = m.forward, torch_dtype(cand.dtype), cand.chunks
    fmt = torch.channels_last if cand.channels_last else torch.preserve_format

    def forward(x, *args, **kwargs):
        with threads(cand.threads):
            xc = x.to(dtype=ct, memory_format=fmt) if x.dim() == 4 else x.to(ct)
            if chunks > 1:
                flat = xc.reshape(-1, xc.shape[-1])
                y = torch.cat([orig(p) for p in flat.chunk(chunks)]).reshape(*xc.shape[:-1], -1)
            else:
                y = orig(xc, *args, **kwargs)
            return y.to(model_dtype)
    return forward


class _Attention(TorchFunctionMode):
    """Runs scaled_dot_product_attention calls of one shape with a candidate's backend, dtype and threads."""

    def __init__(self, sig: Signature, cand: Candidate, model_dtype: torch.dtype):
        super().__init__()
        b, h, sq, sk, d, _ = sig.shape
        self.q_shape, self.cand, self.mt, self.ct = (b, h, sq, d), cand, model_dtype, torch_dtype(cand.dtype)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention and tuple(args[0].shape) == self.q_shape:
            with threads(self.cand.threads), _sdpa_context(self.cand.sdpa):
                q, k, v = (t.to(self.ct) for t in args[:3])
                return func(q, k, v, *args[3:], **kwargs).to(self.mt)
        return func(*args, **kwargs)


def _attention_forward(m: torch.nn.Module, sig: Signature, cand: Candidate, model_dtype: torch.dtype):
    orig = m.forward

    def forward(*args, **kwargs):
        with _Attention(sig, cand, model_dtype):
            return orig(*args, **kwargs)
    return forward


def apply_choices(model: torch.nn.Module, choices: list[tuple[Signature, Candidate, Candidate]],
                  model_dtype: torch.dtype) -> list[str]:
    """Put each (signature, chosen, default) choice that differs from its default onto ``model`` in place.
    Returns one note per signature it could not apply (a module path that is not a leaf of the expected type)."""
    notes = []
    for sig, chosen, default in choices:
        if chosen == default:
            continue
        for path in sig.modules:
            try:
                m = model.get_submodule(path)
            except AttributeError:
                notes.append(f"{sig.key}: no module {path!r}")
                continue
            if sig.family == "attention":
                m.forward = _attention_forward(m, sig, chosen, model_dtype)
                continue
            if not isinstance(m, _LEAVES[sig.family]):
                notes.append(f"{sig.key}: {path or 'the model'} is a {type(m).__name__}, not a "
                             f"{_LEAVES[sig.family].__name__}: left at its default")
                continue
            m.to(torch_dtype(chosen.dtype))
            if chosen.channels_last and sig.family == "conv":
                m.to(memory_format=torch.channels_last)
            m.forward = _leaf_forward(m, chosen, model_dtype)
    return notes
