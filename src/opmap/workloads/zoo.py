"""The built-in zoo and the loader for a user's own model file.

A workload is a module plus example inputs plus the assumptions that came with building it. Zoo models
are built under ``torch.device(device)`` (meta by default: no weights are allocated) with random weights
and cast to the dtype asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from opmap.errors import OpmapError
from opmap.geometry import AttentionSpec, ModelGeometry, attention_kind
from opmap.precision import torch_dtype
from opmap.workloads.bert import Bert, BertConfig
from opmap.workloads.gpt2 import GPT2, GPT2Config
from opmap.workloads.llama import Llama, LlamaConfig
from opmap.workloads.resnet import ResNet
from opmap.workloads.vit import ViT, ViTConfig


@dataclass(frozen=True)
class Workload:
    """A module, its example inputs, and the assumptions that came with building it."""

    name: str
    module: torch.nn.Module
    inputs: Any  # tuple of positional args, or a dict of keyword args
    batch: int
    seq: int | None
    assumptions: tuple[str, ...] = ()
    graph: Any = None  # an OpGraph read from a file (ONNX): no module to capture
    geometry: ModelGeometry | None = None  # from the model's config or spec; None: read off the graph when needed


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    kind: str  # "text" (batch, seq) or "vision" (batch, image size)
    published_params: int  # the published parameter count the zoo model matches
    params_source: str
    default_seq: int  # text: tokens; vision: image side in pixels
    max_seq: int
    build: Callable[[], torch.nn.Module]
    make_inputs: Callable[[int, int, torch.dtype], Any]
    notes: str = ""
    rope: bool = False  # rotary positions: a context past max_seq is possible with rope scaling


LONG_CONTEXT = ("--allow-long-context goes past it (rope scaling: positions beyond the trained context, quality "
                "not assured)")


def positions_limit(name: str, what: str, limit: int, got: int, rope: bool) -> OpmapError:
    """The one-line refusal of a length past a model's position limit, naming the way past it where there is one."""
    tail = f"; {LONG_CONTEXT}" if rope else " (learned positions: no rope scaling)"
    return OpmapError(f"{name} takes {what} from 1 to {limit}, got {got} (its max_position_embeddings){tail}")


def _token_ids(batch: int, seq: int, dtype: torch.dtype):
    return (torch.zeros(batch, seq, dtype=torch.long),)


def _bert_inputs(batch: int, seq: int, dtype: torch.dtype):
    return (torch.zeros(batch, seq, dtype=torch.long), torch.zeros(batch, seq, dtype=torch.long))


def _images(batch: int, size: int, dtype: torch.dtype):
    return (torch.zeros(batch, 3, size, size, dtype=dtype),)


LLAMA3_8B = LlamaConfig()
LLAMA3_70B = LlamaConfig(dim=8192, n_layer=80, n_head=64, n_kv_head=8, ffn_dim=28672)
# Llama 2 (Touvron et al. 2023): 32000-token vocabulary, rope theta 10000, 4096 context; 7B is plain
# multi-head attention (32 KV heads), 70B groups 64 query heads over 8 KV heads
LLAMA2_7B = LlamaConfig(vocab_size=32000, dim=4096, n_layer=32, n_head=32, n_kv_head=32, ffn_dim=11008,
                        rope_theta=10000.0, max_seq=4096)
LLAMA2_70B = LlamaConfig(vocab_size=32000, dim=8192, n_layer=80, n_head=64, n_kv_head=8, ffn_dim=28672,
                         rope_theta=10000.0, max_seq=4096)
# Llama 3.1 405B (Meta, "The Llama 3 Herd of Models", 2024, table 3): 126 layers, d 16384, 128 heads over 8 KV heads,
# FFN 53248, rope theta 500000, 128K context (its rope frequency scaling changes values, not shapes or costs)
LLAMA31_405B = LlamaConfig(dim=16384, n_layer=126, n_head=128, n_kv_head=8, ffn_dim=53248, max_seq=131072)
MIXTRAL_8X7B = LlamaConfig(vocab_size=32000, dim=4096, n_layer=32, n_head=32, n_kv_head=8, ffn_dim=14336,
                           rope_theta=1e6, max_seq=32768, n_experts=8, top_k=2)

