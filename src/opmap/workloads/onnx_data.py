"""The tensors of an ONNX model and the files their data lives in.

A TensorProto sits in many places of a model: the graph's initializers and sparse initializers; node attributes
(a Constant's ``value`` and ``sparse_value``, ConstantOfShape's ``value``, any tensor or sparse-tensor attribute);
and all of these again inside every subgraph (If / Loop / Scan bodies, nested to any depth), every function and
every training graph. Any of them may keep its data in an external file, named by its ``location``.

One rule holds for every one of them (:func:`check_external_data`, before anything is read): the location is a
path relative to the model's folder, with no ``..`` part; no part of it is a symbolic link; it names a regular
file (not a FIFO, a device or a folder) that holds the bytes the tensor needs. Values are read only through
:func:`tensor_value`, which resolves the file against the model's folder and reads the tensor's span with
opmap.safeio.read_span - never through onnx's own loader, which resolves a location against the process's working
directory when it is given no folder (a model could otherwise show the first bytes of a file beside the user).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from math import ceil, prod
from pathlib import Path
from typing import Any

import numpy as np

from opmap.errors import OpmapError

# a value read from a file holds at most this many bytes: onnx_model.FOLD_LIMIT elements of the widest type
MAX_VALUE_BYTES = (1 << 22) * 16
EXTERNAL = 1  # TensorProto.EXTERNAL

# ONNX element types by their TensorProto number, as opmap (torch) dtype names
ELEM_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
               10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 14: "complex64", 15: "complex128",
               16: "bfloat16", 17: "float8_e4m3fn", 18: "float8_e4m3fnuz", 19: "float8_e5m2",
               20: "float8_e5m2fnuz", 21: "uint4", 22: "int4"}


def tensors(m) -> Iterator[tuple[Any, str]]:
    """Every TensorProto in the ModelProto ``m`` (a sparse tensor's values and indices each count), with where it
    sits, in words, for a refusal. Every attribute field is looked at whatever the attribute's declared type."""
    todo: list[tuple[Any, str]] = [(m.graph, "")]
    todo += [(ti.initialization, "training initialization: ") for ti in m.training_info]
    todo += [(ti.algorithm, "training algorithm: ") for ti in m.training_info]
    nodes: list[tuple[Any, str]] = [(n, f"function {f.name!r}: ") for f in m.functions for n in f.node]
    while todo or nodes:
        if todo:
            g, where = todo.pop()
            yield from ((t, f"{where}initializer {t.name!r}") for t in g.initializer)
            for s in g.sparse_initializer:
                yield from _sparse(s, f"{where}sparse initializer {s.values.name!r}")
            nodes += [(n, where) for n in g.node]
            continue
        node, where = nodes.pop()
        for a in node.attribute:
            here = f"{where}{node.op_type} node {node.name or (node.output[0] if node.output else '')!r} " \
                   f"attribute {a.name!r}"
            if a.HasField("t"):
                yield a.t, here
            yield from ((t, here) for t in a.tensors)
            if a.HasField("sparse_tensor"):
                yield from _sparse(a.sparse_tensor, here)
            for s in a.sparse_tensors:
                yield from _sparse(s, here)
            if a.HasField("g"):
                todo.append((a.g, f"{here} > "))
            todo += [(g, f"{here} > ") for g in a.graphs]


def _sparse(s, where: str) -> Iterator[tuple[Any, str]]:
    yield s.values, f"{where} (values)"
    yield s.indices, f"{where} (indices)"


def is_external(t) -> bool:
    return t.HasField("data_location") and t.data_location == EXTERNAL


def _refuse(path: Path, where: str, loc: str, why: str):
    return OpmapError(f"{path}: {where} keeps its data at {loc!r}, {why}; accepted: a regular file inside the "
                      "model's folder, named by a relative path (no '..', no link)")


def _number(entries: dict[str, str], key: str, path: Path, where: str) -> int | None:
    v = entries.get(key)
    if v is None or v == "":
        return None
    if not v.isdigit() or not v.isascii():
        raise OpmapError(f"{path}: {where} gives its external data {key} as {v!r}; accepted: a non-negative integer")
    return int(v)


def locate(t, path: Path, where: str) -> tuple[Path, int, int]:
    """The file (inside the model's folder, checked part by part), offset and length of external tensor ``t``
    of the model at ``path``; anything the rule refuses is one OpmapError line."""
    entries = {e.key: e.value for e in t.external_data}
    loc = entries.get("location", "")
    parts = [p for p in re.split(r"[\\/]", loc) if p not in ("", ".")]
    if not parts or "\0" in loc or loc.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", loc) or ".." in parts:
        raise _refuse(path, where, loc, "outside the model's folder (an absolute path, '..' or no name)")
    base = path.parent.resolve()
    here = base
    for i, part in enumerate(parts):
        here = here / part
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            raise OpmapError(f"{path}: external data file {loc!r} ({where}) is missing beside the model") from None
        except OSError as e:
            raise _refuse(path, where, loc, f"which cannot be read ({e.strerror})") from None
        if stat.S_ISLNK(st.st_mode):
            raise _refuse(path, where, loc, "a symbolic link")
        if i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
            raise _refuse(path, where, loc, "not a file in a folder")
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, where, loc, "not a regular file (a FIFO, a device or a folder)")
    offset = _number(entries, "offset", path, where) or 0
    length = _number(entries, "length", path, where)
    if length is None:
        length = ceil(prod(max(int(d), 0) for d in t.dims) * elem_bytes(t.data_type))
    if offset + length > st.st_size:
        raise OpmapError(f"{path}: external data file {loc!r} holds {st.st_size} bytes, {where} needs bytes up to "
                         f"{offset + length} (the file is truncated)")
    return here, offset, length


def elem_bytes(elem: int) -> float:
    from opmap.precision import dtype_bytes

    return dtype_bytes(ELEM_DTYPES.get(elem, "float32"))


def check_external_data(m, path: Path) -> None:
    """Every tensor of the model (:func:`tensors`) that keeps its data in a file follows the rule of the module
    docstring, checked before any value is read."""
    for t, where in tensors(m):
        if is_external(t):
            locate(t, path, where)


def tensor_value(t, path: Path, where: str = "") -> np.ndarray:
    """The value of TensorProto ``t`` of the model at ``path``: inline data, or its span of an external file inside
    the model's folder (read with opmap.safeio.read_span, at most MAX_VALUE_BYTES). Data that does not match the
    tensor's type and dims is one OpmapError line."""
    from onnx import TensorProto, numpy_helper

    from opmap.safeio import read_span

    where = where or f"tensor {t.name!r}"
    if is_external(t):
        file, offset, length = locate(t, path, where)
        data = read_span(file, offset, length, MAX_VALUE_BYTES, f"{path.name}: external data of {where} in")
        inline = TensorProto()
        inline.CopyFrom(t)
        del inline.external_data[:]
        inline.data_location = TensorProto.DEFAULT
        inline.raw_data = data
        t = inline
    try:
        return numpy_helper.to_array(t)
    except Exception as e:  # noqa: BLE001 - onnx raises several types for malformed data; one line here
        raise OpmapError(f"{path}: {where} holds data that does not match its type and dims "
                         f"({str(e).strip()[:200] or type(e).__name__})") from None
