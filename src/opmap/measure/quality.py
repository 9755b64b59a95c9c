"""Quality evidence for a reduced precision: the model in that format against an fp32 reference.

Both runs use the same weights (random for zoo models: the evidence says so) and the same random inputs
(seeded), on the CPU:

- ``bf16`` / ``fp16``: a real cast of the module and its floating-point inputs;
- ``fp8``: fake quantization to float8 e4m3 (per-tensor scale amax / 448) of every Linear and Conv weight
  and, dynamically, of their inputs (W8A8 as fp8 GEMMs run); compute in fp32;
- ``int8``: symmetric fake quantization, weights per output channel (amax / 127), activations per tensor
  at the GEMM / conv inputs;
- ``int4``: weight-only, symmetric, groups of 128 along the input dimension (amax / 7, values -8..7), as
  GPTQ / AWQ-style kernels store it; activations stay fp32;
- ``mxfp8`` / ``mxfp6`` / ``mxfp4`` / ``nvfp4`` / ``fp8-block``: the block-scaled emulation of
  ``opmap.measure.blockscale`` applied to every Linear's weight and, dynamically, to its input, both blocked
  along the reduction dimension (W8A8, W6A6, W4A4: weights and activations both in the format, as serving
  runs them on block-scaled matrix engines); compute in fp32. Conv layers stay fp32.

A tied weight (GPT-2's embedding and LM head) is quantized once, as the shared tensor it is.

Reported: relative error ||y - y_ref|| / ||y_ref|| (Frobenius, float64), max absolute error, the output's SNR
10 log10(||y_ref||^2 / ||y - y_ref||^2) in dB, and argmax agreement over the last dimension: top-1 agreement
for a classifier, next-token agreement over every position for a language model, whose next-token
distributions are also compared by KL(ref || quantized) = sum p_ref (log p_ref - log p_q), in nats, the mean
over positions. Per Linear layer (its first call): the SNR of its output with the layer fed the reference's
input (its own error, ``snr_db``) and in the quantized model's run (the error reaching it included,
``snr_db_in_model``), against the reference's same layer on the same model inputs.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from opmap.errors import OpmapError
from opmap.formats import registry
from opmap.measure.blockscale import BLOCK_FORMATS, METHOD, qdq
from opmap.precision import torch_dtype
from opmap.validate import Rule, shown

FP8_MAX = 448.0  # largest finite float8 e4m3fn (OCP FP8 spec)
INT4_GROUP = 128


@dataclass(frozen=True)
class LayerQuality:
    """One Linear layer's output SNR (dB) against the reference's: fed the reference's input (``snr_db``) and
    in the quantized model's run (``snr_db_in_model``); None where the outputs are identical (no error)."""

    layer: str
    snr_db: float | None
    snr_db_in_model: float | None


@dataclass(frozen=True)
class Quality:
    """One format's quality evidence against fp32 on the same inputs. Its record is quality.json (``RECORD``: the
    reference format and the torch it ran under among the fields)."""

    RECORD: ClassVar[tuple[Any, ...]] = (
        "schema_version", "workload", "dtype", "reference_dtype", "rel_error", "max_abs_error", "agreement",
        "agreement_kind", "positions", "method", "seed", "weights", "torch_version", ...)
    schema_version: ClassVar[int] = 1  # quality.json's
    reference_dtype: ClassVar[str] = "fp32"
    workload: str
    dtype: str
    rel_error: float
    max_abs_error: float
    agreement: float
    agreement_kind: str
    positions: int
    method: str
    seed: int
    weights: str = "random"  # where the compared weights came from: "random" (the zoo) or a user file's
    snr_db: float | None = None  # the output's SNR against fp32 (None: identical)
    kl: float | None = None  # mean KL(ref || quantized) of the next-token distributions, nats (language models)
    layers: tuple[LayerQuality, ...] = ()

    @property
    def torch_version(self) -> str:
        """The torch that computed it (this process's)."""
        return torch.__version__


# quality.json's fields as ``parse_quality`` checks them: text fields, and numbers with their ranges
QUALITY_TEXT = ("workload", "dtype", "agreement_kind")
QUALITY_NUMBERS: dict[str, Rule] = {
    "rel_error": Rule(lo=0),  # ||y - y_ref|| / ||y_ref||: 0 is exact agreement, any finite size possible
    "agreement": Rule(lo=0, hi=1),  # a fraction of positions
    "max_abs_error": Rule(lo=0),
    "positions": Rule(lo=1, integer=True),
    "seed": Rule(lo=0, integer=True),
    "snr_db": Rule(),  # any finite dB (negative: the error outweighs the signal); null where outputs are identical
    "kl": Rule(lo=0),
}


