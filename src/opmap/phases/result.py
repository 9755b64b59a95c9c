"""The typed figures of a phase's step: ``PhaseResult`` (``Prefill``, ``Decode``) and ``TrainStep`` (an
iteration), each a frozen value whose step time is the sum of its parts (checked on construction), whose record
(``opmap.record``) is analysis.json's ``phase`` block, the one place the figures become string keys."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from opmap.record import key

REL_TOL = 1e-9  # the parts are summed in another order than the step time was: float rounding only


def _check_sum(what: str, step_s: float, parts: dict[str, float]) -> None:
    total = math.fsum(parts.values())
    if not math.isclose(step_s, total, rel_tol=REL_TOL, abs_tol=1e-15):
        listed = " + ".join(f"{k} {v:.6g}" for k, v in parts.items())
        raise ValueError(f"{what}: step time {step_s:.9g} s is not the sum of its parts ({listed} = {total:.9g} s)")


@dataclass(frozen=True)
class DecodeFloor:
    """A decode step's memory floor: the weights and KV cache it reads, each once, at the achievable memory rate."""

    kv_len: int
    weights_bytes: float
    kv_cache_read_bytes: float
    lower_bound_s: float
    lower_bound_basis: str


# a step over several devices names them and its layout; one device writes neither
_LAID_OUT = key(omit="none")


@dataclass(frozen=True)
class PhaseResult:
    """A prefill pass (``Prefill``: time to first token) or a decode step (``Decode``: time per output token):
    ``step_s`` = ``kernel_time_s`` (the kernels of the step on one device, views' dispatch included; under a layout
    the sharded step, its collectives on the critical path included) + ``runtime_per_step_s`` (the runtime's
    per-step overhead: a graph launch, an engine's scheduler gap; 0 under eager). ``tokens``: the tokens one step
    yields (decode: one per sequence, every replica's), so ``tokens_per_s`` = tokens / step_s. Each kind's record
    (its ``RECORD``) is analysis.json's ``phase`` block: the step time under the phase's own name."""

    name: ClassVar[str]  # "prefill" | "decode": the kind's
    step_s: float
    kernel_time_s: float
    runtime_per_step_s: float
    bound: str
    kernels: int
    tokens: int
    text: str
    floor: DecodeFloor | None = field(default=None, metadata=key(skip=True))  # decode only
    devices: int | None = field(default=None, metadata=_LAID_OUT)  # under a layout over several devices
    layout: str | None = field(default=None, metadata=_LAID_OUT)

    def __post_init__(self) -> None:
        if type(self) is PhaseResult:
            raise TypeError("PhaseResult is a prefill (Prefill) or a decode step (Decode)")
        _check_sum(self.name, self.step_s, self.parts)

    @property
    def parts(self) -> dict[str, float]:
        return {"kernel_time_s": self.kernel_time_s, "runtime_per_step_s": self.runtime_per_step_s}

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_s if self.step_s else 0.0

    @property
    def headline(self) -> tuple[str, float]:
        """(name, seconds) of the step this phase states: decode's time per output token, prefill's to first token."""
        return ("time per output token" if self.name == "decode" else "time to first token"), self.step_s

    @property
    def mfu(self) -> float | None:
        return None  # an inference step's MFU is the pipeline's (Analysis.headline_mfu)


# what every phase block ends with: the step's parts, its kernels and sentence, the layout where there is one
_TAIL = ("kernel_time_s", "runtime_per_step_s", "kernels", "text", "devices", "layout")


@dataclass(frozen=True)
class Prefill(PhaseResult):
    """The prompt's forward pass: its record names the step time ``ttft_s``."""

    RECORD: ClassVar[tuple[str, ...]] = ("name", "ttft_s", "bound", *_TAIL)
    name: ClassVar[str] = "prefill"

    @property
    def ttft_s(self) -> float:
        return self.step_s


@dataclass(frozen=True)
class Decode(PhaseResult):
    """One decode step: its record names the step time ``tpot_s`` and carries its memory floor's figures
    (``floor``, required)."""

    RECORD: ClassVar[tuple[str, ...]] = (
        "name", "kv_len", "tpot_s", "tokens_per_s", "bound", "weights_bytes", "kv_cache_read_bytes", "lower_bound_s",
        "lower_bound_basis", *_TAIL)
    name: ClassVar[str] = "decode"

    def __post_init__(self) -> None:
        if self.floor is None:
            raise TypeError("a decode step carries its memory floor (DecodeFloor)")
        super().__post_init__()

    @property
    def tpot_s(self) -> float:
        return self.step_s

    @property
    def _floor(self) -> DecodeFloor:
        assert self.floor is not None  # __post_init__
        return self.floor

    @property
    def kv_len(self) -> int:
        return self._floor.kv_len

    @property
    def weights_bytes(self) -> float:
        return self._floor.weights_bytes

    @property
    def kv_cache_read_bytes(self) -> float:
        return self._floor.kv_cache_read_bytes

    @property
    def lower_bound_s(self) -> float:
        return self._floor.lower_bound_s

    @property
    def lower_bound_basis(self) -> str:
        return self._floor.lower_bound_basis


