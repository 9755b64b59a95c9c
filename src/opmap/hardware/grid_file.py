"""The measured grids a catalog device carries beside its TOML file (``[calibration]``: gemm_grid, attention_grid,
moe_grid, comm_grid; opmap.hardware.curves, attention_grid, moe_grid, comm_grid): how a grid is named, and reading
one. A grid file is data: its name must match its kind's pattern and lie in the catalog folder (no link followed),
its size is bounded before it is parsed, it is parsed as JSON, never executed, and any problem is one line naming
the file, the problem and what is accepted."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from opmap.errors import OpmapError
from opmap.safeio import LIMIT_JSON_BYTES, read_text_bounded
from opmap.validate import shown

CATALOG_DIR = Path(__file__).with_name("catalog")  # where a catalog device's grid files live


def name_pattern(suffix: str) -> re.Pattern:
    """The names a grid of one kind may have: ``<device>.<suffix>`` (suffix such as ``gemm.json``)."""
    return re.compile(r"[a-z0-9][a-z0-9.-]*\." + re.escape(suffix))


def check_grid_name(value: Any, key: str, pattern: re.Pattern, example: str, where: str) -> None:
    """Refuse a ``[calibration]`` ``key`` that does not name a grid file beside the catalog, in one line."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise OpmapError(f"{where}.{key} must name a file beside the catalog's TOML files, such as {example!r} "
                         f"(got {shown(value)})")


def read_tables(folder: Path, name: str, pattern: re.Pattern, what: str, script: str, tables_are: type,
                described: str, limit: int = LIMIT_JSON_BYTES) -> tuple[dict, Any]:
    """(the parsed file, its non-empty ``tables``: a ``tables_are``, dict or list) of the grid file ``name`` in
    ``folder`` (the catalog's, ``CATALOG_DIR``). ``what``: the grid's name in messages ("GEMM grid"); ``script``:
    what writes the file; ``described``: what ``tables`` holds, for the message when it is missing."""
    path = folder / name
    if not pattern.fullmatch(name) or path.is_symlink() or not path.is_file():
        accepted = pattern.pattern.rsplit("*\\.", 1)[-1].replace("\\", "")
        raise OpmapError(f"no {what} file {name!r} beside the catalog (accepted: a <device>.{accepted} there)")
    text = read_text_bounded(path, limit, what)  # the checks above can race a swap: bounded again here
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise OpmapError(f"cannot read {what} {name}: {e}; expected the JSON benchmarks/reference/{script} "
                         "writes") from None
    tables = raw.get("tables") if isinstance(raw, dict) else None
    if not isinstance(tables, tables_are) or not tables:
        raise OpmapError(f"{what} {name}: missing 'tables' ({described})")
    return raw, tables
