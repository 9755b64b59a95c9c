"""Expert parallelism for inference (opmap.mapping.shard_types, device_time, layout_collectives, sharded_memory):
experts placed E / ep a device, over the tp group (attention tensor-parallel, no all-to-all) or over the dp ranks
(DP attention: each rank its own batch and KV cache, a dispatch and a combine all-to-all per MoE layer), the busiest
rank's load ``ep_imbalance`` x the mean. Checked by hand on kernel rows, then on a Hugging Face config (Qwen3-30B-A3B
cut to two layers, and DeepSeek-R1 cut to a dense layer and a MoE layer) and the zoo's Mixtral 8x7B, each against
the formula from the config: expert weight bytes per device = E / ep x expert bytes (+ the dense ones), all-to-all
bytes per rank and MoE layer = tokens x top_k x hidden x bytes (x (ep - 1) / ep on the wire), the KV cache of a DP
attention rank = its batch / dp sequences'."""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace

import pytest

from opmap.errors import OpmapError
from opmap.mapping.collectives import Collective, collective_time
from opmap.mapping.device_time import KernelRow, device_time
from opmap.mapping.expert_parallel import default_imbalance, imbalance_for
from opmap.mapping.sharding import Parallelism, Sharder

# an expert GEMM of a decode step: 2 tokens by a 4096 x 14336 bf16 weight (Mixtral's w1) on an H200 (the numbers
# only divide): its padded tiles take MATRIX_S whatever the tokens up to a tile, its FLOPs LIN_S at the rate
FLOPS = 2 * 2 * 4096 * 14336
LIN_S = FLOPS / 1.0e15
MATRIX_S = 30e-6  # a 64-row tile's worth: flat in the tokens below 64
MEMORY_S = 4096 * 14336 * 2 / 4.8e12  # 24.5 us, all weights but WEIGHT_FRACTION
WEIGHT_FRACTION = 0.99
LAUNCH_S = 2e-6


def expert_row(**kw) -> KernelRow:
    base: dict = dict(role="expert_column", pos=0, phase="forward", matrix_s=MATRIX_S, vector_s=0.0,
                      memory_s=MEMORY_S, overhead_s=LAUNCH_S, extra_s=0.0, weight_fraction=WEIGHT_FRACTION,
                      kv_narrow=False, sdpa=False, matrix_flops=FLOPS, attention_backward=False, matrix_linear_s=LIN_S)
    base.update(kw)
    return KernelRow(**base, busy_s=max(base["matrix_s"], base["vector_s"], base["memory_s"]))


def test_expert_row_over_dp_ranks_worked_by_hand():
    """ep 8 over the dp ranks (DP attention): the busiest rank runs E / 8 experts at 8 x imb x the tokens each;
    per captured kernel its weights / 8, its activations x imb, its matrix time the padded tiles' / 8 or the
    FLOPs' x imb, whichever is more, the launch / 8."""
    imb = 1.5
    p = Parallelism(dp=8, ep=8, ep_imbalance=imb)
    mem = MEMORY_S * ((1 - WEIGHT_FRACTION) * imb + WEIGHT_FRACTION / 8)
    m = max(MATRIX_S / 8, LIN_S * imb)
    assert device_time(expert_row(), p, kv_heads=8) == pytest.approx(max(m, mem) + LAUNCH_S / 8, rel=1e-12)
    # a GEMM large enough to be linear in its tokens: the imbalance multiplies its matrix time
    big = expert_row(matrix_s=400e-6, matrix_linear_s=400e-6, memory_s=10e-6)
    assert device_time(big, p, 8) == pytest.approx(400e-6 * imb + LAUNCH_S / 8, rel=1e-12)
    assert device_time(big, replace(p, ep_imbalance=1.0), 8) == pytest.approx(400e-6 + LAUNCH_S / 8, rel=1e-12)


def test_expert_row_over_the_tp_group_worked_by_hand():
    """ep 4 inside tp 4 (attention tensor-parallel): E / 4 experts a rank, each whole (tp / ep = 1), on the tokens
    every rank holds: all of it / 4, the activations and the FLOPs x imb; E / 4 experts' launches."""
    imb = 1.25
    p = Parallelism(tp=4, ep=4, ep_imbalance=imb)
    assert p.ep_over_tp and p.expert_split == 4
    mem = MEMORY_S * ((1 - WEIGHT_FRACTION) * imb + WEIGHT_FRACTION)
    m = max(MATRIX_S, LIN_S * imb)
    assert device_time(expert_row(), p, 8) == pytest.approx(max(m, mem) / 4 + LAUNCH_S / 4, rel=1e-12)
    # plain tp 4 splits each expert four ways: every term / 4, every launch kept
    t = Parallelism(tp=4)
    assert device_time(expert_row(), t, 8) == pytest.approx(max(MATRIX_S, MEMORY_S) / 4 + LAUNCH_S, rel=1e-12)
    # a dense GEMM is not an expert's: the imbalance never touches it
    dense = expert_row(role="column")
    assert device_time(dense, p, 8) == device_time(dense, t, 8)


