"""A model named by its Hugging Face config: ``path/to/config.json``, ``path/to/folder`` (holding config.json) or
``hf:ORG/NAME`` (a config already in the local Hugging Face cache, never a folder; nothing is ever downloaded).

The config is data, never code: it is parsed as JSON and checked field by field (opmap.workloads.hf_config) before
transformers is imported, built by transformers' own config class, and a model whose ``auto_map`` names the
repository's Python (a ``model_type`` transformers has no model class for) is refused in one line; transformers is
always called with ``trust_remote_code=False``, so it never prompts on stdin.

``transformers`` builds the model from the config alone, on ``torch.device(device)`` (meta by default: random
weights, none allocated, never the real ones), with ``attn_implementation="sdpa"`` so each attention is one
``scaled_dot_product_attention`` node, and the KV cache off (``use_cache=False``: a prefill). The inputs are
``input_ids`` of shape (batch, seq): one unpadded, unpacked sequence per row.

Two places where transformers reads a tensor's value, which the meta device does not have, are answered as
transformers itself answers them for these inputs (each recorded in the workload's assumptions):

- the packed-sequence probe of the mask builder (``masking_utils.find_packed_sequence_indices``, which calls
  ``.all()`` on the position ids): the positions are 0..seq-1 in every row, so there is no packing and the
  answer is None; attention then runs as SDPA with ``is_causal=True``, as on real tensors;
- the experts of a mixture-of-experts block (``MixtralExperts`` and its kin) loop over the experts the router
  hit (``nonzero``, ``torch.where``): on meta each expert gets an equal share of the batch*seq*top_k
  assignments (the balanced load the zoo's own Mixtral assumes), dispatched as the eager loop does it.

torch's FakeTensorMode is no substitute here: transformers treats a fake tensor as a trace, so it builds an
explicit (batch, 1, seq, seq) mask and repeats the KV heads (the graph then shows dense, masked attention that
an eager run does not do), and the expert loop still fails on ``nonzero``. ``transformers`` is imported only
inside these functions (the optional ``hf`` extra).
"""

from __future__ import annotations

import contextlib
import functools
import types
import warnings
from pathlib import Path
from typing import Any

import torch

from opmap.errors import OpmapError
from opmap.ops import active_experts
from opmap.workloads.hf_config import (
    ACCEPTED,
    TESTED,
    cached_config,
    check_work,
    config_source,
    families,
    positions,
    read_config_file,
    validate_config,
)
from opmap.workloads.zoo import Workload, cast_to, parse_dtype

__all__ = ["ACCEPTED", "TESTED", "build_hf", "cached_config", "is_hf_target", "load_config", "max_positions",
           "validate_config"]
DEFAULT_SEQ = 2048  # capped at the config's own maximum
PREFILL_NOTE = "no KV cache (prefill): use_cache=False"  # a decode step replaces it by its cache's note
_MODEL_CLASSES = ("AutoModelForCausalLM", "AutoModel")  # tried in this order: a causal LM head, else the bare model


def is_hf_target(target: str) -> bool:
    """A config.json, a folder (holding one) or hf:ORG/NAME."""
    return target.endswith(".json") or target.startswith("hf:") or Path(target).is_dir()


def _transformers():
    try:
        import transformers
    except ImportError:
        raise OpmapError("a Hugging Face config needs transformers: pip install 'opmap[hf]' "
                         "(or pip install 'transformers>=4.45')") from None
    return transformers


def _tested() -> str:
    return f"model_type {', '.join(TESTED)} (tested), or another that transformers can build"


def load_config(target: str):
    """The transformers config ``target`` names (a config.json, a folder holding one, or ``hf:ORG/NAME`` from the
    local cache), read as JSON and validated (opmap.workloads.hf_config.validate_config) before transformers is
    imported; a config whose model needs the repository's own Python (``auto_map``) is refused, never run."""
    return _read(target)[0]


def _read(target: str, batch: int = 1, seq: int | None = None) -> tuple[Any, str, str | None]:
    """(config, how errors name it, the auto_map entry transformers' own class replaces, if any). The work a build
    of ``batch`` x ``seq`` tokens takes (seq None: the default, DEFAULT_SEQ capped at the config's positions) is
    checked before transformers is imported (hf_config.check_work)."""
    path, where = config_source(target)
    d = read_config_file(path, where)
    if seq is None:
        seq = min(DEFAULT_SEQ, positions(d) or DEFAULT_SEQ)
    check_work(d, where, max(1, batch) * max(1, seq))
    tf = _transformers()
    from transformers import CONFIG_MAPPING

    mt = d["model_type"]
    if mt not in CONFIG_MAPPING:
        _refuse_remote_code(d, where, ("AutoConfig", *_MODEL_CLASSES))
        raise OpmapError(f"{where}: model_type {mt!r:.80} is unknown to transformers {tf.__version__}; accepted: "
                         f"{_tested()}")
    cls = CONFIG_MAPPING[mt]
    if _auto_class(cls) is None:
        _refuse_remote_code(d, where, _MODEL_CLASSES)
        raise OpmapError(f"{where}: transformers {tf.__version__} has no model class for model_type {mt!r} (a part "
                         f"of a larger model?); accepted: {_tested()}")
    ignored = _auto_map_entry(d, _MODEL_CLASSES)
    try:
        with _quiet_transformers():
            config = cls.from_dict({k: v for k, v in d.items() if k != "auto_map"})
    except Exception as e:  # a config class's own checks: report them in one line
        raise OpmapError(f"{where}: transformers rejects it as {mt} ({_first_line(e)})") from None
    if getattr(config, "is_encoder_decoder", False) is True:
        raise OpmapError(f"{where}: model_type {mt!r} is an encoder-decoder; opmap builds {families()}")
    return config, where, ignored


