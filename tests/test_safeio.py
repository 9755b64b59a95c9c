"""opmap.safeio: one bounded, link-refusing read for every file someone else wrote."""

from __future__ import annotations

import os

import pytest

from opmap.errors import OpmapError
from opmap.safeio import read_bounded, read_text_bounded


def test_reads_a_regular_file(tmp_path):
    f = tmp_path / "a.toml"
    f.write_bytes(b"\xef\xbb\xbfname = 1\n")
    assert read_text_bounded(f, 100, "hardware file") == "name = 1\n"  # the byte-order mark skipped


def test_over_the_limit_refused_without_reading_it(tmp_path):
    f = tmp_path / "big.json"
    f.write_bytes(b"x" * 101)
    with pytest.raises(OpmapError, match=r"big.json is .* over the .* opmap reads for it"):
        read_bounded(f, 100, "run file")
    assert read_bounded(f, 101, "run file") == b"x" * 101  # exactly the limit is accepted


def test_link_to_dev_zero_refused(tmp_path):
    link = tmp_path / "spec.toml"
    link.symlink_to("/dev/zero")
    with pytest.raises(OpmapError, match="symbolic link"):
        read_bounded(link, 1 << 20, "hardware file")
    # a link the user typed may be followed, but its target must still be a regular file
    with pytest.raises(OpmapError, match="is a device: expected a regular file"):
        read_bounded(link, 1 << 20, "hardware file", follow_links=True)


@pytest.mark.parametrize("kind", ["folder", "fifo", "missing"])
def test_not_a_file(tmp_path, kind):
    p = tmp_path / "x"
    if kind == "folder":
        p.mkdir()
    elif kind == "fifo":
        os.mkfifo(p)  # opened non-blocking: no writer, no hang
    with pytest.raises(OpmapError) as e:
        read_bounded(p, 100, "trace")
    assert {"folder": "is a folder", "fifo": "is a FIFO", "missing": "not found"}[kind] in str(e.value)


def test_not_text(tmp_path):
    f = tmp_path / "b"
    f.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(OpmapError, match="not UTF-8 text"):
        read_text_bounded(f, 100, "trace")
