"""Precision: the one dtype table and the one precision policy.

Two kinds of names meet here:

- torch dtype names as the capture records them (``"float32"``, ``"bfloat16"``, ``"float8_e4m3fn"``):
  ``dtype_bytes`` gives their size per element;
- opmap format names (``fp32 tf32 bf16 fp16 fp8 int8 int4 nvfp4 mxfp8 mxfp6 mxfp4``, plus ``fp64`` in the
  catalog; ``fp8-block``, DeepSeek-V3's block-scaled fp8, runs on the fp8 engine): what a user asks for with
  ``--dtype``, what the catalog lists peaks for, what a kernel computes in. They are the format registry's
  (opmap.formats, data in formats.toml); ``format_bytes`` gives their size per element at the matrix engine (int4:
  half a byte; a block-scaled format: its scales included). ``--dtype fp4`` is an alias, not a format:
  ``resolve_dtype`` names the format it means on a device (nvfp4 on Blackwell, mxfp4 on CDNA 4, else the
  narrowest float format the device runs).

An unknown name is refused with the accepted ones, never given a default size.

The policy (``policy(fmt)``) says, per requested format, what each op family runs in: GEMM / conv / attention
run in the matrix format (falling back to the nearest one the device has, ``fallback(fmt)``); softmax and norms
compute in fp32 whatever the storage; the other vector ops run in the activation format. The graph is
captured at ``capture`` (the torch dtype the model is built in), weights are stored at ``weights``, so
weight bytes scale by the formats' sizes. int4 stores a 16-bit scale per group of 128 weights (GPTQ /
AWQ-style group quantization); int8 a 16-bit scale per output channel of 4096.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from opmap.errors import OpmapError
from opmap.formats import FormatPolicy, get_format, registry


class HardwareSpec(Protocol):
    """What the precision policy reads of a device (opmap.hardware.spec.HardwareSpec, a layer above this leaf):
    its name, matrix and vector peaks per format (values with a ``value``) and power-limited figures."""

    name: str
    matrix_peak_flops_per_s: Mapping[str, Any]
    vector_peak_flops_per_s: Mapping[str, Any]
    achievable_matrix_flops_per_s: Mapping[str, Any]
    sustained_matrix_flops_per_s: Mapping[str, Any]
    @property
    def power_window_s(self) -> float | None: ...

    def matrix_dtypes(self) -> list[str]: ...

# Bytes per element by torch dtype name (str(torch.float32) without "torch."): every dtype torch 2.13 defines.
# Sub-byte integer and bit types are stored one element per byte by torch; packed types (float4_e2m1fn_x2,
# quint4x2, quint2x4, bits4x2, bits2x4, bits1x8) hold several values in the byte counted here.
DTYPE_BYTES: dict[str, float] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1,
    "float4_e2m1fn_x2": 1,
    "complex128": 16, "complex64": 8, "complex32": 4,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1, "bool": 1,
    "int1": 1, "int2": 1, "int3": 1, "int4": 1, "int5": 1, "int6": 1, "int7": 1,
    "uint1": 1, "uint2": 1, "uint3": 1, "uint4": 1, "uint5": 1, "uint6": 1, "uint7": 1,
    "qint32": 4, "qint8": 1, "quint8": 1, "quint4x2": 1, "quint2x4": 1,
    "bits16": 2, "bits8": 1, "bits4x2": 1, "bits2x4": 1, "bits1x8": 1,
}

# The opmap formats are the registry's (opmap.formats, held as data in formats.toml): bytes per element, the torch
# dtype a model is built in, the fallback chain, the policy are its values, asked for through the functions below.
FORMATS = registry().names(catalog=True)  # the catalog's peak keys, in display order
# Formats that are torch dtypes a real run can execute in (profile); the rest are modelled, not run.
RUNNABLE = registry().names(runnable=True)


def requestable() -> tuple[str, ...]:
    """The formats --dtype accepts (its aliases aside: ``accepted``)."""
    return registry().names(requestable=True)


def aliases() -> dict[str, tuple[str, ...]]:
    """The --dtype aliases (``fp4``) and their formats, in the order a device is asked for them."""
    return registry().aliases()


def accepted() -> tuple[str, ...]:
    """What --dtype accepts: the requestable formats, then the aliases resolved per device."""
    return (*requestable(), *aliases())


def policy(fmt: str) -> FormatPolicy:
    """What a request for ``fmt`` means per op family (a requestable format; others refused, an alias too: it
    means a format only on a device, ``resolve_dtype``)."""
    return get_format(check_format(fmt)).policy


def fallback(fmt: str) -> tuple[str, ...]:
    """The matrix formats tried for a request of ``fmt``, nearest first."""
    return get_format(check_format(fmt)).fallback


def capture_format(dtype: str) -> str:
    """The format a model requested at ``dtype`` (a format or an alias) is captured in: its policy's capture; an
    alias's formats share theirs (formats.parse_formats checks their build dtypes agree)."""
    members = aliases().get(dtype)
    return policy(members[0] if members else dtype).capture


