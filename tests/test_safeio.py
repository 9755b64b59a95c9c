"""opmap.safeio: one bounded, link-refusing read for every file someone else wrote."""

from __future__ import annotations

import os

import pytest

from opmap.errors import OpmapError
from opmap.safeio import read_bounded, read_span, read_text_bounded


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


def test_a_span_of_a_file(tmp_path):
    """read_span reads bytes offset .. offset + length of a regular file, and refuses a span past its end, a link,
    a FIFO (without blocking) and a device."""
    f = tmp_path / "w.bin"
    f.write_bytes(bytes(range(16)))
    assert read_span(f, 4, 3, 100, "weights") == bytes([4, 5, 6])
    assert read_span(f, 16, 0, 100, "weights") == b""
    with pytest.raises(OpmapError, match=r"holds 16 bytes, needs bytes up to 17"):
        read_span(f, 10, 7, 100, "weights")
    with pytest.raises(OpmapError, match=r"up to 0 MiB"):
        read_span(f, 0, 101, 100, "weights")
    with pytest.raises(OpmapError, match=r"non-negative offset"):
        read_span(f, -1, 4, 100, "weights")
    link = tmp_path / "link.bin"
    link.symlink_to(f)
    with pytest.raises(OpmapError, match="symbolic link"):
        read_span(link, 0, 4, 100, "weights")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OpmapError, match="is a FIFO"):
        read_span(tmp_path / "fifo", 0, 4, 100, "weights")
    with pytest.raises(OpmapError, match="is a device"):
        read_span("/dev/zero", 0, 4, 100, "weights")
