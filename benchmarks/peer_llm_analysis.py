"""opmap's training rows beside llm-analysis's on the same published runs (issue 22: "ahead of llm-analysis").

llm-analysis (cli-ai, PyPI ``llm-analysis`` 0.2.2) prices a training step from FLOPs alone: the model's forward
(its own count: q / k / v / o projections, 16 b s h^2 for any MLP, gated or not, whatever its width (its
bundled Llama 2 configs give ffn 4 h: model_configs/NousResearch_Llama-2-7b-hf.json), attention 4 b s^2 h, the
logits), twice that
backward, the recomputation the policy adds, over GPUs x peak x ``flops_efficiency`` per model-parallel group, times
the gradient-accumulation steps; no pipeline bubble, no communication. Its authors' guide
(llm_analysis/constant.py: "FLOPS efficiency achieved by Megatron-LM is ~0.5 for LLM training") sets the efficiency
this script gives it, 0.5; the catalog peaks are its own (``gpu_configs``: H100 SXM 989 / 1979 TFLOP/s for 16 / 8-bit
GEMMs, A100 312).

Rows: every held-out training row of ``benchmarks/results/published.json`` (written by ``published.py``: run that
first) that llm-analysis can express: a GPU it lists, no context parallelism (it has none), heads x head width equal
to the width (MaxText's scaled models are not: TPU rows left out, and llm-analysis lists no TPU). fp8 rows run as its
8-bit weight and activation config (w8a8e16: the 8-bit peak, H100's fp8 dense figure). Each row is written here with
the layout published.py prices (model, TP / PP / DP, global batch, sequence, recomputation) and joined to
published.json by its label; a label published.json lacks stops the script.

llm-analysis pins transformers < 5 for Hugging Face look-ups this script never makes; install it beside opmap without
its dependencies: ``make peers`` (pip install --no-deps llm-analysis==0.2.2 'fire<0.6' six termcolor).

    PYTHONPATH=src .venv/bin/python benchmarks/peer_llm_analysis.py
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
BAND = (0.8, 1.25)  # issue 22's training band
EFFICIENCY = 0.5  # llm-analysis's authors' figure for Megatron-LM training


@dataclass(frozen=True)
class Peer:
    what: str  # the row's label in published.json
    gpu: str  # llm-analysis's gpu_configs name
    dtype: str  # llm-analysis's dtype_configs name
    layers: int
    heads: int
    hidden: int
    vocab: int
    seq: int
    tp: int
    pp: int
    dp: int
    global_batch: int
    recompute: str  # none | selective | full
    kv_heads: int | None = None

    @property
    def gated(self) -> bool:
        """A SwiGLU MLP (the Llamas; Nemotron's squared ReLU and the GPTs are not gated)."""
        return "lama" in self.what


A100, H100 = "a100-sxm-80gb", "h100-sxm-80gb"
BF16, FP8 = "w16a16e16", "w8a8e16"
def _nemo(name: str, layers: int, heads: int, h: int, vocab: int, seq: int, tp: int, pp: int, vp: int, dp: int,
          gb: int, mb: int, recompute: str, kv: int) -> Peer:
    """A row of NeMo 24.07's fp8 table, labelled as published.py's nemo_fp8_rows labels it."""
    what = (f"{name} fp8, tp{tp} cp1 pp{pp} vp{vp} dp{dp}, seq {seq}, batch {gb} (microbatch {mb}), "
            f"recompute {recompute}")
    return Peer(what, H100, FP8, layers, heads, h, vocab, seq, tp, pp, dp, gb, recompute, kv)


# Llama 2 (Touvron et al. 2023) and Llama 3.1 405B (Meta 2024) layouts; NeMo's GPT-3 and Nemotron recipes as
# published.py builds them (vocabulary 50,304 / 256,000); Megatron's 2021 GPTs (vocabulary 51,200)
PEERS = [
    *(Peer(f"GPT {n}, tp{tp} pp{pp} dp32, batch {gb}, full recompute", A100, BF16, L, a, h, 51200, 2048, tp, pp, 32,
           gb, "full")
      for n, h, L, a, tp, pp, gb in (("1.7B", 2304, 24, 24, 1, 1, 512), ("3.6B", 3072, 30, 32, 2, 1, 512),
                                     ("7.5B", 4096, 36, 32, 4, 1, 512), ("18B", 6144, 40, 48, 8, 1, 1024),
                                     ("39B", 8192, 48, 64, 8, 2, 1536))),
    Peer("GPT 22B, tp8 pp1 sp, batch 8, selective recompute", A100, BF16, 48, 64, 6144, 51200, 2048, 8, 1, 1, 8,
         "selective"),
    Peer("GPT 175B, tp8 pp8 sp, batch 64, selective recompute", A100, BF16, 96, 96, 12288, 51200, 2048, 8, 8, 1, 64,
         "selective"),
    # NeMo 24.07's table: name, layers, heads, width, vocabulary, sequence, TP, PP, VP, DP, batch, microbatch,
    # recomputation, KV heads
    *(_nemo(*row) for row in (
        ("GPT3-175B", 96, 96, 12288, 50304, 2048, 4, 8, 6, 4, 256, 1, "selective", 96),
        ("GPT3-175B", 96, 96, 12288, 50304, 2048, 4, 8, 6, 16, 2048, 2, "selective", 96),
        ("llama-2-7b", 32, 32, 4096, 32000, 4096, 1, 1, 1, 8, 128, 1, "none", 32),
        ("llama-2-13b", 40, 40, 5120, 32000, 4096, 1, 4, 10, 4, 128, 1, "none", 40),
        ("llama-2-70b", 80, 64, 8192, 32000, 4096, 4, 4, 20, 4, 128, 1, "none", 8),
        ("Nemotron-8B", 32, 32, 4096, 256000, 4096, 2, 1, 1, 32, 256, 4, "none", 32),
        ("Nemotron-22B", 40, 48, 6144, 256000, 4096, 2, 4, 10, 8, 256, 2, "none", 48),
        ("Nemotron-340B", 96, 96, 18432, 256000, 4096, 8, 8, 12, 2, 32, 1, "selective", 8))),
    Peer("Llama 2 7B fp8 (NeMo 24.03.01), seq 4K, tp1 cp1 pp1 dp4, batch 1024", H100, FP8, 32, 32, 4096, 32000,
         4096, 1, 1, 4, 1024, "none", 32),
    Peer("Llama 2 7B fp8 (NeMo 24.03.01), seq 8K, tp1 cp1 pp2 dp4, batch 512", H100, FP8, 32, 32, 4096, 32000,
         8192, 1, 2, 4, 512, "none", 32),
    Peer("Llama 2 7B fp8 (NeMo 24.03.01), seq 16K, tp2 cp1 pp1 dp8, batch 256", H100, FP8, 32, 32, 4096, 32000,
         16384, 2, 1, 8, 256, "none", 32),
    Peer("llama-3-70b fp8 (Megatron-Core), tp4 cp1 pp8 vp5 dp2, seq 8192, batch 128", H100, FP8, 80, 64, 8192,
         128256, 8192, 4, 8, 2, 128, "none", 8),
    *(Peer(f"Megatron-Core GPT {n} bf16, tp{tp} pp{pp} dp48, seq 4096, batch {gb}", H100, BF16, L, a, h, 131072,
           4096, tp, pp, 48, gb, "none")
      for n, a, h, L, tp, pp, gb in (("1.7B", 16, 2048, 24, 1, 1, 192), ("7.1B", 32, 4096, 30, 2, 1, 192),
                                     ("16B", 48, 6144, 32, 4, 1, 192), ("32B", 56, 7168, 48, 8, 1, 192),
                                     ("70B", 64, 8192, 84, 8, 2, 384), ("119B", 80, 10240, 92, 8, 4, 768),
                                     ("177B", 96, 12288, 96, 8, 6, 1152), ("314B", 128, 16384, 96, 8, 8, 1536),
                                     ("462B", 144, 18432, 112, 8, 16, 3072))),
    Peer("Llama 3 405B, tp8 cp1 pp16 dp64, seq 8192, 2048 sequences per step", H100, BF16, 126, 128, 16384, 128256,
         8192, 8, 16, 64, 2048, "none", 8),
    Peer("Llama 3 405B, tp8 cp1 pp16 dp128, seq 8192, 2048 sequences per step", H100, BF16, 126, 128, 16384, 128256,
         8192, 8, 16, 128, 2048, "none", 8),
]


def llm_analysis_step_s(p: Peer) -> float:
    """llm-analysis's latency per iteration for ``p`` (its own FLOP count and efficiency model)."""
    from llm_analysis.analysis import ActivationRecomputation, LLMAnalysis
    from llm_analysis.config import ModelConfig, ParallelismConfig, get_dtype_config_by_name, get_gpu_config_by_name

    model = ModelConfig(name=p.what, num_layers=p.layers, n_head=p.heads, hidden_dim=p.hidden, vocab_size=p.vocab,
                        max_seq_len=p.seq, num_key_value_heads=p.kv_heads or p.heads,
                        ffn_embed_dim=4 * p.hidden)  # its own Llama configs too (model_configs/*Llama-2-7b*.json)
    a = LLMAnalysis(model, get_gpu_config_by_name(p.gpu), get_dtype_config_by_name(p.dtype),
                    ParallelismConfig(tp_size=p.tp, pp_size=p.pp, dp_size=p.dp), flops_efficiency=EFFICIENCY,
                    hbm_memory_efficiency=0.9)
    rc = {"none": ActivationRecomputation.NONE, "selective": ActivationRecomputation.SELECTIVE,
          "full": ActivationRecomputation.FULL}[p.recompute]
    out = a.training(batch_size_per_gpu=1, global_batch_size=p.global_batch, seq_len=p.seq,
                     activation_recomputation=rc, flash_attn=p.recompute != "full",
                     mlp_gated_linear_units=p.gated)
    return float(out["latency_per_iter"])


def main() -> int:
    sys.path.insert(0, str(HERE))
    try:
        import llm_analysis  # noqa: F401
    except ImportError:
        print("peer_llm_analysis.py needs llm-analysis: make peers (pip install --no-deps llm-analysis==0.2.2 "
              "'fire<0.6' six termcolor)", file=sys.stderr)
        return 2
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from _common import SCHEMA_VERSION, now_iso, write_json

    src = HERE / "results" / "published.json"
    if not src.exists():
        print(f"no {src}: run benchmarks/published.py first", file=sys.stderr)
        return 2
    published = {r["what"]: r for r in json.loads(src.read_text())["rows"]}
    missing = [p.what for p in PEERS if p.what not in published]
    if missing:
        print(f"published.json has no row {missing[0]!r}: rerun benchmarks/published.py", file=sys.stderr)
        return 2
    logging.getLogger("llm_analysis").setLevel(logging.ERROR)
    from llm_analysis.logger import logger as la_logger

    la_logger.setLevel(logging.ERROR)
    rows = []
    for p in PEERS:
        r = published[p.what]
        if r["role"] != "held out":
            continue
        la = llm_analysis_step_s(p)
        rows.append({"what": p.what, "published_s": r["published_s"], "opmap_s": r["predicted_s"],
                     "llm_analysis_s": la, "opmap_ratio": r["predicted_s"] / r["published_s"],
                     "llm_analysis_ratio": la / r["published_s"]})
    t = Table(title=f"Training step, predicted / published (llm-analysis at flops_efficiency {EFFICIENCY})")
    for c in ("row", "published s", "opmap", "llm-analysis"):
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(escape(r["what"]), f"{r['published_s']:.4g}", f"{r['opmap_ratio']:.2f}",
                  f"{r['llm_analysis_ratio']:.2f}")
    con = Console()
    con.print(t)
    summary = {}
    for who in ("opmap", "llm_analysis"):
        ratios = [r[f"{who}_ratio"] for r in rows]
        summary[who] = {"within": sum(BAND[0] <= x <= BAND[1] for x in ratios),
                        "mean_abs_error": statistics.fmean(abs(x - 1) for x in ratios),
                        "median_ratio": statistics.median(ratios),
                        "geomean_error": math.exp(statistics.fmean(abs(math.log(x)) for x in ratios)) - 1}
        s = summary[who]
        con.print(f"{who}: {s['within']} of {len(rows)} within {BAND[0]}-{BAND[1]}, mean |pred/pub - 1| "
                  f"{s['mean_abs_error']:.1%}, median pred/pub {s['median_ratio']:.3f}")
    path = write_json(Path(__file__).stem, {
        "schema_version": SCHEMA_VERSION, "benchmark": "peer_llm_analysis", "created": now_iso(),
        "llm_analysis_version": "0.2.2", "flops_efficiency": EFFICIENCY, "band": list(BAND), "rows": rows,
        "summary": summary, "published_json_created": json.loads(src.read_text()).get("created")})
    con.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