MODELS: dict[str, ModelSpec] = {m.name: m for m in (
    ModelSpec("gpt2", "GPT-2 small, 12 layers, d 768, tied LM head", "text", 124_439_808,
              "Radford et al. 2019; HF gpt2 num_parameters() = 124,439,808", 1024, 1024,
              lambda: GPT2(GPT2Config()), _token_ids),
    ModelSpec("bert-base", "BERT-base uncased encoder with pooler", "text", 109_482_240,
              "Devlin et al. 2019 (110M); HF bert-base-uncased BertModel = 109,482,240", 128, 512,
              lambda: Bert(BertConfig()), _bert_inputs),
    ModelSpec("vit-b16", "ViT-B/16 with 1000-class head, 224x224", "vision", 86_567_656,
              "Dosovitskiy et al. 2021 (86M); torchvision vit_b_16 = 86,567,656", 224, 4096,
              lambda: ViT(ViTConfig()), _images),
    ModelSpec("resnet50", "ResNet-50 v1.5 (torchvision layout), 1000 classes", "vision", 25_557_032,
              "He et al. 2016; torchvision resnet50 = 25,557,032", 224, 4096,
              lambda: ResNet((3, 4, 6, 3)), _images),
    ModelSpec("llama-3-8b", "Llama 3 8B: 32 layers, d 4096, GQA 32/8 heads, SwiGLU 14336", "text",
              8_030_261_248, "Meta Llama 3 model card: 8.03B (8,030,261,248)", 2048, 8192,
              lambda: Llama(LLAMA3_8B), _token_ids, rope=True),
    ModelSpec("llama-3-70b", "Llama 3 70B: 80 layers, d 8192, GQA 64/8 heads, SwiGLU 28672", "text",
              70_553_706_496, "Meta Llama 3 model card: 70.6B (70,553,706,496)", 2048, 8192,
              lambda: Llama(LLAMA3_70B), _token_ids, rope=True),
    ModelSpec("llama-2-7b", "Llama 2 7B: 32 layers, d 4096, 32 heads (MHA), SwiGLU 11008, vocab 32000", "text",
              6_738_415_616, "Touvron et al. 2023, Llama 2 (7B); HF Llama-2-7b-hf num_parameters() = 6,738,415,616",
              2048, 4096, lambda: Llama(LLAMA2_7B), _token_ids, rope=True),
    ModelSpec("llama-2-70b", "Llama 2 70B: 80 layers, d 8192, GQA 64/8 heads, SwiGLU 28672, vocab 32000", "text",
              68_976_648_192, "Touvron et al. 2023, Llama 2 (70B); HF Llama-2-70b-hf num_parameters() = 68,976,648,192",
              2048, 4096, lambda: Llama(LLAMA2_70B), _token_ids, rope=True),
    ModelSpec("llama-3.1-405b", "Llama 3.1 405B: 126 layers, d 16384, GQA 128/8 heads, SwiGLU 53248", "text",
              405_853_388_800, "Meta Llama 3.1 model card: 405B; HF Llama-3.1-405B num_parameters() = 405,853,388,800",
              2048, 131072, lambda: Llama(LLAMA31_405B), _token_ids, rope=True),
    ModelSpec("mixtral-8x7b", "Mixtral-style MoE: 32 layers, d 4096, top-2 of 8 SwiGLU experts", "text",
              46_702_792_704, "Jiang et al. 2024, Mixtral of Experts: 46.7B total, 12.9B active", 2048, 32768,
              lambda: Llama(MIXTRAL_8X7B), _token_ids,
              rope=True,
              notes="balanced expert load on the meta device"),
)}


def _llama_geometry(c: LlamaConfig) -> ModelGeometry:
    spec = AttentionSpec(attention_kind(c.n_head, c.n_kv_head), c.n_head, c.n_kv_head, c.hd)
    moe = {"n_experts": c.n_experts, "top_k": c.top_k, "expert_ffn": c.ffn_dim} if c.n_experts else {}
    return ModelGeometry(c.n_layer, c.dim, c.vocab_size, (spec,) * c.n_layer, ffn=c.ffn_dim, source="zoo", **moe)


