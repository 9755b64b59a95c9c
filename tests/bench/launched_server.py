"""Helpers of the bench tests that use the launched server (conftest.py holds the fixtures)."""

from __future__ import annotations

import os
from pathlib import Path

# A Llama-shaped decoder small enough that a CPU step is about a millisecond: 2 layers, hidden 128, 4 heads, FFN
# 352, vocabulary 2048, context 1024 (positions: the HTTP 400 past the context is tested at 1024 tokens)
TINY_CONFIG = {"model_type": "llama", "vocab_size": 2048, "hidden_size": 128, "intermediate_size": 352,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
               "max_position_embeddings": 1024, "torch_dtype": "float32"}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of another user took the id: not ours
        return False
    try:  # a zombie (exited, not reaped) is not running
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False