def test_layout_checks_name_the_limit():
    assert not Parallelism(dp=2, ep=2).ep_over_tp and Parallelism(dp=2, ep=2).expert_split == 2
    with pytest.raises(OpmapError, match="--ep 4 must divide --dp 2 .* or --tp 2"):
        Parallelism(tp=2, dp=2, ep=4)
    with pytest.raises(OpmapError, match="--ep-imbalance must be a number from 1"):
        Parallelism(dp=4, ep=4, ep_imbalance=0.5)
    with pytest.raises(OpmapError, match="to --ep 4"):
        Parallelism(dp=4, ep=4, ep_imbalance=5.0)
    with pytest.raises(OpmapError, match="--dp-attention needs --ep above 1"):
        Parallelism(tp=2, dp_attention=True)


def test_default_imbalance_is_sourced_and_only_under_ep():
    d = default_imbalance()
    # SGLang's large-scale EP blog: 59,337 / 50,302 tok/s per node, perfect EPLB against the default placement
    assert d.value == pytest.approx(59337 / 50302, abs=0.005)
    assert "lmsys.org/blog/2025-05-05-large-scale-ep" in d.source and d.kind == "measured"
    assert imbalance_for(1, None) == 1.0 and imbalance_for(8, None) == d.value and imbalance_for(8, 1.0) == 1.0


def test_a_layout_records_its_ep_fields_only_with_ep():
    from dataclasses import fields

    from opmap.record import record

    # the fields in declaration order; a layout without ep leaves its two EP fields out (files written before it
    # stay as they were), one with ep writes them even at their defaults (ep 2 with a balanced 1.0)
    names = [f.name for f in fields(Parallelism)]
    dense = record(Parallelism(tp=2, dp=2))
    assert list(dense) == [n for n in names if n not in ("ep_imbalance", "dp_attention")]
    moe = record(Parallelism(tp=2, dp=2, ep=2))
    assert list(moe) == names and moe["ep_imbalance"] == 1.0 and moe["dp_attention"] is False


# -- on captured models -----------------------------------------------------------------------------------------

pytest.importorskip("transformers")

from hf_family_configs import DEEPSEEK_R1, QWEN3_30B_A3B, shallow  # noqa: E402
from opmap.api import Layout, Model, Phase, RuntimeChoice, Shape  # noqa: E402
from opmap.hardware import get_hardware  # noqa: E402
from opmap.phases.sharded import shard_analysis  # noqa: E402

HW = "h200"


def decode(model: str, batch: int, kv_len: int, runtime: str = "engine", hardware: str = HW, dtype: str = "bf16"):
    """The decode step of ``model`` at ``batch`` sequences and ``kv_len`` cached tokens, ``dtype`` (bf16), under
    ``runtime`` on ``hardware`` (H200)."""
    hw = get_hardware(hardware)
    spec = Phase("decode", kv_len, "none", None, None, 0, 1, "adamw").spec(model, batch)
    rt, fusion = RuntimeChoice(runtime).resolve(hw, spec)
    spec = replace(spec, kv_write=rt.kv_write)
    m = Model(model, dtype, "meta", "nchw", {}, False, {}, lambda *a, **k: contextlib.nullcontext())
    return m.phase(spec, Shape(batch, None, None), hw, rt, fusion, None, lambda n: "-").analysis


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory):
    path = tmp_path_factory.mktemp("q") / "config.json"
    path.write_text(json.dumps(shallow(QWEN3_30B_A3B, 2)))
    return decode(str(path), 8, 256)