@dataclass(frozen=True)
class QualityEvidence:
    """quality.json as read back (``parse_quality``): the workload and format it covers and its end-to-end figures
    against fp32; an optional field the file leaves out is None (``weights``: files before the key)."""

    workload: str
    dtype: str
    rel_error: float
    agreement: float
    agreement_kind: str
    weights: str | None = None
    snr_db: float | None = None  # None: identical outputs
    kl: float | None = None
    max_abs_error: float | None = None
    positions: int | None = None
    seed: int | None = None


def parse_quality(text: str | bytes, origin: str = "quality.json") -> QualityEvidence:
    """quality.json (``Quality.to_dict``) read from its text, nothing else touched: its figures, or OpmapError naming
    the field when it is not JSON, not an object, lacks workload / dtype / rel_error / agreement /
    agreement_kind, holds a non-string where text belongs (``weights`` too, where present), or a number that is
    a bool, a string, NaN, infinite or out of range (rel_error >= 0, agreement from 0 to 1)."""
    try:
        q = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise OpmapError(f"cannot read quality file {origin}: expected quality.json from opmap quality "
                         f"({type(e).__name__}: {' '.join(str(e).split())[:80]})") from None
    if not isinstance(q, dict):
        raise OpmapError(f"quality file {origin}: expected a JSON object from opmap quality (got {shown(q)})")
    for key in (*QUALITY_TEXT, "rel_error", "agreement"):
        if key not in q:
            raise OpmapError(f"quality file {origin}: missing {key} (expected quality.json from opmap quality)")
    for key in (*QUALITY_TEXT, "weights"):
        if key in q and not isinstance(q[key], str):
            raise OpmapError(f"quality file {origin}: {key} must be a string (got {shown(q[key])})")
    for key, rule in QUALITY_NUMBERS.items():
        if key in q and not (key in ("snr_db", "kl") and q[key] is None):
            q[key] = rule.check(q[key], f"quality file {origin}: {key}")
    return QualityEvidence(**{f.name: q.get(f.name) for f in fields(QualityEvidence)})


def read_quality(path: Path) -> QualityEvidence:
    """``parse_quality`` of the file at ``path``: the user's path (their own link is followed), what it names a
    regular file of at most LIMIT_JSON_BYTES (opmap.safeio), else one line saying what it is."""
    from opmap.safeio import LIMIT_JSON_BYTES, read_bounded

    return parse_quality(read_bounded(path, LIMIT_JSON_BYTES, "quality file", follow_links=True), str(path))


def fake_fp8(x: torch.Tensor) -> torch.Tensor:
    s = x.detach().abs().amax().clamp(min=1e-12) / FP8_MAX
    return (x / s).to(torch.float8_e4m3fn).to(x.dtype) * s


def fake_int8(x: torch.Tensor, per_channel: bool) -> torch.Tensor:
    a = x.detach().abs()
    amax = a.flatten(1).amax(1).view(-1, *([1] * (x.dim() - 1))) if per_channel and x.dim() > 1 else a.amax()
    s = amax.clamp(min=1e-12) / 127.0
    return torch.round(x / s).clamp(-127, 127) * s


def fake_int4(w: torch.Tensor, group: int = INT4_GROUP) -> torch.Tensor:
    flat = w.detach().reshape(w.shape[0], -1)
    cols = flat.shape[1]
    pad = (-cols) % group
    g = torch.nn.functional.pad(flat, (0, pad)).reshape(flat.shape[0], -1, group)
    s = g.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 7.0
    q = (torch.round(g / s).clamp(-8, 7) * s).reshape(flat.shape[0], -1)[:, :cols]
    return q.reshape(w.shape)


def _quantize(model: nn.Module, dtype: str) -> list:
    """Fake-quantize ``model`` in place; returns the hook handles."""
    if dtype in BLOCK_FORMATS:
        return _quantize_blocks(model, dtype)
    handles, done = [], set()
    for m in model.modules():
        if not isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            continue
        w = m.weight
        if id(w) not in done:
            done.add(id(w))
            with torch.no_grad():
                w.copy_({"fp8": fake_fp8, "int8": lambda t: fake_int8(t, True), "int4": fake_int4}[dtype](w))
        if dtype in ("fp8", "int8"):
            fq = fake_fp8 if dtype == "fp8" else (lambda t: fake_int8(t, False))
            handles.append(m.register_forward_pre_hook(
                lambda _m, args, fq=fq: tuple(fq(a) if isinstance(a, torch.Tensor) and a.is_floating_point()
                                              else a for a in args)))
    return handles


