"""Software stacks' runtime overheads (``runtimes.toml``), typed and sourced like the catalog: per stack, the
gap between kernels inside a graph replay, one graph launch, and a serving engine's scheduler host time per
step. A device names its stack by vendor and type (``stack_for``)."""

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
    """The software stack a device's graph / engine runtime runs on: by vendor (NVIDIA CUDA graphs, AMD HIP
    graphs, Intel Gaudi HPU graphs, Google XLA on TPU), a CPU's eager PyTorch otherwise."""
    vendor = (hw.vendor or "").lower()
    if hw.device_type == "cpu":
        name = "cpu"
    elif "nvidia" in vendor:
        name = "cuda-graphs"
    elif "amd" in vendor:
        name = "hip-graphs"
    elif "intel" in vendor or "habana" in vendor:
        name = "hpu-graphs"
    elif "google" in vendor:
        name = "xla"
    else:
        raise OpmapError(f"{hw.name}: no software stack known for vendor {hw.vendor!r}")
    return stacks()[name]
