"""Layer types: which part of a network each operator belongs to.

The rule, in order (first that applies wins):

1. A user override: ``PATTERN=TYPE`` where PATTERN is a glob on the module path (``h.*.attn.*``). Overrides
   are tried in the order given; the path matched is the innermost module of the op.
2. The module stack, innermost module first. Each module is looked up by its class name, then by its
   attribute name (the last part of its path), in ``RULES``. A *decisive* match gives the type. Generic
   containers and layers that take their meaning from where they sit (Linear, Dropout, Sequential,
   activation modules) decide by attribute name only (``lm_head``, ``fc``), so ``h.3.attn.c_attn`` (a Linear)
   is attention because of ``attn``.
   Names are matched as whole words separated by ``.``/``_`` or by case (``SelfAttention`` has ``attention``).
3. No module decides: the operator decides. Pointwise ops are ``elementwise``, copies, concatenations and
   views are ``data_movement``, anything else is ``other``.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence

from opmap.errors import OpmapError

LAYER_TYPES = (
    "embedding", "attention", "mlp", "norm", "conv", "pooling", "head", "moe_router", "moe_expert",
    "elementwise", "data_movement", "other",
)

# (class-name regex, attribute-name regex, layer type). Class regexes are matched against the class name,
# attribute regexes against the module's own name (last path part). Order matters: more specific first.
RULES: tuple[tuple[str | None, str | None, str], ...] = (
    # Mixture of experts: experts before the router, the router before the MoE block that owns dispatch.
    (r"(?i)expert", r"(?i)^experts?$|^expert_?\d*$", "moe_expert"),
    (r"(?i)router|topkgate", r"(?i)^router$", "moe_router"),
    # the MoE block by the end of its class name: a family's own name may hold "Moe" (Qwen3MoeAttention,
    # Qwen3MoeRMSNorm are attention and norm, not the block)
    (r"(?i)(moe|mixtureofexperts|sparse\w*block)$", None, "moe_router"),
    (r"(?i)embedding", r"(?i)^(wte|wpe|embed.*|tok_embeddings|.*_embeddings?|patch_embed)$",
     "embedding"),
    (r"(?i)norm$|^LayerNorm|^RMSNorm|^GroupNorm|^BatchNorm|^InstanceNorm|^LocalResponseNorm",
     r"(?i)^(ln_?\w*|.*norm.*|bn\d*)$", "norm"),
    (r"^Conv(Transpose)?[123]d$|^LazyConv", None, "conv"),
    (r"(?i)pool(ing)?(\dd)?$", r"(?i)^(avg|max)?pool$", "pooling"),
    (r"(?i)attention|^MultiheadAttention$|attn$", r"(?i)^(self_)?attn$|^attention$|^self_attention$|^mha$",
     "attention"),
    (r"(?i)mlp|feedforward|^FFN|swiglu", r"(?i)^(mlp|ffn|feed_forward|ff|intermediate)$", "mlp"),
    (r"(?i)head$|classifier", r"(?i)^(lm_head|head|heads|classifier|fc|pooler)$", "head"),
)

# Module classes that never decide a layer type on their own.
GENERIC_CLASSES = re.compile(
    r"^(Linear|LazyLinear|Bilinear|Identity|Dropout\d?d?|Sequential|ModuleList|ModuleDict|"
    r"ReLU|ReLU6|GELU|SiLU|Tanh|Sigmoid|Softmax|LogSoftmax|Mish|Hardswish|Hardsigmoid|LeakyReLU|ELU|Flatten|"
    r"Unflatten|NonDynamicallyQuantizableLinear)$")

_COMPILED = tuple(
    (re.compile(c) if c else None, re.compile(a) if a else None, t) for c, a, t in RULES)


def parse_overrides(items: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """Parse ``PATTERN=TYPE`` strings; a bad one raises OpmapError naming what is accepted."""
    out = []
    for item in items:
        pat, sep, typ = item.partition("=")
        if not sep or not pat or typ not in LAYER_TYPES:
            raise OpmapError(f"bad layer-type override {item!r}: expected PATTERN=TYPE with TYPE one of "
                             f"{', '.join(LAYER_TYPES)}")
        out.append((pat, typ))
    return tuple(out)


def unmatched_overrides(overrides: Sequence[tuple[str, str]], module_paths: Iterable[str]) -> list[str]:
    """The ``PATTERN=TYPE`` overrides whose pattern matches none of ``module_paths`` (the innermost module
    paths of a capture's ops, which is what ``classify`` matches)."""
    paths = set(module_paths)
    return [f"{pat}={typ}" for pat, typ in overrides if not any(fnmatch.fnmatchcase(m, pat) for m in paths)]


def _module_type(cls_name: str, attr: str) -> str | None:
    if not GENERIC_CLASSES.match(cls_name):
        for cre, _are, typ in _COMPILED:
            if cre is not None and cre.search(cls_name):
                return typ
    for _cre, are, typ in _COMPILED:
        if are is not None and are.match(attr):
            return typ
    return None


def classify(stack: Sequence[tuple[str, str]], op_kind: str,
             overrides: Sequence[tuple[str, str]] = ()) -> str:
    """Layer type of an op.

    ``stack`` is the module stack outermost first, as (path, class name) pairs; ``op_kind`` is the op's
    family fallback: "elementwise", "data_movement" or "other".
    """
    path = stack[-1][0] if stack else ""
    for pat, typ in overrides:
        if fnmatch.fnmatchcase(path, pat):
            return typ
    for mod_path, cls_name in reversed(stack):
        attr = mod_path.rsplit(".", 1)[-1]
        typ = _module_type(cls_name, attr)
        if typ is not None:
            return typ
    return op_kind