def test_qwen3_moe_experts_per_device_and_all_to_all(qwen3_moe):
    """Qwen3-30B-A3B, two layers: 128 experts of 3 x 2048 x 768 weights a layer (gate, up, down); 8 tokens x top 8
    x hidden 2048 x 2 bytes routed a rank and MoE layer; over 4 dp ranks one dispatch and one combine a layer."""
    c = QWEN3_30B_A3B
    h, f, e, k = c["hidden_size"], c["moe_intermediate_size"], c["num_experts"], c["num_experts_per_tok"]
    s = Sharder(qwen3_moe)
    assert s.geo.experts == e and s.moe_layers == 2
    experts = 2 * e * 3 * h * f
    assert s.expert_params == experts
    dense = s.params - experts
    dp = Parallelism(dp=4, ep=4, ep_imbalance=1.18, dp_attention=True)
    assert s.params_per_device(dp) == pytest.approx(dense + experts / 4, rel=1e-12)
    tp = Parallelism(tp=4, ep=4)
    assert s.params_per_device(tp) == pytest.approx(dense / 4 + experts / 4, rel=1e-12)
    sh = s.shard(dp)
    a2a = [x for x in sh.collectives if x.collective.kind == "all_to_all"]
    assert len(a2a) == 1 and a2a[0].count == 2 * 2  # dispatch + combine, 2 MoE layers
    msg = 8 * k * h * 2 * 1.18  # the busiest rank's share: x the imbalance
    assert a2a[0].collective.message_bytes == pytest.approx(msg, rel=1e-12)
    assert a2a[0].collective.group_size == 4 and a2a[0].link == "scale_up"
    hw = get_hardware(HW)
    assert a2a[0].predicted_s == collective_time(hw, Collective("all_to_all", msg, 4, "scale_up")).seconds
    # on the wire (ep - 1) / ep of it, at best at the NVLink rate the catalog gives
    assert a2a[0].predicted_s > 3 / 4 * msg / hw.scale_up_bandwidth_bytes_per_s
    # ep over the tp group: every rank holds the tokens, no all-to-all; the TP all-reduce combines
    assert not [x for x in s.shard(tp).collectives if x.collective.kind == "all_to_all"]