# fp8 on a device with no fp8 matrix engine (A100, MI250X, TPU v5e): priced as the weight-only fallback engines run
# there, fp8 (e4m3) weights in memory, dequantized to bf16 inside the GEMM, bf16 compute (W8A16). vLLM's FP8 docs
# (docs.vllm.ai, Quantization > FP8 W8A8): "FP8 models will run on compute capability >= 7.5 (Turing) as weight-only
# W8A16, utilizing FP8 Marlin"; vllm-project/vllm PR 5975 (FP8 Marlin, Ampere): "a fast fused dequantization kernel
# for FP8 to BF16/FP16 conversion". One scale per output channel is negligible beside the weights: 1 byte a weight.
FP8_WEIGHT_ONLY = FormatPolicy("bf16", "fp8 (e4m3), weight-only: dequantized to bf16 in the GEMM (W8A16)", "bf16",
                               "fp32", 1.0, quantized=True, weight_only=True)
FP8_WEIGHT_ONLY_NOTE = ("{hw} has no fp8 matrix engine: fp8 priced as the weight-only fallback (fp8 weights in "
                        "memory, dequantized to bf16 in the GEMM, {matrix} compute at the {matrix} rate; vLLM's FP8 "
                        "Marlin W8A16 path)")


WEIGHT_ONLY_NOTE = ("{hw} has no {engine} matrix engine: {fmt} priced as the weight-only fallback ({fmt} weights in "
                    "memory, dequantized to {matrix} in the GEMM, {matrix} compute at the {matrix} rate: {kernel})")


def weight_only_policy(fmt: str, matrix: str) -> FormatPolicy:
    """``fmt`` on a device without its matrix engine: the weights stay in ``fmt`` (its bytes, scales included) and
    are dequantized to ``matrix`` inside the GEMM, activations at the capture format (W4A16 for an fp4 format)."""
    f = get_format(fmt)
    pol = f.policy
    return FormatPolicy(pol.capture, f"{pol.weights}, weight-only: dequantized to {matrix} in the GEMM "
                                     f"(W{f.bits}A16)", pol.capture, "fp32", pol.weight_bytes, quantized=True,
                        weight_only=True)


# fp8 training as NVIDIA Transformer Engine runs it (TE docs, "Using FP8 with Transformer Engine"; Micikevicius et
# al. 2022, "FP8 Formats for Deep Learning"): the Linear layers' three GEMMs take fp8 operands (fprop E4M3 x E4M3,
# dgrad E5M2 gradient x E4M3 weight, wgrad E4M3 input x E5M2 gradient) with per-tensor delayed scaling, accumulate in
# fp32 and write bf16; the weights stay bf16, with fp32 master weights and AdamW moments in the optimizer (as bf16
# mixed precision), cast to fp8 once per iteration. weight_bytes 2: the bf16 weights are what the model stores.
FP8_TRAINING = FormatPolicy("bf16", "bf16 + its fp8 e4m3 copy and transpose, cast once per iteration (fp32 master "
                                    "and AdamW state in the optimizer)",
                            "bf16 (Linear GEMM inputs cast to fp8 e4m3, their gradients to e5m2)", "fp32", 2.0,
                            quantized=True, one_byte_operands=True)
