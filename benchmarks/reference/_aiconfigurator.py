"""What the aiconfigurator extractors (aiconfigurator_gemm.py, _comm.py, _moe.py, _attention.py) share: the catalog
they write into, the wheel they read, and their run loop (one JSON file per device, a line of sizes each).

Run any of them (the wheel is 80 MB, fetched from PyPI once; nothing here runs at opmap run time):

    pip download aiconfigurator-core==0.12.0 --no-deps -d /tmp/aic
    cd /tmp/aic && unzip -q aiconfigurator_core-0.12.0-*.whl -d x
    PYTHONPATH=src python benchmarks/reference/aiconfigurator_<kind>.py /tmp/aic/x
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO / "src" / "opmap" / "hardware" / "catalog"
WHEEL = "aiconfigurator-core 0.12.0 (PyPI wheel aiconfigurator_core-0.12.0-cp311-abi3-manylinux_2_28_x86_64.whl)"


def run(doc: str, devices: Iterable[str], extract: Callable[[Path, str], dict], suffix: str,
        summary: Callable[[dict], Any]) -> int:
    """The extractor's command line: the unpacked wheel's folder; each device's ``extract`` written compact to
    ``<device>.<suffix>.json`` beside the catalog's TOML files, its size and ``summary`` printed."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("root", type=Path, help="the unpacked wheel")
    args = ap.parse_args()
    for device in devices:
        data = extract(args.root, device)
        out = CATALOG / f"{device}.{suffix}.json"
        out.write_text(json.dumps(data, separators=(",", ":")) + "\n")
        print(f"{out.relative_to(REPO)}: {out.stat().st_size / 1e3:.1f} kB; {summary(data)}")
    return 0
