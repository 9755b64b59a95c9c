"""A preset applied to a priced replica: the flags given over it (``Applied``) and what the sizing reads of the
replica (``sizing_inputs``: the device, the layout, the priced memory, the model's parameters and context, the
run's mean lengths). serve and fit's layout search both go through here, so a replica is sized one way."""

from __future__ import annotations

from dataclasses import dataclass, replace

from opmap.engines.presets import EnginePreset
from opmap.engines.rules import EngineSetting, MemoryRule, SizingInputs, engine_setting, memory_rule, override


@dataclass(frozen=True)
class Applied:
    """``preset`` with the values the command's flags give (None: the preset's): the memory fraction in the
    engine's own sense, max sequences, the token budget, the KV block, chunking."""

    preset: EnginePreset
    fraction: float | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_block: int | None = None
    chunked_prefill: bool | None = None

    def memory(self, hw, tp: int, pp: int) -> MemoryRule:
        return memory_rule(self.preset, hw.name, hw.memory_bytes, tp, pp, self.fraction)

    def setting(self, x: SizingInputs, memory: MemoryRule) -> EngineSetting:
        s = override(engine_setting(self.preset, x, memory), self.max_num_seqs, self.max_num_batched_tokens,
                     self.kv_block, self.chunked_prefill)
        if self.fraction is not None:
            s = replace(s, overrides=(*s.overrides, f"memory fraction {self.fraction:g} of {memory.of} "
                                                    "(--gpu-memory-utilization)"))
        return s


def sizing_inputs(model: str, dtype: str, hw, tp: int, pp: int, cost, input_mean: float, output_mean: float,
                  offline: bool) -> SizingInputs:
    """What the sizing rules read of ``model`` priced on ``hw`` at ``tp`` x ``pp`` (``cost``: its TableCost): the
    KV capacity and bytes per token per device, the weights per device, the parameters (the whole model's bytes
    at its build dtype over that dtype's size) and the position limit."""
    from opmap.serve.resolve import Resolved

    r = Resolved.build(model, dtype)
    m = cost.memory or {}
    return SizingInputs(hw.name, hw.memory_bytes, tp, pp, int(cost.kv_capacity_tokens or 0),
                        float(m.get("weights_bytes", 0.0)), float(cost.kv_bytes_per_token or 0.0),
                        r.held_bytes / r.kv_itemsize, int(r.max_positions or 0), float(input_mean),
                        float(output_mean), bool(offline), dtype)
