"""Context parallelism: the sequence split over ``cp`` devices per tensor-parallel group, attention as a ring.

Megatron-Core runs context parallelism through TransformerEngine's context-parallel attention with point-to-point
exchange (``AttnFuncWithCPAndKVP2P``, transformer_engine/pytorch/attention: ``cp_comm_type="p2p"``):

- load balancing for causal attention: the sequence is cut into 2 cp chunks and rank r holds chunks r and
  2 cp - 1 - r, so every rank does the same share of the causal work (the sequence must divide by 2 cp);
- forward: each rank keeps its own queries and passes its K / V chunk (b x s / cp tokens x the KV heads it holds)
  around the ring; each of the cp - 1 ring steps sends one chunk to the next rank while the attention of the
  chunk in hand is computed (double buffered), so per step only max(0, send - attention step) is exposed;
  with load balancing every step holds the same causal work (2 c^2 score entries for chunk length c), so an
  attention step is 1 / cp of the rank's attention;
- backward: K / V travel the ring again with their gradients dK / dV (two chunks per step), overlapped with
  the attention backward of the chunk in hand;
- everything else in a block (projections, MLP, norms) is token-wise: each rank runs s / cp tokens; weights are
  read whole on every rank (replicated over cp), so a kernel's weight traffic does not split;
- the gradient all-reduce spans the data-parallel x context-parallel ranks (Megatron's
  ``data_parallel_group_with_cp``): cp ranks hold gradients of different tokens of the same replica;
- memory: each rank keeps the activations of its s / cp tokens (saved activations / cp) plus the exchange's
  buffers: K / V double-buffered in forward, K / V and dK / dV in backward (4 chunks, one layer at a time).

The all-gather variant (``cp_comm="all_gather"``, Llama 3's): one all-gather of K / V per layer before the
attention, exposed (not overlapped); memory holds the gathered K / V and dK / dV of one layer.

Placement (Megatron's default order tp-cp-ep-dp-pp): a CP ring's neighbours are tp ranks apart, so a ring spans
tp x cp consecutive ranks; the link is ``link_for`` of that span.
"""

from __future__ import annotations

from dataclasses import dataclass

from opmap.geometry import forward_calls, layer_specs

CP_SOURCE = ("Megatron-Core context parallelism over TransformerEngine AttnFuncWithCPAndKVP2P (cp_comm_type p2p, "
             "causal load balancing: 2 cp chunks, rank r holds r and 2 cp - 1 - r)")
# K / V double-buffered in forward, K / V and dK / dV in backward (one layer's exchange at a time)
CP_BUFFER_CHUNKS = 4
# p2p: the ring above; all_gather: Llama 3's (paper sec. 3.3.2): K / V all-gathered, then the local queries'
# attention, the gather exposed; in backward K / V gathered again and dK / dV reduce-scattered
CP_COMMS = ("p2p", "all_gather")
CP_ALL_GATHER_SOURCE = ("all-gather context parallelism as Llama 3 ran it (arXiv 2407.21783 sec. 3.3.2: K / V "
                        "all-gathered, the local query chunk's attention computed; backward re-gathers K / V and "
                        "reduce-scatters dK / dV)")


@dataclass(frozen=True)
class KVShape:
    """The K and V one attention call reads at the captured shape (one microbatch, whole sequence): bytes of K plus
    V, their heads, and whether the attention is causal."""

    kv_bytes: float
    kv_heads: int
    causal: bool


def kv_shape(graph) -> KVShape | None:
    """K + V bytes of the first forward fused attention call (opmap.geometry.forward_calls; None: no fused
    attention), its KV heads and whether it is causal, as the layer is (opmap.geometry.layer_specs)."""
    calls = forward_calls(graph)
    for c, s in zip(calls, layer_specs(graph, calls)):
        if c.fused:  # the whole sequence's K and V travel the ring: no window cap
            return KVShape(float(c.held_bytes(s, capped=False)), int(s.n_kv_heads), s.causal)
    return None


def chunk_bytes(kv: KVShape, tp: int, cp: int) -> float:
    """One ring step's K / V payload per rank: K + V of s / cp tokens over the KV heads the rank holds (a KV head
    is replicated when tp exceeds the KV heads, so they split over min(tp, KV heads))."""
    return kv.kv_bytes / (cp * max(1, min(tp, kv.kv_heads)))


def ring_bytes_per_layer(kv: KVShape, tp: int, cp: int) -> float:
    """Bytes one rank sends per layer in forward: (cp - 1) chunks = 2 (cp - 1) / cp x b s h_kv d bytes / min(tp,
    KV heads) (K and V)."""
    return (cp - 1) * chunk_bytes(kv, tp, cp)


def exposed(send_s: float, compute_s: float) -> float:
    """The part of one ring step's send not hidden behind the attention compute of the chunk in hand."""
    return max(0.0, send_s - compute_s)


def check_sequence(seq: int, cp: int, causal: bool) -> str:
    """Empty when ``seq`` splits over ``cp`` (2 cp chunks for causal load balancing), else why not."""
    need = 2 * cp if causal else cp
    if seq % need:
        return (f"--cp {cp} needs the sequence {seq} to divide into {need} chunks ("
                + ("2 x cp: causal load balancing, each rank holds two chunks" if causal else "cp") + ")")
    return ""
