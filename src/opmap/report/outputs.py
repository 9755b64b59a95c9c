"""Output sets on disk: every command's files (JSON, CSV, Markdown, HTML, PNG) written all together or not at all,
never through a symbolic link; and the run folder's files read back only when they are regular files.

Writing a set (``write_set``): the files are written into a private temporary folder inside the output folder
(``.opmap-tmp-*``, mode 0700; each file opened with O_CREAT | O_EXCL | O_NOFOLLOW, so nothing is opened
through a link), then renamed into place one by one. An entry already at a final name (a file or a symbolic
link) is kept aside in the temporary folder first, so a failure puts every earlier entry back; a symbolic link
at a final name is replaced by the new file, never followed (its target is left as it was). Names in
``remove`` that the new set does not hold (a PNG an earlier run drew, this one did not) go in the same step.
The temporary folder is removed whatever happens. The output folder itself may be a symbolic link: it is the
folder the user named, and everything inside it is created fresh.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

from opmap.errors import OpmapError
from opmap.safeio import LIMIT_JSON_BYTES, read_text_bounded
from opmap.validate import visible

TMP_PREFIX = ".opmap-tmp-"


def check_out_dir(out_dir: Path) -> None:
    """Refuse an output folder that could not be created or written, before the long work that fills it; the
    folder itself is not created here (a refused run leaves nothing behind)."""
    p = Path(out_dir)
    if p.exists():
        if not p.is_dir():
            raise OpmapError(f"cannot write into {visible(p)}: it exists and is not a folder")
        if not os.access(p, os.W_OK | os.X_OK):
            raise OpmapError(f"cannot write into {visible(p)}: permission denied")
        return
    if p.is_symlink():
        raise OpmapError(f"cannot write into {visible(p)}: it is a symbolic link to nothing")
    parent = p.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise OpmapError(f"cannot create output folder {visible(p)}: {visible(parent)} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OpmapError(f"cannot create output folder {visible(p)}: permission denied in {visible(parent)}")


def _lstat(p: Path) -> os.stat_result | None:
    try:
        return os.lstat(p)
    except FileNotFoundError:
        return None


def _write_new(path: Path, data: str | bytes) -> None:
    """Create ``path`` (it must not exist; a link there is not followed) with the umask's ordinary mode."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o666)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def _check_names(out_dir: Path, names: Iterable[str]) -> None:
    for n in names:
        if not n or n in (".", "..") or "/" in n or os.sep in n or n.startswith(TMP_PREFIX):
            raise ValueError(f"write_set takes plain file names, got {n!r}")
        st = _lstat(out_dir / n)
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise OpmapError(f"cannot write {visible(out_dir / n)}: a folder has that name; accepted: another --out")


def write_set(out_dir: Path, contents: dict[str, str | bytes], remove: Iterable[str] = ()) -> list[Path]:
    """Write every file of ``contents`` (name -> text or bytes) into ``out_dir`` and remove the names of
    ``remove`` it does not hold, as one step: a failure (full disk, no permission) leaves the folder as it was.
    Returns the paths written, in the order of ``contents``."""
    out_dir = Path(out_dir)
    gone = [n for n in dict.fromkeys(remove) if n not in contents]
    created = not out_dir.exists() and not out_dir.is_symlink()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OpmapError(f"cannot create output folder {visible(out_dir)}: {e.strerror}") from None
    _check_names(out_dir, [*contents, *gone])
    try:
        tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=out_dir))
    except OSError as e:
        raise OpmapError(f"cannot write into {visible(out_dir)}: {e.strerror}") from None
    done = keep_old = False
    why = ""
    try:
        (tmp / "new").mkdir()
        (tmp / "old").mkdir()
        for name, data in contents.items():
            _write_new(tmp / "new" / name, data)
        _swap(out_dir, tmp, list(contents), gone)
        done = True
    except _NotPutBack as e:
        keep_old, why = True, str(e.strerror)
    except OSError as e:
        why = str(e.strerror or e)
    finally:
        shutil.rmtree(tmp / "new" if keep_old else tmp, ignore_errors=True)
        if not done and created:  # the folder this call made goes too (only the last level, only if empty)
            with contextlib.suppress(OSError):
                out_dir.rmdir()
    if not done:
        raise OpmapError(f"cannot write into {visible(out_dir)}: {why}")
    return [out_dir / n for n in contents]


class _NotPutBack(OSError):
    """A failed set whose earlier files could not all be put back: they stay in the temporary folder."""


def _swap(out_dir: Path, tmp: Path, names: list[str], gone: list[str]) -> None:
    """Move the entries at ``names`` and ``gone`` aside into tmp/old, then the new files from tmp/new into
    place; on any failure (an exception) put everything back and re-raise (_NotPutBack when putting back failed
    too: tmp/old then still holds earlier files and must not be deleted)."""
    aside: list[str] = []
    placed: list[str] = []
    try:
        for n in [*names, *gone]:
            if _lstat(out_dir / n) is None:
                continue
            os.rename(out_dir / n, tmp / "old" / n)
            aside.append(n)
            if stat.S_ISDIR(os.lstat(tmp / "old" / n).st_mode):  # a folder appeared since the check
                raise OSError(errno.EISDIR, f"{out_dir / n} is a folder")
        for n in names:
            os.rename(tmp / "new" / n, out_dir / n)
            placed.append(n)
    except BaseException:
        lost = False
        for n in placed:
            try:
                os.rename(out_dir / n, tmp / "new" / n)
            except OSError:
                lost = True
        for n in aside:
            try:
                os.rename(tmp / "old" / n, out_dir / n)
            except OSError:
                lost = True
        if lost:
            raise _NotPutBack(errno.EIO, f"could not put every earlier file back: they are in {visible(tmp / 'old')}") \
                from None
        raise


def read_input(path: Path) -> str:
    """The text of a run folder's file: opmap.safeio's bounded read (a regular file of at most LIMIT_JSON_BYTES,
    opened without following a symbolic link and without blocking on a FIFO): opmap reads a run folder's own
    files, not what a link there points to."""
    return read_text_bounded(path, LIMIT_JSON_BYTES, "run file")
