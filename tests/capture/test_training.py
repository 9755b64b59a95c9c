"""Training-step capture: backward ops with their forward module, matrix FLOPs against FlopCounterMode."""

from __future__ import annotations

from collections import Counter

import pytest
from torch.utils.flop_counter import FlopCounterMode

from opmap.capture import capture
from opmap.capture.training import training_loss
from opmap.costs import cost_graph, uncounted
from opmap.workloads import build_zoo


def _fc_total(name, batch, seq):
    w = build_zoo(name, batch, seq, "fp32", "cpu")
    m = w.module.train()
    with FlopCounterMode(display=False) as fc:
        training_loss(m(*w.inputs)).backward()
    return fc.get_total_flops(), {str(k): v for k, v in fc.get_flop_counts()["Global"].items()}


def test_resnet50_training_step_matches_flop_counter():
    w = build_zoo("resnet50", 1, 64, "fp32")
    g = capture(w.module, w.inputs, train=True)
    c = cost_graph(g)
    assert uncounted(g, c) == {}
    total, _ = _fc_total("resnet50", 1, 64)
    assert sum(x.matrix_flops for x in c) == total  # forward convs + convolution_backward + the head's mms
    phases = Counter(n.args.get("phase", "forward") for n in g.nodes)
    # the SGD update is one in-place add per parameter tensor
    assert phases["optimizer"] == sum(1 for _ in w.module.parameters())
    conv_bwd = [n for n in g.nodes if n.op.startswith("aten.convolution_backward")]
    assert len(conv_bwd) == 53 and all(n.layer_type == "conv" and n.module for n in conv_bwd)


def test_gpt2_training_step_gemms_and_attention_backward():
    w = build_zoo("gpt2", 1, 32, "fp32", "cpu")
    g = capture(w.module, w.inputs, train=True)
    c = cost_graph(g)
    assert uncounted(g, c) == {}
    by = Counter()
    for n, x in zip(g.nodes, c):
        by[n.op.split(".")[1]] += x.matrix_flops
    _, fc = _fc_total("gpt2", 1, 32)
    # FlopCounterMode counts the GEMMs (and 0 for the CPU flash attention, forward and backward)
    assert by["addmm"] == fc["aten.addmm"] and by["mm"] == fc["aten.mm"]
    # the fused attention backward is five GEMMs of the forward's two: 2.5x
    assert by["_scaled_dot_product_flash_attention_for_cpu_backward"] == pytest.approx(
        2.5 * by["scaled_dot_product_attention"])
    mlp_bwd = [n for n in g.nodes if n.args.get("phase") == "backward" and n.op == "aten.mm.default"
               and n.module.endswith("mlp.c_fc")]
    assert mlp_bwd and all(n.layer_type == "mlp" for n in mlp_bwd)


def test_training_capture_counts_parameters_like_inference():
    """A training capture reports the model's parameter count (resnet50: 25,557,032, torchvision), and its
    analysis serialises: the trainable-parameter list once shadowed the count."""
    import json

    from opmap.analyze import analyze_graph
    from opmap.hardware import get_hardware

    w = build_zoo("resnet50", 1, 64, "fp32")
    g = capture(w.module, w.inputs, train=True)
    assert g.params == 25_557_032
    d = analyze_graph(g, w, get_hardware("h100-sxm"), "fp32").to_dict()
    assert json.loads(json.dumps(d))["totals"]["params"] == 25_557_032


def test_training_loss_is_cross_entropy_over_classes_and_vocabularies():
    # scores over classes ([N, C]) or a vocabulary ([B, S, V]) take cross-entropy in fp32 against class 0: on zero
    # logits every class is equally likely, so the loss is ln(C) exactly; any other output takes the mean stand-in
    import math

    import torch

    assert training_loss(torch.zeros(3, 10)).item() == pytest.approx(math.log(10), rel=1e-6)
    assert training_loss(torch.zeros(2, 5, 32000, dtype=torch.bfloat16)).item() == pytest.approx(math.log(32000),
                                                                                                 rel=1e-6)
    assert training_loss((torch.ones(2, 3, 4, 4), "x")).item() == 1.0  # an image-shaped output: the mean
    assert training_loss(torch.full((4, 1), 2.0)).item() == 2.0  # one score a row: no classes, the mean


def test_language_model_training_captures_the_fp32_softmax_over_the_vocabulary():
    # gpt2 at batch 1, sequence 32: the loss casts the [32, 50257] logits to fp32 and takes log-softmax over them:
    # read 32 x 50257 fp32, write as much (8 B a logit); its backward reads the output and the incoming gradient
    # and writes the gradient (12 B a logit); nll_loss's backward writes the dense gradient (4 B a logit)
    w = build_zoo("gpt2", 1, 32, "fp32")
    g = capture(w.module, w.inputs, train=True)
    c = cost_graph(g)
    assert uncounted(g, c) == {}
    n_logits = 32 * 50257
    by = {n.packet: (n, x) for n, x in zip(g.nodes, c)
          if n.packet in ("_log_softmax", "_log_softmax_backward_data", "nll_loss_forward", "nll_loss_backward")}
    assert set(by) == {"_log_softmax", "_log_softmax_backward_data", "nll_loss_forward", "nll_loss_backward"}
    lsm, lsm_cost = by["_log_softmax"]
    assert tuple(lsm.inputs[0].shape) == (32, 50257) and lsm.inputs[0].dtype == "float32"
    assert lsm_cost.bytes == pytest.approx(8 * n_logits, rel=1e-3)
    assert by["_log_softmax_backward_data"][1].bytes == pytest.approx(12 * n_logits, rel=1e-3)
