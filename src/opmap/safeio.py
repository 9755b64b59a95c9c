"""Reading a file someone else wrote: a regular file, opened without following a symbolic link and without
blocking on a FIFO or a device, and never more than a stated number of bytes.

Every reader of user-supplied or cached data (hardware TOML, graph cache entries, traces, imports, fusion plans,
run folders) goes through :func:`read_bounded`, so a name linked to ``/dev/zero``, a folder, a FIFO or a
multi-gigabyte file costs one line and exit status 2, never memory or a hang.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

from opmap.errors import OpmapError

MiB = 1 << 20

# What each kind of input may weigh. Each is far above anything opmap writes or a real file of its kind holds.
LIMIT_TOML_BYTES = 4 * MiB  # a hardware spec or calibrated profile is a few kB; a measured grid under 1 MB
LIMIT_JSON_BYTES = 64 * MiB  # run folders, fusion plans, quality evidence, cache entries (a 405B graph is ~20 MB)
LIMIT_TRACE_BYTES = 256 * MiB  # an arrival trace: a line per request, millions of requests


def _describe(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _open_regular(p: Path, what: str, follow_links: bool) -> tuple[int, os.stat_result]:
    """An fd open for reading on the regular file ``p`` and its stat, else one :class:`OpmapError` line."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(p, flags)
    except (OSError, ValueError) as e:  # ValueError: a name holding a NUL byte
        if isinstance(e, ValueError):
            raise OpmapError(f"{what} {str(p)!r} is not a file name (it holds a NUL byte)") from None
        if e.errno == errno.ELOOP:
            raise OpmapError(f"{what} {p} is a symbolic link: opmap reads only regular files there "
                             "(copy the file in its place)") from None
        if e.errno == errno.ENOENT:
            raise OpmapError(f"{what} {p} not found") from None
        if e.errno == errno.EISDIR:
            raise OpmapError(f"{what} {p} is a folder: expected a regular file") from None
        raise OpmapError(f"cannot read {what} {p}: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise OpmapError(f"{what} {p} is {_describe(st.st_mode)}: expected a regular file")
    return fd, st


def read_bounded(path: str | os.PathLike, limit_bytes: int, what: str, follow_links: bool = False) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit_bytes``, else an :class:`OpmapError` naming
    ``what`` the file was meant to be, the problem and what is accepted.

    ``follow_links=False`` (the default) refuses a symbolic link at ``path`` itself (``O_NOFOLLOW``); a caller that
    accepts a user's own link (a path typed on the command line) passes True, and the target is still checked to
    be a regular file of bounded size. The file is opened ``O_NONBLOCK`` so a FIFO never blocks the open."""
    p = Path(path)
    fd, st = _open_regular(p, what, follow_links)
    with os.fdopen(fd, "rb") as f:
        if st.st_size > limit_bytes:
            raise OpmapError(f"{what} {p} is {st.st_size / MiB:.1f} MiB, over the {limit_bytes / MiB:.0f} MiB "
                             "opmap reads for it")
        data = f.read(limit_bytes + 1)  # a file growing while read is still cut at the limit
    if len(data) > limit_bytes:
        raise OpmapError(f"{what} {p} is over the {limit_bytes / MiB:.0f} MiB opmap reads for it")
    return data


def read_span(path: str | os.PathLike, offset: int, length: int, limit_bytes: int, what: str) -> bytes:
    """Bytes ``offset`` to ``offset + length`` of ``path``, a regular file (never a link, a FIFO or a device) that
    holds them, for a ``length`` of at most ``limit_bytes``: a slice of a large file (an ONNX model's external
    weights) read without reading the rest. Anything else is one :class:`OpmapError` line."""
    p = Path(path)
    if offset < 0 or length < 0 or length > limit_bytes:
        raise OpmapError(f"{what} {p}: cannot read {length} bytes at offset {offset}; accepted: a non-negative "
                         f"offset and up to {limit_bytes / MiB:.0f} MiB")
    fd, st = _open_regular(p, what, False)
    try:
        if offset + length > st.st_size:
            raise OpmapError(f"{what} {p} holds {st.st_size} bytes, needs bytes up to {offset + length} (the file "
                             "is truncated)")
        data = os.pread(fd, length, offset)
    finally:
        os.close(fd)
    if len(data) != length:
        raise OpmapError(f"{what} {p} holds fewer than {offset + length} bytes (it shrank while read)")
    return data


def read_text_bounded(path: str | os.PathLike, limit_bytes: int, what: str, follow_links: bool = False) -> str:
    """:func:`read_bounded` decoded as UTF-8 (a byte-order mark skipped), else one line saying it is not text."""
    data = read_bounded(path, limit_bytes, what, follow_links)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise OpmapError(f"cannot read {what} {path}: not UTF-8 text") from None



def read_json_object(path: str | os.PathLike, limit_bytes: int, what: str, not_object: str) -> dict[str, Any]:
    """The JSON object in ``path`` (:func:`read_text_bounded`, then parsed): the one reader of a run folder's JSON
    files (compare, memo, report). A file that is not JSON raises one line; one that holds something other than
    an object raises ``not_object``."""
    import json

    text = read_text_bounded(path, limit_bytes, what)
    try:
        d = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise OpmapError(f"cannot read {path}: {type(e).__name__}: expected the JSON opmap wrote there") from None
    if not isinstance(d, dict):
        raise OpmapError(not_object)
    return d
