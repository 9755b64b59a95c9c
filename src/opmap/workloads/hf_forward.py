"""Wrappers around the forward of a model transformers built from a config (opmap.workloads.hf), each a method bound
to the module it runs on (``wrap_forward``), so a copy of the model runs its own weights:

- ``mark_eager_kv``: eager attention (a class with no SDPA attention in transformers) marks its K and V as the KV
  cache each layer holds, as an SDPA call's K and V are read;
- ``errors_named``: an error inside transformers' code on the inputs opmap built is one line naming opmap's gap;
- ``answer_packing_probe``: the mask builder's packed-sequence probe answered on meta position ids as transformers
  answers it for one unpacked sequence per row.
"""

from __future__ import annotations

import contextlib
import functools
import types

import torch

from opmap.errors import OpmapError
from opmap.workloads.hf_config import first_line


def wrap_forward(model: torch.nn.Module, around) -> None:
    """Replace ``model.forward`` by ``around(call, *args, **kwargs)``, ``call`` the forward it replaces bound, at call
    time, to the module it is called on: a bound method of the model, not a closure over it, so a copy of the model
    (``copy.deepcopy``: opmap quality's reduced-precision twin) runs its own weights, not the original's."""
    inner = model.__dict__.get("forward")  # an earlier wrapper (a method of the model) or none: the class's
    if inner is not None and not isinstance(inner, types.MethodType):
        def call_of(_self, f=inner):
            return f  # a foreign plain callable: called as it is (it may close over the original)
    else:
        fn = inner.__func__ if inner is not None else type(model).forward

        def call_of(self, f=fn):
            return types.MethodType(f, self)

    @functools.wraps(type(model).forward)
    def forward(self, *args, **kwargs):
        return around(call_of(self), *args, **kwargs)

    model.forward = types.MethodType(forward, model)


def mark_eager_kv(model: torch.nn.Module) -> bool:
    """Wrap the model's forward so that, while it runs, each transformers modeling module's
    ``eager_attention_forward`` (which its attention layers call by name, as their default) first marks its K and
    V (B, H_kv, S, D) as the layer's KV cache (opmap.capture.functions.kv_cache), then runs unchanged. False where
    no module of the model has one."""
    import sys

    from opmap.capture.functions import kv_cache

    where = {sys.modules.get(type(m).__module__) for m in model.modules()}
    owners = [mod for mod in where if callable(getattr(mod, "eager_attention_forward", None))]
    if not owners:
        return False

    def marked(original):
        @functools.wraps(original)
        def eager(module, query, key, value, *args, **kwargs):
            kv_cache(key, value, is_causal=bool(getattr(module, "is_causal", True)))
            return original(module, query, key, value, *args, **kwargs)
        return eager

    def wrapped(forward, *args, **kwargs):
        originals = [(mod, mod.eager_attention_forward) for mod in owners]
        try:
            for mod, original in originals:
                mod.eager_attention_forward = marked(original)
            return forward(*args, **kwargs)
        finally:
            for mod, original in originals:
                mod.eager_attention_forward = original

    wrap_forward(model, wrapped)
    return True


def errors_named(model: torch.nn.Module, where: str, cls: str, version: str, accepted: str) -> None:
    """Wrap the model's forward so that an error inside transformers' code, run on inputs opmap built, is one line
    that says so: opmap's inputs or patches for this family and transformers version, not the user's config (the
    config was checked and transformers built it), with the transformers ``version`` and what is ``accepted``
    (opmap.workloads.hf's tested families). The meta device's own limits (MetaCaptureError) pass as they are."""
    from opmap.capture import MetaCaptureError, ModelForwardError

    def wrapped(forward, *args, **kwargs):
        try:
            return forward(*args, **kwargs)
        except MetaCaptureError:
            raise
        except torch.OutOfMemoryError:
            raise  # the allocator's refusal on a real device: the size asked for (opmap.measure.oom)
        except (ModelForwardError, TypeError, ValueError, AttributeError, IndexError, KeyError, RuntimeError) as e:
            if "can't allocate memory" in str(e):
                raise
            detail = str(e) if isinstance(e, ModelForwardError) else first_line(e)
            detail = detail.split(". This is an error in the model")[0]
            raise OpmapError(f"{where}: transformers {version}'s {cls} fails on the inputs opmap built for it "
                             f"({detail[:400]}); the config was accepted, so this is a gap in opmap's "
                             f"support for this family and transformers version, not an error in the config; "
                             f"accepted: {accepted}") from None

    wrap_forward(model, wrapped)


def answer_packing_probe(model: torch.nn.Module) -> bool:
    """Wrap the model's forward so that, for meta position ids, the mask builder's packed-sequence probe gets
    the answer transformers gives for one unpacked sequence per row (None). False where this transformers has
    no such probe."""
    try:
        from transformers import masking_utils
    except ImportError:
        return False
    if not hasattr(masking_utils, "find_packed_sequence_indices"):
        return False
    def wrapped(forward, *args, **kwargs):
        with _packing_probe_answered(masking_utils):
            return forward(*args, **kwargs)

    wrap_forward(model, wrapped)
    return True


@contextlib.contextmanager
def _packing_probe_answered(masking_utils):
    original = masking_utils.find_packed_sequence_indices

    def probe(position_ids, *args, **kwargs):
        if isinstance(position_ids, torch.Tensor) and position_ids.device.type == "meta":
            return None
        return original(position_ids, *args, **kwargs)

    masking_utils.find_packed_sequence_indices = probe
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original
