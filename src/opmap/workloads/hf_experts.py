"""A mixture-of-experts block of a transformers model on the meta device: its data-dependent routing loop replaced
by a balanced dispatch (opmap.workloads.hf's module docstring says why).

Two layouts of experts are dispatched:

- transformers 5's stacked experts (``MixtralExperts``, ``Qwen3MoeExperts``, ``DeepseekV3Experts``,
  ``GptOssExperts`` and their kin): all experts' weights as 3-D parameters, the module called with
  ``(hidden_states, top_k_index, top_k_weights)`` by its MoE block; its forward is replaced;
- Llama 4's ``Llama4TextMoe``, whose ``Llama4TextExperts`` is called with the hidden states alone: transformers runs
  every expert on every token (one ``bmm`` over all experts, the tokens the router did not pick weighted by
  sigmoid(-inf) = 0), which is 16x Scout's routed work; the block's forward is replaced by the top-k dispatch an
  engine runs (vLLM's fused MoE: each token to its ``num_experts_per_tok`` experts, scaled by the sigmoid of its
  router logit, plus the shared expert), on a balanced load.

A module whose forward takes neither form is left as transformers wrote it.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable

import torch

from opmap.capture.repeat import repeat_calls
from opmap.errors import OpmapError
from opmap.ops import active_experts


def _takes_routing(m: torch.nn.Module) -> bool:
    """Whether the module's forward takes the router's choices (top_k_index, top_k_weights) after the states."""
    try:
        params = list(inspect.signature(m.forward).parameters)
    except (TypeError, ValueError):
        return False
    return len(params) >= 3 or any(p in params for p in ("top_k_index", "routing_weights", "selected_experts"))


def _is_stacked_experts(m: torch.nn.Module) -> bool:
    """transformers 5's experts module: all experts' weights as 3-D parameters (gate_up_proj, or up_proj where the
    experts have no gate, and down_proj), called with (hidden_states, top_k_index, top_k_weights)."""
    up = getattr(m, "gate_up_proj" if getattr(m, "has_gate", True) else "up_proj", None)
    down = getattr(m, "down_proj", None)
    return (type(m).__name__.endswith("Experts") and isinstance(up, torch.nn.Parameter) and up.dim() == 3
            and isinstance(down, torch.nn.Parameter) and down.dim() == 3 and _takes_routing(m))


def _is_llama4_moe(m: torch.nn.Module) -> bool:
    """Llama 4's MoE block: a router (a Linear to the experts), stacked experts called with the states alone
    (gate_up_proj (E, in, 2 x ffn), down_proj (E, ffn, out)) and a shared expert."""
    ex = getattr(m, "experts", None)
    return (isinstance(getattr(m, "router", None), torch.nn.Linear) and ex is not None
            and hasattr(m, "shared_expert") and isinstance(getattr(ex, "gate_up_proj", None), torch.nn.Parameter)
            and not _takes_routing(ex))


def balance_experts(model: torch.nn.Module) -> int:
    """Replace each MoE block's data-dependent routing (module docstring) by a balanced dispatch; the count."""
    n = 0
    for path, m in model.named_modules():
        if _is_llama4_moe(m):
            m.forward = types.MethodType(_llama4_moe_forward, m)
            n += 1
            continue
        if not _is_stacked_experts(m):
            continue
        if getattr(m, "has_post_expert_norm", False):
            raise OpmapError(f"{path} ({type(m).__name__}): opmap's balanced expert dispatch handles experts of an "
                             "up (or gated up) and a down projection, with or without bias; not a norm after them")
        m.forward = types.MethodType(_balanced_experts_forward, m)
        n += 1
    return n


def _expert_linear(self, x: torch.Tensor, name: str, i: int) -> torch.Tensor:
    """Expert ``i``'s projection ``name`` of ``x``, as transformers lays it out: weights (out, in), or (in, out)
    where ``is_transposed`` (gpt-oss), plus ``name``_bias where ``has_bias``."""
    w = getattr(self, name)[i]
    y = x @ w if getattr(self, "is_transposed", False) else torch.nn.functional.linear(x, w)
    return y + getattr(self, f"{name}_bias")[i] if getattr(self, "has_bias", False) else y


def dispatch(hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, n_experts: int,
             expert: Callable[[torch.Tensor, int], torch.Tensor], weight_inputs: bool = False) -> torch.Tensor:
    """The eager expert loop with each expert's share fixed in advance: the T*k (token, choice) pairs sorted by
    expert, split into equal slices over the experts the T tokens are expected to activate
    (opmap.ops.active_experts), ``expert(slice, i)`` run on each (an expert with no tokens launches nothing and
    its weights are not read), the weighted results added back to their tokens (the same dispatch as
    opmap.workloads.llama.SparseMoeBlock on meta); ``weight_inputs``: the routing weight scales each expert's
    input instead of its output (Llama 4)."""
    k = top_k_index.shape[-1]
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token = order // k
    routed = hidden_states.index_select(0, token)
    w = top_k_weights.reshape(-1)[order].unsqueeze(-1).to(hidden_states.dtype)
    if weight_inputs:
        routed = routed * w
    n = flat.numel()
    a = active_experts(n_experts, k, hidden_states.shape[0])  # the experts the tokens are expected to activate
    sizes = [n // a + (1 if i < n % a else 0) if i < a else 0 for i in range(n_experts)]
    # a meta capture records the first two experts of a slice size and replays the rest (opmap.capture.repeat)
    outs = repeat_calls(expert, [(chunk, i) for i, chunk in enumerate(routed.split(sizes)) if chunk.shape[0]])
    y = torch.cat(outs) if weight_inputs else torch.cat(outs) * w
    return torch.zeros_like(hidden_states).index_add_(0, token, y)


def _balanced_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                              top_k_weights: torch.Tensor) -> torch.Tensor:
    """A stacked-experts module's forward as ``dispatch``: each expert's up projection, gated by the class's own
    ``_apply_gate`` or activated by ``act_fn``, then its down projection."""
    gated = getattr(self, "has_gate", True)
    up = "gate_up_proj" if gated else "up_proj"

    def expert(chunk: torch.Tensor, i: int) -> torch.Tensor:
        h = _expert_linear(self, chunk, up, i)
        h = self._apply_gate(h) if gated else self.act_fn(h)
        return _expert_linear(self, h, "down_proj", i)

    return dispatch(hidden_states, top_k_index, top_k_weights, getattr(self, up).shape[0], expert)


def _llama4_moe_forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama 4's MoE block as an engine runs it (module docstring): the router's logits, each token's top-k experts
    weighted by the sigmoid of their logit (Llama4Router's scores where picked), each expert's gate and up
    projection (gate_up_proj (in, 2 x ffn): gate first), act(gate) x up and its down projection on its share of
    the tokens (its input scaled by the routing weight, as transformers scales it), plus the shared expert on every
    token. Returns (output, router logits) as transformers' does."""
    x = hidden_states.reshape(-1, self.hidden_dim)
    logits = torch.nn.functional.linear(x, self.router.weight, self.router.bias)
    top_v, top_i = torch.topk(logits, self.top_k, dim=-1)
    weights = torch.sigmoid(top_v.float()).to(x.dtype)
    ex = self.experts

    def expert(chunk: torch.Tensor, i: int) -> torch.Tensor:
        gate, up = (chunk @ ex.gate_up_proj[i]).chunk(2, dim=-1)
        return (up * ex.act_fn(gate)) @ ex.down_proj[i]

    routed = dispatch(x, top_i, weights, ex.gate_up_proj.shape[0], expert, weight_inputs=True)
    return self.shared_expert(x) + routed, logits
