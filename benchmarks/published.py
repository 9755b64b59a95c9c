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

The figures: benchmarks/reference/published/*.csv, one file per source, a source column on every row.

Run:  .venv/bin/python benchmarks/published.py        Writes benchmarks/results/published.json.
      ... published.py --train-fusion eager             Every training row under one fusion policy (default: each
                                                        row under its software stack's); writes
                                                        benchmarks/results/published_eager.json.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from tables import Column, read_table  # noqa: E402

BAND = (0.75, 1.33)
TRAINING_BAND = (0.8, 1.25)  # issue 22's target for the training rows, with a mean |ratio - 1| under 10%
TRAINING_KINDS = ("training_throughput", "mfu")
# the fusion policy the training rows are priced under. None (the default): each row under its own software stack's
# (opmap.mapping.fusion): library for Megatron-LM, NeMo and Megatron-Core (hand-written fused kernels between vendor
# GEMMs), compiler for MaxText (XLA), eager for Meta's Llama 3 stack (no fused kernels named). --train-fusion POLICY
# prices every training row under one policy instead, for comparison
TRAIN_FUSION: str | None = None


# The published figures are data: one CSV per source in benchmarks/reference/published/ (a source column on every
# row), read with benchmarks/tables.py; each section below names its table's columns.
PUBLISHED_TABLES = HERE / "reference" / "published"


def _i(name: str, required: bool = True) -> Column:
    return Column(name, int, required)


def _f(name: str) -> Column:
    return Column(name, float, True)


def _s(name: str) -> Column:
    return Column(name, str, True)


def _rows(table: str, *columns: Column) -> list[tuple]:
    """The rows of reference/published/<table>.csv as tuples in ``columns``' order, the row's source last."""
    rows = read_table(PUBLISHED_TABLES / f"{table}.csv", (*columns, Column("source", required=True)))
    return [(*(r[c.name] for c in columns), r["source"]) for r in rows]


def _fusion(stack: str) -> str:
    """The fusion policy a row is priced under: its stack's, unless --train-fusion names one for all rows."""
    return TRAIN_FUSION or stack


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
    # (bytes, busbw GB/s) and (bytes, time s) as published; the 8 GiB row set the catalog's in-switch rate: fit
    table = _rows("nccl_dgx_h100_all_reduce", _s("measure"), _i("bytes"), _f("value"), _s("role"))

    def size(b: int) -> str:
        return f"{b} B" if b < mib else f"{b // mib} MiB" if b < 1024 * mib else f"{b // (1024 * mib)} GiB"

    rows = []
    for measure, b, value, role, source in table:
        t, algo, d = collective_time(hw, Collective("all_reduce", b, n))
        if measure == "busbw":  # GB/s
            pub_s = b / (value * 1e9 / bus_factor("all_reduce", n))
            rows.append(Row("collective", hw.name, f"all_reduce {size(b)}, 8 GPUs (busbw)", value, "GB/s busbw",
                            pub_s, t, source, role, f"{algo}/{d['protocol']}"))
        else:  # a time in seconds
            rows.append(Row("collective", hw.name, f"all_reduce {size(b)}, 8 GPUs (time)", value * 1e6, "us", value,
                            t, source, role, f"{algo}/{d['protocol']}"))
    return rows




def _megatron_gpt(h: int, layers: int, heads: int):
    """A GPT of Megatron-LM's 2021 runs: vocabulary 51,200, sequence 2048, learned positions, GELU, 4h FFN,
    the attention core unfused (scores in memory, fused masked softmax, dropout) and dropout 0.1, fp16."""
    import torch

    from opmap.workloads.gpt2 import GPT2, GPT2Config
    from opmap.workloads.zoo import Workload, cast_to

    cfg = GPT2Config(vocab_size=51200, block_size=2048, n_layer=layers, n_head=heads, n_embd=h,
                     attention="unfused", dropout=0.1)
    with torch.device("meta"):
        m, x = GPT2(cfg), torch.zeros(1, 2048, dtype=torch.long)
    m, _ = cast_to(m, (x,), torch.float16)
    return Workload(f"gpt h{h} L{layers}", m, (x,), 1, 2048)


def _train_iteration(w, hw, tp: int, pp: int, dp: int, global_batch: int, recompute: str, sp: bool = False):
    """(iteration s, phase figures, sharded) of a Megatron-style run: microbatch 1, fused AdamW, the DP
    gradient all-reduce after backward (dp_overlap 0: Megatron-LM in 2021-22 did not overlap it). Fusion: library
    (Narayanan et al. 2021, sec. 4.2: bias + GeLU and bias + dropout + add fused, scale + mask + softmax in custom
    kernels; LayerNorm is Apex's fused kernel)."""
    from opmap.mapping.sharding import Parallelism, shard
    from opmap.phases.sharded import sharded_phase_figures
    from opmap.phases.step import analyze_phase, capture_phase
    from opmap.workloads.phases import PhaseSpec

    spec = PhaseSpec("train", None, recompute, 1, global_batch, 0, dp=dp, optimizer="adamw-fused")
    pa = analyze_phase(capture_phase(w, spec), w, hw, "fp16", spec, fusion=_fusion("library"))
    par = Parallelism(tp=tp, pp=pp, dp=dp, sp=sp, microbatch=1, global_batch=global_batch, recompute=recompute,
                      dp_overlap=0.0)
    sh = shard(pa.analysis, par)
    fig = sharded_phase_figures(pa.analysis.phase_figures, sh, pa.analysis)
    return fig.step_s, fig, sh


def megatron_rows() -> list[Row]:
    """Table 1's TFLOP/s per GPU as an iteration time: F / (GPUs x TFLOP/s), F = 96 B s l h^2 (1 + s / 6h +
    V / 16 l h) (Narayanan et al. eq. 3: the FLOPs with full activation recomputation, which the runs used)."""
    from opmap.hardware import get_hardware

    hw = get_hardware("a100-sxm-80gb")
    s, vocab = 2048, 51200
    # params, hidden, layers, heads, tp, pp, GPUs, global batch, TFLOP/s per GPU (heads: Table 1's column)
    table = _rows("megatron_narayanan_2021", _s("name"), _i("hidden"), _i("layers"), _i("heads"), _i("tp"), _i("pp"),
                  _i("gpus"), _i("global_batch"), _f("tflops_per_gpu"))
    rows = []
    for name, h, L, a, tp, pp, gpus, gb, tflops, source in table:
        flops = 96 * gb * s * L * h * h * (1 + s / (6 * h) + vocab / (16 * L * h))
        pub_s = flops / (gpus * tflops * 1e12)
        it, fig, sh = _train_iteration(_megatron_gpt(h, L, a), hw, tp, pp, gpus // (tp * pp), gb, "full")
        rows.append(Row("training_throughput", hw.name, f"GPT {name}, tp{tp} pp{pp} dp{gpus // (tp * pp)}, "
                        f"batch {gb}, full recompute", tflops, "TFLOP/s per GPU", pub_s, it, source,
                        how=f"bubble {sh.bubble_fraction:.1%}, HFU {fig.hfu:.0%}"))
    return rows


def korthikanti_rows() -> list[Row]:
    """MFU with sequence parallelism and selective recomputation, no data parallelism, microbatch 1 (the paper's
    Table 3 layouts): MFU as an iteration time, model FLOPs (72 B s l h^2 (1 + s / 6h + V / 12 l h), no
    recomputation) / (GPUs x MFU x 312 TFLOP/s)."""
    from opmap.hardware import get_hardware

    hw = get_hardware("a100-sxm-80gb")
    s, vocab = 2048, 51200
    # name, hidden, layers, heads, tp, pp, GPUs (batch = GPUs: one sequence per GPU per iteration), MFU
    table = _rows("korthikanti_2022", _s("name"), _i("hidden"), _i("layers"), _i("heads"), _i("tp"), _i("pp"),
                  _i("gpus"), _f("mfu"))
    rows = []
    for name, h, L, a, tp, pp, gpus, mfu, source in table:
        gb = gpus
        flops = 72 * gb * s * L * h * h * (1 + s / (6 * h) + vocab / (12 * L * h))
        pub_s = flops / (gpus * mfu * 312e12)
        it, fig, sh = _train_iteration(_megatron_gpt(h, L, a), hw, tp, pp, 1, gb, "selective", sp=True)
        rows.append(Row("mfu", hw.name, f"GPT {name}, tp{tp} pp{pp} sp, batch {gb}, selective recompute", mfu * 100,
                        "% MFU", pub_s, it, source, how=f"MFU {fig.mfu:.1%}, bubble {sh.bubble_fraction:.1%}"))
    return rows


# The recipes' settings the rows take (NVIDIA/NeMo-Framework-Launcher launcher_scripts/conf/training/gpt3/5b.yaml,
# 20b.yaml, 175b.yaml, llama/llama2_70b.yaml and nemotron/nemotron_8b.yaml, 22b, 340b): distributed fused Adam with
# overlap_grad_sync, sequence parallel with TP above 1, hidden and attention dropout 0.1 for GPT-3 (0 for Llama 2 and
# Nemotron), activation recomputation none (5B, Llama 2, Nemotron 8B / 22B) or selective (20B, 175B, Nemotron 340B).
# The attention rate of NeMo's 2024 containers (24.03.01, 24.07): the catalog's FlashAttention-2 curve (Shah et al.
# 2024, Figure 5 / 6), not its cuDNN one. Transformer Engine ran cuDNN's fused attention on Hopper then too, but the
# catalog's cuDNN rows are the FA3 paper's (mid 2024), and cuDNN's attention speed moved between releases (cuDNN
# 9.0.0 release notes: fused flash attention "up to 50%" faster than 8.9.7 on Hopper). Two published comparisons say
# the 2024 stacks ran at the FA2 curve: (1) the same Llama 3 8B layout (8 GPUs, CP 2, seq 8192) is 12,036 tok/s/GPU
# in NeMo 24.07 and 13,812 in Megatron-Core r0.12 (2025): 0.871, where opmap's step under the cuDNN curve over its
# step under the FA2 curve is 0.886; (2) NeMo's long-sequence table (nemo_long_rows: Llama 2 7B, 4K to 1M tokens,
# attention from ~15% to ~97% of the FLOPs) stays at 0.97-1.02 under the FA2 curve and falls from 0.94 to 0.63
# under cuDNN's. Megatron-Core r0.12's rows keep the catalog's cuDNN curve. Inferred from published runs, not
# measured: a GPU session timing TE's attention in those containers would settle it
NEMO_2024_ATTENTION = "fa2"
# Attention dropout in the same 2024 stacks (TE 1.x with cuDNN 9.1-9.3 on Hopper; NeMo 24.07, Megatron-Core mid 2024):
# the fused kernel ran about 1.8x its no-dropout time. Inferred from published runs, not measured. NeMo's 24.07 table
# holds GPT-3 rows (attention and hidden dropout 0.1) and Nemotron rows (dropout 0) from one container: priced
# alike, the GPT-3 rows fall short by more, and by the attention a GPU does, not by its width (GPT-3 5B at TP 1 and
# Megatron-Core's 1.7B at TP 1 miss the same time per token and layer with 2x the width apart; 16B and GPT-3 20B
# likewise), which places the difference in the attention kernel. The factor is what makes each GPT-3 row's ratio
# its Nemotron sibling's: GPT-3 5B to Nemotron-8B (the same 16 x 4096 / 32 x 2048 heads x keys a GPU) 1.75,
# GPT-3 20B to Nemotron-22B 1.85 (printed beside those rows on every run); 1.8. Megatron-Core's weak-scaling rows
# (mcore_weak_rows) are out of that fit. Today's kernels pay 3-5% (the catalog's cudnn factor, TransformerEngine
# issue 3312); how the 2024 ones paid ~1.8x is not published: TE 1.8 selects cuDNN's fused attention with dropout
# (no backend filter on it), and cuDNN serves dropout with training statistics on its older "composite" SDPA engine
# to this day (TransformerEngine fused_attn_f16_arbitrary_seqlen.cu; issue 3312 / PR 3313: 5-7x on Blackwell in
# the thd layout). benchmarks/gpu_measure.py times SDPA with and without dropout per backend for the GPU session
# that can settle it
NEMO_2024_DROPOUT = 1.8
NEMO_2024_DROPOUT_WHY = ("inferred for 2024's TE / cuDNN stacks from NeMo 24.07's GPT-3 rows against its Nemotron rows "
                         "(benchmarks/published.py NEMO_2024_DROPOUT)")


def _stack_2024(cudnn):
    """``cudnn`` (the catalog's H100) as NeMo's and Megatron-Core's 2024 stacks priced attention: the
    ``NEMO_2024_ATTENTION`` curve, its dropout at ``NEMO_2024_DROPOUT``."""
    from opmap.hardware import with_attention_dropout, with_attention_kernel

    return with_attention_dropout(with_attention_kernel(cudnn, NEMO_2024_ATTENTION), NEMO_2024_DROPOUT,
                                  NEMO_2024_DROPOUT_WHY)


def _gpt3(h: int, layers: int, heads: int, batch: int):
    """NeMo's GPT-3 (Megatron-core GPT, its recipes): vocabulary 50,304 (GPT-2's 50,257 padded to a multiple of
    128), sequence 2048, learned positions, GELU, 4h FFN, fused (flash) attention, dropout 0.1; built in bf16."""
    import torch

    from opmap.workloads.gpt2 import GPT2, GPT2Config
    from opmap.workloads.zoo import Workload, cast_to

    cfg = GPT2Config(vocab_size=50304, block_size=2048, n_layer=layers, n_head=heads, n_embd=h, dropout=0.1)
    with torch.device("meta"):
        m, x = GPT2(cfg), torch.zeros(batch, 2048, dtype=torch.long)
    m, _ = cast_to(m, (x,), torch.bfloat16)
    return Workload(f"gpt3 h{h} L{layers}", m, (x,), batch, 2048)


# Llama 2 13B (Touvron et al. 2023, Table 1 and the released config): 40 layers, d 5120, 40 heads (no GQA), FFN
# 13824, vocabulary 32000, rope theta 10000
LLAMA2_13B = dict(vocab_size=32000, dim=5120, n_layer=40, n_head=40, n_kv_head=40, ffn_dim=13824, rope_theta=10000.0,
                  max_seq=4096)


def _llama(name: str, cfg: dict, batch: int, seq: int):
    """A Llama the zoo does not list, built in bf16 on meta from its config (``LLAMA2_13B``)."""
    import torch

    from opmap.workloads.llama import Llama, LlamaConfig
    from opmap.workloads.zoo import Workload, cast_to

    with torch.device("meta"):
        m, x = Llama(LlamaConfig(**cfg)), torch.zeros(batch, seq, dtype=torch.long)
    m, _ = cast_to(m, (x,), torch.bfloat16)
    return Workload(name, m, (x,), batch, seq)


class Nemotron(NamedTuple):
    """A Nemotron layout of NeMo's recipes (NVIDIA/NeMo-Framework-Launcher launcher_scripts/conf/training/nemotron/
    nemotron_{8b,22b,340b}.yaml at commit 766225b5, 2024-08): width, layers, heads, KV heads, FFN width."""

    h: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int


NEMOTRON_8B = Nemotron(4096, 32, 32, 32, 16384)
NEMOTRON_22B = Nemotron(6144, 40, 48, 48, 24576)
NEMOTRON_340B = Nemotron(18432, 96, 96, 8, 73728)  # ffn 4 h
NEMO_ARCHS = {"nemotron-8b": NEMOTRON_8B, "nemotron-22b": NEMOTRON_22B, "nemotron-340b": NEMOTRON_340B,
              "llama-2-13b": LLAMA2_13B}


def _nemo_arch(model: str, arch: str, hidden: int | None, layers: int | None, heads: int | None):
    """A nemo_24_07_fp8.csv row's model: a GPT-3 (hidden, layers, heads), a named layout (``NEMO_ARCHS``) or None
    for a zoo name."""
    if arch == "gpt3":
        if None in (hidden, layers, heads):
            raise ValueError(f"nemo_24_07_fp8.csv: {model}: arch gpt3 needs hidden, layers and heads")
        return hidden, layers, heads
    if arch == "zoo":
        return None
    if arch not in NEMO_ARCHS:
        raise ValueError(f"nemo_24_07_fp8.csv: {model}: arch {arch!r} unknown; accepted: gpt3, zoo, "
                         f"{', '.join(NEMO_ARCHS)}")
    return NEMO_ARCHS[arch]


def _nemotron(cfg: Nemotron, batch: int, seq: int):
    """NeMo's Nemotron (the recipes of ``Nemotron``: LayerNorm with zero-centred gamma (layernorm1p), squared-ReLU MLP,
    no biases, RoPE on half of each head (rotary_percentage 0.5), untied embeddings, the 256,000-token vocabulary of
    its tokenizer, hidden and attention dropout 0), built by transformers' own Nemotron class from a config (the HF
    path, ``opmap.workloads.hf``: model_type nemotron is that architecture) on meta in fp8."""
    import json
    import tempfile

    from opmap.workloads.hf import build_hf

    config = {"model_type": "nemotron", "hidden_size": cfg.h, "intermediate_size": cfg.ffn,
              "num_hidden_layers": cfg.layers, "num_attention_heads": cfg.heads, "num_key_value_heads": cfg.kv_heads,
              "head_dim": cfg.h // cfg.heads, "vocab_size": 256000, "max_position_embeddings": seq,
              "partial_rotary_factor": 0.5, "hidden_act": "relu2", "tie_word_embeddings": False,
              "attention_dropout": 0.0}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "config.json"
        path.write_text(json.dumps(config))
        return build_hf(str(path), batch, seq, "fp8", "meta")


def _fp8_iteration(w, hw, tp: int, pp: int, vp: int, dp: int, global_batch: int, microbatch: int, recompute: str,
                   cp: int = 1, alt_hw=()):
    """(iteration s, phase figures, sharded) of a NeMo fp8 pre-training run as its recipes set it up: Transformer
    Engine fp8 (opmap --dtype fp8 in training), the distributed optimizer (ZeRO 1) with fused Adam, the DP gradient
    reduce-scatter overlapped with the last microbatch's backward (overlap_grad_sync) and the parameter all-gather
    with the next iteration's first forward (overlap_param_sync: true in the recipes; opmap's default bucketed
    overlap), sequence parallelism with TP above 1, the recipe's activation recomputation; fusion library (TE's
    fused norm + cast, activation, RoPE and bias-dropout-add kernels between the GEMMs). The same capture is also
    priced on each device of ``alt_hw``: (iteration s, phase figures, sharded, the iteration s on each alt_hw)."""
    from opmap.mapping.sharding import Parallelism, shard
    from opmap.phases.sharded import sharded_phase_figures
    from opmap.phases.step import analyze_phase, capture_phase
    from opmap.workloads.phases import PhaseSpec

    spec = PhaseSpec("train", None, recompute, microbatch, global_batch, 1, dp=dp, optimizer="adamw-fused")
    g = capture_phase(w, spec)
    pa = analyze_phase(g, w, hw, "fp8", spec, fusion=_fusion("library"))
    par = Parallelism(tp=tp, pp=pp, dp=dp, vp=vp, cp=cp, sp=tp > 1, microbatch=microbatch, global_batch=global_batch,
                      recompute=recompute, zero=1)
    sh = shard(pa.analysis, par)
    fig = sharded_phase_figures(pa.analysis.phase_figures, sh, pa.analysis)
    alt = []
    for other in alt_hw:
        pa2 = analyze_phase(g, w, other, "fp8", spec, fusion=_fusion("library"))
        alt.append(sharded_phase_figures(pa2.analysis.phase_figures, shard(pa2.analysis, par), pa2.analysis).step_s)
    return fig.step_s, fig, sh, tuple(alt)


def nemo_fp8_rows() -> list[Row]:
    """NeMo's fp8 pre-training throughput on DGX H100, every row of the table: tokens / s / GPU as
    an iteration time, global batch x sequence / (GPUs x tokens/s/GPU). Context parallelism (the Llama 3 rows, CP
    2) as Megatron-Core runs it: the K/V ring, each step's exchange overlapped with attention. Attention: priced at
    ``NEMO_2024_ATTENTION``'s rate (FlashAttention-2's measured curve), its dropout (the GPT-3 rows) at
    ``NEMO_2024_DROPOUT``; each row also prints its ratio at the catalog's cuDNN curve (today's kernel, its dropout
    at the catalog's measured factor), the GPT-3 rows theirs at the kernel's no-dropout rate (factor 1), and the
    two GPT-3 rows that pair with a Nemotron row the dropout factor at which the pair's ratios agree (what
    ``NEMO_2024_DROPOUT`` rests on: those two rows are marked fit, out of the held-out counts)."""
    from opmap.hardware import get_hardware, with_attention_dropout, with_attention_kernel
    from opmap.workloads import load_workload

    cudnn = get_hardware("h100-sxm")
    hw = _stack_2024(cudnn)
    free = with_attention_dropout(with_attention_kernel(cudnn, NEMO_2024_ATTENTION), 1.0, "the no-dropout rate")
    # model, (hidden, layers, heads) for a GPT-3 / a Nemotron layout / a Llama config / None for a zoo name, seq,
    # GPUs, GBS, MBS, TP, PP, CP, VP (the table's columns), recompute (the recipe's), tokens/s/GPU (the table's)
    rows_ = _rows("nemo_24_07_fp8", _s("model"), _s("arch"), _i("hidden", False), _i("layers", False),
                  _i("heads", False), _i("seq"), _i("gpus"), _i("global_batch"), _i("microbatch"), _i("tp"), _i("pp"),
                  _i("cp"), _i("vp"), _s("recompute"), _f("tokens_per_s_per_gpu"))
    table = [(r[0], _nemo_arch(r[0], *r[1:5]), *r[5:]) for r in rows_]
    pairs = {"GPT3-5B": "Nemotron-8B", "GPT3-20B": "Nemotron-22B"}  # the same attention a GPU, or the nearest
    rows, free_s = [], {}
    for name, cfg, seq, gpus, gb, mb, tp, pp, cp, vp, recompute, tok, source in table:
        dp = gpus // (tp * pp * cp)
        w = (_nemotron(cfg, mb, seq) if isinstance(cfg, Nemotron) else _gpt3(*cfg, mb) if isinstance(cfg, tuple)
             else _llama(name, cfg, mb, seq) if cfg is not None else load_workload(name, mb, seq, "fp8", "meta"))
        pub_s = gb * seq / (gpus * tok)
        gpt = isinstance(cfg, tuple) and not isinstance(cfg, Nemotron)
        it, fig, sh, alt = _fp8_iteration(w, hw, tp, pp, vp, dp, gb, mb, recompute, cp,
                                          alt_hw=(cudnn, free) if gpt else (cudnn,))
        if gpt:
            free_s[name] = alt[1]
        rows.append(Row("training_throughput", hw.name, f"{name} fp8, tp{tp} cp{cp} pp{pp} vp{vp} dp{dp}, seq {seq}, "
                        f"batch {gb} (microbatch {mb}), recompute {recompute}", tok, "tokens/s per GPU", pub_s, it,
                        source, role="fit" if name in pairs else "held out",
                        how=f"{gb * seq / (gpus * it):.4g} tok/s/GPU, bubble {sh.bubble_fraction:.1%}, "
                            f"MFU {fig.mfu:.0%} of the fp8 peak; with cuDNN attention: {alt[0] / pub_s:.2f}"
                            + (f"; attention at its no-dropout rate: {alt[1] / pub_s:.2f}" if gpt else "")))
    index = {r.what.split(" fp8")[0]: i for i, r in enumerate(rows)}  # GPT3-175B's two rows: not paired
    for gpt, sibling in pairs.items():
        r, s = rows[index[gpt]], rows[index[sibling]]
        per_unit = (r.predicted_s - free_s[gpt]) / (NEMO_2024_DROPOUT - 1.0)  # the attention time one unit adds
        implied = 1.0 + (s.ratio * r.published_s - free_s[gpt]) / per_unit
        rows[index[gpt]] = replace(r, how=f"{r.how}; the dropout factor that gives {sibling}'s ratio "
                                          f"({s.ratio:.3f}): {implied:.2f}")
    return rows




def nemo_llama2_7b_flops_per_token(seq: int) -> float:
    """NeMo's model FLOPs per token of Llama 2 7B (nemo/utils/flops_formulas.py llama2 at commit f0bf77bcf7f3:
    gbs s L h^2 (12 + 12 groups / heads + 18 ffn / h + 12 s / h + 6 V / (L h)), attention dense), per token."""
    layers, h, ffn, vocab = 32, 4096, 11008, 32000  # Llama 2 7B (Touvron et al. 2023), no GQA: groups = heads
    return layers * h * h * (12 + 12 + 18 * ffn / h + 12 * seq / h + 6 * vocab / (layers * h))


def nemo_long_rows() -> list[Row]:
    """NeMo's long-sequence table (its CSV): Llama 2 7B in fp8 from 4K to 1M tokens a sequence, the same 4M
    tokens a batch, context parallelism from 1 to 32 with TP 1-8 (every row the table lists with CP; its TP, PP, DP,
    CP). TFLOP/s per GPU as a step time with NeMo's own FLOPs: the llama2 formula of nemo/utils/flops_formulas.py
    (commit f0bf77bcf7f3, its first version) with attention counted dense, 12 s / h, which the table's figures fit
    (an earlier revision of the performance summary prints 16,671 tokens/s per GPU for the 4K row's 768 TFLOP/s and
    318 for the 1M row's 536). Set up as ``_fp8_iteration`` sets NeMo's runs up (TE fp8, distributed optimizer, SP
    with TP above 1, the K/V ring for CP, microbatch 1, library fusion), priced from two captured blocks standing
    for 32 (opmap.explore.depth); the table names no recomputation: the fastest that fits 80 GB, as ``plan``
    chooses it (none, on every row). Attention at ``NEMO_2024_ATTENTION``'s rate; the ratio under the catalog's
    cuDNN curve printed beside."""
    from opmap.explore.depth import shallow
    from opmap.hardware import get_hardware, with_attention_kernel
    from opmap.mapping.sharding import Parallelism, Sharder, saved_per_block, sharded_memory
    from opmap.phases.step import analyze_phase, capture_phase
    from opmap.workloads import load_workload
    from opmap.workloads.phases import PhaseSpec

    cudnn = get_hardware("h100-sxm")
    hw = with_attention_kernel(cudnn, NEMO_2024_ATTENTION)
    # sequence (K tokens), GPUs, global batch, TP, PP, DP, CP, TFLOP/s per GPU (the table's 'With CP' columns)
    table = _rows("nemo_24_03_long_sequence", _i("seq_k"), _i("gpus"), _i("global_batch"), _i("tp"), _i("pp"),
                  _i("dp"), _i("cp"), _f("tflops_per_gpu"))
    rows = []
    for k, gpus, gb, tp, pp, dp, cp, tflops, source in table:
        seq = k * 1024
        pub_s = gb * seq * nemo_llama2_7b_flops_per_token(seq) / (gpus * tflops * 1e12)
        short, depth = shallow(load_workload("llama-2-7b", 1, seq, "fp8", "meta", allow_long_context=True))
        spec = PhaseSpec("train", None, "none", 1, gb, 1, dp=dp, optimizer="adamw-fused")
        g = capture_phase(short, spec)
        fusion = _fusion("library")
        s = Sharder(analyze_phase(g, short, hw, "fp8", spec, fusion=fusion).analysis, depth)
        s_cudnn = Sharder(analyze_phase(g, short, cudnn, "fp8", spec, fusion=fusion).analysis, depth)
        saved = saved_per_block(g, s.roles, seq, fp8=s.a.assumptions.fp8_training is not None)
        runs = []
        for rc in ("none", "selective", "full"):
            p = Parallelism(tp=tp, pp=pp, dp=dp, cp=cp, sp=tp > 1, microbatch=1, global_batch=gb, recompute=rc,
                            zero=1)
            fits = sharded_memory(p, s, saved, "fp8", True, seq).fits
            runs.append((not fits, s.shard(p, per_kernel=False).step_s, p))
        _, step, p = min(runs, key=lambda x: x[:2])
        r = s.shard(p, per_kernel=False)
        rows.append(Row("training_throughput", hw.name, f"Llama 2 7B fp8 (NeMo 24.03.01), seq {k}K, tp{tp} cp{cp} "
                        f"pp{pp} dp{dp}, batch {gb}", tflops, "TFLOP/s per GPU", pub_s, step, source,
                        how=f"recompute {p.recompute}, bubble {r.bubble_fraction:.1%}"
                            + (f", CP exchange exposed {r.cp_exposed_s * 1e3:.3g} ms" if cp > 1 else "")
                            + f"; with cuDNN attention: {s_cudnn.shard(p, per_kernel=False).step_s / pub_s:.2f}"))
    return rows




def mcore_fp8_rows() -> list[Row]:
    """Megatron-Core's own fp8 table for Llama 3, a newer stack than NeMo 24.07's (the 8B row has the
    same layout as NeMo's and runs 15% faster: 13,812 against 12,036 tokens / s / GPU). Set up as
    ``_fp8_iteration`` sets NeMo's runs up: Transformer Engine fp8, distributed optimizer, sequence parallelism with
    TP above 1, the K/V ring with CP above 1, cuDNN attention. The README lists no recomputation: none for 8B and
    70B; the 405B (126 layers over PP 8 x VP 8, priced from a capture of two blocks standing for 126,
    opmap.explore.depth) takes the fastest recomputation that fits 80 GB, as ``plan`` would choose it."""
    from opmap.explore.depth import shallow
    from opmap.hardware import get_hardware
    from opmap.mapping.sharding import Parallelism, Sharder, saved_per_block, sharded_memory
    from opmap.phases.step import analyze_phase, capture_phase
    from opmap.workloads import load_workload
    from opmap.workloads.phases import PhaseSpec

    hw = get_hardware("h100-sxm")
    seq = 8192
    # model, GPUs, GBS, MBS, TP, PP, CP, VP, tokens/s/GPU, TFLOP/s/GPU (the table's columns)
    table = _rows("megatron_core_r0_12_fp8", _s("model"), _i("gpus"), _i("global_batch"), _i("microbatch"), _i("tp"),
                  _i("pp"), _i("cp"), _i("vp"), _f("tokens_per_s_per_gpu"), _f("tflops_per_gpu"))
    rows = []
    for name, gpus, gb, mb, tp, pp, cp, vp, tok, tflops, source in table:
        dp = gpus // (tp * pp * cp)
        pub_s = gb * seq / (gpus * tok)
        w = load_workload(name, mb, seq, "fp8", "meta")
        if name != "llama-3.1-405b":
            it, fig, sh, _ = _fp8_iteration(w, hw, tp, pp, vp, dp, gb, mb, "none", cp)
            how = f"recompute none, bubble {sh.bubble_fraction:.1%}, MFU {fig.mfu:.0%} of the fp8 peak"
        else:
            short, depth = shallow(w)
            spec = PhaseSpec("train", None, "none", mb, gb, 1, dp=dp, optimizer="adamw-fused")
            g = capture_phase(short, spec)
            s = Sharder(analyze_phase(g, short, hw, "fp8", spec, fusion=_fusion("library")).analysis, depth)
            saved = saved_per_block(g, s.roles, seq, fp8=s.a.assumptions.fp8_training is not None)
            runs = []
            for rc in ("none", "selective", "full"):
                p = Parallelism(tp=tp, pp=pp, dp=dp, vp=vp, cp=cp, sp=True, microbatch=mb, global_batch=gb,
                                recompute=rc, zero=1)
                fits = sharded_memory(p, s, saved, "fp8", True, seq).fits
                runs.append((not fits, s.shard(p, per_kernel=False).step_s, p))
            _, it, p = min(runs, key=lambda x: x[:2])
            sh = s.shard(p, per_kernel=False)
            how = f"recompute {p.recompute}, bubble {sh.bubble_fraction:.1%}"
        rows.append(Row("training_throughput", hw.name, f"{name} fp8 (Megatron-Core), tp{tp} cp{cp} pp{pp} vp{vp} "
                        f"dp{dp}, seq {seq}, batch {gb}", tok, "tokens/s per GPU", pub_s, it, source,
                        how=f"{gb * seq / (gpus * it):.4g} tok/s/GPU ({tflops} TFLOP/s/GPU published), {how}"))
    return rows




def megatron_flops_per_sequence(h: int, layers: int, seq: int, vocab: int) -> float:
    """Megatron-LM's model FLOPs per sequence for a GPT (megatron/training/training.py
    num_floating_point_operations at its table's commit: 12 s L h^2 ((1 + groups / heads + s / h) q / h +
    ffn / h + V / (2 L h)), here groups = heads, q = h, ffn = 4 h: 12 s L h^2 (6 + s / h + V / (2 L h)); attention
    counted dense)."""
    return 12 * seq * layers * h * h * (6 + seq / h + vocab / (2 * layers * h))


def mcore_weak_rows() -> list[Row]:
    """Megatron-Core's H100 weak-scaling table, the runs issue 22 names (opmap was 1.2-1.6x
    optimistic on the small ones): per-GPU teraFLOP/s as an iteration time, Megatron's own FLOPs
    (``megatron_flops_per_sequence``) x batch / (GPUs x teraFLOP/s). The model: Megatron's GPT with its defaults
    (LayerNorm, GELU, 4h MLP, biases, learned positions, hidden and attention dropout 0.1), bf16, embeddings tied
    (the table's sizes count them untied, 1.7B = 1.48B + 0.27B: the extra copy adds optimizer and gradient volume,
    which ZeRO 1 over 48 and the overlapped reduce keep off the step); the distributed optimizer
    (--overlap-param-gather needs it: ZeRO 1) with the DP overlap, sequence parallelism with TP above 1, library
    fusion, attention as the same month's stack ran it (``_stack_2024``: NeMo 24.07's; the ratios with today's cuDNN
    and at the no-dropout rate printed beside: these rows are out of ``NEMO_2024_DROPOUT``'s fit). Microbatch,
    virtual stages and recomputation are not published: the fastest that fits 80 GB among microbatch 1 / 2 / 4,
    every vp that divides a stage's layers and none / selective / full, as ``plan`` chooses. Priced from two
    captured blocks standing for all (opmap.explore.depth)."""
    import torch

    from opmap.explore.depth import shallow
    from opmap.explore.plan import vp_candidates
    from opmap.hardware import get_hardware, with_attention_dropout, with_attention_kernel
    from opmap.mapping.sharding import Parallelism, Sharder, saved_per_block, sharded_memory
    from opmap.phases.step import analyze_phase, capture_phase
    from opmap.workloads.gpt2 import GPT2, GPT2Config
    from opmap.workloads.phases import PhaseSpec
    from opmap.workloads.zoo import Workload, cast_to

    cudnn = get_hardware("h100-sxm")
    hw = _stack_2024(cudnn)
    free = with_attention_dropout(with_attention_kernel(cudnn, NEMO_2024_ATTENTION), 1.0, "the no-dropout rate")
    seq, vocab = 4096, 131072
    # size, heads, hidden, layers, TP, PP, DP, GPUs, batch, per-GPU teraFLOP/s (the table's columns)
    table = _rows("megatron_core_weak_scaling_2024", _s("size"), _i("heads"), _i("hidden"), _i("layers"), _i("tp"),
                  _i("pp"), _i("dp"), _i("gpus"), _i("global_batch"), _f("tflops_per_gpu"))
    rows = []
    for name, heads, h, layers, tp, pp, dp, gpus, gb, tflops, source in table:
        pub_s = gb * megatron_flops_per_sequence(h, layers, seq, vocab) / (gpus * tflops * 1e12)
        runs = []
        for mb in (1, 2, 4):
            if gb % (mb * dp):
                continue
            cfg = GPT2Config(vocab_size=vocab, block_size=seq, n_layer=layers, n_head=heads, n_embd=h, dropout=0.1)
            with torch.device("meta"):
                m, x = GPT2(cfg), torch.zeros(mb, seq, dtype=torch.long)
            m, _ = cast_to(m, (x,), torch.bfloat16)
            short, depth = shallow(Workload(f"gpt {name}", m, (x,), mb, seq))
            spec = PhaseSpec("train", None, "none", mb, gb, 0, dp=dp, optimizer="adamw-fused")
            g = capture_phase(short, spec)
            fusion = _fusion("library")
            s = Sharder(analyze_phase(g, short, hw, "bf16", spec, fusion=fusion).analysis, depth)
            s_cudnn = Sharder(analyze_phase(g, short, cudnn, "bf16", spec, fusion=fusion).analysis, depth)
            s_free = Sharder(analyze_phase(g, short, free, "bf16", spec, fusion=fusion).analysis, depth)
            saved = saved_per_block(g, s.roles, seq, fp8=s.a.assumptions.fp8_training is not None)
            for vp in vp_candidates(layers, pp):
                for rc in ("none", "selective", "full"):
                    p = Parallelism(tp=tp, pp=pp, dp=dp, vp=vp, sp=tp > 1, microbatch=mb, global_batch=gb,
                                    recompute=rc, zero=1)
                    fits = sharded_memory(p, s, saved, "bf16", True, seq).fits
                    runs.append((not fits, s.shard(p, per_kernel=False).step_s, p, s_cudnn, s_free))
        _, step, p, s_cudnn, s_free = min(runs, key=lambda x: x[:2])
        r = s.shard(p, per_kernel=False)
        rows.append(Row("training_throughput", hw.name, f"Megatron-Core GPT {name} bf16, tp{tp} pp{pp} dp{dp}, seq "
                        f"{seq}, batch {gb}", tflops, "teraFLOP/s per GPU", pub_s, step, source,
                        how=f"{p.label()}, bubble {r.bubble_fraction:.1%}; with cuDNN attention: "
                            f"{s_cudnn.shard(p, per_kernel=False).step_s / pub_s:.2f}; attention at its no-dropout "
                            f"rate: {s_free.shard(p, per_kernel=False).step_s / pub_s:.2f}"))
    return rows




def llama3_rows() -> list[Row]:
    """Llama 3 405B pre-training as Table 4 lists it: 8K sequences without context parallelism and 131K with CP
    16, TP 8, PP 16, microbatch 1 and batch / DP microbatches. TFLOP/s per GPU as a step time, the model FLOPs
    by PaLM's accounting (6 N + 12 L H Q T per token, attention dense; N less the input embedding) / (GPUs x
    TFLOP/s). Context parallelism as the paper ran it (sec. 3.3.2): K / V all-gathered, not a ring, the gather
    exposed (``cp_comm="all_gather"``). ZeRO 2: the paper's FSDP shards optimizer state and gradients, not the
    parameters. Not published,
    so opmap's choice as ``plan`` makes it for the published TP / CP / PP / DP: the fastest virtual stages (a
    divisor of the 8 layers per stage), sequence parallelism and recomputation that fit 80 GB. Priced from a
    capture of two blocks standing for 126 (opmap.explore.depth). Attention: FlashAttention-2 (``--attention-kernel
    fa2``): the paper names no kernel; the runs (early 2024) predate FlashAttention-3 (July 2024) and Meta's stack is
    PyTorch's (its flash backend and xFormers ran FlashAttention-2 on Hopper then), not Transformer Engine's cuDNN;
    the row also prints the ratio under cuDNN attention."""
    from dataclasses import replace

    from opmap.analyze import analyze_graph
    from opmap.capture import capture
    from opmap.explore.depth import shallow
    from opmap.explore.plan import vp_candidates
    from opmap.hardware import get_hardware, with_attention_kernel
    from opmap.mapping.sharding import Parallelism, Sharder, saved_per_block, sharded_memory
    from opmap.workloads import load_workload

    hw = with_attention_kernel(get_hardware("h100-sxm"), "fa2")
    cudnn = get_hardware("h100-sxm")
    layers, heads, head_dim, vocab, hidden = 126, 128, 128, 128256, 16384  # Llama 3 405B (paper Table 3)
    # GPUs, TP, CP, PP, DP, sequence, batch per DP, TFLOP/s per GPU (BF16 MFU 43%, 41%, 38%)
    table = _rows("llama3_405b_table4", _i("gpus"), _i("tp"), _i("cp"), _i("pp"), _i("dp"), _i("seq"),
                  _i("batch_per_dp"), _f("tflops_per_gpu"))
    sharders: dict[int, tuple] = {}
    rows = []
    for gpus, tp, cp, pp, dp, seq, per_dp, tflops, source in table:
        if seq not in sharders:
            w = load_workload("llama-3.1-405b", 1, seq, "bf16", "meta")
            short, depth = shallow(w)
            g = capture(short.module, short.inputs, train=True, optimizer="adamw-fused")
            bare = replace(short, module=None, inputs=None)
            s = Sharder(analyze_graph(g, bare, hw, "bf16", fusion=_fusion("eager")), depth)
            s_cudnn = Sharder(analyze_graph(g, bare, cudnn, "bf16", fusion=_fusion("eager")), depth)
            fp8 = s.a.assumptions.fp8_training is not None
            sharders[seq] = (s, depth, saved_per_block(g, s.roles, seq, fp8=fp8), s_cudnn)
        s, depth, saved, s_cudnn = sharders[seq]
        gb = dp * per_dp
        runs = []
        for vp in vp_candidates(layers, pp):
            for sp in (False, True):
                for rc in ("none", "selective", "full"):
                    p = Parallelism(tp=tp, cp=cp, pp=pp, dp=dp, vp=vp, sp=sp, microbatch=1, global_batch=gb,
                                    zero=2, recompute=rc, cp_comm="all_gather")
                    fits = sharded_memory(p, s, saved, "bf16", True, seq).fits
                    runs.append((not fits, s.shard(p, per_kernel=False).step_s, p))
        _, step, p = min(runs, key=lambda x: x[:2])
        r = s.shard(p, per_kernel=False)
        mem = sharded_memory(p, s, saved, "bf16", True, seq)
        n = depth.params - vocab * hidden
        tokens = gb * seq
        pub_s = (6 * n + 12 * layers * heads * head_dim * seq) * tokens / (gpus * tflops * 1e12)
        causal_half_s = (6 * n + 6 * layers * heads * head_dim * seq) * tokens / (gpus * tflops * 1e12)
        rows.append(Row("training_throughput", hw.name, f"Llama 3 405B, tp{tp} cp{cp} pp{pp} dp{dp}, seq {seq}, "
                        f"{gb} sequences per step", tflops, "TFLOP/s per GPU", pub_s, step, source,
                        how=f"{p.label()}, bubble {r.bubble_fraction:.1%}, "
                            + (f"CP all-gathers {r.cp_exposed_s * 1e3:.3g} ms per microbatch, " if cp > 1 else "")
                            + f"memory "
                            f"{mem.total_bytes / 2**30:.0f} GiB{'' if mem.fits else ' (does not fit)'}; pred/pub "
                            f"with causal attention counted half: {step / causal_half_s:.2f}; with cuDNN "
                            f"attention: {s_cudnn.shard(p, per_kernel=False).step_s / pub_s:.2f}"))
    return rows




def _maxtext_model(scale: int, batch: int):
    """MaxText's default decoder at ``global_parameter_scale`` (configs/base.yml and pyconfig.get_individual_scales at
    its table's commit): a Llama-2 block (RMSNorm, RoPE, SwiGLU, no biases), vocabulary 32,000, untied output,
    sequence 2048; base width 2048, 16 heads of 128, MLP 7168, 16 layers, doubling heads and MLP, then width, then
    layers, in turn (log2 scale = 3 q + r: heads and MLP x 2^(q + (r > 0)), width x 2^(q + (r > 1)), layers x 2^q).
    Heads x head width need not equal the width (16B: width 4096, 64 heads of 128). bf16 activations; MaxText keeps
    fp32 master weights, as opmap's optimizer state does."""
    import math

    import torch

    from opmap.workloads.llama import Llama, LlamaConfig
    from opmap.workloads.zoo import Workload, cast_to

    q, r = divmod(int(math.log2(scale)), 3)
    heads = 16 * 2 ** (q + (r > 0))
    cfg = LlamaConfig(vocab_size=32000, dim=2048 * 2 ** (q + (r > 1)), n_layer=16 * 2 ** q, n_head=heads,
                      n_kv_head=heads, ffn_dim=7168 * 2 ** (q + (r > 0)), head_dim=128, rope_theta=10000.0,
                      max_seq=2048)
    with torch.device("meta"):
        m, x = Llama(cfg), torch.zeros(batch, 2048, dtype=torch.long)
    m, _ = cast_to(m, (x,), torch.bfloat16)
    return Workload(f"maxtext {scale}B-scale", m, (x,), batch, 2048), cfg


def maxtext_rows() -> list[Row]:
    """MaxText on Cloud TPU, the single-slice rows: TFLOP/s per chip as a step time, MaxText's own
    FLOPs (maxtext_utils.calculate_tflops_training_per_device at the commit: 6 x parameters x tokens + causal
    attention 6 x heads x layers x head width x seq^2 per sequence) / TFLOP/s. The layout is the config's: FSDP over
    the chips (ZeRO 3) and ici_tensor_parallelism (TP; each TP group's chips share a batch of TP x the per-device
    batch), one step per batch (no accumulation). remat_policy full = --recompute full; minimal
    (checkpoint_dots_with_no_batch_dims: the weight products' outputs kept, attention and the elementwise ops
    recomputed) = --recompute selective. XLA compiles the step into one program: the compiler fusion policy. Left
    out: v5e 128B (remat minimal_offloaded keeps activations in host memory: no opmap recompute mode), the
    multi-slice rows (data parallel over the data-centre network outside each slice's FSDP: opmap's layout has one
    data-parallel axis), 1160B (no config at the commit)."""
    from opmap.explore.depth import shallow
    from opmap.hardware import get_hardware
    from opmap.mapping.sharding import Parallelism, Sharder
    from opmap.phases.step import analyze_phase, capture_phase
    from opmap.workloads.phases import PhaseSpec

    seq = 2048
    # device, scale, chips, TP, per-device batch, recompute, TFLOP/s per chip (README), the TPU type as published
    table = _rows("maxtext_2024_03", _s("device"), _i("scale"), _i("chips"), _i("tp"), _i("per_device_batch"),
                  _s("recompute"), _f("tflops_per_chip"), _s("tpu_type"))
    sharders: dict[tuple, tuple] = {}
    rows = []
    for dev, scale, chips, tp, pdb, rc, tflops, tpu, source in table:
        hw = get_hardware(dev)
        mb = pdb * tp
        key = (dev, scale, mb, rc)
        if key not in sharders:
            w, cfg = _maxtext_model(scale, mb)
            short, depth = shallow(w)
            spec = PhaseSpec("train", None, rc, mb, mb, 0, optimizer="adamw-fused")
            pa = analyze_phase(capture_phase(short, spec), short, hw, "bf16", spec, fusion=_fusion("compiler"))
            sharders[key] = (Sharder(pa.analysis, depth), cfg, depth)
        s, cfg, depth = sharders[key]
        p = Parallelism(tp=tp, dp=chips // tp, zero=3, microbatch=mb, global_batch=pdb * chips, recompute=rc)
        step = s.shard(p, per_kernel=False).step_s
        flops = (6 * depth.params * seq * pdb + 6 * cfg.n_head * cfg.n_layer * cfg.hd * seq ** 2 * pdb)
        pub_s = flops / (tflops * 1e12)
        rows.append(Row("training_throughput", hw.name, f"MaxText {scale}B on {tpu} ({chips} chips), fsdp "
                        f"{chips // tp} tp{tp}, {pdb} x 2048 tokens per chip, remat {rc}", tflops,
                        "TFLOP/s per chip", pub_s, step, source,
                        how=f"{flops / step / 1e12:.0f} TFLOP/s per chip predicted, "
                            f"{depth.params / 1e9:.1f}B parameters"))
    return rows




def serving_rows() -> list[Row]:
    """Offline throughput: B requests of IN prompt tokens and OUT generated ones, in static batches of B (the
    fixed-batch benchmark TensorRT-LLM's page reports), run through opmap's serving simulator (opmap.serve):
    steps priced by a TableCost of llama-2-7b's prefill and decode analyses on the A100 (opmap.serve.model_cost).
    Output tokens per second as a time for B x OUT tokens. LLM-Viewer's roofline read these 1.4-1.9x high."""
    from opmap.serve.arrivals import make_requests
    from opmap.serve.metrics import summarize
    from opmap.serve.model_cost import model_table_cost
    from opmap.serve.policies import Static
    from opmap.serve.sim import simulate

    hw = "a100-sxm-80gb"
    cost = model_table_cost("llama-2-7b", hw, "fp16")
    rows = []
    for batch, lin, lout, tok_s, source in _rows("trtllm_llama2_7b_a100_static", _i("batch"), _i("input_len"),
                                                 _i("output_len"), _f("output_tokens_per_s")):
        res = simulate(make_requests("offline", lin, lout, n=2 * batch, seed=0), Static(batch), cost)
        pred_tok_s = summarize(res).throughput.output_tokens_per_s
        pub_s = batch * lout / tok_s
        rows.append(Row("serving_throughput", hw, f"llama-2-7b batch {batch}, {lin} in / {lout} out", tok_s,
                        "output tok/s", pub_s, batch * lout / pred_tok_s, source,
                        how=f"simulated static:{batch}, {pred_tok_s:.4g} tok/s"))
    return rows


SECTIONS: list[Callable[[], list[Row]]] = [collective_rows, megatron_rows, korthikanti_rows, nemo_fp8_rows,
                                           nemo_long_rows, mcore_fp8_rows, mcore_weak_rows, llama3_rows, maxtext_rows,
                                           serving_rows]


def _t(x: float) -> str:
    return f"{x * 1e6:.4g} us" if x < 1e-3 else f"{x * 1e3:.4g} ms" if x < 1 else f"{x:.4g} s"


def main(argv: list[str] | None = None) -> int:
    import argparse

    global TRAIN_FUSION
    from opmap.mapping.fusion import POLICIES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-fusion", choices=POLICIES, default=None,
                    help="price every training row under this fusion policy (default: each row under its own "
                         "software stack's)")
    TRAIN_FUSION = ap.parse_args(argv).train_fusion
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
                  _t(r.published_s), _t(r.predicted_s), f"{r.ratio:.2f}", r.how, r.role, v)
    con.print(t)
    held = [r for r in rows if r.role == "held out"]
    passed = sum(1 for r in held if r.passed)
    import statistics

    errs = [abs(math.log(r.ratio)) for r in held]
    med = statistics.median(r.ratio for r in held)
    geo = math.exp(statistics.fmean(errs)) - 1 if errs else 0.0
    con.print(f"held-out rows within {BAND[0]}-{BAND[1]}: {passed} of {len(held)}; median pred/pub {med:.3f}; "
              f"geometric-mean error {geo:.1%}")
    train = [r for r in held if r.kind in TRAINING_KINDS]
    t_in = sum(1 for r in train if TRAINING_BAND[0] <= r.ratio <= TRAINING_BAND[1])
    t_err = statistics.fmean(abs(r.ratio - 1) for r in train) if train else 0.0
    under = f"--train-fusion {TRAIN_FUSION}" if TRAIN_FUSION else "each stack's fusion policy"
    con.print(f"training rows under {under} (issue 22: every one within "
              f"{TRAINING_BAND[0]}-{TRAINING_BAND[1]}, mean error under "
              f"10%): {t_in} of {len(train)} within, mean |pred/pub - 1| {t_err:.1%}")
    stem = Path(__file__).stem + (f"_{TRAIN_FUSION}" if TRAIN_FUSION else "")
    path = write_json(stem, {
        "schema_version": SCHEMA_VERSION, "benchmark": "published", "created": now_iso(), "machine": machine(),
        "claim": f"every held-out row within {BAND[0]}-{BAND[1]} of the published time",
        "rows": [r.to_dict() for r in rows], "held_out": len(held), "passed": passed, "median_ratio": med,
        "geomean_error": geo, "training_rows": len(train), "training_within": t_in, "training_mean_error": t_err,
        "training_band": list(TRAINING_BAND), "train_fusion": TRAIN_FUSION or "each stack's own",
        "pass": passed == len(held)})
    con.print(f"wrote {path}")
    return 0 if passed == len(held) else 1


if __name__ == "__main__":
    sys.exit(main())
