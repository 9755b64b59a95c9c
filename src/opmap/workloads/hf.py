"""A model named by its Hugging Face config: ``path/to/config.json``, ``path/to/folder`` (holding config.json) or
``hf:ORG/NAME`` (a config already in the local Hugging Face cache, never a folder; nothing is ever downloaded).

The config is data, never code: it is parsed as JSON and checked field by field (opmap.workloads.hf_config) before
transformers is imported, built by transformers' own config class, and a model whose ``auto_map`` names the
repository's Python (a ``model_type`` transformers has no model class for) is refused in one line; transformers is
always called with ``trust_remote_code=False``, so it never prompts on stdin.

``transformers`` builds the model from the config alone, on ``torch.device(device)`` (meta by default: random
weights, none allocated, never the real ones), with ``attn_implementation="sdpa"`` so each attention is one
``scaled_dot_product_attention`` node, and the KV cache off (``use_cache=False``: a prefill). A model class that
has no SDPA attention in transformers (``_supports_sdpa = False``) is built with its eager attention, then:
attention with sinks (gpt-oss) runs as the engines' one fused kernel with sinks, exactly (opmap.workloads.hf_sinks);
any other (Gemma-2's logit softcapping) is counted as its eager path computes it (Q K^T over every (query, key)
pair, softcapping, softmax, P V: separate kernels, the scores through memory). Llama 4's chunked-attention layers
run as the engines' chunked kernel, exactly (opmap.workloads.hf_chunked). The class is a causal LM where
transformers has one for the config, the image classifier where the config's ``architectures`` names one, else the
bare model. The inputs are what the class reads (``main_input_name``): ``input_ids`` of shape (batch, seq), one
unpadded, unpacked sequence per row, or ``pixel_values`` of shape (batch, num_channels, side, side), the side the
config's image_size unless given.

Two places where transformers reads a tensor's value, which the meta device does not have, are answered as
transformers itself answers them for these inputs (each recorded in the workload's assumptions; the wrappers of the
built model's forward that do it, and mark eager attention's K and V, are opmap.workloads.hf_forward's):

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
import warnings
from pathlib import Path
from typing import Any

import torch

from opmap.errors import OpmapError
from opmap.workloads.hf_chunked import install_chunked_attention
from opmap.workloads.hf_config import (
    ACCEPTED,
    TESTED,
    cached_config,
    check_work,
    config_source,
    families,
    first_line,
    positions,
    read_config_file,
    validate_config,
)
from opmap.workloads.hf_experts import balance_experts as _balance_experts
from opmap.workloads.hf_forward import answer_packing_probe, errors_named, mark_eager_kv
from opmap.workloads.hf_geometry import hf_geometry
from opmap.workloads.hf_sinks import install_sink_attention
from opmap.workloads.zoo import Workload, cast_to, parse_dtype

__all__ = ["ACCEPTED", "TESTED", "build_hf", "cached_config", "is_hf_target", "load_config", "max_positions",
           "validate_config"]
DEFAULT_SEQ = 2048  # capped at the config's own maximum
PREFILL_NOTE = "no KV cache (prefill): use_cache=False"  # a decode step replaces it by its cache's note
_MODEL_CLASSES = ("AutoModelForCausalLM", "AutoModel")  # tried in this order: a causal LM head, else the bare model
_IMAGE_CLASSIFIER = "AutoModelForImageClassification"  # where the config's architectures name its class


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
            config = cls.from_dict(_as_transformers_reads({k: v for k, v in d.items() if k != "auto_map"}))
    except Exception as e:  # a config class's own checks: report them in one line
        raise OpmapError(f"{where}: transformers rejects it as {mt} ({first_line(e)})") from None
    if getattr(config, "is_encoder_decoder", False) is True:
        raise OpmapError(f"{where}: model_type {mt!r} is an encoder-decoder; opmap builds {families()}")
    return config, where, ignored


# Published configs whose field a later transformers' strict config class types more narrowly: Llama 4 Scout's
# and Maverick's config.json (hub: meta-llama/Llama-4-Scout-17B-16E) write attn_temperature_tuning 4, which
# transformers 4.51 read for its truth (modeling_llama4: ``if self.attn_temperature_tuning and not
# self.use_rope``); transformers 5's Llama4TextConfig takes a bool and refuses the 4.
_AS_BOOL = {"llama4_text": ("attn_temperature_tuning",)}


def _as_transformers_reads(d: dict) -> dict:
    """``d`` (and its text_config) with each _AS_BOOL field that is a number read as the bool it stands for."""
    text = d.get("text_config")
    if isinstance(text, dict):
        d = {**d, "text_config": _as_transformers_reads(text)}
    fields = _AS_BOOL.get(d.get("model_type"), ())
    return {k: bool(v) if k in fields and type(v) in (int, float) else v for k, v in d.items()}


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
    """The longest context the config declares: its max_position_embeddings (or n_positions, max_seq_len,
    seq_length), or its rope-scaled maximum where that is longer: rope scaling's factor x its
    original_max_position_embeddings (Qwen2.5's YaRN, factor 4 of 32,768: 131,072). A factor without the
    original length is not applied (whether max_position_embeddings is already scaled is not said)."""
    base = next((v for v in (getattr(config, a, None) for a in ("max_position_embeddings", "n_positions",
                                                               "max_seq_len", "seq_length"))
                 if isinstance(v, int) and not isinstance(v, bool) and v > 0), None)
    scaled = None
    for rope in (getattr(config, "rope_scaling", None), getattr(config, "rope_parameters", None)):
        if isinstance(rope, dict):
            factor, original = rope.get("factor"), rope.get("original_max_position_embeddings")
            if isinstance(factor, (int, float)) and isinstance(original, int) and factor >= 1 and original > 0:
                scaled = max(scaled or 0, int(factor * original))
    return max(base or 0, scaled or 0) or None


def build_hf(target: str, batch: int = 1, seq: int | None = None, dtype: str = "fp32",
             device: str = "meta", allow_long_context: bool = False) -> Workload:
    """Build the model ``target`` names from its config alone (random weights) with example inputs: ``seq`` is
    tokens for a text model, the image side in pixels for one that reads pixel_values."""
    config, _, ignored = _read(target, batch, seq)
    tdt = parse_dtype(dtype)  # a bad dtype fails before anything is built
    mt = config.model_type
    auto, cls = _model_class(config)
    attn = "sdpa" if getattr(cls, "_supports_sdpa", True) else "eager"
    if batch < 1:
        raise OpmapError(f"batch must be at least 1, got {batch}")
    image = _image_shape(config, cls, target, seq)  # (channels, side, interpolate) of a vision model, else None
    if image is None:
        seq = _text_seq(config, cls, target, seq, allow_long_context)
    config.use_cache = False
    model = _build(config, target, device, auto, attn)
    if attn == "eager" and install_sink_attention(model):
        attn = "sinks"
    elif attn == "sdpa" and install_chunked_attention(model):
        attn = "chunked"
    model.eval()
    notes = [_built_note(mt, cls, target, attn), *((PREFILL_NOTE,) if image is None else ())]
    if ignored:
        notes.append(f"{ignored} ignored: transformers' own {type(model).__name__} built, the repository's code "
                     "never run")
    if device == "meta":
        n = _balance_experts(model)
        if n:
            k = getattr(config, "num_experts_per_tok", None) or getattr(config, "top_k", "top_k")
            notes.append(f"{mt}: balanced expert load on the meta device: each of the {n} MoE blocks' experts gets "
                         f"batch*seq*{k}/experts tokens (transformers' routing loop replaced by opmap's dispatch)"
                         + ("; transformers' Llama 4 runs every expert on every token (the unpicked weighted 0), "
                            "opmap the top-k dispatch an engine runs (vLLM's fused MoE)" if mt.startswith("llama4")
                            else ""))
        if image is None and attn == "eager" and mark_eager_kv(model):
            notes.append("eager attention's K and V (before the KV heads are repeated for the query heads) marked as "
                         "the KV cache each layer holds, as an SDPA call's K and V are read")
        if image is None and answer_packing_probe(model):
            notes.append("unpadded, unpacked inputs (positions 0..seq-1 in every row): transformers' "
                         "packed-sequence probe answered 'none' on meta, as it answers on real tensors")
    name = target if target.startswith("hf:") else Path(target).name
    errors_named(model, f"{target} ({mt})", type(model).__name__, _transformers().__version__, _tested())
    model, _ = cast_to(model, (), tdt)
    if image is not None:
        channels, side, interpolate = image
        with torch.device(device):
            pixels = torch.zeros(batch, channels, side, side, dtype=tdt)
        notes.append(f"input pixel_values of {batch} x {channels} x {side} x {side} ({type(model).__name__})"
                     + ("; position embeddings interpolated from the config's image_size" if interpolate else ""))
        inputs = {"pixel_values": pixels, **({"interpolate_pos_encoding": True} if interpolate else {})}
        return Workload(name, model, inputs, batch, None, tuple(notes), geometry=_geometry(config))
    window = getattr(config, "sliding_window", None)
    if isinstance(window, int) and getattr(config, "use_sliding_window", True) is not False and seq > window:
        notes.append(f"sliding window {window} < seq {seq}: " + (
            f"a parameter of the sink attention kernel, as engines take it, so a sliding layer's attention counts at "
            f"most {window} keys per query" if attn == "sinks" else f"transformers passes an explicit mask to "
            f"{'SDPA' if attn == 'sdpa' else 'the eager attention'}, so attention is counted dense"))
    with torch.device(device):
        ids = torch.zeros(batch, seq, dtype=torch.long)
    return Workload(name, model, {"input_ids": ids, "use_cache": False}, batch, seq, tuple(notes),
                    geometry=_geometry(config))


def _geometry(config):
    """The model's geometry from its config (opmap.workloads.hf_geometry); None where the config lacks the fields
    an adapter reads (a family none reads yet: the graph is read instead)."""
    try:
        return hf_geometry(config)
    except (TypeError, ValueError, ZeroDivisionError):
        return None


def _built_note(mt: str, cls: type, target: str, attn: str) -> str:
    """The first assumption of a built config: what built it, and how its attention is counted."""
    head = f"Hugging Face {mt} built by transformers {_transformers().__version__} from {target}: random weights, "
    if attn == "sdpa":
        return head + "attention as SDPA"
    if attn == "chunked":
        return head + ("attention as SDPA; the chunked-attention layers (layer_types chunked_attention, "
                       "attention_chunk_size tokens) as the chunked kernel engines run (TensorRT-LLM's "
                       "attention_chunk_size, vLLM's chunked local attention): only the causal pairs inside each "
                       "token's chunk computed and the chunk's K and V read, exactly transformers' masked SDPA")
    if attn == "sinks":
        return head + (f"attention with sinks ({cls.__name__} has no SDPA attention in transformers) as one fused "
                       "kernel per layer, as engines run it (FlashInfer's and TensorRT-LLM's kernels with sinks, "
                       "vLLM's FlashAttention-3 s_aux): Q, K and V read once (no repeat_kv copies), the sinks in "
                       "the softmax's denominator, the scores on chip; exactly transformers' eager attention")
    return head + (f"eager attention ({cls.__name__} has no SDPA attention in transformers), counted as the eager "
                   "path computes it: the scores Q K^T over every (query, key) pair, softmax and P V, each its own "
                   "kernel with the scores through memory (no fused attention kernel)")


def _model_class(config) -> tuple[Any, type]:
    """(the auto class that builds ``config``, the model class it builds): the image classifier where the config's
    ``architectures`` names transformers' one for it, else a causal LM, else the bare model."""
    tf = _transformers()
    image = getattr(tf, _IMAGE_CLASSIFIER)
    mapping = image._model_mapping
    if type(config) in mapping and getattr(mapping[type(config)], "__name__", None) in (config.architectures or ()):
        return image, mapping[type(config)]
    auto = _auto_class(type(config)) or tf.AutoModel  # a causal LM; an encoder or another head: the bare model
    return auto, auto._model_mapping[type(config)]


def _text_seq(config, cls: type, target: str, seq: int | None, allow_long_context: bool) -> int:
    """The tokens per sequence of a model reading input_ids (the default: DEFAULT_SEQ capped at its positions);
    a model reading another input (audio, video) is refused in one line."""
    mt = config.model_type
    main = getattr(cls, "main_input_name", "input_ids")
    if main != "input_ids":
        raise OpmapError(f"{target} ({mt}): {cls.__name__} reads {main}; opmap builds inputs for models reading "
                         "input_ids (text) or pixel_values (images)")
    limit = max_positions(config)
    seq = min(DEFAULT_SEQ, limit or DEFAULT_SEQ) if seq is None else seq
    if seq < 1:
        raise OpmapError(f"{target} ({mt}) takes --seq from 1 to {limit or 'any'}, got {seq}")
    check_positions(config, f"{target} ({mt})", "--seq", seq, allow_long_context)
    return seq


def _image_shape(config, cls: type, target: str, side: int | None) -> tuple[int, int, bool] | None:
    """(channels, image side, whether the position embeddings are interpolated) of a model reading pixel_values,
    None for any other: the config's num_channels and image_size (a square one), or ``side`` where given, a
    multiple of the config's patch_size; a side other than image_size interpolates the position embeddings where
    the class can (``interpolate_pos_encoding``), else is refused."""
    if getattr(cls, "main_input_name", None) != "pixel_values":
        return None
    import inspect

    mt = config.model_type
    size = getattr(config, "image_size", None)
    size = size[0] if isinstance(size, (list, tuple)) and len(set(size)) == 1 else size
    channels = getattr(config, "num_channels", 3)
    if not isinstance(size, int) or not isinstance(channels, int) or size < 1 or channels < 1:
        raise OpmapError(f"{target} ({mt}): image_size {size!r:.40} and num_channels {channels!r:.40}: opmap builds "
                         "pixel_values for a square image_size and num_channels, each a positive integer")
    side = size if side is None else side
    patch = getattr(config, "patch_size", None)
    if side < 1 or (isinstance(patch, int) and patch > 0 and side % patch):
        raise OpmapError(f"{target} ({mt}) takes --image-size as a positive multiple of its {patch}-pixel patch "
                         f"(image_size {size}), got {side}")
    interpolate = side != size
    if interpolate and "interpolate_pos_encoding" not in inspect.signature(cls.forward).parameters:
        raise OpmapError(f"{target} ({mt}) takes --image-size {size} (its image_size; {cls.__name__} cannot "
                         f"interpolate its position embeddings), got {side}")
    return channels, side, interpolate


def _build(config, target: str, device: str, auto, attn: str) -> torch.nn.Module:
    """The model ``auto`` builds from ``config`` on ``device`` with attention ``attn`` (sdpa, or eager where the
    class has no SDPA attention)."""
    mt = config.model_type
    # experts_implementation (transformers 5): the per-expert loop, not grouped_mm (whose CPU and meta kernels
    # take bf16 only); a transformers that does not know the argument builds without it
    kwargs: dict[str, Any] = {"attn_implementation": attn, "experts_implementation": "eager",
                              "trust_remote_code": False}  # never a repository's code, never a prompt on stdin
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
        raise OpmapError(f"transformers cannot build {target} ({mt}) on {device}: {first_line(e)}; "
                         f"accepted: {_tested()}") from None
