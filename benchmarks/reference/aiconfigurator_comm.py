"""Extract NVIDIA's measured NCCL collective times from the aiconfigurator-core wheel into catalog grid files.

NVIDIA's aiconfigurator (github.com/ai-dynamo/aiconfigurator, Apache-2.0) ships, per GPU, nccl-tests timings of
all-gather, all-reduce, all-to-all and reduce-scatter on 2, 4 and 8 GPUs of one node (GB200: 2 and 4, one tray):
``aiconfigurator_core/systems/data/<gpu>/comm/nccl/<version>/nccl_perf.parquet``, columns op_name, nccl_dtype
(half, int8), num_gpus, message_size, latency. Its collector (collector/collect_nccl.py in the repository) runs
``<op>_perf -b size -e size -t num_gpus -d dtype -w 40 -n <iters> -c 0`` for size = 512 B ... 512 MiB, doubling,
records ``message_size = size // bytes_per_element`` (elements, not bytes: 2 bytes for half) and ``latency`` =
the out-of-place time column (us) / 1000, in ms. nccl-tests' size is the all-reduce buffer, the all-gather output,
the reduce-scatter input and the all-to-all buffer per device: opmap's ``Collective.message_bytes``
(opmap.mapping.collectives).

This script reads the half (2-byte) rows of the newest NCCL version the wheel holds for each device and writes
``src/opmap/hardware/catalog/<device>.comm.json``: per opmap collective kind and GPU count, the message sizes in
bytes (increasing) and the measured time in microseconds. TensorRT-LLM's own custom all-reduce tables (trtllm/
<version>/custom_allreduce_perf.parquet) are not extracted: opmap prices the NCCL collective every stack can run.

Run: see benchmarks/reference/_aiconfigurator.py (`python benchmarks/reference/aiconfigurator_comm.py /tmp/aic/x`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from _aiconfigurator import WHEEL, run  # beside this script (its folder is sys.path[0])

# opmap device -> (aiconfigurator system, NCCL version: the newest in the wheel)
DEVICES = {
    "h100-sxm": ("h100_sxm", "2.29.2"),
    "h200": ("h200_sxm", "2.29.2"),
    "b200": ("b200_sxm", "2.29.2"),
    "gb200": ("gb200", "2.29.2"),
    "b300": ("b300_sxm", "2.29.2"),
    "gb300": ("gb300", "2.29.2"),
    "rtx-pro-6000": ("rtx_pro_6000_server", "2.29.2"),
    "a100-sxm-80gb": ("a100_sxm", "2.27.3"),
    "l40s": ("l40s", "2.27.3"),
}
# the table's op_name -> opmap's collective kind
KINDS = {"all_gather": "all_gather", "all_reduce": "all_reduce", "alltoall": "all_to_all",
         "reduce_scatter": "reduce_scatter"}
HALF_BYTES = 2  # nccl_dtype half: message_size counts 2-byte elements


def extract(root: Path, device: str) -> dict:
    """One device's grid (module docstring)."""
    import duckdb

    system, version = DEVICES[device]
    rel = f"aiconfigurator_core/systems/data/{system}/comm/nccl/{version}/nccl_perf.parquet"
    path = root / rel
    rows = duckdb.sql(f"select op_name, num_gpus, message_size, latency, kernel_source from '{path}' "
                      "where nccl_dtype = 'half' order by op_name, num_gpus, message_size").fetchall()
    tables: dict[str, dict[str, dict[str, list]]] = {}
    for op, n, elements, ms, src in rows:
        if op not in KINDS or src != "NCCL":
            continue
        t = tables.setdefault(KINDS[op], {}).setdefault(str(n), {"message_bytes": [], "time_us": []})
        if t["message_bytes"] and t["message_bytes"][-1] == elements * HALF_BYTES:
            raise SystemExit(f"{rel}: two rows for {op} on {n} GPUs at {elements} elements")
        t["message_bytes"].append(int(elements) * HALF_BYTES)
        t["time_us"].append(round(float(ms) * 1e3, 4))
    return {"source": f"{WHEEL}, {rel}: NVIDIA's nccl-tests times (NCCL {version}, out-of-place, half, one node's "
                      "GPUs; the collector's message_size counts 2-byte elements, turned into bytes here), time "
                      "in us; extracted by benchmarks/reference/aiconfigurator_comm.py",
            "nccl": version, "tables": tables}


def main() -> int:
    return run(__doc__, DEVICES, extract, "comm",
               lambda d: "GPU counts per kind " + str({k: sorted(int(n) for n in t) for k, t in d["tables"].items()}))


if __name__ == "__main__":
    sys.exit(main())