# What Transformer Engine's fp8 training needs: an fp8 matrix engine (TE's fp8 recipes run on compute capability 8.9
# and later: Ada, Hopper, Blackwell).
FP8_TRAINING_DEVICES = "Hopper, Ada or later: TE's fp8 GEMMs need compute capability 8.9+"


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a torch dtype name; an unknown name is refused."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise OpmapError(f"unknown tensor dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}") from None


def format_bytes(fmt: str) -> float:
    """Bytes per element of an opmap format name; an unknown name is refused."""
    return get_format(fmt).bytes


def check_requestable(dtype: str) -> str:
    """``dtype`` as --dtype takes it: a requestable format or an alias; anything else refused with the list."""
    if dtype in aliases():
        return dtype
    f = registry().get(dtype)
    if f is None or not f.requestable:
        raise OpmapError(f"unknown dtype {dtype!r}; accepted: {', '.join(accepted())}")
    return dtype


def check_format(dtype: str) -> str:
    """``dtype`` as a format (an alias refused: it names a format only once a device is known)."""
    if dtype in aliases():
        raise OpmapError(f"--dtype {dtype} is an alias resolved per device ({', '.join(aliases()[dtype])}, else "
                         "the narrowest float format the device runs): resolve it on a device first")
    return check_requestable(dtype)


def build_dtype(fmt: str) -> str:
    """The torch dtype name a model is built in for ``fmt`` (quantized formats: bfloat16: the stored format is a
    mapping decision, the policy, not a torch dtype). An alias: its formats' build dtype (they share one)."""
    members = aliases().get(check_requestable(fmt))
    return get_format(members[0] if members else fmt).build


def build_bytes(fmt: str) -> float:
    """Bytes per element of the tensors a real build of ``fmt`` holds (its build dtype's)."""
    return dtype_bytes(build_dtype(fmt))


def reference(fmt: str) -> bool:
    """``fmt`` is stored in fp32, the reference quality compares against (fp32, tf32)."""
    return build_dtype(fmt) == "float32"


def torch_dtype(fmt: str):
    """The torch dtype a model is built in for ``fmt`` (quantized formats: bfloat16)."""
    import torch

    return getattr(torch, build_dtype(fmt))


