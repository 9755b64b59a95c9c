"""Repeated calls replayed in a meta capture (opmap.capture.repeat): the graph node for node the full capture's (every
call run), for each MoE family's expert loop at its published widths, and the analysis of both the same figure for
figure; the routed experts' GEMM FLOPs against the formula; a loop whose calls do not match runs every call."""

from __future__ import annotations

import json

import pytest
import torch

from opmap.analyze import analyze_graph
from opmap.capture import capture
from opmap.capture import repeat as rep
from opmap.costs import cost_graph
from opmap.hardware import get_hardware
from opmap.ops import active_experts

pytest.importorskip("transformers")

from hf_family_configs import DEEPSEEK_R1, GPT_OSS_120B, QWEN3_30B_A3B, shallow  # noqa: E402
from opmap.workloads import load_workload  # noqa: E402

# Mixtral-8x7B's config.json (mistralai/Mixtral-8x7B-v0.1 on the Hugging Face hub), two of its 32 layers
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2,
    "num_hidden_layers": 2, "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 32000}
FAMILIES = {"deepseek_v3": shallow(DEEPSEEK_R1, 2), "qwen3_moe": shallow(QWEN3_30B_A3B, 2),
            "gpt_oss": shallow(GPT_OSS_120B, 2), "mixtral": MIXTRAL_8X7B}
SEQ = 64


def _workload(tmp_path, family: str):
    p = tmp_path / f"{family}.json"
    p.write_text(json.dumps(FAMILIES[family]))
    return load_workload(str(p), 1, SEQ, "bf16")


def _count_replays(monkeypatch) -> list[int]:
    n = [0]
    replay = rep._Template.replay

    def counted(self, t, index):
        n[0] += 1
        return replay(self, t, index)

    monkeypatch.setattr(rep._Template, "replay", counted)
    return n


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_replayed_capture_is_the_full_capture(tmp_path, monkeypatch, family):
    """Replayed (the default) and full (memoize off: every expert call and every op runs torch's meta kernel): the
    same nodes (ids, ops, modules, layer types, shapes, edges, arguments), and the same analysis on an H200 (FLOPs,
    bytes, memory, every kernel's predicted time), at the published widths, 64 tokens."""
    w = _workload(tmp_path, family)
    replays = _count_replays(monkeypatch)
    fast = capture(w.module, w.inputs)
    assert replays[0] > 0  # the expert loop was replayed, not run
    full = capture(w.module, w.inputs, memoize=False)
    assert len(fast.nodes) == len(full.nodes)
    assert [n.to_dict() for n in fast.nodes] == [n.to_dict() for n in full.nodes]
    hw = get_hardware("h200")
    a, b = analyze_graph(fast, w, hw, "bf16"), analyze_graph(full, w, hw, "bf16")
    assert a.to_dict() == b.to_dict()
    assert [k.predicted_s for k in a.kernel_results] == [k.predicted_s for k in b.kernel_results]
    assert a.memory == b.memory and a.predicted_latency_s == b.predicted_latency_s


def test_deepseek_routed_expert_flops_by_the_formula(tmp_path):
    """DeepSeek-R1's routed experts in the replayed graph: each of the 64 tokens through 8 experts, each expert a
    gate-up GEMM (7168 -> 2 x 2048) and a down GEMM (2048 -> 7168): 2 x 64 x 8 x (7168 x 4096 + 2048 x 7168)
    FLOPs in the one MoE layer of two (first_k_dense_replace 1), over the experts 512 assignments activate."""
    w = _workload(tmp_path, "deepseek_v3")
    g = capture(w.module, w.inputs)
    h, inter, k = 7168, 2048, 8
    flops, calls = 0.0, 0
    for n, c in zip(g.nodes, cost_graph(g)):
        if any(t.param and t.param.endswith(("experts.gate_up_proj", "experts.down_proj")) for t in n.inputs) \
                and c.matrix_flops:
            flops += c.matrix_flops
            calls += 1
    assert flops == 2 * SEQ * k * (h * 2 * inter + inter * h)
    assert calls == 2 * active_experts(256, k, SEQ)


