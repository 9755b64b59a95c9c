"""DeepSeek-R1 decode under expert parallelism (issue 38): batch 256, KV 4096 tokens, 8 H200s, fp8 weights, runtime
engine; tp8 against tp8 ep8 (experts over the tp group) against ep8 with DP attention (32 sequences a rank). The
same figures as

    opmap analyze R1.json --phase decode --kv-len 4096 --batch 256 --hardware h200 --dtype fp8 --runtime engine --tp 8
    ... --tp 8 --ep 8
    ... --ep 8 --dp-attention

with R1.json the published config (tests/hf_family_configs.py: DEEPSEEK_R1); each batch captured once (the two
batch-256 layouts share one capture). Writes benchmarks/results/expert_parallel.json: TPOT, tok/s, memory per
device, the all-to-all, and the CPU and wall time it took.

    python benchmarks/bench_expert_parallel.py [--layers N]   # N < 61: a cut model, for a quick look
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _common import SCHEMA_VERSION, machine, now_iso, write_json  # noqa: E402
from hf_family_configs import DEEPSEEK_R1, shallow  # noqa: E402
from opmap.api import Layout, Model, Phase, RuntimeChoice, Shape  # noqa: E402
from opmap.cli.common import stack_hardware  # noqa: E402
from opmap.phases.sharded import shard_analysis  # noqa: E402

BATCH, KV, HW, DTYPE = 256, 4096, "h200", "fp8"
CASES = (("tp8", Layout(tp=8)), ("tp8 ep8", Layout(tp=8, ep=8)), ("ep8 dp-attention", Layout(ep=8, dp_attention=True)))


def run(cfg: str) -> list[dict]:
    hw = stack_hardware(HW, None, None)
    m = Model(cfg, DTYPE, "meta", "nchw", {}, False, {}, lambda *a, **k: contextlib.nullcontext())
    cache, rows = {}, []
    for name, lay in CASES:
        lay, b = lay.per_rank(BATCH)
        spec = Phase("decode", KV, "none", None, None, 0, lay.dp, "adamw").spec(cfg, b)
        rt, fusion = RuntimeChoice("engine").resolve(hw, spec)
        spec = replace(spec, kv_write=rt.kv_write)
        if b not in cache:
            cache[b] = m.phase(spec, Shape(b, None, None), hw, rt, fusion, None, lambda n: "-").analysis
        a = shard_analysis(cache[b], lay.parallelism(spec, b))
        f, fit = a.phase_figures, a.fit
        a2a = [c for c in a.sharded.collectives if c.collective.kind == "all_to_all"]
        rows.append({"layout": name, "label": a.sharded.parallelism.label(), "tpot_s": f.step_s,
                     "tokens_per_s": f.tokens / f.step_s, "weights_gib": fit.weights_bytes / 2**30,
                     "kv_gib": fit.kv_cache_bytes / 2**30, "total_gib": fit.total_bytes / 2**30,
                     "capacity_gib": fit.capacity_bytes / 2**30, "fits": fit.fits,
                     "all_to_all": [{"message_bytes": c.collective.message_bytes, "count": c.count,
                                     "predicted_s": c.predicted_s, "link": c.link} for c in a2a],
                     "text": f.text})
        print(f"{name}: {f.text}; memory {fit.total_bytes / 2**30:.4g} GiB per device", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=DEEPSEEK_R1["num_hidden_layers"])
    args = ap.parse_args()
    c = shallow(DEEPSEEK_R1, args.layers) if args.layers < DEEPSEEK_R1["num_hidden_layers"] else DEEPSEEK_R1
    t0, r0 = time.time(), resource.getrusage(resource.RUSAGE_SELF)
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "config.json"
        cfg.write_text(json.dumps(c))
        rows = run(str(cfg))
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    write_json("expert_parallel", {
        "schema_version": SCHEMA_VERSION, "created": now_iso(), "machine": machine(),
        "workload": {"model": "DeepSeek-R1 (published config)", "layers": args.layers, "batch": BATCH,
                     "kv_len": KV, "hardware": HW, "dtype": DTYPE, "runtime": "engine"},
        "rows": rows, "wall_s": time.time() - t0, "user_s": r1.ru_utime - r0.ru_utime,
        "sys_s": r1.ru_stime - r0.ru_stime})


if __name__ == "__main__":
    main()