@dataclass(frozen=True)
class Precision:
    """A requested format resolved on one device: the matrix format used (after fallback) and its peaks."""

    requested: str
    matrix: str  # the dtype whose matrix peak is used
    matrix_peak_flops_per_s: float
    vector_peak_flops_per_s: float
    note: str = ""
    weight_scale: float = 1.0  # stored weight bytes over the captured weight bytes
    # the rate the time model runs the matrix units at: the achievable (measured, sustained) rate where the
    # spec has one, else the dense peak; the peak stays the MFU denominator
    matrix_rate_flops_per_s: float = 0.0
    rate_basis: str = "dense peak"  # where matrix_rate_flops_per_s came from, for the assumptions
    sustained: bool = False  # a long run on a power-limited card: the rate blends boost and sustained
    # the policy actually priced when it differs from policy(requested) (fp8 without an fp8 engine: FP8_WEIGHT_ONLY)
    fallback_policy: FormatPolicy | None = None

    def __post_init__(self):
        if not self.matrix_rate_flops_per_s:
            object.__setattr__(self, "matrix_rate_flops_per_s", self.matrix_peak_flops_per_s)

    @property
    def format_policy(self) -> FormatPolicy:
        return self.fallback_policy or policy(self.requested)

    @property
    def policy(self) -> dict[str, str]:
        return {**self.format_policy.to_dict(), "matrix": self.matrix, "softmax_norm": "fp32 compute"}

    @property
    def operand_format(self) -> str:
        """The format of a GEMM's operands at the matrix engine (fp8 / int8: one byte each; block-scaled fp8 one
        byte and its scales; a block-scaled matrix format, nvfp4 / mxfp*, its elements and scales)."""
        if self.format_policy.one_byte_operands:
            return self.requested if get_format(self.requested).scaled else "fp8"
        return self.matrix

    @property
    def weight_operand_bytes(self) -> float | None:
        """Bytes per element of a weight-only-quantized B operand (int4), None when B is at the operand format."""
        return self.format_policy.weight_bytes if self.format_policy.weight_only else None

    def kernel_format(self, kernel_class: str) -> str:  # a mapping KernelClass (a str enum)
        """The format line of a kernel row: matrix kernels in the matrix format (and, quantized, the stored
        weights and accumulator), reductions at fp32 compute, the rest at the capture format."""
        pol = self.format_policy
        if kernel_class == "matrix" and pol is FP8_TRAINING:
            return "fp8 (fprop e4m3 x e4m3; dgrad, wgrad with e5m2 gradients), accumulate fp32"
        if kernel_class == "matrix":
            return (f"{self.matrix} compute, weights {pol.weights}, accumulate {pol.accumulate}"
                    if pol.quantized else self.matrix)
        if kernel_class == "reduction":
            return f"{pol.capture} storage, fp32 compute"
        return pol.capture


def matrix_rate(hw: HardwareSpec, fmt: str, sustained: bool = False) -> tuple[float, str]:
    """The rate the matrix units run ``fmt`` at on ``hw``, and where it came from.

    A measured figure for ``fmt`` wins (the sustained table when ``sustained``, else the achievable one). A
    sustained rate without a figure of its own is ``fmt``'s achievable rate times another format's sustained /
    achievable ratio (the power limit lowers the shared clock). Without a figure, the device's measured fraction of
    peak for another format (bf16 first) scales ``fmt``'s dense peak: the
    clock and power limits that hold one format below its peak hold the others too (crowd-sourced torch.mm runs
    show it: H100 SXM tf32 402 of 495 TFLOP/s and bf16 798 of 989, 0.81 both). No measured figure at all: the
    dense peak."""
    peak = float(hw.matrix_peak_flops_per_s[fmt].value)
    if sustained and fmt not in hw.sustained_matrix_flops_per_s:
        # the power limit lowers the clock, which every format shares: fmt's boost rate times a measured format's
        # sustained / boost ratio (H100 SXM: bf16 719.72 of 794.5 TFLOP/s)
        for donor in registry().rate_donors():
            d, b = hw.sustained_matrix_flops_per_s.get(donor), hw.achievable_matrix_flops_per_s.get(donor)
            if d is not None and d.value and b is not None and b.value and donor != fmt:
                boost, basis = matrix_rate(hw, fmt)
                ratio = min(1.0, float(d.value) / float(b.value))
                return boost * ratio, f"{basis} x the {d.kind} sustained / achievable {donor} ratio {ratio:.3f}"
    tables = ((hw.sustained_matrix_flops_per_s, "sustained"),) if sustained else ()
    tables += ((hw.achievable_matrix_flops_per_s, "achievable"),)
    for table, what in tables:
        v = table.get(fmt)
        if v is not None and v.value:
            return float(v.value), f"{v.kind} {what} {fmt} rate"
        for donor in registry().rate_donors():
            d, p = table.get(donor), hw.matrix_peak_flops_per_s.get(donor)
            if d is not None and d.value and p is not None and p.value:
                frac = float(d.value) / float(p.value)
                return peak * frac, f"{fmt} dense peak x the {d.kind} {what} {donor} fraction {frac:.2f}"
    return peak, "dense peak (no measured rate)"


