"""A Hugging Face config read as data, never run: where it is (a config.json, a folder holding one, or ``hf:ORG/NAME``
in the local Hugging Face cache), its JSON, and the checks on every field opmap builds from.

Nothing here imports transformers: ``validate_config`` is a pure check of a dict, fast enough to refuse a config of
a billion layers in milliseconds, before transformers builds anything. Whether a config needs a repository's own
Python (``auto_map``) is decided in opmap.workloads.hf, which knows what transformers has.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opmap.errors import OpmapError
from opmap.ops import active_experts

ACCEPTED = ("path/to/config.json or hf:NAME (a hub id, ORG/NAME, in the local Hugging Face cache), or a folder "
            "holding config.json, given as a path")
TESTED = ("llama", "mistral", "mixtral", "qwen2", "gpt2", "opt", "qwen3", "qwen3_moe", "gpt_oss", "deepseek_v3",
          "llama4_text")
MAX_CONFIG_BYTES = 16 * 2 ** 20  # published config.json files are a few KB (a 21k-label id2label: ~1 MB)
MAX_DEPTH = 32  # published configs nest 3 or 4 deep (config -> text_config -> rope_parameters -> layer type)
# encoder-decoder families transformers knows (is_encoder_decoder is also read from the config itself)
ENCODER_DECODER = frozenset({
    "t5", "mt5", "umt5", "longt5", "switch_transformers", "t5gemma", "t5gemma2", "bart", "mbart", "plbart", "pegasus",
    "pegasus_x", "marian", "blenderbot", "blenderbot-small", "led", "bigbird_pegasus", "m2m_100", "nllb-moe", "fsmt",
    "prophetnet", "xlm-prophetnet", "whisper", "speech_to_text", "seamless_m4t", "seamless_m4t_v2", "encoder-decoder",
    "vision-encoder-decoder", "speech-encoder-decoder", "pop2piano", "mvp", "moonshine", "kyutai_speech_to_text",
})
_LABEL_MAPS = frozenset({"id2label", "label2id", "task_specific_params", "auto_map", "quantization_config"})
_ROPE_DICTS = frozenset({"rope_scaling", "rope_parameters"})
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def families() -> str:
    """The model families opmap builds from a config, in words."""
    return (f"decoder-only models (tested: {', '.join(TESTED)}) and the bare model of an encoder (such as bert); "
            "not encoder-decoder ones (T5, BART, Whisper...)")


@dataclass(frozen=True)
class Limit:
    """The accepted values of one numeric field: lo..hi (lo excluded when ``lo_open``), integers only when
    ``integer``; ``why`` says where hi comes from. JSON null (unset: transformers' default) is always accepted, and
    so is an array or object of accepted values (per layer or per stage: Gemma 3n's intermediate_size, Swin's
    num_heads, LXMERT's num_hidden_layers)."""

    lo: float
    hi: float
    integer: bool  # an integral float (1200.0, as some configs write) is accepted: JSON has one number type
    why: str
    lo_open: bool = False

    def describe(self) -> str:
        if self.integer:
            return f"an integer from {int(self.lo):,} to {int(self.hi):,}"
        if self.lo_open:
            return f"a number above {self.lo:g} and at most {self.hi:g}"
        return f"a number from {self.lo:g} to {self.hi:g}"

    def accepts(self, v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        if isinstance(v, float) and not (math.isfinite(v) and (v.is_integer() or not self.integer)):
            return False
        return (v > self.lo if self.lo_open else v >= self.lo) and v <= self.hi


# Limits: generously above the largest published models (figures from their config.json on the hub), so that a
# size no real model has (num_hidden_layers 1e9: minutes and gigabytes to build) is refused up front.
LAYERS = Limit(1, 1024, True, "8x the 126 layers of Llama-3.1-405B, the deepest published")
HIDDEN = Limit(1, 131_072, True, "6x the 20,480 of Megatron-Turing NLG 530B, the widest published")
FFN = Limit(1, 1_048_576, True, "14x the 73,728 of PaLM 540B, the widest published feed-forward")
HEADS = Limit(1, 1024, True, "8x the 128 heads of Llama-3.1-405B and DeepSeek-V3")
HEAD_DIM = Limit(1, 4096, True, "16x the 256 of Gemma, the largest published head dimension")
HEAD_DIM_OR_NONE = Limit(0, 4096, True, "0: none, or hidden_size / heads; 16x the 256 of Gemma")
VOCAB = Limit(1, 4_194_304, True, "16x the 262,144 tokens of Gemma 3, the largest published vocabulary")
POSITIONS = Limit(1, 67_108_864, True, "6x the 10,485,760 positions of Llama 4 Scout, the longest published")
EXPERTS = Limit(1, 262_144, True, "16x the 16,384 tiny experts of Doge's default, the most known")
EXPERTS_OR_NONE = Limit(0, 262_144, True, "0: none; 16x the 16,384 tiny experts of Doge's default")
WINDOW = Limit(0, 67_108_864, True, "0 or null: no window; at most the longest positions accepted")
LAYER_COUNT_OR_NONE = Limit(0, 1024, True, "0: none; 8x the 126 layers of Llama-3.1-405B")
FFN_OR_NONE = Limit(0, 1_048_576, True, "0: none; 14x the 73,728 of PaLM 540B")
EPS = Limit(0, 1, False, "a normalisation epsilon: published ones are 1e-5 or 1e-6", lo_open=True)
FRACTION = Limit(0, 1, False, "the fraction of each head dimension rotated", lo_open=True)
ROPE_THETA = Limit(0, 1e12, False, "10^5 x the 1e7 of Qwen2.5-1M and MiniMax-Text-01, the largest published",
                   lo_open=True)
ROPE_FACTOR = Limit(0, 65_536, False, "32x the 2,048 of transformers' Mistral Large 4 default, the largest known",
                    lo_open=True)
ROPE_COEF = Limit(0, 1024, False, "published ones are from 0.1 to 32 (YaRN beta_fast)")

FIELDS: dict[str, Limit] = {
    **dict.fromkeys(("num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_decoder_layers"), LAYERS),
    **dict.fromkeys(("max_window_layers", "first_k_dense_replace"), LAYER_COUNT_OR_NONE),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "word_embed_proj_dim", "kv_lora_rank", "q_lora_rank"),
                    HIDDEN),
    **dict.fromkeys(("intermediate_size", "n_inner", "ffn_dim", "d_ff", "moe_intermediate_size"), FFN),
    **dict.fromkeys(("shared_expert_intermediate_size",), FFN_OR_NONE),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_heads", "num_key_value_heads", "n_kv_heads",
                     "num_kv_heads", "multi_query_group_num"), HEADS),
    **dict.fromkeys(("kv_channels", "d_kv", "v_head_dim"), HEAD_DIM),
    **dict.fromkeys(("head_dim", "qk_rope_head_dim", "qk_nope_head_dim"), HEAD_DIM_OR_NONE),
    "vocab_size": VOCAB,
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length",
                     "max_sequence_length", "original_max_position_embeddings"), POSITIONS),
    "sliding_window": WINDOW,
    **dict.fromkeys(("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok", "moe_topk",
                     "n_group", "topk_group", "decoder_sparse_step"), EXPERTS),
    **dict.fromkeys(("n_shared_experts", "num_shared_experts"), EXPERTS_OR_NONE),
    **dict.fromkeys(("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps"), EPS),
    "partial_rotary_factor": FRACTION,
    "rope_theta": ROPE_THETA,
}
ROPE_FIELDS: dict[str, Limit] = {
    "rope_theta": ROPE_THETA,
    "factor": ROPE_FACTOR,
    "original_max_position_embeddings": POSITIONS,
    "partial_rotary_factor": Limit(0, 64, False, "the rotated fraction of a head, 1 or less in text models "
                                   "(EfficientLoFTR's default: 4)", lo_open=True),
    **dict.fromkeys(("low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "attention_factor"),
                    Limit(0, 1024, False, ROPE_COEF.why, lo_open=True)),
    **dict.fromkeys(("mscale", "mscale_all_dim"), ROPE_COEF),
}


def _check_field(where: str, path: str, v: Any, limit: Limit, depth: int = 0) -> None:
    if v is None or limit.accepts(v):
        return
    if isinstance(v, (list, dict)) and depth < 2:  # per layer, or per stage then per layer
        for i, x in (v.items() if isinstance(v, dict) else enumerate(v)):
            _check_field(where, f"{path}[{i!r}]", x, limit, depth + 1)
        return
    raise OpmapError(f"{where}: {path} must be {limit.describe()} ({limit.why}), got {_shown(v)}")


def _shown(v: Any) -> str:
    """``v`` for a one-line message: its repr, cut short (an integer of thousands of digits by its size)."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10 ** 30:
        return f"an integer of about 10^{int(v.bit_length() * math.log10(2))}"
    return f"{v!r}"[:80] if isinstance(v, (bool, int, float, str)) else f"a JSON {_json_kind(v)}"


def _child(path: str, key: Any) -> str:
    """The path of ``key`` under ``path``: dotted where the key is a plain name, else bracketed and quoted (a
    key holding a newline cannot break the message's one line)."""
    if isinstance(key, str) and key.isprintable() and 0 < len(key) <= 64 and "." not in key:
        return f"{path}.{key}" if path else key
    return f"{path}[{f'{key!r}'[:64]}]"


def _json_kind(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(type(v), type(v).__name__)


def _walk(d: dict, where: str) -> None:
    """Every numeric field in ``d`` and its nested objects: in range where opmap knows the field (FIELDS, and
    ROPE_FIELDS inside rope_scaling / rope_parameters), and no NaN anywhere (it means nothing in a config; an
    infinity may: Mamba's time_step_limit is [0, inf])."""
    stack: list[tuple[str, Any, int, bool]] = [("", d, 0, False)]
    while stack:
        path, v, depth, rope = stack.pop()
        if depth > MAX_DEPTH:
            raise OpmapError(f"{where}: {path} nests deeper than {MAX_DEPTH} levels; published configs nest 3 or 4")
        if isinstance(v, float) and math.isnan(v):
            raise OpmapError(f"{where}: {path} is NaN; accepted: a number (no config field means anything by NaN)")
        if isinstance(v, list):
            stack.extend((f"{path}[{i}]", x, depth + 1, rope) for i, x in enumerate(v))
            continue
        if not isinstance(v, dict):
            continue
        table = ROPE_FIELDS if rope else FIELDS
        for key, x in v.items():
            sub = _child(path, key)
            if key in table:
                _check_field(where, sub, x, table[key])
            if key in _LABEL_MAPS and isinstance(x, dict):
                stack.extend((_child(sub, k), y, depth + 2, False) for k, y in x.items() if not isinstance(y, dict))
                continue  # labels and other free-form maps: only NaN is looked for, not the field table
            stack.append((sub, x, depth + 1, rope or key in _ROPE_DICTS))


def _pair(d: dict, names: tuple[str, ...]) -> tuple[str, Any] | None:
    return next(((n, d[n]) for n in names if isinstance(d.get(n), int) and not isinstance(d.get(n), bool)), None)


def _check_shapes(d: dict, where: str) -> None:
    """The relations between fields that transformers would otherwise hit mid-build (a tensor-size mismatch)."""
    heads = _pair(d, ("num_attention_heads", "n_head", "n_heads"))
    kv = _pair(d, ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num"))
    if heads and kv and heads[1] % kv[1]:
        raise OpmapError(f"{where}: {kv[0]} {kv[1]} does not divide {heads[0]} {heads[1]}; accepted: a divisor of "
                         f"{heads[1]} (each KV head serves an equal group of query heads)")
    experts = _pair(d, ("num_local_experts", "num_experts", "n_routed_experts"))
    k = _pair(d, ("num_experts_per_tok", "moe_topk"))
    if experts and k and k[1] > experts[1]:
        raise OpmapError(f"{where}: {k[0]} {k[1]} is more than the {experts[1]} experts ({experts[0]}); accepted: "
                         f"1 to {experts[1]}")


# The work a build takes, bounded as a whole: every field inside its Limit still allows a model no one has built
# (hidden 131,072 x 1,024 layers: ~490 T parameters, 96 s to analyze; 262,144 experts with top-k 262,144: millions
# of expert calls, past 200 s). Both figures are closed-form estimates from the config, read low (a field the config
# leaves unset counts as absent), checked before transformers is imported.
MAX_PARAMS = 20 * 10**12
PARAMS_WHY = "10x the ~2 T of the largest models announced; DeepSeek-V3 has 671 B, Kimi K2 1 T"
MAX_NODES = 1_000_000  # about 1 ms each to analyze
NODES_WHY = ("5x the ~190,000 of Kimi K2 (61 layers x 384 routed experts, all active at 2,048 tokens); DeepSeek-V3 "
             "has 256 routed experts, top-k 8")
NODES_PER_LAYER = 60  # a llama decoder layer records 70 nodes in transformers
NODES_PER_EXPERT = 8  # an expert called on its share of the tokens records 9 (Mixtral's layout)
_KEYS = {
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_decoder_layers"),
    "heads": ("num_attention_heads", "n_head", "n_heads", "num_heads"),
    "kv": ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num"),
    "head_dim": ("head_dim", "kv_channels", "d_kv"),
    "ffn": ("intermediate_size", "n_inner", "ffn_dim", "d_ff"),
    "moe_ffn": ("moe_intermediate_size",),
    "experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "top_k": ("num_experts_per_tok", "moe_topk"),
    "vocab": ("vocab_size",),
    "positions": ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"),
}


def _size(d: dict, what: str) -> float:
    """The first of ``what``'s fields that ``d`` sets to a positive number (one per layer or per stage: their
    mean, so a layer count times it is their sum), else 0."""
    for key in _KEYS[what]:
        v = d.get(key)
        vals = list(v.values()) if isinstance(v, dict) else v if isinstance(v, list) else [v]
        nums = [float(x) for x in vals if isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0]
        if nums:
            return sum(nums) / len(nums)
    return 0.0


def positions(d: dict) -> int | None:
    """The config's own position limit, as transformers reads it (opmap.workloads.hf.max_positions)."""
    n = _size(d, "positions")
    return int(n) if n else None


def work(d: dict, tokens: int) -> tuple[float, float, str, str]:
    """(parameters, graph nodes a capture of ``tokens`` tokens records, each as the words that explain it), in
    closed form from the config and its text_config (the larger of the two): embeddings V h, and per layer the
    attention projections h x head_dim x (2 heads + 2 KV heads) and the MLP 3 h f (an MoE: every expert's
    3 h f_moe and the router); nodes NODES_PER_LAYER per layer plus NODES_PER_EXPERT per expert the tokens
    activate (opmap.ops.active_experts, as the meta capture dispatches them)."""
    figures = []
    text = d.get("text_config")
    for c in (d, {**d, **text}) if isinstance(text, dict) else (d,):
        h, n_layers, heads = _size(c, "hidden"), max(_size(c, "layers"), 1.0), max(_size(c, "heads"), 1.0)
        kv, ffn = _size(c, "kv") or heads, _size(c, "ffn")
        hd = _size(c, "head_dim") or h / heads
        e, k = int(_size(c, "experts")), int(_size(c, "top_k") or 1)
        mlp = e * (3 * h * (_size(c, "moe_ffn") or ffn) + h) if e else 3 * h * ffn
        params = _size(c, "vocab") * h + n_layers * (h * hd * (2 * heads + 2 * kv) + mlp)
        active = active_experts(e, k, tokens) if e else 0
        nodes = n_layers * (NODES_PER_LAYER + NODES_PER_EXPERT * active)
        figures.append((params, f"hidden size {h:,.0f} x {n_layers:,.0f} layers" + (f" x {e:,} experts" if e else ""),
                        nodes, f"{n_layers:,.0f} layers" + (f" x {active:,} experts active for {tokens:,} "
                                                            f"token{'s' * (tokens > 1)} (top-k {k:,} of {e:,})"
                                                            if e else "")))
    params, p_words = max((f[0], f[1]) for f in figures)
    nodes, n_words = max((f[2], f[3]) for f in figures)
    return params, nodes, p_words, n_words


def check_work(d: dict, where: str, tokens: int = 1) -> None:
    """Refuse, in one line naming the figure and the limit, a config whose estimated parameters exceed MAX_PARAMS
    or whose capture of ``tokens`` tokens would record more than MAX_NODES nodes (tokens 1: the least any build
    records)."""
    params, nodes, p_words, n_words = work(d, max(1, int(tokens)))
    if params > MAX_PARAMS:
        raise OpmapError(f"{where}: about {params / 1e12:,.0f} T parameters ({p_words}, estimated from the config); "
                         f"opmap builds models of at most {MAX_PARAMS / 1e12:.0f} T parameters ({PARAMS_WHY})")
    if nodes > MAX_NODES:
        raise OpmapError(f"{where}: a capture would record about {nodes:,.0f} graph nodes ({n_words}); opmap builds "
                         f"at most {MAX_NODES:,} ({NODES_WHY})")


def validate_config(d: Any, where: str) -> dict:
    """Check a Hugging Face config dict, as parsed from config.json, without building anything; return it.

    Raises OpmapError (one line, starting with ``where``) for: not an object; a ``model_type`` missing or not a
    string; an encoder-decoder model; a numeric field opmap builds from (layers, hidden size, heads, KV heads,
    intermediate size, vocab, positions, experts, head_dim, norm epsilon, rope values) that is a bool, a string,
    NaN, inf, not an integer where one is meant, or outside its Limit; NaN anywhere; KV heads that do not
    divide the heads; more experts per token than experts; more work as a whole than MAX_PARAMS parameters or
    MAX_NODES graph nodes for one token (check_work). ``auto_map`` (a repository's own code) is judged by
    opmap.workloads.hf.load_config, which knows what transformers has.
    """
    if not isinstance(d, dict):
        raise OpmapError(f"{where} is not a JSON object (got a JSON {_json_kind(d)}); expected a Hugging Face "
                         "config.json: an object with \"model_type\"")
    if "model_type" not in d:
        raise OpmapError(f"{where} has no \"model_type\"; expected a Hugging Face config.json of {families()}")
    mt = d["model_type"]
    if not isinstance(mt, str) or not mt.strip():
        raise OpmapError(f"{where}: model_type must be a string naming the architecture (such as \"llama\"), got "
                         f"{_shown(mt)}")
    if mt in ENCODER_DECODER or d.get("is_encoder_decoder") is True:
        raise OpmapError(f"{where}: model_type {mt!r} is an encoder-decoder; opmap builds {families()}")
    am = d.get("auto_map")
    if am is not None and not isinstance(am, dict):
        raise OpmapError(f"{where}: auto_map must be an object (auto class -> module.Class), got a JSON "
                         f"{_json_kind(am)}")
    _walk(d, where)
    _check_shapes(d, where)
    if isinstance(d.get("text_config"), dict):
        _check_shapes(d["text_config"], f"{where} text_config")
    check_work(d, where)
    return d


def read_config_file(path: Path, where: str | None = None) -> dict:
    """Parse and validate the config.json at ``path`` (``where`` names it in errors: the path by default)."""
    from opmap.safeio import read_text_bounded

    where = where or f"config file {path}"
    try:  # a regular file of bounded size; a link followed (the hub cache links snapshots to blobs); BOM skipped
        d = json.loads(read_text_bounded(path, MAX_CONFIG_BYTES, "config file", follow_links=True))
    except OpmapError:
        raise
    except RecursionError:
        raise OpmapError(f"{where} is not valid JSON (nested too deep); expected a Hugging Face config.json") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise OpmapError(f"{where} is not valid JSON ({first_line(e)}); expected a Hugging Face config.json") \
            from None
    return validate_config(d, where)


def first_line(e: BaseException, limit: int = 300) -> str:
    """An exception as one line: its type and its message's first line, cut at the last sentence or word end
    within ``limit`` characters (a cut marked "...", never mid-word)."""
    s = str(e).strip()
    if not s:
        return type(e).__name__
    line = s.splitlines()[0]
    if len(line) > limit:
        head = line[:limit]
        end = head.rfind(". ")
        line = head[:end + 1] if end > limit // 2 else head[:max(head.rfind(" "), 1)].rstrip(" ,;:") + "..."
    return f"{type(e).__name__}: {line}"


def hub_cache() -> Path:
    """The local Hugging Face hub cache, found as huggingface_hub finds it: HF_HUB_CACHE (or the older
    HUGGINGFACE_HUB_CACHE), else HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def cached_config(target: str) -> Path:
    """The config.json of ``hf:ORG/NAME`` in the local hub cache (models--ORG--NAME/snapshots/<refs/main>/), never a
    folder elsewhere (not ./ORG/NAME under the current directory); nothing is downloaded."""
    name = target[3:]
    if not _HUB_ID.match(name) or "--" in name or ".." in name or name.endswith((".", "-")):
        raise OpmapError(f"{target}: hf: takes a Hugging Face hub id (ORG/NAME, as in hf:meta-llama/Llama-2-7b-hf), "
                         f"got {name!r}; a folder or a config.json is given as a path, without hf:")
    repo = hub_cache() / ("models--" + name.replace("/", "--"))
    snapshot = _snapshot(repo)
    config = snapshot / "config.json" if snapshot is not None else None
    if config is None or not config.is_file():
        here = " (a folder of that name is here: give it as ./" + name + ")" if Path(name).is_dir() else ""
        raise OpmapError(f"{target}: {name!r} is not in the local Hugging Face cache {hub_cache()} (no config.json; "
                         f"opmap never downloads: fetch it with `hf download {name} config.json`); a folder is given "
                         f"as a path, without hf:{here}; accepted: {ACCEPTED}")
    return config


def _snapshot(repo: Path) -> Path | None:
    """The snapshot refs/main names, or the only snapshot where there is no refs/main; None if neither."""
    ref = repo / "refs" / "main"
    try:
        rev = ref.read_text(encoding="utf-8").strip() if ref.is_file() else None
    except (OSError, UnicodeDecodeError):
        rev = None
    if rev is not None:
        return repo / "snapshots" / rev if _REVISION.match(rev) else None
    snaps = [p for p in (repo / "snapshots").iterdir()] if (repo / "snapshots").is_dir() else []
    return snaps[0] if len(snaps) == 1 else None


def config_source(target: str) -> tuple[Path, str]:
    """(the config.json ``target`` names, how errors name it): ``hf:ORG/NAME`` from the cache, a folder's
    config.json, or a config.json given as a path."""
    if target.startswith("hf:"):
        return cached_config(target), target
    path = Path(target)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise OpmapError(f"folder {path} has no config.json; accepted: {ACCEPTED}")
        return path / "config.json", f"config file {path / 'config.json'}"
    if not path.is_file():
        raise OpmapError(f"config file {path} does not exist; accepted: {ACCEPTED}")
    return path, f"config file {path}"
