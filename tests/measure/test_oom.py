"""Out of memory on a real run is the user's batch, said in one line: the estimate checked before a run, and the
allocator's own refusal turned into an error naming the request."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from opmap.capture import capture
from opmap.errors import OpmapError
from opmap.measure.oom import asked_bytes, check_fits, refusal_as_error, run_bytes


def test_run_bytes_is_the_weights_and_the_largest_operator():
    """Linear(64, 256) on a 32 x 64 input, fp32: weights (64 x 256 + 256) x 4 B = 66,560 B; its one operator
    (addmm) reads the 32 x 64 input (8,192 B; the weight and bias are counted above) and writes 32 x 256
    (32,768 B): 107,520 B in all."""
    g = capture(nn.Linear(64, 256).to("meta"), (torch.empty(32, 64, device="meta"),))
    assert run_bytes(g) == pytest.approx(66_560 + 8_192 + 32_768)


def test_a_point_over_the_memory_available_is_refused_up_front():
    with pytest.raises(OpmapError) as e:
        check_fits(1e18, "sweep --measure at batch 100000 x seq 64")
    msg = str(e.value)
    assert "\n" not in msg and "batch 100000 x seq 64" in msg and "1,000,000,000.0 GB" in msg
    check_fits(1.0, "a tiny point")  # one byte always fits


def test_the_allocators_refusal_names_the_request_and_the_bytes():
    """A real refusal: 2^48 bytes (281 TB) is more than any host here has; the CPU allocator refuses at once."""
    with pytest.raises(OpmapError) as e, refusal_as_error("profile of gpt2 at batch 100000"):
        torch.empty(2**48, dtype=torch.uint8)
    msg = str(e.value)
    assert "\n" not in msg and "batch 100000" in msg and "281,475.0 GB" in msg  # 2^48 / 1e9


def test_other_errors_pass_through():
    with pytest.raises(ValueError), refusal_as_error("x"):
        raise ValueError("not memory")
    assert asked_bytes(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")) == 2 * 2**30


def test_a_view_is_not_a_second_allocation():
    """Linear(64, 256, bias=False) on 32 x 64, then flattened (a view of the 32 x 256 output), fp32: weights
    64 x 256 x 4 = 65,536 B; the largest operator is the matmul, 32 x 64 x 4 = 8,192 B in and 32 x 256 x 4 =
    32,768 B out. The flatten reads and 'writes' the same 32,768 B storage: counted as two it would be 65,536 B,
    larger than the matmul's 40,960, and the floor would not be one."""
    m = nn.Sequential(nn.Linear(64, 256, bias=False), nn.Flatten(0)).to("meta")
    g = capture(m, (torch.empty(32, 64, device="meta"),))
    assert any(n.is_view for n in g.nodes)
    assert run_bytes(g) == 65_536 + 8_192 + 32_768
