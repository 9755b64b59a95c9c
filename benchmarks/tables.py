"""Published reference rows as data: one CSV file per source, a ``source`` column on every row (issue 37).

The benchmark scripts (serving_reference.py, published.py) keep the arithmetic that turns a published figure into
a prediction to compare; the figures themselves, their workload, layout and citation live in
``benchmarks/reference/<table>/*.csv``, so a table grows without growing code. Each script names its columns and
their types (``Column``); ``read_table`` parses a file with the csv module (nothing is executed) and refuses, in one
line naming the file, the line and what is accepted: a column the script does not know, a required column missing
or empty, a number that does not parse, an empty ``source``, a repeated ``id``.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from opmap.errors import OpmapError

REFERENCE = Path(__file__).resolve().parent / "reference"
MAX_ROWS = 10_000  # a reference table is a few dozen rows; a bound keeps a wrong file from being read whole
MAX_FIELD = 4_000  # characters in one cell (a citation with its table cell fits in well under this)


@dataclass(frozen=True)
class Column:
    """A column of a reference table: its name, its parser (str, int, float, or ``flags``), whether every row must
    fill it, and its value where a row leaves it empty."""

    name: str
    parse: Callable[[str], object] = str
    required: bool = False
    default: object = None


def flags(text: str) -> dict[str, str]:
    """``--name=value --switch`` (whitespace-separated) as an ordered dict of opmap options (value "" for a switch)."""
    out: dict[str, str] = {}
    for tok in text.split():
        if not tok.startswith("--") or len(tok) < 3:
            raise ValueError(f"option {tok!r} does not start with '--' (write --name=value or --switch)")
        name, _, value = tok.partition("=")
        out[name] = value
    return out


def _number(parse: Callable[[str], object], text: str) -> object:
    v = parse(text)
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"{text!r} is not a finite number")
    return v


def read_table(path: Path, columns: Iterable[Column]) -> list[dict]:
    """The rows of one reference CSV as dicts of parsed values (every declared column present, empty cells at their
    default), plus ``table`` (the file's stem). Raises OpmapError naming the file and line of the first bad cell."""
    cols = {c.name: c for c in columns}
    if "source" not in cols:
        raise OpmapError(f"{path.name}: a reference table's columns must include 'source'")
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as e:
        raise OpmapError(f"cannot read reference table {path}: {e.strerror}") from None
    with handle:
        reader = csv.DictReader(handle, restval=None, restkey="__extra__")
        header = reader.fieldnames or []
        unknown = [h for h in header if h not in cols]
        if unknown:
            raise OpmapError(f"{path.name}: unknown column(s) {', '.join(map(repr, unknown))}; accepted: "
                             f"{', '.join(cols)}")
        missing = [c.name for c in cols.values() if c.required and c.name not in header]
        if missing:
            raise OpmapError(f"{path.name}: required column(s) {', '.join(missing)} missing")
        rows, seen = [], set()
        for raw in reader:
            if len(rows) >= MAX_ROWS:
                raise OpmapError(f"{path.name}: more than {MAX_ROWS} rows; a reference table is split by source")
            rows.append(_row(path, reader.line_num, raw, cols, seen))
    return rows


def _row(path: Path, line: int, raw: dict, cols: dict[str, Column], seen: set) -> dict:
    where = f"{path.name} line {line}"
    if raw.get("__extra__"):
        raise OpmapError(f"{where}: {len(raw['__extra__'])} more cell(s) than the header's {len(cols)} columns")
    row: dict = {"table": path.stem}
    for name, col in cols.items():
        text = (raw.get(name) or "").strip()
        if len(text) > MAX_FIELD:
            raise OpmapError(f"{where}: column {name!r} is {len(text)} characters, at most {MAX_FIELD}")
        if not text:
            if col.required:
                raise OpmapError(f"{where}: column {name!r} is empty; every row must fill it")
            row[name] = col.default
            continue
        try:
            row[name] = _number(col.parse, text) if col.parse in (int, float) else col.parse(text)
        except ValueError as e:
            kind = {int: "an integer", float: "a number"}.get(col.parse, "a valid value")
            raise OpmapError(f"{where}: column {name!r} must be {kind}, got {text!r} ({e})") from None
    if not row["source"]:
        raise OpmapError(f"{where}: column 'source' is empty; every row names its source")
    if "id" in row:
        if row["id"] in seen:
            raise OpmapError(f"{where}: id {row['id']!r} appears twice")
        seen.add(row["id"])
    return row


def read_tables(folder: Path, columns: Iterable[Column], skip: Iterable[str] = ()) -> list[dict]:
    """Every ``*.csv`` in ``folder`` but the file names in ``skip`` (tables with columns of their own, read by their
    own reader), in name order, rows in file order; ids unique across the folder."""
    cols, left_out = list(columns), set(skip)
    paths = sorted(p for p in folder.glob("*.csv") if p.name not in left_out)
    if not paths:
        raise OpmapError(f"no reference tables (*.csv) in {folder}")
    rows, ids = [], {}
    for p in paths:
        for r in read_table(p, cols):
            if r.get("id") is not None:
                if r["id"] in ids:
                    raise OpmapError(f"{p.name}: id {r['id']!r} is also in {ids[r['id']]}")
                ids[r["id"]] = p.name
            rows.append(r)
    return rows
