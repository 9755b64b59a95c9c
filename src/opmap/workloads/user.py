"""A user's own model file: ``path/to/file.py:factory`` returns (module, example inputs)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from opmap.errors import OpmapError
from opmap.workloads.zoo import MODELS, Workload, cast_to, parse_dtype


def _run_user_code(what: str, run: Callable[[], Any]) -> Any:
    """``run()``, the user's code: whatever it raises (an error, ``sys.exit(...)``, any other BaseException but
    Ctrl-C) becomes one OpmapError naming ``what``; a model file that exits, even with status 0, has failed."""
    try:
        return run()
    except (OpmapError, KeyboardInterrupt):
        raise
    except SystemExit as e:
        raise OpmapError(f"{what} called sys.exit({e.code!r}); a model file must define its factory and a factory "
                         "must return (module, example inputs), not exit") from None
    except BaseException as e:  # noqa: BLE001 - the user's code: report whatever it raised in one line
        text = str(e).strip()
        raise OpmapError(f"{what} failed: {type(e).__name__}" + (f": {text.splitlines()[0][:300]}" if text else "")) \
            from None


def load_user(target: str, dtype: str = "fp32", device: str = "meta") -> Workload:
    """``path/to/file.py:factory``: factory() returns (module, example inputs), called under
    ``torch.device(device)`` so the tensors it makes land there; ``dtype`` casts the module and the
    floating-point inputs."""
    path_s, sep, factory = target.rpartition(":")
    if not sep or not path_s.endswith(".py") or not factory.isidentifier():
        raise OpmapError(f"bad model target {target!r}: expected a zoo name ({', '.join(MODELS)}) "
                         "or path/to/file.py:factory")
    path = Path(path_s)
    if not path.is_file():
        raise OpmapError(f"model file {path} does not exist")
    tdt = parse_dtype(dtype)  # a bad dtype fails before the user's file is imported
    mod_name = f"opmap_user_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        _run_user_code(f"importing {path}", lambda: spec.loader.exec_module(module))
    except OpmapError:
        sys.modules.pop(mod_name, None)
        raise
    fn = getattr(module, factory, None)
    if not callable(fn):
        raise OpmapError(f"{path} has no callable {factory!r}")

    def call():
        with torch.device(device):
            return fn()

    result = _run_user_code(f"{path}:{factory}() on device {device!r}", call)
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.nn.Module)):
        raise OpmapError(f"{path}:{factory}() must return (module, example inputs), got {type(result).__name__}")
    net, inputs = result
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    net, inputs = cast_to(net, inputs, tdt)
    first = next((x for x in (inputs.values() if isinstance(inputs, dict) else inputs)
                  if isinstance(x, torch.Tensor)), None)
    batch = int(first.shape[0]) if first is not None and first.dim() else 1
    seq = int(first.shape[1]) if first is not None and first.dim() > 1 and not first.is_floating_point() else None
    return Workload(f"{path.name}:{factory}", net, inputs, batch, seq, ("user model: " + target,))
