"""The dispatch tracer: nodes, edges through tensor identity, parameters, module paths, meta errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from opmap.capture import MetaCaptureError, capture
from opmap.errors import OpmapError


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        y = self.proj(x)
        v = y.view(-1)  # a view of y
        v.mul_(2.0)  # in-place through the view: later readers of y depend on the mul_
        return self.norm(y) + y


def _ops(g):
    return [n.op for n in g.nodes]


def test_edges_views_and_inplace():
    with torch.device("meta"):
        m, x = Tiny(), torch.empty(4, 8)
    g = capture(m, (x,))
    ops = _ops(g)
    addmm = ops.index("aten.addmm.default")
    mul = ops.index("aten.mul_.Tensor") if "aten.mul_.Tensor" in ops else ops.index("aten.mul_.Scalar")
    ln = ops.index("aten.native_layer_norm.default")
    add = ops.index("aten.add.Tensor")
    # addmm reads x (a graph input, no producer), the bias, and the weight through aten.t (a view)
    (t_node,) = g.nodes[addmm].producers
    assert g.nodes[t_node].op == "aten.t.default" and g.nodes[t_node].inputs[0].param == "proj.weight"
    view = g.nodes[mul].inputs[0].producer
    assert g.nodes[view].is_view and g.nodes[view].inputs[0].producer == addmm
    # the layer norm reads y, whose storage the in-place mul_ wrote last
    assert g.nodes[ln].inputs[0].producer == mul
    assert set(g.nodes[add].producers) == {ln, mul}
    assert g.nodes[mul].is_inplace


def test_parameters_flagged_through_views_and_module_paths():
    with torch.device("meta"):
        m, x = Tiny(), torch.empty(4, 8)
    g = capture(m, (x,))
    addmm = next(n for n in g.nodes if n.op == "aten.addmm.default")
    params = {t.param for t in addmm.inputs if t.param}
    assert params == {"proj.weight", "proj.bias"}  # the weight arrives through aten.t, a view
    assert addmm.module == "proj" and addmm.module_class == "Linear"
    assert g.params == 8 * 16 + 16 + 16 * 2
    assert g.param_bytes == g.params * 4


def test_meta_and_cpu_capture_agree_on_costly_ops():
    torch.manual_seed(0)
    m, x = Tiny(), torch.randn(4, 8)
    cpu = capture(m, (x,))
    meta = capture(m.to("meta"), (x.to("meta"),))
    assert [n.op for n in cpu.nodes if not n.is_view] == [n.op for n in meta.nodes if not n.is_view]
    assert cpu.device == "cpu" and meta.device == "meta"


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x):
        return self.inner(x)[torch.nonzero(x[:, 0] > 0).flatten()]


def test_data_dependent_op_on_meta_names_op_module_and_fix():
    with torch.device("meta"):
        m, x = DataDependent(), torch.empty(3, 4)
    with pytest.raises(MetaCaptureError) as e:
        capture(m, (x,))
    msg = str(e.value)
    assert "nonzero" in msg and "meta" in msg and "--device cpu" in msg
    assert isinstance(e.value, OpmapError)
    g = capture(DataDependent(), (torch.randn(3, 4),))  # real tensors work
    assert any("nonzero" in n.op for n in g.nodes)


def test_kwargs_inputs_and_training_flag_restored():
    m = Tiny().train()
    g = capture(m, {"x": torch.randn(2, 8)})
    assert m.training  # capture runs eval and restores the mode
    assert g.inputs[0].shape == (2, 8)


def _nodes(g):
    return [n.to_dict() for n in g.nodes]


@pytest.mark.parametrize("name,seq", [("gpt2", 32), ("bert-base", 16), ("resnet50", 32), ("vit-b16", 32)])
def test_memoised_capture_is_the_same_graph(name, seq):
    """Replaying repeated calls from their signature must give exactly the graph running every meta kernel
    gives: every node's op, module, inputs (shapes, strides, dtypes, producers), outputs and args."""
    from opmap.workloads import build_zoo

    w = build_zoo(name, 2, seq, "bf16")
    fast, slow = capture(w.module, w.inputs), capture(w.module, w.inputs, memoize=False)
    assert _nodes(fast) == _nodes(slow)


