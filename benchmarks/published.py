"""opmap's predictions beside published large-system figures (/work/shared/reference/published.md).

Each row is a small record: kind, device, what was measured, the published figure with its unit and source,
that figure as a time, opmap's predicted time, and ratio = predicted / published time. A row whose figure
set a catalog value is marked ``fit`` and kept out of the verdict (a row cannot be evidence for a number taken
from it). Other kinds of rows (training throughput, MFU, decode lower bounds) are added by writing one more
function that returns ``Row`` records and listing it in ``SECTIONS``.

Collectives: nccl-tests all_reduce on one DGX H100 (NVIDIA/dgxc-benchmarking ``nccl/README.md``), busbw
converted to a time by nccl-tests' own formula (``doc/PERFORMANCE.md``): t = S / algbw, algbw = busbw /
(2(n-1)/n). The 8 GiB row set the catalog's in-switch rate (``in_switch_bandwidth_bytes_per_s``): fit.

Band (issue 11): every held-out row within 0.75-1.33.

Run:  .venv/bin/python benchmarks/published.py        Writes benchmarks/results/published.json.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
BAND = (0.75, 1.33)
DGX_H100_NCCL = ("NVIDIA/dgxc-benchmarking nccl/README.md, one DGX H100 (8 x H100 80GB), all_reduce, "
                 "float sum, in place (published.md)")


@dataclass(frozen=True)
class Row:
    """One published figure beside opmap's prediction. Times in seconds; ``published_value`` in
    ``published_unit`` as the source prints it."""

    kind: str  # collective | training_throughput | mfu | decode_bound | ...
    device: str
    what: str
    published_value: float
    published_unit: str
    published_s: float  # the published figure as a time
    predicted_s: float
    source: str
    role: str = "held out"  # held out | fit
    how: str = ""  # what opmap chose (algorithm, protocol)

    @property
    def ratio(self) -> float:
        return self.predicted_s / self.published_s

    @property
    def passed(self) -> bool | None:
        return BAND[0] <= self.ratio <= BAND[1] if self.role == "held out" else None

    def to_dict(self) -> dict:
        return {**asdict(self), "ratio": self.ratio, "band": list(BAND), "pass": self.passed}


def collective_rows() -> list[Row]:
    from opmap.hardware import get_hardware
    from opmap.mapping.collectives import Collective, bus_factor, collective_time

    hw, n = get_hardware("h100-sxm"), 8
    mib = 2**20
    # (bytes, busbw GB/s) and (bytes, time s) as published
    busbw = [(1 * mib, 68.14), (16 * mib, 238.61), (64 * mib, 361.68), (256 * mib, 421.91), (1024 * mib, 467.85),
             (8192 * mib, 479.84)]
    times = [(8, 13.03e-6), (64 * mib, 324.7e-6)]
    fit = {8192 * mib}  # the catalog's in-switch rate comes from this row

    def size(b: int) -> str:
        return f"{b} B" if b < mib else f"{b // mib} MiB" if b < 1024 * mib else f"{b // (1024 * mib)} GiB"

    rows = []
    for b, gbs in busbw:
        t, algo, d = collective_time(hw, Collective("all_reduce", b, n))
        pub_s = b / (gbs * 1e9 / bus_factor("all_reduce", n))
        rows.append(Row("collective", hw.name, f"all_reduce {size(b)}, 8 GPUs (busbw)", gbs, "GB/s busbw", pub_s, t,
                        DGX_H100_NCCL, "fit" if b in fit else "held out", f"{algo}/{d['protocol']}"))
    for b, pub_s in times:
        t, algo, d = collective_time(hw, Collective("all_reduce", b, n))
        rows.append(Row("collective", hw.name, f"all_reduce {size(b)}, 8 GPUs (time)", pub_s * 1e6, "us", pub_s, t,
                        DGX_H100_NCCL, "held out", f"{algo}/{d['protocol']}"))
    return rows


SECTIONS: list[Callable[[], list[Row]]] = [collective_rows]


def main() -> int:
    sys.path.insert(0, str(HERE))
    from rich.console import Console
    from rich.table import Table

    from _common import SCHEMA_VERSION, machine, now_iso, write_json

    con = Console()
    rows = [r for section in SECTIONS for r in section()]
    t = Table(title="Predicted over published (shared/reference/published.md)")
    for c in ("kind", "device", "what", "published", "published time", "predicted", "pred/pub", "opmap chose",
              "role", "verdict"):
        t.add_column(c, overflow="fold")
    for r in rows:
        v = "-" if r.passed is None else ("PASS" if r.passed else "FAIL")
        t.add_row(r.kind, r.device, r.what, f"{r.published_value:.4g} {r.published_unit}",
                  f"{r.published_s * 1e6:.4g} us", f"{r.predicted_s * 1e6:.4g} us", f"{r.ratio:.2f}", r.how, r.role, v)
    con.print(t)
    held = [r for r in rows if r.role == "held out"]
    passed = sum(1 for r in held if r.passed)
    con.print(f"held-out rows within {BAND[0]}-{BAND[1]}: {passed} of {len(held)}")
    path = write_json(Path(__file__).stem, {
        "schema_version": SCHEMA_VERSION, "benchmark": "published", "created": now_iso(), "machine": machine(),
        "claim": f"every held-out row within {BAND[0]}-{BAND[1]} of the published time",
        "rows": [r.to_dict() for r in rows], "held_out": len(held), "passed": passed,
        "pass": passed == len(held)})
    con.print(f"wrote {path}")
    return 0 if passed == len(held) else 1


if __name__ == "__main__":
    sys.exit(main())
