"""Software stacks' runtime overheads (``runtimes.toml``), typed and sourced like the catalog: per stack, the
gap between kernels inside a graph replay, one graph launch, and a serving engine's scheduler host time per
step. A device names its stack in its catalog file (``software_stack``; ``stack_for``)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from opmap.errors import OpmapError
from opmap.hardware.spec import KINDS, HardwareSpec, Value
from opmap.safeio import LIMIT_TOML_BYTES, read_text_bounded

FILE = Path(__file__).with_name("runtimes.toml")
KEYS = ("graph_kernel_gap_s", "graph_launch_s", "engine_step_host_s")


@dataclass(frozen=True)
class Stack:
    name: str
    display: str
    values: dict[str, Value]


@cache
def stacks() -> dict[str, Stack]:
    raw = tomllib.loads(read_text_bounded(FILE, LIMIT_TOML_BYTES, "runtimes file"))
    out = {}
    for name, body in raw.items():
        vals = {}
        for k in KEYS:
            v = body.get(k)
            if not isinstance(v, dict) or not isinstance(v.get("value"), (int, float)) or not v["value"] >= 0 \
                    or v.get("kind") not in KINDS or not v.get("source"):
                raise OpmapError(f"{FILE.name}: stack {name!r} needs {k} as a table with value >= 0, kind and "
                                 "source")
            vals[k] = Value(float(v["value"]), v["kind"], v["source"], v.get("note", ""))
        out[name] = Stack(name, body.get("display", name), vals)
    return out


def stack_for(hw: HardwareSpec) -> Stack:
    """The software stack a device's graph / engine runtime runs on: the one its catalog file names
    (``software_stack``); a device file written before that field by its type and vendor (NVIDIA CUDA graphs,
    AMD HIP graphs, Intel Gaudi HPU graphs, Google XLA on TPU, a CPU's eager PyTorch)."""
    name = hw.software_stack or _stack_by_vendor(hw)
    return stacks()[name]


def _stack_by_vendor(hw: HardwareSpec) -> str:
    vendor = (hw.vendor or "").lower()
    if hw.device_type == "cpu":
        return "cpu"
    for word, name in (("nvidia", "cuda-graphs"), ("amd", "hip-graphs"), ("intel", "hpu-graphs"),
                       ("habana", "hpu-graphs"), ("google", "xla")):
        if word in vendor:
            return name
    raise OpmapError(f"{hw.name}: no software_stack in its file and none known for vendor {hw.vendor!r} "
                     "(accepted: software_stack = one of the sections of opmap/hardware/runtimes.toml)")