class _Stacked(torch.nn.Module):
    """Experts as one stacked weight, called in a loop; ``odd`` gives odd experts another op (calls that differ
    by more than the index: not replayable)."""

    def __init__(self, odd: bool):
        super().__init__()
        self.w = torch.nn.Parameter(torch.empty(6, 8, 8))
        self.odd = odd

    def forward(self, x):
        def expert(chunk, i):
            y = chunk @ self.w[i]
            return torch.relu(y) if self.odd and i % 2 else torch.sigmoid(y)

        return torch.cat(rep.repeat_calls(expert, [(c, i) for i, c in enumerate(x.split(2))]))


@pytest.mark.parametrize("odd", [False, True])
def test_a_loop_is_replayed_only_where_its_calls_match(monkeypatch, odd):
    with torch.device("meta"):
        m, x = _Stacked(odd), torch.empty(12, 8)
    replays = _count_replays(monkeypatch)
    fast = capture(m, (x,))
    assert replays[0] == (0 if odd else 4)  # experts 0 and 1 run, 2..5 replayed
    full = capture(m, (x,), memoize=False)
    assert [n.to_dict() for n in fast.nodes] == [n.to_dict() for n in full.nodes]
    selects = [n.args["index"] for n in fast.nodes if n.op == "aten.select.int"]
    assert selects == list(range(6))


def test_outside_a_capture_only_the_shapes(monkeypatch):
    """On meta outside a capture (a shape probe) each later call of a layout gets a fresh tensor of the first call's
    result layout; on real tensors every call runs."""
    calls = []

    def fn(x, i):
        calls.append(i)
        return x * 2

    with torch.device("meta"):
        xs = [(torch.empty(3, 4), i) for i in range(5)]
        with torch.no_grad():  # under torch.device's own mode, as opmap.workloads.hf_cache probes
            out = rep.repeat_calls(fn, xs)
    assert calls == [0] and [tuple(o.shape) for o in out] == [(3, 4)] * 5
    calls.clear()
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False):  # a mode that counts every op: every call runs
        rep.repeat_calls(fn, xs)
    assert calls == [0, 1, 2, 3, 4]
    calls.clear()
    real = rep.repeat_calls(fn, [(torch.ones(3, 4), i) for i in range(3)])
    assert calls == [0, 1, 2] and all(torch.equal(r, torch.full((3, 4), 2.0)) for r in real)

    calls.clear()
    from opmap.capture.tracer import shapes_only

    with torch.device("meta"), torch.no_grad(), shapes_only():  # a mode that keeps no ops watches nothing
        rep.repeat_calls(fn, xs)
    assert calls == [0]


@pytest.mark.parametrize("family", ["deepseek_v3", "mixtral"])
def test_the_cache_probe_under_the_meta_memo_is_the_plain_probe(tmp_path, monkeypatch, family):
    """A decode step's cache layout probe (opmap.workloads.hf_cache.cache_layout: one token through every layer on
    meta) under shapes_only (a functional op seen before gets outputs of the recorded layout) gives each layer's K
    and V shapes as the probe running every meta kernel does; the memo served the second layer's ops (its kernels
    run fewer times than ops were dispatched)."""
    import transformers

    from opmap.capture import tracer
    from opmap.workloads import hf_cache

    w = _workload(tmp_path, family)
    ran, seen = [0], [0]
    call, dispatch = tracer._ShapesOnly._call, tracer._ShapesOnly.__torch_dispatch__

    def counted_call(self, *a):
        ran[0] += 1
        return call(self, *a)

    def counted_dispatch(self, *a, **k):
        seen[0] += 1
        return dispatch(self, *a, **k)

    monkeypatch.setattr(tracer._ShapesOnly, "_call", counted_call)
    monkeypatch.setattr(tracer._ShapesOnly, "__torch_dispatch__", counted_dispatch)
    memo = hf_cache.cache_layout(transformers, w.module, 4, "cache", family)
    assert 0 < ran[0] < seen[0]
    import contextlib

    monkeypatch.setattr(tracer, "shapes_only", contextlib.nullcontext)
    plain = hf_cache.cache_layout(transformers, w.module, 4, "cache", family)
    assert memo == plain and len(plain) == 2
