"""Extract NVIDIA's measured TensorRT-LLM MoE layer timings from the aiconfigurator-core wheel into catalog files.

NVIDIA's aiconfigurator (github.com/ai-dynamo/aiconfigurator, Apache-2.0) ships, per GPU and serving framework, the
time of one MoE layer's expert computation measured on the device at the shapes of published models:
``aiconfigurator_core/systems/data/<gpu>/moe/<framework>/<version>/moe_perf.parquet``, columns moe_dtype,
num_tokens, hidden_size, inter_size, topk, num_experts, moe_tp_size, moe_ep_size, distribution, kernel_source,
latency (ms). What a row times (its collector, collector/trtllm/collect_moe.py in that repository): one
``moe.forward(hidden_states, router_logits)`` of TensorRT-LLM's fused MoE module (``create_moe``, CUDA graphs) on
one GPU holding ``num_experts / moe_ep_size`` experts, each ``inter_size / moe_tp_size`` wide, with
``num_tokens`` bf16 tokens entering it (all the tokens routed over the EP group: the collector routes them over every
expert and the module keeps its own): the routing of the given logits (top-k and renormalization), the activations'
quantization where the format has one, the permutation, both grouped GEMMs (gate-and-up, then down) with the gated
activation between them, and the finalize (un-permute, weight by the routing scores, sum); ``reduce_results`` off, so
no all-reduce, and no all-to-all: those, and the router's own GEMM, are not in the time.

This script reads the TensorRT-LLM tables of the version the GEMM grids use (aiconfigurator_gemm.py: 1.3.0rc20),
balanced routing (the collector's ``balanced_logits``: every expert the same number of tokens), the gated
kernels (SwiGLU; the ``moe_torch_flow_nongated`` rows, Nemotron's ReLU^2, and the ``moe_torch_flow_min_latency``
twin, a second kernel of the same layer, are left out), the layouts of at most MAX_DEVICES GPUs (moe_tp x moe_ep),
and writes ``src/opmap/hardware/catalog/<device>.moe.json``: per opmap format, a list of measured shapes
(hidden, inter, topk, experts, tp, ep), each with its num_tokens axis and the latency in microseconds.

Run: see benchmarks/reference/_aiconfigurator.py (`python benchmarks/reference/aiconfigurator_moe.py /tmp/aic/x`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from _aiconfigurator import WHEEL, run  # beside this script (its folder is sys.path[0])

VERSION = "1.3.0rc20"  # the GEMM grids' (aiconfigurator_gemm.py)
# Hopper: the formats TensorRT-LLM's collector runs there (SM90: bfloat16, fp8, fp8_block, w4a16_mxfp4, the last
# gpt-oss's MXFP4 experts as W4A16 on the Triton backend), opmap's mxfp4 being the weight-only W4A16 fallback on a
# device without an fp4 engine (opmap.precision.weight_only_policy)
HOPPER = {"bf16": "bfloat16", "fp8": "fp8", "fp8-block": "fp8_block", "mxfp4": "w4a16_mxfp4"}
# Blackwell: nvfp4 (CUTLASS) and gpt-oss's W4A8 (MXFP4 weights, MXFP8 activations, TRTLLM-Gen); opmap's mxfp4 runs
# on Blackwell's fp4 engine, which no table times (w4a16_mxfp4 there is a weight-only kernel), so it is left out
BLACKWELL = {"bf16": "bfloat16", "fp8": "fp8", "fp8-block": "fp8_block", "nvfp4": "nvfp4",
             "w4a8-mxfp4": "w4a8_mxfp4_mxfp8"}
# opmap device -> (aiconfigurator system, {opmap format: table moe_dtype})
DEVICES = {
    "h100-sxm": ("h100_sxm", HOPPER),
    "h200": ("h200_sxm", HOPPER),
    "b200": ("b200_sxm", BLACKWELL),
    # the GB200 NVL72's Blackwell GPU, measured on its own (the table's device column: 'NVIDIA GB200')
    "gb200": ("gb200", BLACKWELL),
}
# Layouts kept: moe_tp x moe_ep up to one HGX node's 8 GPUs (the tables reach 256
# GPUs; opmap prices a wider layout off the nearest measured one, opmap.hardware.moe_grid)
MAX_DEVICES = 8
KERNELS_LEFT_OUT = ("moe_torch_flow_min_latency", "moe_torch_flow_nongated")


def extract(root: Path, device: str) -> dict:
    import duckdb

    system, formats = DEVICES[device]
    rel = f"aiconfigurator_core/systems/data/{system}/moe/trtllm/{VERSION}/moe_perf.parquet"
    path = root / rel
    if not path.exists():
        raise SystemExit(f"no {rel} under {root} (unpack the wheel there; see the docstring)")
    tables = {}
    left_out = ", ".join(f"'{k}'" for k in KERNELS_LEFT_OUT)
    for fmt, md in formats.items():
        rows = duckdb.sql(
            f"select hidden_size, inter_size, topk, num_experts, moe_tp_size, moe_ep_size, num_tokens, "
            f"median(latency), list(distinct kernel_source) from '{path}' where moe_dtype = '{md}' and "
            f"distribution = 'balanced' and latency > 0 and kernel_source not in ({left_out}) and "
            f"moe_tp_size * moe_ep_size <= {MAX_DEVICES} group by all order by all").fetchall()
        if not rows:
            continue
        shapes: dict[tuple, tuple[list[int], list[float]]] = {}
        sources = set()
        for h, i, k, e, tp, ep, t, lat, src in rows:
            toks, us = shapes.setdefault((h, i, k, e, tp, ep), ([], []))
            toks.append(int(t))
            us.append(float(f"{lat * 1e3:.4g}"))
            sources.update(src)
        tables[fmt] = {"table_dtype": md, "kernel_source": sorted(sources),
                       "shapes": [{"shape": list(s), "tokens": t, "latency_us": v} for s, (t, v) in shapes.items()]}
    return {"source": f"{WHEEL}, {rel}: NVIDIA's measured time of one TensorRT-LLM fused MoE layer "
                      f"(trtllm {VERSION}, moe.forward on one GPU: routing of given logits, the activations' "
                      "quantization, permute, both grouped GEMMs with the gated activation, finalize; no router "
                      "GEMM, no all-to-all, no all-reduce), balanced routing, num_tokens the tokens entering the "
                      "layer over the EP group; latency in us",
            "framework": f"trtllm {VERSION}", "distribution": "balanced",
            "shape_fields": ["hidden", "inter", "topk", "experts", "tp", "ep"], "tables": tables,
            # the tables time bfloat16; FP16 and BF16 tensor-core peaks are one figure on Hopper and Blackwell
            "aliases": {"fp16": "bf16"}}


def main() -> int:
    return run(__doc__, DEVICES, extract, "moe",
               lambda d: "measured shapes per format " + str({f: len(t["shapes"]) for f, t in d["tables"].items()}))


if __name__ == "__main__":
    sys.exit(main())