@dataclass(frozen=True)
class Fp8Split:
    """fp8 training's share of a step on one device (opmap.phases.fp8): seconds of the fp8 GEMMs, the matrix
    kernels left in bf16 and the casts per microstep, the weight casts per iteration."""

    gemm_s: float
    bf16_matrix_s: float
    cast_s: float
    weight_cast_s: float
    cast_kernels: Any
    text: str


@dataclass(frozen=True)
class PalmFlops:
    """PaLM appendix B's model FLOPs per token, 6N + 12 L H Q T (opmap.phases.train.palm_flops_per_token):
    ``value`` = 6 ``n_params`` + ``attention_flops_per_token``, the attention term over ``layers`` layers."""

    value: float
    n_params: int  # N: the parameters less the embedding tables that are only looked up
    layers: int
    attention_flops_per_token: float


STEP_PARTS = ("microsteps x (microstep_s + recompute_s)", "bubble_s", "exposed_comm_s", "optimizer_s")


@dataclass(frozen=True)
class TrainStep:
    """A training iteration per device: ``step_s`` (= ``iteration_s``) = microsteps x (microstep_s + recompute_s)
    + bubble_s (the pipeline's idle slots) + exposed_comm_s (collectives not overlapped) + optimizer_s
    (``STEP_PARTS``); the model and hardware FLOPs, MFU and HFU at that time. Field order is analysis.json's: its
    ``phase`` block is the record (``RECORD``), the name first, the iteration time and its parts after the
    optimizer's, the optional fields only where set."""

    RECORD: ClassVar[tuple[Any, ...]] = (
        "name", "recompute", "recompute_note", "optimizer", "microbatch", "global_batch", "dp", "zero", "microsteps",
        "devices", "step_s", "microstep_s", "recompute_s", "bubble_s", "exposed_comm_s", "optimizer_s", "iteration_s",
        "step_parts", ...)
    step_parts: ClassVar[tuple[str, ...]] = STEP_PARTS
    recompute: str
    recompute_note: str
    optimizer: str
    microbatch: int
    global_batch: int
    dp: int
    zero: int
    microsteps: int
    devices: int
    step_s: float
    microstep_s: float
    recompute_s: float
    bubble_s: float
    exposed_comm_s: float
    optimizer_s: float
    tokens_per_s: float
    tokens_per_s_per_device: float
    model_flops: float
    hardware_flops: float
    recompute_flops: float
    attention_recompute_flops: float
    executed_matrix_flops: float
    model_flops_per_s_per_device: float
    hardware_flops_per_s_per_device: float
    mfu: float
    hfu: float
    dense_peak_flops_per_s: float
    palm_flops_per_token: PalmFlops
    model_flops_per_token: float
    mfu_definition: str
    bound: str
    text: str = ""
    fp8: Fp8Split | None = field(default=None, metadata=key(omit="none"))
    layout: str | None = field(default=None, metadata=key(omit="none"))  # under a layout over several devices
    bubble_fraction: float | None = field(default=None, metadata=key(omit="none"))
    # context parallelism: the K/V ring per microbatch, all and exposed
    cp_exchange_s: float | None = field(default=None, metadata=key(omit="none"))
    cp_exposed_s: float | None = field(default=None, metadata=key(omit="none"))
    name: str = field(default="train", init=False)

    def __post_init__(self) -> None:
        _check_sum("train", self.step_s, self.parts)

    @property
    def parts(self) -> dict[str, float]:
        return {"microsteps x (microstep_s + recompute_s)": self.microsteps * (self.microstep_s + self.recompute_s),
                "bubble_s": self.bubble_s, "exposed_comm_s": self.exposed_comm_s, "optimizer_s": self.optimizer_s}

    @property
    def iteration_s(self) -> float:
        return self.step_s

    @property
    def headline(self) -> tuple[str, float]:
        return "iteration", self.step_s