@contextlib.contextmanager
def _quiet_transformers():
    """transformers' own warnings (its logger, such as "bos_token_id must be within the vocabulary", and Python
    warnings, such as a deprecated key) off while it reads a config or builds a model: an error stays one line
    on stderr, and what opmap assumes is stated in the workload's assumptions."""
    from transformers.utils import logging as tf_logging

    level = tf_logging.get_verbosity()
    tf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        tf_logging.set_verbosity(level)


def _auto_class(config_cls):
    """The transformers auto class that builds ``config_cls`` with transformers' own code; None if none does."""
    tf = _transformers()
    for name in _MODEL_CLASSES:
        auto = getattr(tf, name)
        if config_cls in auto._model_mapping:
            return auto
    return None


def _auto_map_entry(d: dict, keys: tuple[str, ...]) -> str | None:
    """The config's first ``auto_map`` entry among ``keys`` (else its first entry), as ``auto_map["K"] = V``."""
    am = d.get("auto_map") or {}
    key = next((k for k in keys if k in am), next(iter(am), None))
    return None if key is None else f"auto_map[{key!r}] = {am[key]!r}"[:200]


def _refuse_remote_code(d: dict, where: str, keys: tuple[str, ...]) -> None:
    """A model transformers has no code of its own for, whose config names a repository's Python: refused."""
    entry = _auto_map_entry(d, keys)
    if entry is not None:
        raise OpmapError(f"{where}: model_type {d['model_type']!r:.80} needs the repository's own Python ({entry}); "
                         "opmap reads configs and never runs their code (trust_remote_code=False); accepted: "
                         f"{families()}")


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return f"{type(e).__name__}: {s.splitlines()[0][:300]}" if s else type(e).__name__


def has_rope(config) -> bool:
    """Rotary position embeddings (a context past the limit is possible with rope scaling)."""
    return any(getattr(config, k, None) is not None for k in ("rope_theta", "rope_scaling", "rope_parameters"))


def check_positions(config, name: str, what: str, n: int, allow_long_context: bool = False) -> None:
    """A length past the config's position limit: refused in one line unless allowed for a rotary model."""
    from opmap.workloads.zoo import positions_limit

    limit = max_positions(config)
    if limit is not None and n > limit and not (allow_long_context and has_rope(config)):
        raise positions_limit(name, what, limit, n, has_rope(config))


