"""Energy counters: NVML on NVIDIA GPUs, RAPL on CPUs that expose it; otherwise "not measured".

Both are cumulative hardware counters read before and after the timed loop, so the energy is measured,
not estimated from a power figure. Nothing here ever makes up a number: a meter that cannot read its
counter says why, and the result carries ``joules: null``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

RAPL_ROOT = Path("/sys/class/powercap")


@dataclass(frozen=True)
class EnergyReading:
    joules: float | None
    seconds: float
    method: str  # what was read, or why nothing was

    def to_dict(self, work_items: int = 0) -> dict:
        d: dict = {"joules": self.joules, "seconds": self.seconds, "method": self.method,
                   "average_w": (self.joules / self.seconds) if self.joules is not None and self.seconds else None}
        if work_items and self.joules is not None:
            d["joules_per_iteration"] = self.joules / work_items
        return d


class RaplMeter:
    """Sum of the package domains under /sys/class/powercap (intel-rapl:N, also used by AMD), wrap-safe."""

    def __init__(self, root: Path = RAPL_ROOT):
        self.root = root
        self.domains = []
        if root.is_dir():
            for d in sorted(root.glob("intel-rapl:*")):
                if d.name.count(":") == 1 and (d / "energy_uj").exists():  # packages, not their subdomains
                    self.domains.append(d)

    def why_not(self) -> str | None:
        if not self.domains:
            return f"no RAPL package domain under {self.root}"
        try:
            for d in self.domains:
                int((d / "energy_uj").read_text())
        except (OSError, ValueError) as e:
            return f"RAPL counter not readable ({e.__class__.__name__}: {getattr(e, 'strerror', e)})"
        return None

    def read_uj(self) -> list[int]:
        return [int((d / "energy_uj").read_text()) for d in self.domains]

    def delta_j(self, before: list[int], after: list[int]) -> float:
        """Joules between two reads: per package the counter delta in microjoules; a counter that went down wrapped
        once at its ``max_energy_range_uj`` (the kernel's powercap ABI: energy_uj counts 0 .. max_energy_range_uj),
        so the delta is (max - before) + after."""
        total = 0
        for d, b, a in zip(self.domains, before, after):
            if a < b:  # the counter wrapped
                a += int((d / "max_energy_range_uj").read_text())
            total += a - b
        return total / 1e6


class NvmlMeter:
    """nvmlDeviceGetTotalEnergyConsumption (millijoules since the driver loaded; Volta and later)."""

    def __init__(self, index: int = 0):
        self.handle = None
        self.error = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        except ImportError:
            self.error = "pynvml (nvidia-ml-py) is not installed"
        except Exception as e:  # NVMLError and its subclasses: not supported, no permission, no driver
            self.error = f"NVML energy counter unavailable ({e})"

    def why_not(self) -> str | None:
        return self.error

    def read_mj(self) -> int:
        return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))


def measure_energy(fn: Callable[[], float], device: str, rapl_root: Path = RAPL_ROOT) -> tuple[float, EnergyReading]:
    """Run ``fn`` (which returns the seconds it took) between two counter reads."""
    if device.startswith("cuda"):
        import torch

        meter = NvmlMeter(torch.device(device).index or 0)
        why = meter.why_not()
        if why is None:
            a = meter.read_mj()
            secs = fn()
            return secs, EnergyReading((meter.read_mj() - a) / 1e3, secs,
                                       "measured (NVML total energy counter, the whole board)")
        secs = fn()
        return secs, EnergyReading(None, secs, f"not measured: {why}")
    rapl = RaplMeter(rapl_root)
    why = rapl.why_not()
    if why is None:
        b = rapl.read_uj()
        secs = fn()
        return secs, EnergyReading(rapl.delta_j(b, rapl.read_uj()), secs,
                                   f"measured (RAPL package domain, {len(rapl.domains)} package(s); the whole "
                                   "package, not only this process)")
    secs = fn()
    return secs, EnergyReading(None, secs, f"not measured: {why}")


def energy_figures(reading: EnergyReading, tokens: int, modelled_w: tuple[float, str] | None = None) -> dict:
    """A run's energy as J, W and per token: ``energy_j`` over ``energy_window_s`` (s), ``power_w`` = J / s,
    ``energy_per_token_j`` = J / ``tokens``, ``tokens_per_j`` its inverse, and ``power_method``.

    A reading with no joules takes ``modelled_w`` (watts, how they were modelled) where one is given: energy =
    W x s, the method says "modelled"; otherwise every figure is None and the method keeps the meter's reason."""
    secs = reading.seconds
    joules, method = reading.joules, reading.method
    if joules is None and modelled_w is not None and secs > 0:
        watts, how = modelled_w
        joules, method = watts * secs, f"modelled: {how} ({method})"
    out = {"energy_j": joules, "energy_window_s": secs, "power_w": None, "energy_per_token_j": None,
           "tokens_per_j": None, "power_method": method}
    if joules is not None and secs > 0:
        out["power_w"] = joules / secs
    if joules is not None and tokens > 0:
        out["energy_per_token_j"] = joules / tokens
        out["tokens_per_j"] = tokens / joules if joules > 0 else None
    return out


def timed_iterations_with_energy(call: Callable[[], object], dev, device: str, warmup: int, iters: int,
                                 step: Callable[[str, int], None]):
    """The measured part of a profile run (torch's and onnxruntime's alike): ``warmup`` calls, then ``iters`` timed
    iterations (opmap.timing.time_iterations, the one timer) between two energy counter reads. Returns
    (LatencyStats, EnergyReading); ``step(label, n)`` reports progress."""
    from opmap.timing import time_iterations

    step("warm-up", 0)
    for _ in range(warmup):
        call()
        step("warm-up", 1)
    holder = {}

    def timed() -> float:
        holder["lat"] = time_iterations(call, dev, iters, lambda: step("timed iterations", 1))
        return sum(holder["lat"].times_s)

    step("timed iterations", 0)
    _, energy = measure_energy(timed, device)
    return holder["lat"], energy

