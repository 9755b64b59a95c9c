"""Modules PyTorch runs through its fused inference fast path are named, and profile measures the captured path."""

from __future__ import annotations

import torch

from opmap.capture import capture


def _encoder():
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()


def test_an_eval_encoder_is_named_with_what_to_do():
    m = _encoder()
    g = capture(m, (torch.randn(2, 8, 32),))
    assert len(g.notes) == 1 and g.notes[0].startswith("fast path: (top) (TransformerEncoder)")
    assert "set_fastpath_enabled(False)" in g.notes[0]
    # a training capture, or the fast path switched off, needs no note
    assert capture(torch.nn.Linear(4, 4), (torch.randn(2, 4),)).notes == ()
    prev = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        assert capture(m, (torch.randn(2, 8, 32),)).notes == ()
    finally:
        torch.backends.mha.set_fastpath_enabled(prev)


def test_profile_measures_the_unfused_path_it_captured():
    from opmap.hardware import get_hardware
    from opmap.measure import run_profile
    from opmap.measure.run import fast_path
    from opmap.workloads.zoo import Workload

    seen = []

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = _encoder()

        def forward(self, x):
            seen.append(torch.backends.mha.get_fastpath_enabled())
            return self.enc(x)

    w = Workload("enc", Probe().eval(), (torch.randn(2, 8, 32),), 2, 8)
    p = run_profile(w, get_hardware("h100-sxm"), "fp32", "cpu", warmup=1, iters=2, profile_iters=1)
    assert any("fast path" in n for n in p.analysis.assumptions.capture_notes)
    assert seen and not any(seen[1:])  # every run after the capture ran with the fast path off
    assert torch.backends.mha.get_fastpath_enabled()  # and it is restored after
    with fast_path(False):
        assert not torch.backends.mha.get_fastpath_enabled()