def test_memoised_capture_of_a_small_llama_with_moe_and_gqa():
    from opmap.workloads.llama import Llama, LlamaConfig

    with torch.device("meta"):
        m = Llama(LlamaConfig(vocab_size=64, dim=64, n_layer=3, n_head=4, n_kv_head=2, ffn_dim=96, n_experts=4))
        ids = torch.zeros(1, 16, dtype=torch.long)
    assert _nodes(capture(m, (ids,))) == _nodes(capture(m, (ids,), memoize=False))


def test_a_capture_after_another_takes_the_process_memo_and_gives_the_same_graph():
    """The meta-call memo is the process's (opmap.capture.tracer._MEMOS): a second capture whose calls the first
    already made (serve's decode steps at two KV lengths) replays them, and its graph is the one running every
    meta kernel gives; a capture under another default dtype keeps a memo of its own."""
    from opmap.capture import tracer
    from opmap.workloads.llama import Llama, LlamaConfig

    with torch.device("meta"):
        m = Llama(LlamaConfig(vocab_size=64, dim=64, n_layer=2, n_head=4, n_kv_head=2, ffn_dim=96, n_experts=4))
        short, long = torch.zeros(2, 8, dtype=torch.long), torch.zeros(2, 24, dtype=torch.long)
    tracer._MEMOS.clear()
    capture(m, (short,))
    memo = tracer._MEMOS[torch.get_default_dtype()]
    warm = len(memo)
    assert warm > 0
    again = capture(m, (short,))
    assert len(memo) == warm  # every memoisable call was a hit
    assert _nodes(again) == _nodes(capture(m, (short,), memoize=False))
    assert _nodes(capture(m, (long,))) == _nodes(capture(m, (long,), memoize=False))
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert tracer._shared_memo() is not memo
    finally:
        torch.set_default_dtype(before)


class ShapeError(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 8)

    def forward(self, x):
        return self.proj(x)


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_shape_error_in_the_model_is_the_models_not_metas(device):
    """A forward that fails on its own (Linear(4, 8) fed 2x5) is reported as the model's error, naming the
    module, the op and the input shapes, on meta as on the CPU: never blamed on the meta device."""
    with torch.device(device):
        m, x = ShapeError(), torch.empty(2, 5)
    with pytest.raises(OpmapError) as e:
        capture(m, (x,))
    msg = str(e.value)
    assert not isinstance(e.value, MetaCaptureError)
    assert "the model's forward fails" in msg and "addmm" in msg and "'proj' (Linear)" in msg
    assert "2x5 float32" in msg and "4x8 float32" in msg and "\n" not in msg
    assert ("not a limit of the meta device" in msg) == (device == "meta") and "--device cpu" not in msg


def test_meta_limitation_tells_shape_errors_apart():
    from opmap.capture.tracer import meta_limitation

    assert meta_limitation(NotImplementedError("Could not run 'aten::foo' with arguments from the 'Meta' backend"))
    assert meta_limitation(RuntimeError("Tensor.item() cannot be called on meta tensors"))
    assert meta_limitation(RuntimeError("Cannot copy out of meta tensor; no data!"))
    assert not meta_limitation(RuntimeError("a and b must have same reduction dim, but got [2, 5] X [4, 8]."))
    assert not meta_limitation(RuntimeError("shape '[3, 7]' is invalid for input of size 10"))


def test_training_dropout_is_the_fused_kernel_cuda_runs():
    # CUDA runs training dropout as aten.native_dropout (output + bool mask: read 2 B, write 2 B + 1 B per fp16
    # element) and its backward as native_dropout_backward; meta alone would decompose it into three kernels
    import torch.nn.functional as F

    from opmap.costs import cost_graph

    class Drop(torch.nn.Module):
        def forward(self, x):
            return F.dropout(x, 0.1, self.training) * 2

    with torch.device("meta"):
        x = torch.empty(4, 1024, dtype=torch.float16, requires_grad=True)
    g = capture(Drop(), (x,), train=True)
    ops = [n.op for n in g.nodes]
    assert "aten.native_dropout.default" in ops and "aten.native_dropout_backward.default" in ops
    assert not any("bernoulli" in o for o in ops)
    (fwd,) = [c for n, c in zip(g.nodes, cost_graph(g)) if n.op == "aten.native_dropout.default"]
    assert fwd.bytes == 4096 * (2 + 2 + 1)
    # eval: the identity, no kernel at all
    assert not any("dropout" in n.op for n in capture(Drop().eval(), (x.detach(),)).nodes)