def power_limited(prec: Precision, hw: HardwareSpec, busy_s: float) -> Precision:
    """``prec`` on a run that keeps ``hw`` busy for ``busy_s`` seconds at its boost rates.

    A power-limited card (a catalog entry with sustained rates) holds its boost clocks while its power budget,
    averaged over ``power_window_s``, allows, then settles at the rate its power limit sustains. Work done in
    the first window runs at the boost rate r_b, the rest at the sustained rate r_s, so a run of boost-time B
    takes tau + (B - tau) r_b / r_s and its matrix units average r_b B / (tau + (B - tau) r_b / r_s). The whole
    busy time is taken as matrix work (the power-hungry part): a first-order model, stated in the assumptions.
    ``busy_s`` infinite: steady load (a serving run, busy for minutes), priced at the sustained rate itself.
    Returns ``prec`` itself where nothing changes."""
    tau = hw.power_window_s
    if not hw.sustained_matrix_flops_per_s or tau is None or busy_s <= tau:
        return prec
    r_b = prec.matrix_rate_flops_per_s
    r_s, basis = matrix_rate(hw, prec.matrix, sustained=True)
    if r_s >= r_b:
        return prec
    if math.isinf(busy_s):  # steady load (a serving run): the boost window is a vanishing part of it
        return replace(prec, matrix_rate_flops_per_s=r_s, sustained=True,
                       rate_basis=(f"power-limited: under steady load, past the {tau * 1e3:.3g} ms power window, "
                                   f"the sustained rate ({basis})"))
    r_eff = r_b * busy_s / (tau + (busy_s - tau) * r_b / r_s)
    return replace(prec, matrix_rate_flops_per_s=r_eff, sustained=True,
                   rate_basis=(f"power-limited: {busy_s * 1e3:.3g} ms busy at boost, past the {tau * 1e3:.3g} ms "
                               f"power window; the first window at the boost rate ({prec.rate_basis}), the rest at "
                               f"the sustained rate ({basis})"))


def resolve_precision(hw: HardwareSpec, dtype: str) -> Precision:
    """The matrix and vector peaks for ``dtype`` on ``hw``, falling back to the nearest supported format. The
    matrix rate is the boost-clock one (achievable); ``power_limited`` lowers it for long runs. An alias
    (``fp4``) is resolved on ``hw`` first (``resolve_dtype``): ``requested`` is the format it names there."""
    dtype = resolve_dtype(hw, dtype).format
    chain, fmt = fallback(dtype), get_format(dtype)
    chosen = next((d for d in chain if (v := hw.matrix_peak_flops_per_s.get(d)) and v.value), None)
    if chosen is None:
        raise OpmapError(f"{hw.name} has no matrix peak for {dtype} or its fallbacks "
                         f"({', '.join(chain)}); it lists {', '.join(hw.matrix_dtypes())}")
    pol = fmt.policy
    fb_policy = None
    vec = hw.vector_peak_flops_per_s.get(pol.capture) or hw.vector_peak_flops_per_s["fp32"]
    note = "" if chosen == chain[0] else \
        f"{hw.name} has no {chain[0]} matrix peak: used {chosen} (tried {', '.join(chain)})"
    if fmt.weight_only_fallback and chosen != chain[0]:
        pol = fb_policy = FP8_WEIGHT_ONLY if dtype == "fp8" else weight_only_policy(fmt.name, chosen)
        note = (FP8_WEIGHT_ONLY_NOTE.format(hw=hw.name, matrix=chosen) if dtype == "fp8" else
                WEIGHT_ONLY_NOTE.format(hw=hw.name, fmt=dtype, engine=chain[0], matrix=chosen,
                                        kernel=fmt.weight_only_fallback if isinstance(fmt.weight_only_fallback, str)
                                        else f"{dtype} weights dequantized in the GEMM"))
    if pol.weight_only and fb_policy is None:
        note = ((note + "; " if note else "")
                + f"{dtype} is weight-only: weights dequantized to {pol.capture} in the GEMM")
    scale = pol.weight_bytes / format_bytes(pol.capture)
    peak = float(hw.matrix_peak_flops_per_s[chosen].value)
    rate, basis = matrix_rate(hw, chosen)
    return Precision(dtype, chosen, peak, float(vec.value), note, scale, rate, basis, fallback_policy=fb_policy)


