"""TensorMeta byte accounting and Node helpers."""

from opmap.graph import Node, TensorMeta


def test_storage_bytes_counts_broadcast_dims_once():
    t = TensorMeta((4, 1024, 768), "bfloat16", (0, 768, 1))  # expanded along dim 0
    assert t.nbytes == 4 * 1024 * 768 * 2
    assert t.storage_bytes == 1024 * 768 * 2
    assert TensorMeta((0, 3), "float32", (3, 1)).storage_bytes == 0


def test_node_packet_and_producers():
    a = TensorMeta((2,), "float32", (1,), producer=3)
    b = TensorMeta((2,), "float32", (1,), producer=1)
    n = Node(5, "aten.add_.Tensor", "m", "M", "elementwise", (a, b, a), (a,), ("self", "other", "x"))
    assert n.packet == "add_"
    assert n.producers == (1, 3)
    assert n.input("other") is b and n.input("missing") is None
    assert TensorMeta.from_dict(a.to_dict()) == a
