"""The machine a calibration was made on: versions, threads, device model, memory and caches."""

from __future__ import annotations

import os
import platform

import torch

from opmap import __version__
from opmap.hardware.host import cpu_caches, cpu_model


def fingerprint(device: torch.device) -> dict[str, object]:
    fp: dict[str, object] = {"torch_version": torch.__version__, "opmap_version": __version__,
                             "python_version": platform.python_version(), "machine": platform.machine(),
                             "threads": torch.get_num_threads(), "cores": os.cpu_count() or 0}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        fp.update(model=p.name, compute_units=p.multi_processor_count, memory_bytes=p.total_memory)
    else:
        fp["memory_bytes"] = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        fp["model"] = cpu_model()
        fp.update(cpu_caches())
    return fp


def device_name(device: torch.device) -> str:
    """The device's model name: the CUDA device name, or the CPU model."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()