def resolve_training_precision(hw: HardwareSpec, dtype: str) -> Precision:
    """``dtype`` for a training step on ``hw``: as ``resolve_precision``, except fp8, which means Transformer
    Engine's fp8 training (``FP8_TRAINING``): priced at the device's fp8 matrix rate (the same recipe on any device
    whose catalog entry lists an fp8 matrix peak), and refused on a device without one (no weight-only fallback in
    training: TE has none)."""
    dtype = resolve_dtype(hw, dtype).format
    if not get_format(check_requestable(dtype)).train_scaled_gemms:
        return resolve_precision(hw, dtype)
    v = hw.matrix_peak_flops_per_s.get(dtype)
    if v is None or not v.value:
        have = [d for d in ("bf16", "fp16", "tf32", "fp32") if (x := hw.matrix_peak_flops_per_s.get(d)) and x.value]
        raise OpmapError(f"fp8 training needs an fp8 matrix engine ({FP8_TRAINING_DEVICES}); {hw.name} has none: "
                         f"accepted for training on it: {', '.join(have)}")
    vec = hw.vector_peak_flops_per_s.get("bf16") or hw.vector_peak_flops_per_s["fp32"]
    rate, basis = matrix_rate(hw, dtype)
    note = ("fp8 training (Transformer Engine): Linear GEMMs in fp8 (fprop e4m3 x e4m3, dgrad e5m2 x e4m3, wgrad "
            "e4m3 x e5m2, per-tensor delayed scaling, fp32 accumulate); embedding, LM head and attention core in bf16")
    return Precision(dtype, dtype, float(v.value), float(vec.value), note, 1.0, rate, basis,
                     fallback_policy=FP8_TRAINING)


# The attention core of an inference run (QK^T and PV of a fused attention kernel) takes Q, K and V in a 16-bit format
# or fp8, never a sub-byte one: TensorRT-LLM's context FMHA runs bf16, or e4m3 when its FP8 context FMHA is on, and
# the torch op turns that on for an fp4 (or fp8) output, or an fp8 KV cache with paged context FMHA:
# ``mFP8ContextFMHA = is_fp8_out || is_fp4_out || (hasFp8KvCache() && use_paged_context_fmha)``
# (NVIDIA/TensorRT-LLM cpp/tensorrt_llm/thop/attentionOp.cpp @ 38134b130944ed5c037949456df20300126ec728); the FMHA
# kernels it dispatches are fp16 / bf16 / e4m3 ones. So a run in a 4- or 6-bit format prices its attention products
# at fp8 (bf16 on a device without fp8), not at its GEMMs' fp4 rate.
ATTENTION_CORE_FLOOR = ("fp8", "bf16")


def attention_core_precision(hw: HardwareSpec, prec: Precision) -> Precision | None:
    """The precision an inference run's fused attention products run in where it differs from ``prec``'s GEMMs:
    a matrix format narrower than 8 bits gives fp8 (bf16 without an fp8 engine; ``ATTENTION_CORE_FLOOR``), None
    otherwise (the attention core runs in the run's own matrix format)."""
    if get_format(prec.matrix).bits >= 8:
        return None
    fmt = next((d for d in ATTENTION_CORE_FLOOR if (v := hw.matrix_peak_flops_per_s.get(d)) and v.value), None)
    if fmt is None:
        return None
    core = resolve_precision(hw, fmt)
    return replace(core, note=(f"attention core in {fmt}: a fused attention kernel takes Q, K, V in 16 bits or fp8, "
                               f"not {prec.matrix}"))


