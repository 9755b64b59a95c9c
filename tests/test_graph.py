"""TensorMeta byte accounting and Node helpers."""

from opmap.graph import Node, TensorMeta
from opmap.record import record


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
    assert TensorMeta.from_dict(record(a)) == a


def test_a_tensor_records_its_producer_and_param_only_where_set():
    # graph.json / analysis.json's tensor: shape, dtype, stride as lists; producer and param only when not None
    t = TensorMeta((2, 3), "float16", (3, 1))
    assert record(t) == {"shape": [2, 3], "dtype": "float16", "stride": [3, 1]}
    w = TensorMeta((3,), "float16", (1,), producer=0, param="lm_head.weight")
    assert list(record(w)) == ["shape", "dtype", "stride", "producer", "param"]
    assert TensorMeta.from_dict(record(w)) == w
    n = Node(1, "aten.mul.Tensor", "m", "M", "elementwise", (t, w), (t,), ("self", "other"))
    assert [i["name"] for i in record(n)["inputs"]] == ["self", "other"]  # Node's own to_dict zips the names in