def zoo_geometry(name: str, image_size: int = 224) -> ModelGeometry | None:
    """A zoo model's geometry from its spec's config (None: a CNN, no attention)."""
    if name in _LLAMAS:
        return _llama_geometry(_LLAMAS[name])
    if name == "gpt2":
        g = GPT2Config()
        return ModelGeometry(g.n_layer, g.n_embd, g.vocab_size, (AttentionSpec("mha", g.n_head, g.n_head,
                             g.n_embd // g.n_head),) * g.n_layer, ffn=4 * g.n_embd, source="zoo")
    if name == "bert-base":
        b = BertConfig()
        return ModelGeometry(b.n_layer, b.hidden, b.vocab_size, (AttentionSpec(
            "mha", b.n_head, b.n_head, b.hidden // b.n_head, causal=False),) * b.n_layer, ffn=b.intermediate,
            source="zoo")
    if name == "vit-b16":
        v = ViTConfig(image_size=image_size)
        return ModelGeometry(v.n_layer, v.hidden, 0, (AttentionSpec(
            "mha", v.n_head, v.n_head, v.hidden // v.n_head, causal=False),) * v.n_layer, ffn=v.mlp_dim,
            source="zoo")
    return None


_LLAMAS = {"llama-3-8b": LLAMA3_8B, "llama-3-70b": LLAMA3_70B, "llama-2-7b": LLAMA2_7B, "llama-2-70b": LLAMA2_70B,
           "llama-3.1-405b": LLAMA31_405B, "mixtral-8x7b": MIXTRAL_8X7B}
CAPTURE_DEVICES = ("meta", "cpu", "cuda")


def check_device(device: str, accepted: tuple[str, ...] = CAPTURE_DEVICES) -> None:
    """Refuse a device a workload cannot be built on here (unknown, or CUDA without a CUDA device), before
    anything is built."""
    if device not in accepted:
        raise OpmapError(f"unknown capture device {device!r}; accepted: {', '.join(accepted)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise OpmapError("--device cuda: no CUDA device is available here; accepted: "
                         + ", ".join(d for d in accepted if d != "cuda"))


def parse_dtype(dtype: str) -> torch.dtype:
    """The torch dtype to build in for an opmap format (quantized formats build in bf16: precision.build_dtype)."""
    return torch_dtype(dtype)


def cast_to(module: torch.nn.Module, inputs: Any, dtype: torch.dtype):
    module = module.to(dtype)

    def cast(x):
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return x.to(dtype)
        if isinstance(x, (list, tuple)):
            return type(x)(cast(y) for y in x)
        if isinstance(x, dict):
            return {k: cast(v) for k, v in x.items()}
        return x

    return module, cast(inputs)


def _check_shape(spec: ModelSpec, batch: int, seq: int, allow_long_context: bool = False) -> None:
    if batch < 1:
        raise OpmapError(f"batch must be at least 1, got {batch}")
    what = "--seq" if spec.kind == "text" else "--image-size"
    if spec.kind == "text" and seq > spec.max_seq and not (allow_long_context and spec.rope):
        raise positions_limit(spec.name, what, spec.max_seq, seq, spec.rope)
    if seq < 1 or (seq > spec.max_seq and spec.kind != "text"):
        raise OpmapError(f"{spec.name} takes {what} from 1 to {spec.max_seq}, got {seq}")
    if spec.kind == "vision" and spec.name == "vit-b16" and seq % 16:
        raise OpmapError(f"vit-b16 takes --image-size as a multiple of its 16-pixel patch, got {seq}")
    if spec.kind == "vision" and seq < 32:
        raise OpmapError(f"{spec.name} takes --image-size of at least 32 pixels, got {seq}")


def build_zoo(name: str, batch: int = 1, seq: int | None = None, dtype: str = "fp32",
              device: str = "meta", allow_long_context: bool = False) -> Workload:
    """Build a zoo model with example inputs. ``seq`` is tokens for text models, the image side for vision."""
    if name not in MODELS:
        raise OpmapError(f"unknown model {name!r}; accepted: {', '.join(MODELS)} (or path/to/file.py:factory)")
    spec = MODELS[name]
    seq = spec.default_seq if seq is None else seq
    _check_shape(spec, batch, seq, allow_long_context)
    tdt = parse_dtype(dtype)
    with torch.device(device):
        if spec.name == "vit-b16":
            module = ViT(ViTConfig(image_size=seq))
        else:
            module = spec.build()
        inputs = spec.make_inputs(batch, seq, tdt)
    module, inputs = cast_to(module, inputs, tdt)
    assumptions = ("random weights built from the published config",)
    if spec.notes and device == "meta":
        assumptions += (f"{spec.name}: {spec.notes} (each expert gets batch*seq*top_k/experts tokens)",)
    return Workload(name, module, inputs, batch, seq if spec.kind == "text" else None, assumptions,
                    geometry=zoo_geometry(name, seq if spec.name == "vit-b16" else 224))