@dataclass(frozen=True)
class DtypeChoice:
    """A --dtype resolved on one device: the format priced, and why where it is not the one asked for by name (an
    alias resolved, or fallen back)."""

    requested: str  # what --dtype said (a format or an alias)
    format: str  # the format priced
    reason: str = ""  # "" where the request was a format
    note: str = ""  # the format's own fallback on the device (resolve_precision's note), where it has one

    @property
    def resolved(self) -> bool:
        return self.requested != self.format

    def header(self) -> str:
        """The header line: the format used, where it came from an alias how, and where it fell back why."""
        return (self.format + (f" (--dtype {self.requested}: {self.reason})" if self.resolved else "")
                + (f"; {self.note}" if self.note else ""))

    def to_dict(self) -> dict[str, str]:
        return {"dtype": self.format, "dtype_requested": self.requested, "dtype_resolution": self.reason,
                "precision_note": self.note}


def _peak(hw: HardwareSpec, fmt: str):
    v = hw.matrix_peak_flops_per_s.get(fmt)
    return v if v is not None and v.value else None


def runs_natively(hw: HardwareSpec, fmt: str) -> bool:
    """``hw``'s catalog entry lists a matrix peak for ``fmt``'s own engine (the head of its fallback chain)."""
    f = get_format(fmt)
    return bool(f.fallback) and f.fallback[0] == fmt and _peak(hw, fmt) is not None


def resolve_dtype(hw: HardwareSpec, dtype: str) -> DtypeChoice:
    """The format a request of ``dtype`` prices on ``hw``: a format is itself (its own fallback chain applies
    later, ``resolve_precision``); an alias (``fp4``) is the first of its formats whose matrix peak ``hw`` lists
    (nvfp4 on Blackwell, mxfp4 on CDNA 4), else the narrowest float format ``hw`` runs natively, built as the
    alias's are (fp8 on Hopper, bf16 on Ampere), with the reason."""
    members = aliases().get(check_requestable(dtype))
    if not members:
        return DtypeChoice(dtype, dtype)
    for i, name in enumerate(members):
        if (v := _peak(hw, name)) is not None:
            skipped = f"{hw.name} lists no {' or '.join(members[:i])} matrix peak; " if i else ""
            return DtypeChoice(dtype, name, f"{skipped}{hw.name} runs {name} at {v.value / 1e15:.3g} PFLOP/s dense "
                                            f"({v.kind})")
    build = build_dtype(dtype)
    runs = [f for f in registry() if f.kind == "float" and f.requestable and f.build == build and f.name not in members
            and runs_natively(hw, f.name)]
    if not runs:
        raise OpmapError(f"--dtype {dtype}: {hw.name} lists no {' or '.join(members)} matrix peak and no float format "
                         f"built in {build} it runs; it lists {', '.join(hw.matrix_dtypes())}")
    best = min(runs, key=lambda f: f.bytes)  # narrowest; table order breaks a tie (bf16 before fp16)
    return DtypeChoice(dtype, best.name, (
        f"{hw.name} has no {dtype} matrix engine (no {' or '.join(members)} peak): {best.name}, the narrowest float "
        f"format it runs (--dtype {members[0]} there prices {members[0]} weights dequantized in the GEMM)"))


def check_kv_format(hw: HardwareSpec, kv_dtype: str) -> str:
    """``kv_dtype`` as a KV-cache format on ``hw``: a format whose engines ship its KV cache only where its matrix
    engine is (``kv_needs_engine``: NVFP4 KV on Blackwell) is refused on another device, with what it accepts."""
    f = get_format(kv_dtype)
    if f.kv_needs_engine and _peak(hw, kv_dtype) is None:
        ok = [n for n in registry().names(kv=True) if not get_format(n).kv_needs_engine or _peak(hw, n)]
        raise OpmapError(f"--kv-dtype {kv_dtype}: engines ship a {kv_dtype} KV cache only on a device with a "
                         f"{kv_dtype} matrix engine, and {hw.name} lists no {kv_dtype} matrix peak; accepted on "
                         f"{hw.name}: {', '.join(ok)}")
    return kv_dtype
