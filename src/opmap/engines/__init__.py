"""Engine presets: vLLM, SGLang, TensorRT-LLM and trtllm-bench's scheduler defaults and sizing rules as
version-pinned, sourced data (``*.toml`` here) and the rules that apply them to a device, a layout and a run
(``rules``). ``serve``, ``fit`` and ``sweep`` take ``--engine-preset NAME[@VERSION]``."""

from opmap.engines.presets import ENGINES, EnginePreset, for_vendor, parse_preset, parse_presets
from opmap.engines.rules import (
    EngineSetting,
    MemoryRule,
    SizingInputs,
    engine_setting,
    memory_rule,
    override,
    trtllm_bench_setting,
)

__all__ = ["ENGINES", "EnginePreset", "EngineSetting", "MemoryRule", "SizingInputs", "engine_setting", "for_vendor",
           "memory_rule", "override", "parse_preset", "parse_presets", "trtllm_bench_setting"]
