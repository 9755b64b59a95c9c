"""Data movement: embedding / index_select / gather / scatter, cat / copy / clone, factories. No matrix work.

Indexing reads only what it touches: an embedding lookup of T indices into a (V x D) table reads the T
indices and T*D table entries (not the whole table) and writes T*D. Scatter-style ops read the source and
indices and write the positions they touch (a scatter-add also reads them and adds: one FLOP per source
element). Copies read the source once and write the destination once. Factories write their output
(``empty`` writes nothing).
"""

from __future__ import annotations

from opmap.costs.base import OpCost, io_cost, rule
from opmap.graph import Node, TensorMeta


def touched(table: TensorMeta, elems: int) -> TensorMeta:
    """A stand-in for the part of ``table`` a lookup touches: ``elems`` elements of its dtype."""
    return TensorMeta((elems,), table.dtype, (1,), table.producer, table.param)


@rule("embedding", "_embedding_bag", "embedding_bag", "_embedding_bag_forward_only")
def embedding_cost(node: Node) -> OpCost:
    weight, idx = node.input("weight"), node.input("indices")
    out = node.outputs[0]
    return io_cost(node, reads=[idx, touched(weight, out.numel)], written=out.nbytes)


@rule("index_select", "gather", "index", "take", "take_along_dim", "masked_select")
def gather_cost(node: Node) -> OpCost:
    """Reads the indices and one source element per output element."""
    out = node.outputs[0]
    src = node.inputs[0]
    idx = [t for t in node.inputs[1:]]
    return io_cost(node, reads=[*idx, touched(src, out.numel)], written=out.nbytes)


@rule("scatter", "scatter_", "scatter_add", "scatter_add_", "scatter_reduce", "scatter_reduce_",
      "index_add", "index_add_", "index_put", "index_put_", "index_copy", "index_copy_", "index_fill",
      "index_fill_", "masked_scatter", "masked_scatter_", "_index_put_impl_")
def scatter_cost(node: Node) -> OpCost:
    """Out-of-place variants also copy ``self`` whole into the result first."""
    self_t = node.inputs[0]
    others = list(node.inputs[1:])
    src_elems = max((t.numel for t in others), default=0)
    accumulate = ("add" in node.packet or "reduce" in node.packet or bool(node.args.get("accumulate")))
    hit = touched(self_t, src_elems)
    reads = [*others, hit] if accumulate else others
    written = hit.nbytes
    if not node.is_inplace:  # the result starts as a copy of self
        reads.append(self_t)
        written = node.outputs[0].nbytes
    return io_cost(node, reads=reads, written=written, vector_flops=float(src_elems if accumulate else 0))


@rule("cat", "stack", "clone", "_to_copy", "contiguous", "repeat", "repeat_interleave", "constant_pad_nd",
      "pad", "reflection_pad1d", "reflection_pad2d", "replication_pad1d", "replication_pad2d", "roll", "flip",
      "narrow_copy", "alias_copy", "view_copy", "permute_copy", "transpose_copy", "expand_copy", "t_copy",
      "unsqueeze_copy", "squeeze_copy", "slice_copy", "select_copy", "split_copy", "split_with_sizes_copy",
      "unbind_copy", "lift_fresh_copy", "_unsafe_view_copy", "detach_copy", "tile", "unfold_copy", "im2col",
      "col2im", "pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "native_channel_shuffle",
      "upsample_nearest2d", "upsample_bilinear2d", "_upsample_nearest_exact2d", "one_hot", "bincount")
def copy_cost(node: Node) -> OpCost:
    """Read every input once, write every output once."""
    return io_cost(node)


@rule("copy", "copy_")
def copy_into_cost(node: Node) -> OpCost:
    """copy_(dst, src): reads src, writes dst (dst is not read)."""
    src = node.input("src")
    return io_cost(node, reads=[src], written=node.inputs[0].nbytes)


@rule("zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "new_full",
      "fill", "fill_", "zero_", "scalar_tensor", "eye", "tensor", "lift_fresh", "_local_scalar_dense")
def fill_cost(node: Node) -> OpCost:
    """Writes its output, reads nothing it needs (a fill_'s value tensor is one scalar)."""
    small = [t for t in node.inputs if t.numel <= 1]
    return io_cost(node, reads=small, written=sum(t.nbytes for t in node.outputs))


@rule("arange", "linspace", "logspace", "randperm", "rand", "randn", "randint", "rand_like", "randn_like",
      "normal", "uniform_", "normal_", "bernoulli", "bernoulli_", "multinomial")
def generator_cost(node: Node) -> OpCost:
    """Ranges and random numbers: one op per element written."""
    n = sum(t.numel for t in node.outputs)
    return io_cost(node, reads=[], vector_flops=float(n))


@rule("empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "empty_permuted",
      "resize_", "set_", "_assert_async", "_assert_tensor_metadata", "sym_size", "sym_stride", "sym_numel",
      "record_stream")
def no_traffic_cost(node: Node) -> OpCost:
    """Allocation or metadata only: no kernel moves data."""
    return OpCost(kernel=False)


def view_cost(node: Node) -> OpCost:
    """A view aliases its input: no kernel, no traffic."""
    return OpCost(is_view=True, kernel=False)