def max_positions(config) -> int | None:
    for attr in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        v = getattr(config, attr, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def build_hf(target: str, batch: int = 1, seq: int | None = None, dtype: str = "fp32",
             device: str = "meta", allow_long_context: bool = False) -> Workload:
    """Build the model ``target`` names from its config alone (random weights) with example inputs."""
    config, _, ignored = _read(target, batch, seq)
    tdt = parse_dtype(dtype)  # a bad dtype fails before anything is built
    mt = config.model_type
    limit = max_positions(config)
    seq = min(DEFAULT_SEQ, limit or DEFAULT_SEQ) if seq is None else seq
    if batch < 1:
        raise OpmapError(f"batch must be at least 1, got {batch}")
    if seq < 1:
        raise OpmapError(f"{target} ({mt}) takes --seq from 1 to {limit or 'any'}, got {seq}")
    check_positions(config, f"{target} ({mt})", "--seq", seq, allow_long_context)
    config.use_cache = False
    model = _build(config, target, device)
    model.eval()
    notes: list[str] = [f"Hugging Face {mt} built by transformers {_transformers().__version__} from {target}: "
                        "random weights, attention as SDPA", PREFILL_NOTE]
    if ignored:
        notes.append(f"{ignored} ignored: transformers' own {type(model).__name__} built, the repository's code "
                     "never run")
    if device == "meta":
        n = _balance_experts(model)
        if n:
            k = getattr(config, "num_experts_per_tok", None) or getattr(config, "top_k", "top_k")
            notes.append(f"{mt}: balanced expert load on the meta device: each of the {n} MoE blocks' experts gets "
                         f"batch*seq*{k}/experts tokens (transformers' routing loop replaced by opmap's dispatch)")
        if _answer_packing_probe(model):
            notes.append("unpadded, unpacked inputs (positions 0..seq-1 in every row): transformers' "
                         "packed-sequence probe answered 'none' on meta, as it answers on real tensors")
    window = getattr(config, "sliding_window", None)
    if isinstance(window, int) and getattr(config, "use_sliding_window", True) is not False and seq > window:
        notes.append(f"sliding window {window} < seq {seq}: transformers passes an explicit mask to SDPA, "
                     "so attention is counted dense")
    with torch.device(device):
        ids = torch.zeros(batch, seq, dtype=torch.long)
    model, _ = cast_to(model, (), tdt)
    inputs = {"input_ids": ids, "use_cache": False}
    name = target if target.startswith("hf:") else Path(target).name
    return Workload(name, model, inputs, batch, seq, tuple(notes))


def _build(config, target: str, device: str) -> torch.nn.Module:
    tf = _transformers()
    mt = config.model_type
    # experts_implementation (transformers 5): the per-expert loop, not grouped_mm (whose CPU and meta kernels
    # take bf16 only); a transformers that does not know the argument builds without it
    kwargs: dict[str, Any] = {"attn_implementation": "sdpa", "experts_implementation": "eager",
                              "trust_remote_code": False}  # never a repository's code, never a prompt on stdin
    auto = _auto_class(type(config)) or tf.AutoModel  # a causal LM; an encoder or another head: the bare model
    try:
        with torch.device(device), _quiet_transformers():
            try:
                return auto.from_config(config, **kwargs)
            except (TypeError, ValueError) as e:
                if "experts_implementation" not in str(e):
                    raise
                kwargs.pop("experts_implementation")
                return auto.from_config(config, **kwargs)
    except OpmapError:
        raise
    except Exception as e:
        raise OpmapError(f"transformers cannot build {target} ({mt}) on {device}: {_first_line(e)}; "
                         f"accepted: {_tested()}") from None


def _is_stacked_experts(m: torch.nn.Module) -> bool:
    """transformers 5's experts module: all experts' weights as 3-D parameters, called with
    (hidden_states, top_k_index, top_k_weights)."""
    gu, down = getattr(m, "gate_up_proj", None), getattr(m, "down_proj", None)
    return (type(m).__name__.endswith("Experts") and isinstance(gu, torch.nn.Parameter) and gu.dim() == 3
            and isinstance(down, torch.nn.Parameter) and down.dim() == 3)


def _balance_experts(model: torch.nn.Module) -> int:
    """Replace each stacked-experts module's data-dependent routing loop by a balanced dispatch; the count."""
    n = 0
    for path, m in model.named_modules():
        if not _is_stacked_experts(m):
            continue
        if getattr(m, "is_transposed", False) or getattr(m, "has_bias", False) \
                or not getattr(m, "has_gate", True) or not getattr(m, "is_concatenated", True):
            raise OpmapError(f"{path} ({type(m).__name__}): opmap's balanced expert dispatch handles concatenated "
                             "[gate; up] experts without bias (Mixtral's layout), not this one")
        m.forward = types.MethodType(_balanced_experts_forward, m)
        n += 1
    return n


def _balanced_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                              top_k_weights: torch.Tensor) -> torch.Tensor:
    """The eager expert loop with each expert's share fixed in advance: the T*k (token, choice) pairs sorted
    by expert, split into equal slices over the experts the T tokens are expected to activate
    (opmap.ops.active_experts), each expert's SwiGLU run on its slice, the weighted results added back
    to their tokens (the same dispatch as opmap.workloads.llama.SparseMoeBlock on meta)."""
    e = self.gate_up_proj.shape[0]
    k = top_k_index.shape[-1]
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token = order // k
    routed = hidden_states.index_select(0, token)
    n = flat.numel()
    a = active_experts(e, k, hidden_states.shape[0])  # the experts the tokens are expected to activate
    sizes = [n // a + (1 if i < n % a else 0) if i < a else 0 for i in range(e)]
    outs = []
    for i, chunk in enumerate(routed.split(sizes)):
        if not chunk.shape[0]:
            continue  # an expert with no tokens launches nothing (its weights are not read)
        h = self._apply_gate(torch.nn.functional.linear(chunk, self.gate_up_proj[i]))
        outs.append(torch.nn.functional.linear(h, self.down_proj[i]))
    y = torch.cat(outs) * top_k_weights.reshape(-1)[order].unsqueeze(-1).to(hidden_states.dtype)
    return torch.zeros_like(hidden_states).index_add_(0, token, y)


def _answer_packing_probe(model: torch.nn.Module) -> bool:
    """Wrap the model's forward so that, for meta position ids, the mask builder's packed-sequence probe gets
    the answer transformers gives for one unpacked sequence per row (None). False where this transformers has
    no such probe."""
    try:
        from transformers import masking_utils
    except ImportError:
        return False
    if not hasattr(masking_utils, "find_packed_sequence_indices"):
        return False
    forward = model.forward

    @functools.wraps(forward)
    def wrapped(*args, **kwargs):
        with _packing_probe_answered(masking_utils):
            return forward(*args, **kwargs)

    model.forward = wrapped
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