def _quantize_blocks(model: nn.Module, fmt: str) -> list:
    """Every Linear's weight ([out, in], blocked along in) quantize-dequantized to the block-scaled ``fmt`` once
    (a tied weight once), and a pre-hook doing the same to its floating-point inputs (blocked along the last
    dimension, the reduction); the hook handles."""
    handles, done = [], set()
    for m in model.modules():
        if not isinstance(m, nn.Linear):
            continue
        if id(m.weight) not in done:
            done.add(id(m.weight))
            with torch.no_grad():
                m.weight.copy_(qdq(m.weight, fmt, weight=True))
        handles.append(m.register_forward_pre_hook(
            lambda _m, args: tuple(qdq(a, fmt, weight=False) if isinstance(a, torch.Tensor) and a.is_floating_point()
                                   else a for a in args)))
    return handles


def _block_method(fmt: str) -> str:
    bits = registry().get(fmt).bits
    return (f"{METHOD[fmt]}; every Linear's weights and inputs quantize-dequantized (W{bits}A{bits}, as serving "
            "runs it), compute in fp32")


def _first_tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        out = list(out.values())
    for x in out:
        if isinstance(x, torch.Tensor):
            return x
    raise OpmapError("the model's output holds no tensor to compare")


def random_inputs(module: nn.Module, inputs: Any, seed: int) -> Any:
    """Inputs of the same shapes, random: floats N(0, 1); the first integer input uniform token ids over the
    first embedding's vocabulary (other integer inputs, such as token types, stay as given)."""
    g = torch.Generator().manual_seed(seed)
    vocab = next((m.num_embeddings for m in module.modules() if isinstance(m, nn.Embedding)), 2)
    first_int = [True]

    def fill(x):
        if isinstance(x, torch.Tensor):
            if x.is_floating_point():
                return torch.randn(x.shape, generator=g, dtype=torch.float32).to(x.dtype)
            if first_int[0]:
                first_int[0] = False
                return torch.randint(0, vocab, x.shape, generator=g, dtype=x.dtype)
            return x
        if isinstance(x, (list, tuple)):
            return type(x)(fill(y) for y in x)
        if isinstance(x, dict):
            return {k: fill(v) for k, v in x.items()}
        return x

    return fill(inputs)


def _call(module, inputs):
    if isinstance(inputs, dict):
        return module(**inputs)
    return module(*inputs) if isinstance(inputs, (tuple, list)) else module(inputs)


def _cast(x, dt):
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.to(dt)
    if isinstance(x, (list, tuple)):
        return type(x)(_cast(y, dt) for y in x)
    if isinstance(x, dict):
        return {k: _cast(v, dt) for k, v in x.items()}
    return x


def check_dtype(dtype: str) -> None:
    """Refuse a dtype quality cannot compare with fp32 (checked before the model is built)."""
    accepted = registry().names(quality=True)  # the format registry's quality formats
    if dtype not in accepted:
        raise OpmapError(f"quality takes a reduced precision; accepted: {', '.join(accepted)} (got {dtype!r})")


def snr_db(ref: torch.Tensor, y: torch.Tensor) -> float | None:
    """10 log10(||ref||^2 / ||y - ref||^2) in float64; None where y equals ref (no error to measure)."""
    ref, y = ref.double(), y.double()
    noise = float((y - ref).square().sum())
    if noise == 0:
        return None
    return 10 * math.log10(max(float(ref.square().sum()), 1e-300) / noise)


def kl_mean(ref_logits: torch.Tensor, logits: torch.Tensor) -> float:
    """KL(p_ref || p) of the softmax distributions over the last dimension, in nats, the mean over positions."""
    lp_ref = torch.log_softmax(ref_logits.double(), -1)
    lp = torch.log_softmax(logits.double(), -1)
    return float((lp_ref.exp() * (lp_ref - lp)).sum(-1).mean().clamp(min=0))


