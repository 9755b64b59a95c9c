"""The fp8 training kernels' cost rules (opmap.costs.fp8): a cast of N bf16 elements reads 2N bytes and writes N per
fp8 output (the copy and its transpose), 2N vector FLOPs (scale and amax); the scale update reads and writes each
tensor's fp32 amax history and scale."""

from __future__ import annotations

from opmap.costs import cost_node
from opmap.graph import Node, TensorMeta


def _t(shape, dtype, param=None):
    st, acc = [], 1
    for s in reversed(shape):
        st.append(acc)
        acc *= s
    return TensorMeta(tuple(shape), dtype, tuple(reversed(st)), None, param)


def test_cast_transpose_reads_2n_writes_n_per_output():
    n = 64 * 128
    node = Node(0, "opmap.fp8_cast_transpose.default", "l.0.fc", "Linear", "mlp", (_t((64, 128), "bfloat16"),),
                (_t((64, 128), "float8_e4m3fn"), _t((128, 64), "float8_e4m3fn")), ("input",))
    c = cost_node(node)
    assert c.counted and (c.bytes_read, c.bytes_written, c.vector_flops, c.matrix_flops) == (2 * n, 2 * n, 2 * n, 0)
    # a weight: its read counts as a parameter read (stored at bf16: 2 B an element)
    w = Node(1, "opmap.fp8_cast_transpose.default", "l.0.fc", "Linear", "mlp", (_t((64, 128), "bfloat16", "w"),),
             (_t((64, 128), "float8_e4m3fn"),), ("input",))
    cw = cost_node(w)
    assert (cw.bytes_read, cw.param_bytes_read, cw.bytes_written) == (0, 2 * n, n)


def test_scale_update_moves_the_histories():
    hist, scale = _t((30, 1024), "float32"), _t((30,), "float32")
    c = cost_node(Node(0, "opmap.fp8_scale_update.default", "", "", "other", (hist, scale), (hist, scale),
                       ("amax_history", "scale")))
    assert c.bytes_read == c.bytes_written == 4 * (30 * 1024 + 30)
    assert c.vector_flops == 30 * 1024 + 4 * 30
