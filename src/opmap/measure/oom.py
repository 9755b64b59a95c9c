"""Out of memory on a real run, said as the user's request: the batch and sequence asked for more memory than
the device has. Two parts: a check before the run (an estimate of the bytes a point needs against the memory
available now: a refusal in milliseconds instead of the kernel's OOM killer minutes later) and the allocator's
own refusal (torch.OutOfMemoryError, or the CPU allocator's "can't allocate memory") turned into one line."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from opmap.errors import OpmapError

_ASKED = re.compile(r"(?:tried to allocate|allocate)\s+([0-9.]+)\s*(bytes|[KMGT]i?B)", re.IGNORECASE)
_UNIT = {"bytes": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
         "tib": 2**40}


def is_allocator_refusal(e: BaseException) -> bool:
    """torch's own out-of-memory errors: CUDA's OutOfMemoryError and the CPU allocator's refusal."""
    import torch

    if isinstance(e, torch.OutOfMemoryError):
        return True
    text = str(e).lower()
    return isinstance(e, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)


def asked_bytes(e: BaseException) -> float | None:
    """The bytes the refused allocation asked for, where the allocator's message says (CPU and CUDA do)."""
    m = _ASKED.search(str(e))
    return float(m.group(1)) * _UNIT[m.group(2).lower()] if m else None


def available_bytes(device: str = "cpu") -> float | None:
    """Memory a new allocation can take now: MemAvailable on Linux (free + reclaimable cache), the free pages
    elsewhere; a CUDA device's free memory. None where it cannot be asked."""
    import os

    if device == "cuda":
        import torch

        return float(torch.cuda.mem_get_info()[0]) if torch.cuda.is_available() else None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError):
        return None


def run_bytes(graph, itemsize: float = 4.0) -> float:
    """A floor on the memory one forward of ``graph`` needs when run for real with ``itemsize``-byte floating
    tensors (fp32: 4): every parameter, plus the inputs and outputs of its largest operator, all live at once.
    The real peak is higher (other live activations, the allocator's slack): a point over this cannot run. A
    view's or an in-place op's output is its input's storage: only the inputs count there."""
    def nbytes(t) -> float:
        return t.numel * (itemsize if t.dtype.startswith(("float", "bfloat")) else t.itemsize)

    def live(n) -> float:
        fresh = () if n.is_view or n.is_inplace else n.outputs
        return sum(nbytes(t) for t in (*n.inputs, *fresh) if t.param is None)

    largest = max((live(n) for n in graph.nodes), default=0.0)
    return graph.params * itemsize + largest


def _gb(b: float) -> str:
    return f"{b / 1e9:,.1f} GB"


def check_fits(need_bytes: float, what: str, device: str = "cpu", margin: float = 0.8) -> None:
    """Refuse ``what`` (the user's request, e.g. "batch 100000 x seq 64") up front where it needs more than
    ``margin`` of the memory available now (the rest is the runtime's, the allocator's slack and other work)."""
    have = available_bytes(device)
    if have is not None and need_bytes > margin * have:
        raise OpmapError(f"{what} needs at least {_gb(need_bytes)} on {device} (the weights and its largest "
                         f"operator's tensors), {_gb(have)} is available now: lower --batch or --seq")


@contextlib.contextmanager
def refusal_as_error(what: str, device: str = "cpu") -> Iterator[None]:
    """The allocator's refusal inside the block becomes one line naming ``what`` the user asked for."""
    try:
        yield
    except (RuntimeError, MemoryError) as e:
        if isinstance(e, MemoryError) or is_allocator_refusal(e):
            b = asked_bytes(e)
            asked = f": one allocation asked for {_gb(b)}" if b else ""
            raise OpmapError(f"{what} does not fit in {device} memory{asked} (the allocator refused); "
                             "lower --batch or --seq") from None
        raise