def _tap_linears(model: nn.Module, keep_inputs: bool) -> tuple[dict[str, tuple], list]:
    """Forward hooks recording each Linear's (input or None, output) at its first call, by module name."""
    taps: dict[str, tuple] = {}

    def hook(name):
        def record(_m, args, out):
            if name not in taps and isinstance(out, torch.Tensor):
                taps[name] = (args[0].detach() if keep_inputs and args else None, out.detach())
        return record
    return taps, [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if isinstance(m, nn.Linear)]


def _layers(ref_taps: dict, low_taps: dict, low: nn.Module, dt) -> tuple[LayerQuality, ...]:
    """Per Linear: its output SNR fed the reference's input (the low model's layer, its quantization hooks on),
    and in the low model's own run."""
    mods = dict(low.named_modules())
    out = []
    for name, (x, y_ref) in ref_taps.items():
        if not isinstance(x, torch.Tensor) or name not in low_taps:
            continue
        y_iso = mods[name](x.to(dt) if dt is not None else x)
        out.append(LayerQuality(name, snr_db(y_ref, y_iso), snr_db(y_ref, low_taps[name][1])))
    return tuple(out)


def _run_low(name: str, ref_model: nn.Module, x: Any, dtype: str, ref_taps: dict):
    """The ``dtype`` copy of ``ref_model`` run on ``x``: (its output, per-layer figures, method)."""
    low = copy.deepcopy(ref_model)
    dt, handles = None, []
    if registry().get(dtype).runnable:  # a torch dtype (bf16, fp16): a real cast
        dt = torch_dtype(dtype)
        low, x = low.to(dt), _cast(x, dt)
        method = f"real cast of the module and inputs to {dtype}"
    else:
        handles = _quantize(low, dtype)
        method = _block_method(dtype) if dtype in BLOCK_FORMATS else {
            "fp8": "fake quantization to fp8 e4m3, per-tensor scales, weights and GEMM / conv inputs",
            "int8": "fake quantization to int8: weights per output channel, GEMM / conv inputs per tensor (dynamic)",
            "int4": f"weight-only fake quantization to int4, groups of {INT4_GROUP}"}[dtype]
    low_taps, taps = _tap_linears(low, keep_inputs=False)
    try:
        y = _first_tensor(_call(low, x))
        for h in taps:
            h.remove()
        layers = _layers(ref_taps, low_taps, low, dt)
    except (RuntimeError, NotImplementedError) as e:
        if dt is None:
            raise
        raise OpmapError(f"{name} does not run in {dtype} on the CPU ({str(e).splitlines()[0]}); "
                         "accepted here: bf16 and the emulated formats") from None
    for h in handles:
        h.remove()
    return y, layers, method


def measure_quality(name: str, module: nn.Module, inputs: Any, dtype: str, kind: str = "", seed: int = 0,
                    weights: str = "random") -> Quality:
    """Run ``module`` (fp32, on the CPU) and its ``dtype`` version on the same random inputs; compare the
    outputs and each Linear's. ``weights`` says where the module's weights came from ("random": the zoo builds
    no checkpoint)."""
    check_dtype(dtype)
    ref_model = module.float().eval()
    x = random_inputs(ref_model, _cast(inputs, torch.float32), seed)
    with torch.no_grad():
        ref_taps, taps = _tap_linears(ref_model, keep_inputs=True)
        ref = _first_tensor(_call(ref_model, x)).double()
        for h in taps:
            h.remove()
        y, layers, method = _run_low(name, ref_model, x, dtype, ref_taps)
    y = y.double()
    if y.shape != ref.shape:
        raise OpmapError(f"output shapes differ: {tuple(y.shape)} in {dtype}, {tuple(ref.shape)} in fp32")
    diff = y - ref
    rel = float(diff.norm() / ref.norm().clamp(min=1e-300))
    if not math.isfinite(rel):
        raise OpmapError(f"{name} in {dtype} produced non-finite outputs (overflow); the format cannot hold it")
    agree = (y.argmax(-1) == ref.argmax(-1)).double()
    vocab = next((m.num_embeddings for m in ref_model.modules() if isinstance(m, nn.Embedding)), None)
    lm = ref.dim() == 3 and ref.shape[-1] == vocab
    akind = ("next-token agreement" if lm else "top-1 agreement" if ref.dim() == 2 else
             "argmax agreement over the last dimension (hidden states: weak evidence)")
    return Quality(name, dtype, rel, float(diff.abs().max()), float(agree.mean()), akind, int(agree.numel()),
                   method, seed, weights, snr_db(ref, y), kl_mean(ref, y) if lm else None, layers)
