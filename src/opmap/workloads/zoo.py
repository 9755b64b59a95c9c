"""The built-in zoo and the loader for a user's own model file.

A workload is a module plus example inputs plus the assumptions that came with building it. Zoo models
are built under ``torch.device(device)`` (meta by default: no weights are allocated) with random weights
and cast to the dtype asked for.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from opmap.errors import OpmapError
from opmap.workloads.resnet import ResNet
from opmap.workloads.transformers import GPT2, Bert, BertConfig, GPT2Config, Llama, LlamaConfig, ViT, ViTConfig

TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
                # quantized formats are built in bf16; the format is a mapping decision (predict.POLICY)
                "fp8": torch.bfloat16, "int8": torch.bfloat16, "int4": torch.bfloat16}


@dataclass
class Workload:
    name: str
    module: torch.nn.Module
    inputs: Any  # tuple of positional args, or a dict of keyword args
    batch: int
    seq: int | None
    assumptions: list[str] = field(default_factory=list)


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


def _ids(vocab: int):
    def make(batch: int, seq: int, dtype: torch.dtype):
        return (torch.zeros(batch, seq, dtype=torch.long),)

    return make


def _bert_inputs(batch: int, seq: int, dtype: torch.dtype):
    return (torch.zeros(batch, seq, dtype=torch.long), torch.zeros(batch, seq, dtype=torch.long))


def _images(batch: int, size: int, dtype: torch.dtype):
    return (torch.zeros(batch, 3, size, size, dtype=dtype),)


LLAMA3_8B = LlamaConfig()
LLAMA3_70B = LlamaConfig(dim=8192, n_layer=80, n_head=64, n_kv_head=8, ffn_dim=28672)
MIXTRAL_8X7B = LlamaConfig(vocab_size=32000, dim=4096, n_layer=32, n_head=32, n_kv_head=8, ffn_dim=14336,
                           rope_theta=1e6, max_seq=32768, n_experts=8, top_k=2)

MODELS: dict[str, ModelSpec] = {m.name: m for m in (
    ModelSpec("gpt2", "GPT-2 small, 12 layers, d 768, tied LM head", "text", 124_439_808,
              "Radford et al. 2019; HF gpt2 num_parameters() = 124,439,808", 1024, 1024,
              lambda: GPT2(GPT2Config()), _ids(50257)),
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
              lambda: Llama(LLAMA3_8B), _ids(128256)),
    ModelSpec("llama-3-70b", "Llama 3 70B: 80 layers, d 8192, GQA 64/8 heads, SwiGLU 28672", "text",
              70_553_706_496, "Meta Llama 3 model card: 70.6B (70,553,706,496)", 2048, 8192,
              lambda: Llama(LLAMA3_70B), _ids(128256)),
    ModelSpec("mixtral-8x7b", "Mixtral-style MoE: 32 layers, d 4096, top-2 of 8 SwiGLU experts", "text",
              46_702_792_704, "Jiang et al. 2024, Mixtral of Experts: 46.7B total, 12.9B active", 2048, 32768,
              lambda: Llama(MIXTRAL_8X7B), _ids(32000),
              notes="balanced expert load on the meta device"),
)}


def parse_dtype(dtype: str) -> torch.dtype:
    if dtype not in TORCH_DTYPES:
        raise OpmapError(f"unknown dtype {dtype!r}; accepted: {', '.join(TORCH_DTYPES)}")
    return TORCH_DTYPES[dtype]


def _cast(module: torch.nn.Module, inputs: Any, dtype: torch.dtype):
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


def _check_shape(spec: ModelSpec, batch: int, seq: int) -> None:
    if batch < 1:
        raise OpmapError(f"batch must be at least 1, got {batch}")
    what = "--seq" if spec.kind == "text" else "--image-size"
    if seq < 1 or seq > spec.max_seq:
        raise OpmapError(f"{spec.name} takes {what} from 1 to {spec.max_seq}, got {seq}")
    if spec.kind == "vision" and spec.name == "vit-b16" and seq % 16:
        raise OpmapError(f"vit-b16 takes --image-size as a multiple of its 16-pixel patch, got {seq}")
    if spec.kind == "vision" and seq < 32:
        raise OpmapError(f"{spec.name} takes --image-size of at least 32 pixels, got {seq}")


def build_zoo(name: str, batch: int = 1, seq: int | None = None, dtype: str = "fp32",
              device: str = "meta") -> Workload:
    """Build a zoo model with example inputs. ``seq`` is tokens for text models, the image side for vision."""
    if name not in MODELS:
        raise OpmapError(f"unknown model {name!r}; accepted: {', '.join(MODELS)} (or path/to/file.py:factory)")
    spec = MODELS[name]
    seq = spec.default_seq if seq is None else seq
    _check_shape(spec, batch, seq)
    tdt = parse_dtype(dtype)
    with torch.device(device):
        if spec.name == "vit-b16":
            module = ViT(ViTConfig(image_size=seq))
        else:
            module = spec.build()
        inputs = spec.make_inputs(batch, seq, tdt)
    module, inputs = _cast(module, inputs, tdt)
    assumptions = ["random weights built from the published config"]
    if spec.notes and device == "meta":
        assumptions.append(f"{spec.name}: {spec.notes} (each expert gets batch*seq*top_k/experts tokens)")
    return Workload(name, module, inputs, batch, seq if spec.kind == "text" else None, assumptions)


def load_user(target: str, dtype: str = "fp32", device: str = "meta") -> Workload:
    """``path/to/file.py:factory``: factory() returns (module, example inputs), called under
    ``torch.device(device)`` so the tensors it makes land there; ``dtype`` casts the module and the
    floating-point inputs."""
    path_s, sep, factory = target.rpartition(":")
    if not sep or not path_s.endswith(".py") or not factory.isidentifier():
        raise OpmapError(f"bad model target {target!r}: expected a zoo name ({', '.join(MODELS)}) "
                         "or path/to/file.py:factory")
    path = Path(path_s)
    if not path.is_file():
        raise OpmapError(f"model file {path} does not exist")
    tdt = parse_dtype(dtype)
    mod_name = f"opmap_user_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the user's file: report its error in one line
        raise OpmapError(f"importing {path} failed: {type(e).__name__}: {e}") from None
    fn = getattr(module, factory, None)
    if not callable(fn):
        raise OpmapError(f"{path} has no callable {factory!r}")
    try:
        with torch.device(device):
            result = fn()
    except OpmapError:
        raise
    except Exception as e:
        raise OpmapError(f"{path}:{factory}() failed on device {device!r}: {type(e).__name__}: {e}") from None
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.nn.Module)):
        raise OpmapError(f"{path}:{factory}() must return (module, example inputs), got {type(result).__name__}")
    net, inputs = result
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    net, inputs = _cast(net, inputs, tdt)
    first = next((x for x in (inputs.values() if isinstance(inputs, dict) else inputs)
                  if isinstance(x, torch.Tensor)), None)
    batch = int(first.shape[0]) if first is not None and first.dim() else 1
    seq = int(first.shape[1]) if first is not None and first.dim() > 1 and not first.is_floating_point() else None
    return Workload(f"{path.name}:{factory}", net, inputs, batch, seq, ["user model: " + target])


CAPTURE_DEVICES = ("meta", "cpu", "cuda")


def check_device(device: str, accepted: tuple[str, ...] = CAPTURE_DEVICES) -> None:
    """Refuse a device a workload cannot be built on here (unknown, or CUDA without a CUDA device), before
    anything is built."""
    if device not in accepted:
        raise OpmapError(f"unknown capture device {device!r}; accepted: {', '.join(accepted)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise OpmapError("--device cuda: no CUDA device is available here; accepted: "
                         + ", ".join(d for d in accepted if d != "cuda"))


def load_workload(target: str, batch: int = 1, seq: int | None = None, dtype: str = "fp32",
                  device: str = "meta") -> Workload:
    check_device(device)
    if target in MODELS:
        return build_zoo(target, batch, seq, dtype, device)
    if ":" in target and target.rpartition(":")[0].endswith(".py"):
        return load_user(target, dtype, device)
    raise OpmapError(f"unknown model {target!r}; accepted: {', '.join(MODELS)} (or path/to/file.py:factory)")


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
    return Workload(w.name, _ChannelsLast(w.module), w.inputs, w.batch, w.seq,
                    [*w.assumptions, "layout: channels_last (NHWC) activations, weights stored channels-last"])
