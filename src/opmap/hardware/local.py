"""Where the measured profiles of this machine live: ``--hardware local`` (CPU) and ``local-cuda`` read them."""

from __future__ import annotations

import os
from pathlib import Path


def cache_path(device: str = "cpu") -> Path:
    """``$XDG_CACHE_HOME/opmap/local.toml`` (default ``~/.cache``); ``local-cuda.toml`` for a CUDA device."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "opmap" / ("local-cuda.toml" if device.startswith("cuda") else "local.toml")
