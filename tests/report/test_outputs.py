"""Output sets (report.outputs): written whole or not at all through a temporary folder, never through a
symbolic link; stale names removed in the same step; a run folder's inputs read only as regular files."""

from __future__ import annotations

import errno
import os

import pytest

from opmap.errors import OpmapError
from opmap.report.outputs import read_input, write_set


def _listing(d):
    return {p.name: (p.read_bytes() if p.is_file() and not p.is_symlink() else os.readlink(p)) for p in d.iterdir()}


def test_a_link_at_a_final_name_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("secret\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.json").symlink_to(victim)
    paths = write_set(out, {"a.json": "{}\n"})
    assert victim.read_text() == "secret\n"
    assert not paths[0].is_symlink() and paths[0].read_text() == "{}\n"
    assert sorted(p.name for p in out.iterdir()) == ["a.json"]  # no temporary folder left


def test_the_out_folder_may_be_a_link(tmp_path):
    """The folder the user names may be a link (it is theirs); what is created inside it is created fresh."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    write_set(tmp_path / "link", {"a.json": "{}\n"})
    assert (real / "a.json").read_text() == "{}\n"


def test_names_to_remove_go_in_the_same_step(tmp_path):
    write_set(tmp_path, {"fit.json": "1", "trade_curve.png": b"\x89PNG old"})
    write_set(tmp_path, {"fit.json": "2"}, remove=["trade_curve.png"])
    assert _listing(tmp_path) == {"fit.json": b"2"}
    write_set(tmp_path, {"fit.json": "3", "trade_curve.png": b"new"}, remove=["trade_curve.png"])
    assert _listing(tmp_path) == {"fit.json": b"3", "trade_curve.png": b"new"}


def test_a_failed_rename_puts_every_earlier_file_back(tmp_path, monkeypatch):
    """The third rename (the second new file into place) fails as a full or read-only disk would: the first new
    file is taken back, the earlier files (one of them a link, one a name to remove) are restored."""
    (tmp_path / "a.json").write_text("old a")
    (tmp_path / "b.csv").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "old.png").write_bytes(b"old png")
    before = _listing(tmp_path)
    real, calls = os.rename, []

    def rename(src, dst):
        calls.append(dst)
        if len(calls) == 5:  # a.json, b.csv, old.png aside; a.json placed; b.csv placed: fails
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr("opmap.report.outputs.os.rename", rename)
    with pytest.raises(OpmapError, match="No space left on device"):
        write_set(tmp_path, {"a.json": "new a", "b.csv": "new b"}, remove=["old.png"])
    assert _listing(tmp_path) == before


def test_a_failed_write_leaves_the_folder_as_it_was(tmp_path, monkeypatch):
    (tmp_path / "a.json").write_text("old a")
    before = _listing(tmp_path)
    real = os.open

    def full(path, flags, mode=0o777, **kw):
        if str(path).endswith("b.csv"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, flags, mode, **kw)

    monkeypatch.setattr("opmap.report.outputs.os.open", full)
    with pytest.raises(OpmapError, match="No space left on device"):
        write_set(tmp_path, {"a.json": "new a", "b.csv": "new b"})
    assert _listing(tmp_path) == before


def test_a_folder_at_a_final_name_is_refused(tmp_path):
    (tmp_path / "a.json").mkdir()
    with pytest.raises(OpmapError, match="a folder has that name"):
        write_set(tmp_path, {"a.json": "{}", "b.csv": "x"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_inputs_are_read_only_as_regular_files(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("secret")
    (tmp_path / "trace.json").symlink_to(secret)
    with pytest.raises(OpmapError, match="trace.json is a symbolic link"):
        read_input(tmp_path / "trace.json")
    os.mkfifo(tmp_path / "profile.json")  # would block an ordinary open
    with pytest.raises(OpmapError, match="profile.json is a FIFO: expected a regular file"):
        read_input(tmp_path / "profile.json")
    (tmp_path / "ok.json").write_text("{}")
    assert read_input(tmp_path / "ok.json") == "{}"


def test_an_input_over_the_limit_is_refused_unread(tmp_path):
    """A run folder's file was read whole, whatever its size (a 64 MiB file of zeros came back as text). It is
    read through opmap.safeio: at most LIMIT_JSON_BYTES."""
    from opmap.safeio import LIMIT_JSON_BYTES

    with open(tmp_path / "analysis.json", "wb") as f:  # sparse: refused on its size, nothing read
        f.truncate(LIMIT_JSON_BYTES + 1)
    with pytest.raises(OpmapError, match="analysis.json is 64.0 MiB, over the 64 MiB opmap reads for it"):
        read_input(tmp_path / "analysis.json")


def test_a_failed_set_leaves_no_folder_it_created(tmp_path, monkeypatch):
    real = os.open

    def full(path, flags, mode=0o777, **kw):
        if str(path).endswith("a.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, flags, mode, **kw)

    monkeypatch.setattr("opmap.report.outputs.os.open", full)
    with pytest.raises(OpmapError, match=r"cannot write into .*new: No space left on device"):
        write_set(tmp_path / "new", {"a.json": "{}"})
    assert list(tmp_path.iterdir()) == []