@pytest.mark.parametrize("dtype, quant", [("nvfp4", 0.5625), ("fp8", 1.0), ("bf16", 2.0)])
def test_dp_attention_on_pcie_cards_gathers_and_scatters_instead_of_all_to_all(tmp_path, dtype, quant):
    """DEP8 on eight RTX PRO 6000s (PCIe, no NVLink): no all-to-all kernel runs there, TensorRT-LLM falls back to
    AllGather + ReduceScatter (communication_factory.py @ 03c36d62): per MoE layer an all-gather of every rank's
    tokens quantized to the experts' operand format (NVFP4: 0.5 B an element + an E4M3 scale per 16 = 0.5625 B;
    FP8 1 B; bf16 2 B) and a reduce-scatter of the outputs at bf16; a rank's 8 decoding sequences (the captured
    batch is one rank's) x hidden 2048 (Qwen3-30B-A3B) from each of the 8 ranks: gathered 8 x 8 x 2048 x quant
    bytes, scattered 8 x 8 x 2048 x 2, every rank the same (no expert imbalance in the bytes). On an H200
    (NVSwitch) the same layout keeps its all-to-all."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(shallow(QWEN3_30B_A3B, 2)))
    h = QWEN3_30B_A3B["hidden_size"]
    p = Parallelism(dp=8, ep=8, ep_imbalance=1.18, dp_attention=True)
    pcie = Sharder(decode(str(path), 8, 256, hardware="rtx-pro-6000", dtype=dtype)).shard(p).collectives
    by = {c.collective.kind: c for c in pcie}
    assert sorted(by) == ["all_gather", "reduce_scatter"] and all(c.count == 2 for c in pcie)  # 2 MoE layers
    assert by["all_gather"].collective.message_bytes == pytest.approx(8 * 8 * h * quant, rel=1e-12)
    assert by["reduce_scatter"].collective.message_bytes == pytest.approx(8 * 8 * h * 2, rel=1e-12)
    assert {c.collective.group_size for c in pcie} == {8} and {c.link for c in pcie} == {"scale_up"}
    nvswitch = Sharder(decode(str(path), 8, 256, hardware="h200", dtype=dtype)).shard(p).collectives
    assert [c.collective.kind for c in nvswitch] == ["all_to_all"]


def test_qwen3_moe_imbalance_slows_only_the_experts(qwen3_moe):
    """A decode step of 8 sequences reads its experts' weights (E / ep a rank whatever the load) and runs padded
    tiles: the imbalance cannot speed anything up, leaves every dense kernel alone, and grows the busiest rank's
    dispatch (its message x 2; on H200's measured grid 256 KiB and 512 KiB over four GPUs take the same 13.66 us,
    NVIDIA's nccl-tests times in opmap.hardware.comm_grid, so the time may stay flat, never fall)."""
    s = Sharder(qwen3_moe)
    even, skew = (s.shard(Parallelism(dp=4, ep=4, ep_imbalance=x)) for x in (1.0, 2.0))
    rows = s.rows
    for r, a, b in zip(rows, even.kernel_s, skew.kernel_s):
        if r.role in ("expert_column", "expert_row"):
            assert b >= a
        else:
            assert b == a
    a2a = [[c for c in x.collectives if c.collective.kind == "all_to_all"][0] for x in (even, skew)]
    assert a2a[1].collective.message_bytes == 2 * a2a[0].collective.message_bytes
    assert skew.exposed_comm_s >= even.exposed_comm_s


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    path = tmp_path_factory.mktemp("r1") / "config.json"
    path.write_text(json.dumps({k: v for k, v in shallow(DEEPSEEK_R1, 2).items() if k != "quantization_config"}))
    return Sharder(decode(str(path), 4, 128))


def test_deepseek_dense_first_layers_keep_their_moe_layers_apart(deepseek):
    """DeepSeek-R1 cut to 1 dense + 1 MoE layer (first_k_dense_replace 1): 256 routed experts of 3 x 7168 x 2048
    weights (transformers 5 stacks them: one gate_up_proj and one down_proj) in the one MoE layer, the shared
    expert dense; one dispatch and one combine."""
    c, s = DEEPSEEK_R1, deepseek
    h, f, e = c["hidden_size"], c["moe_intermediate_size"], c["n_routed_experts"]
    assert s.geo.experts == e and s.moe_layers == 1
    assert s.expert_params == e * 3 * h * f
    sh = s.shard(Parallelism(dp=8, ep=8, ep_imbalance=1.0))
    a2a = [x for x in sh.collectives if x.collective.kind == "all_to_all"]
    assert len(a2a) == 1 and a2a[0].count == 2


def test_deepseek_all_to_all_carries_the_hidden_states(deepseek):
    """4 tokens x top 8 x hidden 7168 x 2 bytes a rank and MoE layer."""
    c = DEEPSEEK_R1
    sh = deepseek.shard(Parallelism(dp=8, ep=8, ep_imbalance=1.0))
    a2a = [x for x in sh.collectives if x.collective.kind == "all_to_all"]
    assert a2a[0].collective.message_bytes == pytest.approx(4 * c["num_experts_per_tok"] * c["hidden_size"] * 2)


@pytest.fixture(scope="module")
def mixtral():
    return {b: decode("mixtral-8x7b", b, 512) for b in (8, 16)}


def test_mixtral_dp_attention_holds_its_own_kv_and_e_over_ep_experts(mixtral):
    """Mixtral 8x7B decode, 16 sequences at 512 tokens over 2 GPUs: --ep 2 --dp-attention runs 8 a rank, each rank
    holding its 8 sequences' KV (2 x 32 layers x 8 KV heads x 128 x 2 bytes x 512 tokens each) and 4 of the 8
    experts (32 layers x 8 x 3 x 4096 x 14336 weights / 2) beside the whole attention; tp 2 ep 2 splits
    the KV heads and the dense weights over 2 as well and holds the same expert bytes."""
    lay, b = Layout(ep=2, dp_attention=True).per_rank(16)
    assert (lay.dp, b) == (2, 8)
    spec = Phase("decode", 512, "none", None, None, 0, lay.dp, "adamw").spec("mixtral-8x7b", b)
    par = lay.parallelism(spec, b)
    assert par.ep_imbalance == default_imbalance().value and par.global_batch == 16
    a = shard_analysis(mixtral[8], par)
    kv_seq = 2 * 32 * 8 * 128 * 2 * 512
    assert a.fit.kv_cache_bytes == pytest.approx(8 * kv_seq, rel=1e-9)
    experts = 32 * 8 * 3 * 4096 * 14336
    s = Sharder(mixtral[8])
    dense = s.params - experts
    assert s.expert_params == experts
    assert a.fit.weights_bytes == pytest.approx(2 * (dense + experts / 2), rel=1e-9)
    assert a.phase_figures.tokens == 16 and a.phase_figures.devices == 2
    t = shard_analysis(mixtral[16], Layout(tp=2, ep=2).parallelism(spec, 16))
    assert t.fit.kv_cache_bytes == pytest.approx(16 * kv_seq / 2, rel=1e-9)
    assert t.fit.weights_bytes == pytest.approx(2 * (dense / 2 + experts / 2), rel=1e-9)
    # ep 1 keeps its imbalance at 1 whatever the default
    assert Layout(tp=2).parallelism(spec, 16).ep_imbalance == 1.0


def test_deepseek_mla_latent_is_whole_on_every_tp_rank(deepseek):
    """MLA caches one latent a token and layer (kv_lora_rank 512 + RoPE key 64, bf16 here) that every head reads:
    tensor parallelism cannot split it, each of tp 8 ranks holds all 4 sequences' x 128 tokens x 2 layers; DP
    attention over 8 ranks holds each rank's own sequences only."""
    from opmap.phases.sharded import sharded_fit

    c = DEEPSEEK_R1
    latent = (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * 2
    assert deepseek.cache_kv_heads == 1
    whole = 4 * 128 * 2 * latent
    tp8 = sharded_fit(deepseek.a, Parallelism(tp=8, microbatch=4, global_batch=4), deepseek)
    assert tp8.kv_cache_bytes == pytest.approx(whole, rel=1 / 128)
    # the same 4 sequences' cache is 4 x 128 x 2 x latent however the layout lays the step
    dpa = sharded_fit(deepseek.a, Parallelism(dp=8, ep=8, microbatch=4, global_batch=32, dp_attention=True),
                      deepseek)
    assert dpa.kv_cache_bytes == tp8.kv_cache_bytes
    # and each tp rank's attention reads all of it: its memory term is not split
    sh = deepseek.shard(Parallelism(tp=8, microbatch=4, global_batch=4))
    for r, t in zip(deepseek.rows, sh.kernel_s):
        if r.sdpa:
            assert t >= r.memory_s


def test_deepseek_mla_down_projections_are_replicated_and_one_all_reduce_a_half_layer(deepseek):
    """MLA under TP as vLLM and SGLang hold it (DeepSeek-V2, arXiv 2405.04434 sec. 2.1): the down projections
    q_a_proj and kv_a_proj_with_mqa are normalized over their whole width (q_a_layernorm, kv_a_layernorm), so they
    run whole on every rank (ReplicatedLinear); q_b_proj and the absorbed per-head W_UK / W_UV split with the heads;
    o_proj is the row GEMM. So each layer all-reduces the residual stream twice (after o_proj, after the MLP or
    the experts' combine): 4 tokens x hidden 7168 x 2 bytes, not the 128 x 192-wide query."""
    c, s = DEEPSEEK_R1, deepseek
    roles = s.roles
    by_module: dict[str, set[str]] = {}
    for n in s.a.graph.nodes:
        if n.module.startswith("model.layers.1.self_attn") and n.packet in ("mm", "bmm"):
            by_module.setdefault(n.module.rsplit(".", 1)[-1], set()).add(roles.role[n.id])
    assert by_module["q_a_proj"] == {"replicated"} and by_module["kv_a_proj_with_mqa"] == {"replicated"}
    assert by_module["q_b_proj"] == {"column"} and by_module["self_attn"] == {"column"}  # the two absorbed bmm
    assert by_module["o_proj"] == {"row"}
    assert s.geo.hidden == c["hidden_size"] and s.geo.heads == c["num_attention_heads"]
    sh = s.shard(Parallelism(tp=8, microbatch=4, global_batch=4))
    ar = [x for x in sh.collectives if x.collective.kind == "all_reduce"]
    assert len(ar) == 1 and ar[0].collective.message_bytes == 4 * c["hidden_size"] * 2
    assert ar[0].count == 2 * 2  # 2 layers x (attention + MLP)


def test_qwen3_per_head_norm_keeps_q_and_k_column_parallel(qwen3_moe):
    """Qwen3 normalizes q and k per head (q_norm / k_norm over head_dim 128 of a 32 x 128-wide query): a norm over a
    head's slice runs on a TP rank's heads, so q_proj and k_proj stay column-parallel (not replicated)."""
    s = Sharder(qwen3_moe)
    roles = {n.module.rsplit(".", 1)[-1]: s.roles.role[n.id] for n in s.a.graph.nodes
             if n.module.startswith("model.layers.1.self_attn.") and n.packet == "mm"}
    assert roles["q_proj"] == roles["k_proj"] == roles["v_proj"] == "column" and roles["o_proj"] == "row"
    assert s.geo.hidden == QWEN3_30B_A3B["hidden_size"]
